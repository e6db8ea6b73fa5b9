"""Every rule of the DESIGN.md decision, table-driven on plain metrics documents."""

from __future__ import annotations

import json
import math

import pytest
from conftest import cutile_symbol
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tilegym_bot.policy import Decision, decide, decide_baseline
from tilegym_bot.stats import ratio_of_means

BASE_SHA = "a" * 40


def _set(doc, path, value):
    *parents, last = path
    for key in parents:
        doc = doc[key]
    doc[last] = value


def _del(doc, path):
    *parents, last = path
    for key in parents:
        doc = doc[key]
    del doc[last]


NOISY = (50.0, 51.0, 49.0, 50.5, 49.5)
# (id, base kwargs, head kwargs, head edits [(path, value|DEL)], rerun, status, reason part)
DEL = object()
CASES = [
    ("keep", {}, {"coverage": 55.0}, [], False, "keep", "coverage 50.00% → 55.00%: +5.00 pp"),
    ("coverage_equal", {}, {}, [], False, "discard", "coverage 50.00% → 50.00%: no gain"),
    ("coverage_gain_at_threshold", {}, {"coverage": 50.01}, [], False, "discard", "no gain"),
    ("coverage_drop", {}, {"coverage": 40.0}, [], False, "discard", "no gain"),
    ("crash_head", {}, {"status": "crash"}, [], False, "crash", "head benchmark ended with crash"),
    ("timeout_head", {}, {"status": "timeout"}, [], False, "timeout", "ended with timeout"),
    ("refused_head", {}, {"status": "refused"}, [], False, "refused", "ended with refused"),
    ("crash_beats_bad_base", {"status": "crash"}, {"status": "crash"}, [], False, "crash", "head"),
    ("base_crashed", {"status": "crash"}, {"coverage": 55.0}, [], False, "inconclusive", "base"),
    ("incorrect", {}, {"coverage": 55.0, "passed": False}, [], False, "incorrect", "incorrect"),
    (
        "correctness_missing",
        {},
        {"coverage": 55.0, "passed": None},
        [],
        False,
        "inconclusive",
        "correctness was not measured",
    ),
    (
        "other_gpu",
        {},
        {"coverage": 55.0, "gpu": "NVIDIA B200"},
        [],
        False,
        "inconclusive",
        "GPU differs",
    ),
    (
        "other_model",
        {},
        {"coverage": 55.0, "model_key": "llama"},
        [],
        False,
        "inconclusive",
        "model key differs",
    ),
    (
        "other_workload",
        {},
        {"coverage": 55.0},
        [(("workload", "input_length"), 2048)],
        False,
        "inconclusive",
        "input length differs",
    ),
    (
        "other_cc",
        {},
        {"coverage": 55.0},
        [(("env", "compute_capability"), "10.0")],
        False,
        "inconclusive",
        "compute capability differs",
    ),
    (
        "missing_field",
        {},
        {"coverage": 55.0},
        [(("coverage", "gpu_time_pct"), DEL)],
        False,
        "inconclusive",
        "head metrics rejected by the schema",
    ),
    (
        "wrong_type",
        {},
        {"coverage": 55.0},
        [(("cutile",), "fast")],
        False,
        "inconclusive",
        "rejected by the schema",
    ),
    ("nan_coverage", {}, {"coverage": math.nan}, [], False, "inconclusive", "stored coverage n/a"),
    (
        "nan_sample",
        {},
        {"coverage": 55.0, "cutile": (50.0, math.nan, 49.0)},
        [],
        False,
        "inconclusive",
        "non-finite",
    ),
    (
        "no_cutile",
        {},
        {"coverage": 55.0, "cutile": None},
        [],
        False,
        "inconclusive",
        "no cuTile throughput measured on head",
    ),
    (
        "no_coverage",
        {"coverage": None},
        {"coverage": 55.0},
        [],
        False,
        "inconclusive",
        "no cuTile coverage measured on base",
    ),
    ("equal_samples", {}, {"coverage": 55.0, "cutile": NOISY}, [], False, "keep", "1.000"),
    (
        "single_sample_fast",
        {"cutile": (50.0,)},
        {"coverage": 55.0, "cutile": (51.0,)},
        [],
        False,
        "keep",
        "no 95% CI",
    ),
    (
        "single_sample_slow",
        {"cutile": (50.0,)},
        {"coverage": 55.0, "cutile": (40.0,)},
        [],
        False,
        "inconclusive",
        "rerun both sides with twice the samples",
    ),
    (
        "zero_variance_slow",
        {"cutile": (50.0,) * 4},
        {"coverage": 55.0, "cutile": (45.0,) * 4},
        [],
        False,
        "discard",
        "significant slowdown",
    ),
    (
        "zero_variance_equal",
        {"cutile": (50.0,) * 4},
        {"coverage": 55.0, "cutile": (50.0,) * 4},
        [],
        False,
        "keep",
        "1.000 (95% CI 1.000–1.000)",
    ),
    (
        "significant_drop",
        {},
        {"coverage": 55.0, "cutile": tuple(v * 0.8 for v in NOISY)},
        [],
        False,
        "discard",
        "whole interval lies below 0.98",
    ),
    (
        "unclear_drop",
        {"cutile": (40.0, 60.0, 50.0)},
        {"coverage": 55.0, "cutile": (38.0, 58.0, 48.0)},
        [],
        False,
        "inconclusive",
        "not significant",
    ),
    (
        "unclear_drop_rerun",
        {"cutile": (40.0, 60.0, 50.0)},
        {"coverage": 55.0, "cutile": (38.0, 58.0, 48.0)},
        [],
        True,
        "discard",
        "after the rerun with twice the samples",
    ),
    (
        "within_margin",
        {},
        {"coverage": 55.0, "cutile": tuple(v * 0.985 for v in NOISY)},
        [],
        False,
        "keep",
        "not below 0.98",
    ),
    ("rerun_keeps_keep", {}, {"coverage": 55.0}, [], True, "keep", "no significant drop"),
    (
        "rerun_rejected_stays_inconclusive",
        {},
        {"coverage": 55.0, "gpu": "B200"},
        [],
        True,
        "inconclusive",
        "GPU differs",
    ),
]


