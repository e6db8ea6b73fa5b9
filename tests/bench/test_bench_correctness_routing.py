"""The routing-aware referee on real tiny MoE models on the CPU: the routers' forms, a bf16
routing flip that used to leave fp32 unable to referee, a group flip where no expert is
near-tied, a wrong expert that still fails, and a dense model scored exactly as before."""

import pytest
import torch
from tilegym_bot.policy import recheck_correctness
from tilegym_hf_bench.correctness_check import case_inputs, check_correctness, generate_case
from tilegym_hf_bench.generation import Generator, make_input_ids
from tilegym_hf_bench.metrics import assemble
from tilegym_hf_bench.metrics_schema import validation_errors
from tilegym_hf_bench.model_factory import fp32_reference, random_model, twin_sharing_weights
from tilegym_hf_bench.routing import (
    Referee,
    forcing,
    recording,
    routers,
    routing_line,
    tie_sites,
)
from tilegym_hf_bench.routing_rule import (
    group_gap,
    same_selection,
    selection_gap,
    swapped_groups,
    swapped_selection,
)
from tilegym_hf_bench.scoring import cases, input_mask, reference_logits, token_errors
from tilegym_hf_bench.tolerance import MAX_BASELINE_REL_ERR
from tilegym_hf_bench.workloads import Workload

#: gpt-oss's router, 2 of its 8 experts a token: with seed 0 bf16 flips a near-tie of the
#: padded case (its bf16 error 0.84 from fp32, measured on this CPU)
FLIPPING = ("tiny-gpt_oss", {"num_experts_per_tok": 2})
WL = Workload("t", batch_size=2, input_length=32, output_length=8, seed=0)

MOE = [
    ("tiny-mixtral", {}),
    FLIPPING,
    ("tiny-qwen3_moe", {}),
    ("tiny-olmoe", {}),
    ("tiny-qwen3_next", {"num_experts_per_tok": 2}),
    ("tiny-deepseek_v2", {}),
    ("tiny-deepseek_v2", {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2}),
    ("tiny-deepseek_v3", {}),
]
#: the routers that keep only their best groups of experts (tiny-deepseek_v3: 2 of 4)
GROUPED = MOE[-2:]


def sides(key, overrides, wrong_scale=None):
    base = random_model(key, "cpu", WL.seed, overrides).model
    if wrong_scale is None:
        cutile = twin_sharing_weights(base)
    else:  # a wrong MoE kernel: expert 0's output scaled in every layer
        cutile = random_model(key, "cpu", WL.seed, overrides).model
        with torch.no_grad():
            for layer in cutile.model.layers:
                layer.mlp.experts.down_proj[0].mul_(wrong_scale)
    ids = make_input_ids(512, WL.batch_size, WL.input_length, WL.seed, "cpu")
    return Generator(base, ids, "cpu"), Generator(cutile, ids, "cpu")


@pytest.mark.parametrize(("key", "overrides"), MOE)
def test_each_router_form_reproduces_its_router_and_forces_the_other_side(key, overrides):
    """Recording checks each form against the router's own selection and weights; forcing a
    token gives it the other side of its tie there and leaves the other tokens alone."""
    ref = fp32_reference(random_model(key, "cpu", 0, overrides).model)
    ids = make_input_ids(512, 2, 12, 3, "cpu")
    with torch.inference_mode():
        with recording(ref, check=True) as plain:
            ref(input_ids=ids)
        assert len(plain.chosen) == len(routers(ref)) >= 1
        swap = torch.zeros(ids.numel(), dtype=torch.bool)
        swap[5] = True
        with forcing(ref, {0: swap}), recording(ref) as forced:
            ref(input_ids=ids)
    expected = swapped_selection(plain.ranking[0][5:6], plain.chosen[0][5:6])
    assert torch.equal(forced.chosen[0][5:6], expected)
    assert not torch.equal(expected, plain.chosen[0][5:6])
    assert torch.equal(forced.chosen[0][:5], plain.chosen[0][:5])


