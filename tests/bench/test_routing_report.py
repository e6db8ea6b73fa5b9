"""A side's routing report (``routing_report``) and the referee's use of it: a generate()'s
record is the routing a forward hook sees in one teacher-forced forward, in eager mode and in
the compiled static step, a patched block reports through its tap as the upstream router does,
and the referee scores a side against fp32 routed as it reports only where each reported choice
is within bf16's reach (real tiny models, CPU)."""

import copy

import pytest
import torch
from tilegym_hf_bench.compile_guard import no_compile
from tilegym_hf_bench.errors import BenchError
from tilegym_hf_bench.generation import Generator, make_input_ids
from tilegym_hf_bench.model_factory import fp32_reference, random_model
from tilegym_hf_bench.modes import EAGER
from tilegym_hf_bench.routing import Referee, following, forcing, recording, routers
from tilegym_hf_bench.routing_report import generate_reporting
from tilegym_hf_bench.routing_rule import (
    group_gap,
    same_selection,
    selection_gap,
    swapped_selection,
)
from tilegym_hf_bench.scoring import left_pad_mask, reference_logits
from tilegym_hf_bench.tilegym_patch import apply_patch

PROMPT, NEW = 20, 6


def _fp32(key: str, overrides=None):
    return fp32_reference(random_model(key, "cpu", 0, overrides or {}).model)


def _teacher_forced(model, seq, mask=None):
    with torch.inference_mode(), recording(model) as routed:
        reference_logits(model, seq, PROMPT, mask)
    return routed


def _recorded(model, seq, mask=None, mode=EAGER):
    """(sequence, report) of one generate() of ``seq``'s prompt, recorded as it runs."""
    gen = Generator(model, seq[:, :PROMPT], "cpu", mode)
    gen.use_prompt(seq[:, :PROMPT], mask)
    out, _, report = generate_reporting(
        model, lambda: gen.generate_with_logits(NEW), seq.shape[0], PROMPT, NEW
    )
    return out, report


def _padded_prompt(batch: int, seed: int):
    mask = left_pad_mask(batch, PROMPT)
    seq = make_input_ids(512, batch, PROMPT, seed, "cpu").masked_fill(mask == 0, 0)
    return seq, mask


@pytest.mark.parametrize("key", ["tiny-qwen3_moe", "tiny-gpt_oss", "tiny-deepseek_v3"])
def test_a_generate_records_the_routing_of_one_teacher_forced_forward_with_left_padding(key):
    """fp32, so the prompt's forward and the per-token ones order the experts alike: the
    record of every position, padded rows included, is the one forward's on the sequence the
    generate() made."""
    model = _fp32(key)
    prompt, mask = _padded_prompt(2, 4)
    seq, report = _recorded(model, prompt, mask)
    forward = _teacher_forced(model, seq, mask)
    assert len(report) == len(forward.chosen) == len(routers(model)) >= 1
    for mine, theirs in zip(report, forward.chosen, strict=True):
        assert mine.shape == theirs.shape == (2 * (PROMPT + NEW - 1), theirs.shape[1])
        assert bool(same_selection(mine, theirs).all())


@pytest.mark.parametrize("key", ["tiny-qwen3_moe", "tiny-gpt_oss"])
def test_the_compiled_static_step_records_its_own_routing(key):
    """Static mode, in the benchmark's order: a plain generate() compiles the step (the
    warm-up), then records are made (the correctness cases), then plain generate()s run again
    (the timed runs). Each record is written by the compiled step itself and is the routing of
    one teacher-forced forward at every position; the step compiled without a listener is used
    again afterwards without compiling (the timed runs' guard)."""
    model = _fp32(key)
    prompt = make_input_ids(512, 1, PROMPT, 3, "cpu")
    gen = Generator(model, prompt, "cpu", "static")
    first = gen.generate(NEW)
    for _ in range(2):
        seq, report = _recorded(model, prompt, mode="static")
        assert torch.equal(seq, first)
        forward = _teacher_forced(model, seq)
        for mine, theirs in zip(report, forward.chosen, strict=True):
            assert mine.shape == theirs.shape
            assert bool(same_selection(mine, theirs).all())
    with no_compile("timed run"):
        assert torch.equal(gen.generate(NEW), first)