@pytest.mark.parametrize(
    "base_kw, head_kw, edits, rerun, status, reason",
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_decision_rules(make_metrics, base_kw, head_kw, edits, rerun, status, reason):
    base = make_metrics(commit=BASE_SHA, **base_kw)
    head = make_metrics(**head_kw)
    for path, value in edits:
        _del(head, path) if value is DEL else _set(head, path, value)
    decision = decide(base, head, rerun=rerun)
    assert decision.status == status, decision.reasons
    assert any(reason in r for r in decision.reasons), decision.reasons
    doc = decision.to_json()
    assert set(doc) == {
        "status",
        "ledger_status",
        "reasons",
        "coverage",
        "throughput",
        "gpu_time_ms_per_token",
        "rerun",
        "kept_by",
        "sampling",
    }
    assert doc["kept_by"] == ("coverage" if status == "keep" else None)
    as_discard = ("incorrect", "refused", "inconclusive")
    expected_ledger = "discard" if status in as_discard else status
    assert doc["ledger_status"] == expected_ledger


def _with_kernels(doc, kernels, coverage=None):
    """``doc`` with this kernel list and its (honest, unless given) coverage share."""
    total = sum(k["gpu_ms"] for k in kernels)
    doc["coverage"]["kernels"] = kernels
    doc["coverage"]["total_gpu_ms"] = total
    honest = 100.0 * sum(k["gpu_ms"] for k in kernels if k["cutile"]) / total
    doc["coverage"]["gpu_time_pct"] = honest if coverage is None else coverage
    return doc


def _scaled(kernels, factor, *, cutile):
    """The list with the cuTile (or the other) kernels taking ``factor`` times as long."""
    return [
        dict(k, gpu_ms=k["gpu_ms"] * (factor if k["cutile"] == cutile else 1.0)) for k in kernels
    ]


def test_planted_slow_gemm_is_a_discard(make_metrics):
    """The review's planted regression: the cuTile GEMMs launched three times. Coverage rises,
    the GPU kernel time per token rises with it: discard in one round, however fast eager
    throughput looks."""
    base = make_metrics(commit=BASE_SHA)
    head = _with_kernels(make_metrics(), _scaled(base["coverage"]["kernels"], 3.0, cutile=True))
    assert head["coverage"]["gpu_time_pct"] == pytest.approx(75.0)
    decision = decide(base, head)
    assert decision.status == "discard", decision.reasons
    assert "GPU kernel time per token 7.8125 → 15.6250 ms (+100.0%" in decision.reasons[0]
    assert decision.gpu_ms_head == pytest.approx(2 * decision.gpu_ms_base)


def test_coverage_from_slower_cutile_kernels_alone_is_a_discard(make_metrics):
    """Within the GPU-time margin, but the non-cuTile time did not fall: no credit."""
    base = make_metrics(commit=BASE_SHA)
    head = _with_kernels(make_metrics(), _scaled(base["coverage"]["kernels"], 1.004, cutile=True))
    decision = decide(base, head)
    assert decision.status == "discard", decision.reasons
    assert "non-cuTile GPU time per token did not fall" in decision.reasons[0]


def test_moving_a_kernel_to_cutile_at_equal_gpu_time_stays_a_keep(make_metrics):
    base = make_metrics(commit=BASE_SHA)
    kernels = [dict(k) for k in base["coverage"]["kernels"]]
    moved = kernels.pop(2)  # the elementwise kernel, now a cuTile kernel of the same time
    kernels.append(dict(moved, name=cutile_symbol("elementwise_kernel"), cutile=True))
    head = _with_kernels(make_metrics(), kernels)
    decision = decide(base, head)
    assert decision.status == "keep", decision.reasons
    assert decision.coverage_head == pytest.approx(65.0)
    assert decision.gpu_ms_head == pytest.approx(decision.gpu_ms_base)


def test_planted_gemm_under_a_compiled_decode_step_is_a_discard(make_metrics):
    """The planted 3x QKV GEMM through the loop in static mode (H200): the compiler drops the
    two unused launches from the decode graph, so only the eager prefill pays them. GPU time
    per token +0.8%, coverage +0.07 pp, the non-cuTile time 0.17% lower by noise: it was kept
    at a 2% margin; at the noise-sized margin it is a discard."""
    base = make_metrics(commit=BASE_SHA)
    kernels = _scaled(base["coverage"]["kernels"], 1.016, cutile=True)  # half the time: +0.8%
    head = _with_kernels(make_metrics(), _scaled(kernels, 0.9983, cutile=False))
    decision = decide(base, head)
    assert decision.status == "discard", decision.reasons
    assert decision.reasons[0].startswith("GPU kernel time per token")
    assert "allowed +0.5%" in decision.reasons[0]


def test_the_same_code_profiled_twice_passes_the_gpu_time_gate(make_metrics):
    """The largest spread measured between profiled runs of one commit (+0.31%) is no
    slowdown: the gate lets it through to the coverage rule."""
    base = make_metrics(commit=BASE_SHA)
    kernels = [dict(k, gpu_ms=k["gpu_ms"] * 1.0031) for k in base["coverage"]["kernels"]]
    decision = decide(base, _with_kernels(make_metrics(), kernels))
    assert decision.status == "discard"
    assert decision.reasons[0].startswith("coverage 50.00% → 50.00%: no gain"), decision.reasons


def test_gpu_time_margin_is_a_parameter(make_metrics):
    base = make_metrics(commit=BASE_SHA)
    head = _with_kernels(make_metrics(), _scaled(base["coverage"]["kernels"], 1.06, cutile=True))
    head["coverage"]["kernels"][0]["gpu_ms"] -= 1.0  # non-cuTile time falls a little
    _with_kernels(head, head["coverage"]["kernels"])
    assert decide(base, head).status == "discard"
    assert decide(base, head, gpu_margin=0.05).status == "keep"
    with pytest.raises(ValueError):
        decide(base, head, gpu_margin=-0.1)


def test_a_self_reported_pass_is_recomputed(make_metrics):
    """``passed: true`` with an error of 0.9 against the file's own tolerance of 0.019."""
    base = make_metrics(commit=BASE_SHA)
    head = make_metrics(coverage=55.0)
    head["correctness"].update(passed=True, logits_rel_err=0.9, tolerance=0.019)
    decision = decide(base, head)
    assert decision.status == "incorrect", decision.reasons
    assert "0.9 > tolerance" in decision.reasons[0] and "claims it passed" in decision.reasons[0]
    # a tolerance the file widened itself does not count either
    head["correctness"].update(logits_rel_err=0.05, tolerance=1.0)
    assert decide(base, head).status == "incorrect"


def test_a_reference_too_far_from_bf16_makes_correctness_inconclusive(make_metrics):
    """The bf16 model 0.93 from fp32 (gemma3's random preset as it was): its tolerance would
    pass a kernel returning zeros, so no pass is trusted, whatever the file says."""
    base = make_metrics(commit=BASE_SHA)
    head = make_metrics(coverage=55.0)
    head["correctness"].update(passed=True, logits_rel_err=1.0, baseline_rel_err=0.93)
    head["correctness"].update(tolerance=1.396)
    decision = decide(base, head)
    assert decision.status == "inconclusive", decision.reasons
    assert "correctness cannot be established" in decision.reasons[0]
    assert not decision.rerun_useful


def test_stored_coverage_that_disagrees_with_its_kernels_is_refused(make_metrics):
    base = make_metrics(commit=BASE_SHA)
    head = make_metrics(coverage=55.0)
    head["coverage"]["gpu_time_pct"] = 99.0
    decision = decide(base, head)
    assert decision.status == "inconclusive"
    assert "head metrics refused: stored coverage 99.00%" in decision.reasons[0]
    assert not decision.rerun_useful


def test_a_foreign_kernel_marked_cutile_is_refused(make_metrics):
    """A Triton kernel named like a cuTile symbol, marked cuTile by a fooled classifier."""
    base = make_metrics(commit=BASE_SHA)
    kernels = [dict(k) for k in base["coverage"]["kernels"]]
    kernels[2] = dict(kernels[2], name="fused_rmsnorm_Kt2", cutile=True)
    head = _with_kernels(make_metrics(), kernels)
    decision = decide(base, head, base_kernels=frozenset({"rms_norm_kernel"}))
    assert decision.status == "inconclusive", decision.reasons
    assert "'fused_rmsnorm_Kt2'" in decision.reasons[0]


def test_a_cutile_symbol_of_a_function_not_in_the_tree_is_not_cutile(make_metrics):
    base = make_metrics(commit=BASE_SHA)
    head = make_metrics(coverage=55.0)
    names = frozenset({"rms_norm_kernel"})
    assert decide(base, head, base_kernels=names, head_kernels=names).status == "keep"
    decision = decide(base, head, base_kernels=names, head_kernels=frozenset({"other"}))
    assert decision.status == "inconclusive" and "head metrics refused" in decision.reasons[0]


def test_a_cpu_run_says_so_and_asks_for_no_rerun(make_metrics):
    base = make_metrics(commit=BASE_SHA, gpu=None)
    head = make_metrics(coverage=55.0, gpu=None)
    decision = decide(base, head)
    assert decision.status == "inconclusive"
    assert "without a CUDA GPU" in decision.reasons[0]
    assert not decision.rerun_useful and decision.to_json()["rerun"] is False


def test_broken_glue_on_a_cpu_is_incorrect_not_inconclusive(make_metrics):
    """The worker runs the patched model on a CPU too (the ops' references): a head whose
    output is wrong there is judged so, before the no-GPU rule says nothing can be decided."""
    base = make_metrics(commit=BASE_SHA, gpu=None)
    head = make_metrics(coverage=55.0, gpu=None, passed=False)
    decision = decide(base, head)
    assert decision.status == "incorrect" and decision.to_json()["ledger_status"] == "discard"


def test_a_refused_head_is_recorded_as_a_discard(make_metrics):
    head = make_metrics(status="refused")
    decision = decide(make_metrics(commit=BASE_SHA), head)
    assert decision.status == "refused" and decision.to_json()["ledger_status"] == "discard"


def test_only_a_throughput_doubt_asks_for_a_rerun(make_metrics):
    base = make_metrics(commit=BASE_SHA)
    unclear = make_metrics(coverage=55.0, cutile=(38.0, 58.0, 48.0))
    decision = decide(base, unclear)
    assert decision.status == "inconclusive" and decision.rerun_useful
    assert decide(base, unclear, rerun=True).status == "discard"


def test_paired_speedups_cancel_machine_drift(make_metrics):
    """Head's machine is 30% slower overall, but its cuTile/PyTorch speedup is higher: keep."""
    base = make_metrics(
        commit=BASE_SHA,
        cutile=(50.0, 52.0, 48.0, 51.0),
        baseline=(25.0, 26.0, 24.0, 25.5),
        interleaved=True,
    )
    head = make_metrics(
        coverage=55.0,
        cutile=(37.8, 39.3, 36.3, 38.5),
        baseline=(17.5, 18.2, 16.8, 17.85),
        interleaved=True,
    )
    decision = decide(base, head)
    assert decision.status == "keep", decision.reasons
    assert decision.ratio == pytest.approx(
        (37.8 / 17.5 + 39.3 / 18.2 + 36.3 / 16.8 + 38.5 / 17.85) / 4 / 2.0, rel=1e-9
    )
    assert any("paired speedups" in r for r in decision.reasons)
    # The same numbers without the interleaved flag fall back to mean cuTile throughputs: drop.
    for doc in (base, head):
        for block in ("baseline", "cutile"):
            del doc[block]["throughput"]["interleaved"]
    assert decide(base, head).status == "discard"


def test_unequal_interleaved_counts_fall_back_to_means(make_metrics):
    base = make_metrics(commit=BASE_SHA, interleaved=True)
    head = make_metrics(coverage=55.0, interleaved=True, baseline=(25.0, 25.0))
    decision = decide(base, head)
    assert any("ratio of mean cuTile throughputs" in r for r in decision.reasons)


def test_margin_is_a_parameter(make_metrics):
    base = make_metrics(commit=BASE_SHA)
    head = make_metrics(coverage=55.0, cutile=tuple(v * 0.94 for v in NOISY))
    assert decide(base, head).status == "discard"
    assert decide(base, head, margin=0.07).status == "keep"
    with pytest.raises(ValueError):
        decide(base, head, margin=1.5)


def test_decision_json_is_finite_on_nan(make_metrics):
    """A NaN stored coverage is recomputed from the kernel list (50%) and the file refused."""
    decision = decide(make_metrics(commit=BASE_SHA), make_metrics(coverage=math.nan))
    assert decision.status == "inconclusive"
    assert "head metrics refused: stored coverage n/a" in decision.reasons[0]
    assert decision.to_json()["coverage"] == {"base": 50.0, "head": 50.0, "delta_pp": 0.0}
    json.dumps(decision.to_json(), allow_nan=False)


def test_baseline_decisions(make_metrics):
    ok = decide_baseline(make_metrics())
    assert (ok.status, ok.ledger_status, ok.coverage_head) == ("keep", "keep", 50.0)
    assert decide_baseline(make_metrics(status="timeout")).status == "timeout"
    assert decide_baseline({"schema": "nope"}).status == "inconclusive"


def test_ratio_ci_welch_t():
    """Checked by hand: log-ratio delta method, Welch df, t(0.975) from scipy."""
    est = ratio_of_means([10.0, 12.0], [10.0, 10.0])
    se = math.sqrt(2.0 / (2 * 11.0**2))  # var([10,12]) = 2, n = 2, mean 11; other side 0
    t = 12.706204736174698  # t(0.975, df=1)
    assert est.ratio == pytest.approx(1.1)
    assert est.ci95 == pytest.approx((1.1 * math.exp(-t * se), 1.1 * math.exp(t * se)))
    with pytest.raises(ValueError):
        ratio_of_means([1.0, math.nan], [1.0])
    with pytest.raises(ValueError):
        ratio_of_means([], [1.0])


def test_overflowing_speedups_are_inconclusive(make_metrics):
    base = make_metrics(commit=BASE_SHA, interleaved=True)
    head = make_metrics(coverage=55.0, interleaved=True, baseline=(1e-320,) * 5)
    decision = decide(base, head)
    assert decision.status == "inconclusive" and "not computable" in decision.reasons[-1]


samples = st.lists(
    st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(1.0, 100.0)),
    min_size=0,
    max_size=6,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(base=samples, head=samples, cov=st.floats(allow_nan=True), interleaved=st.booleans())
def test_any_samples_give_a_decision_and_finite_json(make_metrics, base, head, cov, interleaved):
    b = make_metrics(commit=BASE_SHA, cutile=base, baseline=base, interleaved=interleaved)
    h = make_metrics(coverage=cov, cutile=head, baseline=base, interleaved=interleaved)
    decision = decide(b, h)
    assert decision.status in ("keep", "discard", "inconclusive")
    json.dumps(decision.to_json(), allow_nan=False)
    if decision.ratio_ci95:
        lo, hi = decision.ratio_ci95
        assert lo <= decision.ratio <= hi


def test_a_significant_drop_while_the_gpu_time_fell_is_rerun_before_a_discard(make_metrics):
    """phi3's cutile-attn round (H200, 3 runs a side): GPU time per token 3.523 -> 3.457 ms, yet
    r = 0.886 with the whole interval below 0.98, because PyTorch static ran 13% faster in the
    head's job. The kernels cannot explain such a drop: a rerun first, and a discard only if
    the drop stays."""
    base = make_metrics(commit=BASE_SHA)
    kernels = [dict(k) for k in base["coverage"]["kernels"]]
    moved = kernels.pop(2)  # the elementwise kernel, now a faster cuTile kernel
    kernels.append(dict(moved, name=cutile_symbol("elementwise_kernel"), cutile=True,
                        gpu_ms=0.9 * moved["gpu_ms"]))  # fmt: skip
    head = _with_kernels(make_metrics(cutile=tuple(v * 0.8 for v in NOISY)), kernels)
    first = decide(base, head)
    assert first.status == "inconclusive" and first.rerun_useful, first.reasons
    assert "but the GPU kernel time per token fell" in first.reasons[-1]
    assert first.gpu_ms_head < first.gpu_ms_base
    again = decide(base, head, rerun=True)
    assert again.status == "discard" and "significant slowdown" in again.reasons[-1]


def test_an_inductor_kernel_named_after_a_mangled_custom_op_is_no_coverage(make_metrics):
    """The attack: a custom op ``zzrope_Kt2_A9f32_1t`` makes Inductor name a fused Triton kernel
    ``triton_poi_fused__to_copy_zzrope_Kt2_A9f32_1t_3``, and a never-launched ``@ct.kernel``
    decoy ``triton_poi_fused__to_copy_zzrope`` in the head's tree made it read as cuTile: the
    only gain, at identical GPU time, was kept. Whether the head's file marks it cuTile (as
    the fooled classifier did) or not, it is no keep."""
    inductor = "triton_poi_fused__to_copy_bmm_cat_cos_mul_qk_norm_rope_sin_slice_transpose_view_3"
    attacked = "triton_poi_fused__to_copy_zzrope_Kt2_A9f32_1t_3"
    base = make_metrics(commit=BASE_SHA)
    kernels = [dict(k) for k in base["coverage"]["kernels"]]
    kernels[2] = dict(kernels[2], name=inductor)
    base = _with_kernels(base, kernels)
    tree = frozenset({"rms_norm_kernel"})
    for marked in (True, False):
        head_kernels = [dict(k) for k in kernels]
        head_kernels[2] = dict(head_kernels[2], name=attacked, cutile=marked)
        head = _with_kernels(make_metrics(), head_kernels)
        decision = decide(
            base,
            head,
            base_kernels=tree,
            head_kernels=tree | {"triton_poi_fused__to_copy_zzrope"},
        )
        assert decision.status != "keep", decision.reasons
        assert decision.gpu_ms_head == pytest.approx(decision.gpu_ms_base)


# Rule 8's speed path (issue 48): after coverage, a faster kernel keeps.


def _faster(kernels, *, cutile_factor=1.0, other_factor=1.0):
    return [
        dict(k, gpu_ms=k["gpu_ms"] * (cutile_factor if k["cutile"] else other_factor))
        for k in kernels
    ]


def test_a_pure_speedup_keeps_though_coverage_falls(make_metrics):
    """The cuTile kernels 10% faster, everything else as it was: coverage falls (a faster
    kernel is a smaller share), which the coverage rule would discard; the speed rule keeps."""
    base = make_metrics(commit=BASE_SHA)
    head = _with_kernels(make_metrics(), _faster(base["coverage"]["kernels"], cutile_factor=0.9))
    decision = decide(base, head)
    assert decision.status == "keep", decision.reasons
    assert decision.kept_by == "speed"
    assert decision.coverage_head < decision.coverage_base
    assert decision.reasons[0].startswith("kept by the speed rule: GPU kernel time per token")
    assert decision.to_json()["kept_by"] == "speed"
    assert decision.ledger_marker == " [speed]"


def test_a_speedup_that_moves_work_back_to_pytorch_is_a_discard(make_metrics):
    """Less GPU time in all, but the non-cuTile time rose: a cuTile kernel dropped for a
    faster fused PyTorch/Inductor one (the "drop RoPE" rounds) is no speed keep."""
    base = make_metrics(commit=BASE_SHA)
    kernels = [dict(k) for k in base["coverage"]["kernels"]]
    rms = next(k for k in kernels if k["cutile"])
    rms["gpu_ms"] -= 100.0  # part of the cuTile work gone ...
    kernels[0]["gpu_ms"] += 40.0  # ... done faster by a PyTorch kernel
    head = _with_kernels(make_metrics(), kernels)
    decision = decide(base, head)
    assert decision.gpu_ms_head < decision.gpu_ms_base * 0.95
    assert decision.status == "discard", decision.reasons
    assert decision.kept_by is None
    assert "moves work back to PyTorch" in decision.reasons[0]
    assert "non-cuTile GPU time per token" in decision.reasons[0]


def test_a_coverage_gain_at_equal_time_keeps_by_the_coverage_rule(make_metrics):
    base = make_metrics(commit=BASE_SHA)
    kernels = [dict(k) for k in base["coverage"]["kernels"]]
    kernels[0]["gpu_ms"] -= 50.0
    next(k for k in kernels if k["cutile"])["gpu_ms"] += 50.0
    head = _with_kernels(make_metrics(), kernels)
    decision = decide(base, head)
    assert decision.status == "keep", decision.reasons
    assert decision.kept_by == "coverage"
    assert decision.gpu_ms_head == pytest.approx(decision.gpu_ms_base)
    assert decision.reasons[0].startswith("kept by the coverage rule: coverage 50.00% → 55.00%")
    assert decision.ledger_marker == ""


@pytest.mark.parametrize("factor", [0.9969, 0.996])  # the largest measured spread; 0.8% of the
def test_a_speedup_within_the_noise_margin_does_not_keep(make_metrics, factor):  # cuTile half
    """GPU time per token down by no more than the noise margin (0.5%): not shown to be faster,
    and no coverage gain: discard."""
    base = make_metrics(commit=BASE_SHA)
    head = _with_kernels(make_metrics(), _faster(base["coverage"]["kernels"], cutile_factor=factor))
    decision = decide(base, head)
    assert decision.status == "discard", decision.reasons
    assert "no gain" in decision.reasons[0]
    assert decision.reasons[1].startswith("not a speedup either: GPU kernel time per token")
    # the same change at a looser noise margin would be one
    assert decide(base, head, gpu_margin=0.001).kept_by == "speed"


def test_an_incorrect_speedup_is_incorrect(make_metrics):
    base = make_metrics(commit=BASE_SHA)
    head = _with_kernels(
        make_metrics(passed=False), _faster(base["coverage"]["kernels"], cutile_factor=0.5)
    )
    decision = decide(base, head)
    assert decision.status == "incorrect", decision.reasons
    assert decision.kept_by is None and decision.ledger_marker == " [incorrect]"


def test_a_speedup_must_not_drop_throughput(make_metrics):
    """Faster kernels with a significantly slower generate(): the throughput rule still holds."""
    base = make_metrics(commit=BASE_SHA, interleaved=True)
    head = _with_kernels(
        make_metrics(cutile=(40.0, 40.5, 39.5, 40.2, 39.8), interleaved=True),
        _faster(base["coverage"]["kernels"], cutile_factor=0.9),
    )
    decision = decide(base, head, rerun=True)
    assert decision.status == "discard", decision.reasons
    assert decision.reasons[0].startswith("GPU kernel time per token")  # the speed path's text
    assert "significant slowdown" in decision.reasons[1]


def test_kept_by_round_trips_and_old_records_read(make_metrics):
    base = make_metrics(commit=BASE_SHA)
    head = _with_kernels(make_metrics(), _faster(base["coverage"]["kernels"], cutile_factor=0.9))
    doc = decide(base, head).to_json()
    assert Decision.from_json(doc).kept_by == "speed"
    del doc["kept_by"]  # a record written before the speed rule
    assert Decision.from_json(doc).kept_by is None