@pytest.mark.parametrize(("key", "overrides"), GROUPED)
def test_a_group_site_trades_the_weakest_kept_group_and_chooses_the_experts_anew(key, overrides):
    """The group site of a group-limiting router comes after every layer's expert site; forcing
    it at a token keeps the other groups there, the experts chosen as the router would choose
    within them, and leaves the other tokens alone."""
    ref = fp32_reference(random_model(key, "cpu", 0, overrides).model)
    layers = len(routers(ref))
    assert [s.label() for s in tie_sites(ref)] == [str(i) for i in range(layers)] + [
        f"g{i}" for i in range(layers)
    ]
    ids = make_input_ids(512, 2, 12, 3, "cpu")
    swap = torch.zeros(ids.numel(), dtype=torch.bool)
    swap[5] = True
    with torch.inference_mode():
        with recording(ref, check=True) as plain:
            ref(input_ids=ids)
        with forcing(ref, {layers: swap}), recording(ref) as forced:
            ref(input_ids=ids)
    router, _ = routers(ref)[0]
    kept = swapped_groups(plain.groups[0][5:6], router.topk_group)
    open_experts = kept.repeat_interleave(router.num_experts // router.num_group, dim=1)
    within = plain.raw[0][5:6].masked_fill(~open_experts, float("-inf"))
    expected = torch.topk(within, plain.chosen[0].shape[1], dim=-1).indices
    assert bool(same_selection(forced.chosen[0][5:6], expected).all())
    assert not bool(same_selection(expected, plain.chosen[0][5:6]).all())
    assert torch.equal(forced.chosen[0][:5], plain.chosen[0][:5])


def test_a_group_flip_where_no_expert_is_near_tied_is_refereed_by_its_group_site():
    """tiny-deepseek_v3: a side that kept another group at one generated token, where the
    experts are not near-tied, is that token's fp32 forward with the group tie swapped: the
    referee with group sites scores it at 0; with expert sites only (the referee before them)
    it keeps its plain error. Deterministic: the side is fp32 itself, no bf16 rounding."""
    base = random_model("tiny-deepseek_v3", "cpu", 0).model
    prompt, new = 24, 8
    seq = make_input_ids(512, 1, prompt + new, 5, "cpu")
    referee = Referee(fp32_reference(base), base)
    plain, routed = referee.plain(seq, prompt)
    router, _ = routers(referee.ref_model)[0]
    group_gaps = group_gap(routed.groups[0], router.topk_group)
    expert_gaps = selection_gap(routed.ranking[0], routed.chosen[0])
    site = [s.groups for s in referee.sites].index(True)
    scale = referee.sites[site].scale
    # a generated token whose group gap is the smallest, and a margin that ties its groups only
    pos = min(range(prompt - 1, prompt + new - 1), key=lambda t: float(group_gaps[t]))
    margin = 1.01 * float(group_gaps[pos]) / scale
    assert float(expert_gaps[pos]) >= margin
    at = torch.zeros(seq.shape[1] - 1, dtype=torch.bool)
    at[pos] = True
    with torch.no_grad(), forcing(referee.ref_model, {site: at}):
        side = reference_logits(referee.ref_model, seq, prompt)
    j = pos - (prompt - 1)
    real = input_mask(seq, prompt).flatten().bool()
    assert [bool(t[pos]) for t in referee.ties(routed, [margin], real)] == [False, True]
    with torch.no_grad():
        run = referee.refereed(seq, prompt, None, plain, routed, [margin], [side])
    errors = run.sides[0]
    assert float(errors.plain[0, j]) > 0.01 and float(errors.best[0, j]) == 0.0
    referee.sites = [s for s in referee.sites if not s.groups]
    with torch.no_grad():
        before = referee.refereed(seq, prompt, None, plain, routed, [margin], [side]).sides[0]
    assert float(before.best[0, j]) == float(before.plain[0, j]) > 0.01


def test_a_bf16_routing_flip_no_longer_leaves_fp32_unable_to_referee():
    """The padded case's bf16 baseline was 0.84 from fp32 (a near-tie flipped): scored against
    fp32 with that near-tie swapped as well, it is within rounding, and the run passes."""
    result = check_correctness(*sides(*FLIPPING), WL)
    assert result["passed"]
    padded = next(c for c in result["cases"] if c["name"] == "padded")
    routing = padded["routing"]
    assert routing["plain_rel_err"]["baseline"] > MAX_BASELINE_REL_ERR
    assert padded["baseline_rel_err"] < 0.02
    assert routing["alternate_tokens"]["baseline"] > 0
    assert routing["margin"] == [2 * n for n in routing["noise"]] and min(routing["noise"]) > 0
    for side, worst in (
        ("baseline", padded["baseline_rel_err"]),
        ("cutile", padded["logits_rel_err"]),
    ):
        q = routing["refereed_quantiles"][side]
        assert 0 < q["p50"] <= q["p90"] <= worst
    assert all(c["baseline_rel_err"] < MAX_BASELINE_REL_ERR for c in result["cases"])
    assert recheck_correctness(result) == (True, None)
    doc = assemble(
        status="ok", error=None, model_key="tiny-gpt_oss", model_id=None, weights="random",
        commit="a" * 40, started_at="2026-01-01T00:00:00+00:00", wall_s=1.0,
        env={k: None for k in ("gpu_name", "gpu_uuid", "compute_capability", "driver", "cuda",
                               "torch", "transformers", "cuda_tile", "tileiras", "python")},
        workload=WL.as_metrics(), parts={"correctness": result},
    )  # fmt: skip
    assert validation_errors(doc) == []


def test_a_wrong_expert_still_fails_where_the_flip_used_to_hide_it():
    """Expert 0's output 10% too large: the padded case fails on its error now (before, fp32
    could not referee it at all), and the bot's recount agrees."""
    result = check_correctness(*sides(*FLIPPING, wrong_scale=1.1), WL)
    assert not result["passed"]
    padded = next(c for c in result["cases"] if c["name"] == "padded")
    assert padded["routing"]["plain_rel_err"]["baseline"] > MAX_BASELINE_REL_ERR
    assert padded["tolerance"] is not None and padded["logits_rel_err"] > padded["tolerance"]
    passed, why = recheck_correctness(result)
    assert passed is False and "tolerance" in why


def test_a_dense_model_is_scored_exactly_as_against_plain_fp32():
    """No router, no hook, no extra forward: every case's errors are today's."""
    base, cutile = sides("tiny-qwen3", None)
    result = check_correctness(base, cutile, WL)
    ref = fp32_reference(base.model)
    for case, got in zip(cases(2, 32, 8), result["cases"], strict=True):
        ids, mask = case_inputs(case, 512, WL.seed)
        seq, logits, _ = generate_case(base, case, ids, mask)
        expected = token_errors(logits, reference_logits(ref, seq, case.input_length, mask))
        assert got["baseline_rel_err"] == float(expected.max())
        assert got["routing"] is None
    assert routers(ref) == []


def test_the_log_line_gives_the_refereed_quantiles_where_the_block_has_them():
    block = {
        "moe_layers": 2,
        "noise": [0.01, 0.02],
        "margin": [0.02, 0.04],
        "near_ties": {"baseline": 3, "cutile": 4},
        "unplanned": {"baseline": 0, "cutile": 0},
        "extra_forwards": 5,
        "alternate_tokens": {"baseline": 1, "cutile": 2},
        "plain_rel_err": {"baseline": 0.5, "cutile": 0.6},
        "refereed_quantiles": {
            "baseline": {"p50": 0.01, "p90": 0.02},
            "cutile": {"p50": 0.011, "p90": 0.03},
        },
    }
    line = routing_line(block)
    assert line.endswith("refereed token rel err p50/p90 1.000e-02/2.000e-02 / 1.100e-02/3.000e-02")
    del block["refereed_quantiles"]  # a file from before the field: the line without it
    assert routing_line(block).endswith("plain fp32 max token rel err 5.000e-01 / 6.000e-01")
