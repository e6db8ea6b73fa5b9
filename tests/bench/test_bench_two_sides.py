"""The two-sided path the GPU run takes (baseline + a twin sharing its weights), exercised on CPU
with an unpatched twin: interleaved timing, teacher-forced correctness and a valid document."""

import pytest
import torch
from tilegym_hf_bench.correctness_check import check_correctness
from tilegym_hf_bench.generation import Generator, make_input_ids
from tilegym_hf_bench.metrics import assemble, throughput_block
from tilegym_hf_bench.metrics_schema import validation_errors
from tilegym_hf_bench.model_factory import (
    fp32_reference,
    random_model,
    twin_sharing_weights,
    weight_fingerprint,
)
from tilegym_hf_bench.throughput import measure, warm_up
from tilegym_hf_bench.workloads import Workload

WL = Workload(
    "default", batch_size=2, input_length=10, output_length=5, warmup_runs=1, timed_runs=3
)


def test_random_weights_are_seeded_and_give_finite_spread_logits():
    a = random_model("tiny-llama", "cpu", seed=5).model
    b = random_model("tiny-llama", "cpu", seed=5).model
    c = random_model("tiny-llama", "cpu", seed=6).model
    assert torch.equal(weight_fingerprint(a), weight_fingerprint(b))
    assert not torch.equal(weight_fingerprint(a), weight_fingerprint(c))
    assert a.lm_head.weight is a.model.embed_tokens.weight
    ids = make_input_ids(512, 2, 16, seed=0, device="cpu")
    with torch.no_grad():
        logits = a(input_ids=ids).logits.float()
    assert torch.isfinite(logits).all()
    assert logits.std() > 0.05  # not degenerate
    assert (logits.argmax(-1) != logits.argmax(-1)[0, 0]).any()


def test_twin_shares_weights_but_not_its_config():
    base = random_model("tiny-qwen3", "cpu", seed=0).model
    twin = twin_sharing_weights(base)
    assert twin.config is not base.config
    for (name, p), (_, q) in zip(
        base.named_parameters(remove_duplicate=False),
        twin.named_parameters(remove_duplicate=False),
        strict=True,
    ):
        assert p is q, name
    twin.set_attn_implementation("eager")
    assert base.config._attn_implementation == "sdpa"
    ref = fp32_reference(base)
    assert ref.model.norm.weight.dtype == torch.float32
    assert torch.equal(
        ref.model.layers[0].mlp.up_proj.weight, base.model.layers[0].mlp.up_proj.weight.float()
    )


@pytest.mark.slow
def test_interleaved_sides_and_correctness_make_a_valid_document():
    base = random_model("tiny-qwen3", "cpu", seed=0).model
    twin = twin_sharing_weights(base)
    ids = make_input_ids(512, WL.batch_size, WL.input_length, WL.seed, "cpu")
    sides = {"baseline": Generator(base, ids, "cpu"), "cutile": Generator(twin, ids, "cpu")}
    logged = []
    runs = warm_up(sides, WL.output_length, WL.warmup_runs, logged.append)
    assert runs >= 2  # one requested, and at least two to see the timings settle
    prompts = [make_input_ids(512, WL.batch_size, WL.input_length, 7 + i, "cpu") for i in range(3)]
    samples = measure(
        sides, WL.batch_size, WL.output_length, WL.timed_runs, logged.append, prompts.__getitem__
    )
    assert [len(s.tokens_per_s) for s in samples.values()] == [3, 3]
    assert torch.equal(samples["baseline"].last_output, samples["cutile"].last_output)
    assert torch.equal(samples["cutile"].last_output[:, : WL.input_length], prompts[-1])
    assert sum(line.startswith("timed run") for line in logged) == 3

    result = check_correctness(sides["baseline"], sides["cutile"], WL)
    assert result["passed"]
    assert result["logits_rel_err"] == result["baseline_rel_err"] > 0
    assert 0.0 <= result["top1_agreement"] <= 1.0

    parts = {
        name: throughput_block(s.tokens_per_s, s.ttft_ms, s.decode_tokens_per_s, True)
        for name, s in samples.items()
    }
    doc = assemble(
        status="ok", error=None, model_key="tiny-qwen3", model_id=None, weights="random",
        commit="a" * 40, started_at="2026-01-01T00:00:00+00:00", wall_s=1.0,
        env={k: None for k in ("gpu_name", "gpu_uuid", "compute_capability", "driver", "cuda",
                               "torch", "transformers", "cuda_tile", "tileiras", "python")},
        workload=WL.as_metrics(), parts={**parts, "correctness": result, "coverage": None},
    )  # fmt: skip
    assert validation_errors(doc) == []
    assert doc["cutile"]["throughput"]["interleaved"] is True