def test_a_router_hooked_only_after_compiling_fails_the_record_loudly():
    """Dynamo does not guard on module hooks: a model whose step was compiled before its
    routers were hooked (not through ``Generator``) records the prompt only, and the report
    says so instead of passing a short record on."""
    model = _fp32("tiny-qwen3_moe")
    prompt = make_input_ids(512, 1, PROMPT, 3, "cpu")
    gen = Generator(model, prompt, "cpu", "static")
    for router, _ in routers(model):
        router._forward_hooks.clear()
    gen.generate(NEW)
    with pytest.raises(BenchError, match=f"recorded {PROMPT} routed tokens"):
        _recorded(model, prompt, mode="static")


def test_a_dense_model_reports_nothing():
    model = _fp32("tiny-qwen3")
    prompt = make_input_ids(512, 1, PROMPT, 0, "cpu")
    assert _recorded(model, prompt)[1] is None


@pytest.mark.parametrize(("key", "model_type"), [
    ("tiny-qwen3_moe", "qwen3_moe"),
    ("tiny-deepseek_v3", "deepseek_v3"),
])  # fmt: skip
def test_a_patched_block_reports_through_its_tap_as_the_upstream_router_does(key, model_type):
    """Patched, the router module is not called (its linear is a GEMM op, its top-k a routing
    op): the block's tap reports the same experts (fp32, the ops' PyTorch references)."""
    upstream = _fp32(key)
    patched = copy.deepcopy(upstream)
    report = apply_patch(patched, model_type)
    assert report.applied
    prompt = make_input_ids(512, 1, PROMPT, 2, "cpu")
    calls = []
    for router, _ in routers(patched):
        router.register_forward_hook(lambda *a: calls.append(1))
    seq, mine = _recorded(patched, prompt)
    assert calls == []  # nothing went through the router modules
    forward = _teacher_forced(upstream, seq)
    for layer, theirs in zip(mine, forward.chosen, strict=True):
        assert bool(same_selection(layer, theirs).all())


def _side(model, routed, layer: int, tokens: list[int]):
    """fp32's routing of one forward with ``tokens`` of MoE layer ``layer`` given the other
    side of their near-tie: the report a side routed so would send."""
    report = [c.clone() for c in routed.chosen]
    rows = torch.tensor(tokens)
    report[layer][rows] = swapped_selection(routed.ranking[layer][rows], report[layer][rows])
    return report


def _refereed(model, seq, margin: float, side_report, report=None):
    """(the side's errors, its report's counts) of a side that is fp32 routed as
    ``side_report``, scored with ``report`` (default: that routing itself)."""
    referee = Referee(model, model)
    with torch.inference_mode():
        plain, routed = referee.plain(seq, PROMPT)
        with following(model, side_report):
            side = reference_logits(model, seq, PROMPT)
        margins = [margin] * referee.moe_layers
        report = side_report if report is None else report
        run = referee.refereed(seq, PROMPT, None, plain, routed, margins, [side], [report])
    return run.sides[0]


def _closest_prompt_ties(routed, layer: int, count: int) -> list[int]:
    gaps = selection_gap(routed.ranking[layer], routed.chosen[layer])[: PROMPT - 1]
    return [int(t) for t in gaps.argsort()[:count]]


