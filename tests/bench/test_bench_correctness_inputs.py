"""Correctness prompts are a function of the run's seed and the case alone: the same run gives
the same cases whatever ran before (tiny-qwen3_moe passed or failed by the prompt it drew)."""

import json
import secrets

import pytest
import torch
from tilegym_hf_bench.correctness_check import CorrectnessCheck
from tilegym_hf_bench.generation import make_input_ids
from tilegym_hf_bench.workloads import Workload

from tests.bench.test_bench_cli import COMMIT, FAST, bench

VOCAB = 512
WL = Workload("t", batch_size=1, input_length=24, output_length=6, seed=0)


def inputs(wl):
    return CorrectnessCheck(wl, VOCAB, log=lambda _: None).inputs


def same(a, b) -> bool:
    return all(
        torch.equal(ia, ib) and (ma is None if mb is None else torch.equal(ma, mb))
        for (ia, ma), (ib, mb) in zip(a, b, strict=True)
    )


def test_the_same_seed_gives_the_same_cases_whatever_was_drawn_between():
    first = inputs(WL)
    torch.rand(1000)  # the global generator and the OS, used a varying number of times
    secrets.randbits(31)
    torch.manual_seed(1234)
    assert same(first, inputs(WL))


def test_another_seed_gives_other_cases_and_no_case_reuses_the_warm_up_prompt():
    first, other = inputs(WL), inputs(Workload("t", 1, 24, 6, seed=1))
    assert not any(torch.equal(a[0], b[0]) for a, b in zip(first, other, strict=True))
    warm_up = make_input_ids(VOCAB, 1, 24, WL.seed, "cpu")
    assert not torch.equal(first[0][0], warm_up)
    assert not torch.equal(first[0][0], first[2][0][:, :24])  # the cases differ from each other


@pytest.mark.slow
def test_two_bench_runs_score_the_same_errors(tmp_path):
    """Two whole runs (the model worker, the timed runs and their OS-drawn prompts included)
    give the same per-case errors: nothing a run does before the check moves its cases."""
    docs = []
    for i in range(2):
        out = tmp_path / f"m{i}.json"
        r = bench(
            "--model-key", "tiny-qwen3_moe", "--device", "cpu", "--metrics-out", str(out),
            "--commit", COMMIT, *FAST,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        docs.append(json.loads(out.read_text())["correctness"]["cases"])
    assert docs[0] == docs[1]
    assert all(case["logits_rel_err"] is not None for case in docs[0])