def test_correctness_scores_the_generate_path_against_fp32():
    """The logits come from generate() itself; a twin whose generate() path is broken (its
    final norm scaled, as a wrong kernel would) fails, the same twin's plain forward aside."""
    base = random_model("tiny-qwen3", "cpu", seed=0).model
    twin = twin_sharing_weights(base)
    ids = make_input_ids(512, WL.batch_size, WL.input_length, WL.seed, "cpu")
    norm = twin.model.norm
    original = norm.forward
    norm.forward = lambda hidden: original(hidden) * 1.5
    result = check_correctness(Generator(base, ids, "cpu"), Generator(twin, ids, "cpu"), WL)
    assert not result["passed"] and result["logits_rel_err"] > result["tolerance"]
    seq, logits = Generator(base, ids, "cpu").generate_with_logits(WL.output_length)
    assert seq.shape == (WL.batch_size, WL.input_length + WL.output_length)
    assert logits.shape[:2] == (WL.batch_size, WL.output_length) and logits.dtype == torch.float32


def test_timed_prompts_are_drawn_per_run_and_the_first_token_run_has_its_own():
    """A worker cannot know a timed prompt before its request: the seeds come from the OS for
    each run, and the full run's prompt is not the one its first-token run just saw."""
    from tilegym_hf_bench.runner import timed_prompt_seeds

    first, second = timed_prompt_seeds(4), timed_prompt_seeds(4)
    flat = [s for pair in first for s in pair]
    assert len(set(flat)) == 8
    assert first != second


def test_a_crashed_run_carries_no_measurement():
    block = throughput_block([10.0, 11.0], [5.0, 5.0], [12.0, 13.0], False)
    doc = assemble(
        status="crash", error="CUDA error: out of memory", model_key="qwen3", model_id=None,
        weights="random", commit="b" * 40, started_at="2026-01-01T00:00:00Z", wall_s=3.0,
        env={k: None for k in ("gpu_name", "gpu_uuid", "compute_capability", "driver", "cuda",
                               "torch", "transformers", "cuda_tile", "tileiras", "python")},
        workload=WL.as_metrics(), parts={"baseline": block},
    )  # fmt: skip
    assert validation_errors(doc) == []
    assert doc["baseline"] is None and doc["error"] == "CUDA error: out of memory"


def test_without_a_cutile_side_nothing_is_judged_and_no_pass_is_printed(capsys):
    """A run whose cuTile side did not run (``--skip-cutile``) checks the PyTorch side only, and
    its log never prints a PASS for code that did not run."""
    base = random_model("tiny-qwen3", "cpu", seed=0).model
    ids = make_input_ids(512, WL.batch_size, WL.input_length, WL.seed, "cpu")
    result = check_correctness(Generator(base, ids, "cpu"), None, WL)
    out = capsys.readouterr().out
    assert "correctness: PyTorch side only (no cuTile code ran): nothing was judged" in out
    assert "correctness: PASS" not in out
    assert result["logits_rel_err"] is None and result["timed_agreement"] is None