def test_a_side_routed_its_own_way_at_prompt_near_ties_is_scored_as_it_reports():
    """One of two near-tied prompt tokens swapped (no swap plan gives exactly that: a layer's
    plan swaps both): scored against fp32 routed as it reports, its every token is exact."""
    model = _fp32("tiny-qwen3_moe")
    seq = make_input_ids(512, 1, PROMPT + NEW, 7, "cpu")
    routed = _teacher_forced(model, seq)
    a, b = _closest_prompt_ties(routed, 0, 2)
    gaps = selection_gap(routed.ranking[0], routed.chosen[0])
    margin = 1.01 * float(gaps[[a, b]].max())
    report = _side(model, routed, 0, [a])
    errors = _refereed(model, seq, margin, report)
    assert float(errors.plain.max()) > 1e-3
    assert float(errors.best.max()) == 0.0
    assert errors.report == {"accepted": 1, "refused": 0}


def test_a_reported_choice_beyond_bf16_reach_is_refused():
    """The same swap with the margin below that token's gap: the report is refused there, the
    side is scored against fp32's own routing, and its error stays."""
    model = _fp32("tiny-qwen3_moe")
    seq = make_input_ids(512, 1, PROMPT + NEW, 7, "cpu")
    routed = _teacher_forced(model, seq)
    (a,) = _closest_prompt_ties(routed, 0, 1)
    gap = float(selection_gap(routed.ranking[0], routed.chosen[0])[a])
    errors = _refereed(model, seq, 0.5 * gap, _side(model, routed, 0, [a]))
    assert errors.report == {"accepted": 0, "refused": 1}
    assert torch.equal(errors.best, errors.plain) and float(errors.plain.max()) > 1e-3


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda r: r[:-1], "MoE layers reported"),
        (lambda r: [r[0][:-1]] + r[1:], "expected"),
        (lambda r: [r[0].float()] + r[1:], "expected"),
        (lambda r: [r[0] + 1000] + r[1:], "expert ids outside"),
    ],
)
def test_a_report_that_does_not_fit_the_sequence_is_an_error(damage, words):
    model = _fp32("tiny-qwen3_moe")
    seq = make_input_ids(512, 1, PROMPT + NEW, 7, "cpu")
    routed = _teacher_forced(model, seq)
    with pytest.raises(BenchError, match=f"routing report does not fit.*{words}"):
        _refereed(model, seq, 0.0, routed.chosen, damage([c.clone() for c in routed.chosen]))


def test_a_report_naming_an_expert_twice_is_refused():
    model = _fp32("tiny-qwen3_moe")
    seq = make_input_ids(512, 1, PROMPT + NEW, 7, "cpu")
    routed = _teacher_forced(model, seq)
    report = [c.clone() for c in routed.chosen]
    report[0][3, 1] = report[0][3, 0]
    errors = _refereed(model, seq, 10.0, routed.chosen, report)
    assert errors.report == {"accepted": 0, "refused": 1}


def test_a_reported_group_flip_is_accepted_only_within_the_groups_margin():
    """tiny-deepseek_v3 (2 of 4 groups kept): a side that kept another group at the prompt
    token whose group scores are nearest, reporting it, is accepted where the margin times
    the group scores' Lipschitz factor covers that gap and refused at half of it."""
    model = _fp32("tiny-deepseek_v3")
    seq = make_input_ids(512, 1, PROMPT + NEW, 5, "cpu")
    referee = Referee(model, model)
    routed = _teacher_forced(model, seq)
    router, _ = routers(model)[0]
    gaps = group_gap(routed.groups[0], router.topk_group)[: PROMPT - 1]
    token = int(gaps.argmin())
    site = [s.groups for s in referee.sites].index(True)
    at = torch.zeros(seq.shape[1] - 1, dtype=torch.bool)
    at[token] = True
    with torch.inference_mode(), forcing(model, {site: at}), recording(model) as side:
        reference_logits(model, seq, PROMPT)
    assert not bool(same_selection(side.chosen[0], routed.chosen[0])[token])
    enough = 1.01 * float(gaps[token]) / referee.sites[site].scale
    errors = _refereed(model, seq, enough, side.chosen)
    assert errors.report["accepted"] >= 1 and errors.report["refused"] == 0
    assert float(errors.best.max()) == 0.0
    refused = _refereed(model, seq, 0.5 * enough, side.chosen)
    assert refused.report["refused"] >= 1
