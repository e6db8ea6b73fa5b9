"""The routing referee on MoE models a CPU runs: the published routers (DeepSeek-V3's groups,
gpt-oss's biased top-4 of 32, Qwen3-Next's top-10 of many) at width 1024 and 4 layers, the bf16
PyTorch side scored as the benchmark scores it (``check_correctness``: the workload, padded and
long cases, 1 x 192 -> 24).

    python benchmarks/e2e/referee_cpu.py --model deepseek_v3 --seeds 0 6
    python benchmarks/e2e/referee_cpu.py --model qwen3_next --seeds 0 3 --patched
    python benchmarks/e2e/referee_cpu.py --model qwen3_next --seeds 0 3 --follow

Per seed and case: the refereed bf16 error / the plain one against fp32, near-ties, extra fp32
forwards, the refereed p50, and the side's routing report's choices unlike fp32's, accepted /
refused. A case above 0.2 cannot be refereed (``tolerance.MAX_BASELINE_REL_ERR``). DeepSeek-V3
is scored twice, the second time with the referee's group sites left out (expert near-ties
only, the referee before them). ``--no-report`` scores without the sides' routing reports
(the referee before them). ``--patched`` judges the model with the cuTile patch applied (its
ops run their PyTorch implementations on a CPU: other roundings, so other flips, than the
PyTorch side's) and adds its refereed / plain error, its tolerance and verdict, and its report's
counts. ``--follow`` instead scores the workload case's generated bf16
logits against plain fp32 and against fp32 routed, layer by layer and token by token, as the
bf16 model routes that sequence teacher-forced in one forward (unchecked: it tells whether
routing flips explain the error), and the bf16 teacher-forced logits against the same.
"""

from __future__ import annotations

import argparse
import copy
import sys
from contextlib import nullcontext
from unittest import mock

import torch
from tilegym_hf_bench import correctness_check, routing
from tilegym_hf_bench.correctness_check import case_inputs, check_correctness, generate_case
from tilegym_hf_bench.generation import Generator, make_input_ids
from tilegym_hf_bench.model_factory import fp32_reference, random_model, twin_sharing_weights
from tilegym_hf_bench.scoring import cases, reference_logits, token_errors
from tilegym_hf_bench.tilegym_patch import apply_patch
from tilegym_hf_bench.workloads import Workload

WIDTH = dict(hidden_size=1024, num_hidden_layers=4, vocab_size=4096)
MODELS = {
    "deepseek_v3": (
        "tiny-deepseek_v3",
        WIDTH
        | dict(
            intermediate_size=2048,
            moe_intermediate_size=256,
            n_routed_experts=32,
            n_group=8,
            topk_group=4,
            num_experts_per_tok=8,
            first_k_dense_replace=1,
            num_attention_heads=8,
            num_key_value_heads=8,
            q_lora_rank=256,
            kv_lora_rank=128,
            qk_rope_head_dim=32,
            qk_nope_head_dim=64,
            v_head_dim=64,
        ),
    ),
    "gpt_oss": (
        "tiny-gpt_oss",
        WIDTH
        | dict(
            intermediate_size=1024,
            num_local_experts=32,
            num_experts_per_tok=4,
            experts_per_token=4,
            layer_types=["sliding_attention", "full_attention"] * 2,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=64,
            sliding_window=128,
        ),
    ),
    "qwen3_next": (
        "tiny-qwen3_next",
        WIDTH
        | dict(
            intermediate_size=2048,
            num_experts=128,
            num_experts_per_tok=10,
            moe_intermediate_size=128,
            shared_expert_intermediate_size=128,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=128,
            linear_key_head_dim=64,
            linear_value_head_dim=64,
            linear_num_key_heads=8,
            linear_num_value_heads=16,
        ),
    ),
}
PROMPT, NEW = 192, 24
TIE_SITES = routing.tie_sites


def experts_only(model):
    """``routing.tie_sites`` without the group sites: the referee before them."""
    return [site for site in TIE_SITES(model) if not site.groups]


def _model(name: str, seed: int):
    preset, config = MODELS[name]
    model = random_model(preset, "cpu", seed, config).model
    return model, make_input_ids(WIDTH["vocab_size"], 1, PROMPT, seed, "cpu")


def _judged(name: str, seed: int, base, patched: bool):
    """The judged side: the bf16 model itself (its twin), or a copy patched with the cuTile
    patch, whose ops run their PyTorch implementations on a CPU (other roundings, other
    flips)."""
    if not patched:
        return twin_sharing_weights(base)
    judged = copy.deepcopy(base)
    apply_patch(judged, name)  # MODELS' keys are model types
    return judged


def _unreported(model, generate, *shape):
    """``generate_reporting`` for a side that sends no report."""
    return (*generate(), None)


def scored(
    name: str, seed: int, groups: bool = True, reports: bool = True, patched: bool = False
) -> str:
    base, ids = _model(name, seed)
    wl = Workload("referee-cpu", batch_size=1, input_length=PROMPT, output_length=NEW, seed=seed)
    sites = nullcontext() if groups else mock.patch.object(routing, "tie_sites", experts_only)
    unreported = (
        nullcontext() if reports else mock.patch.object(correctness_check, "reporting", _unreported)
    )
    with sites, unreported:
        result = check_correctness(
            Generator(base, ids, "cpu"),
            Generator(_judged(name, seed, base, patched), ids, "cpu"),
            wl,
        )
    return " | ".join(
        f"{c['name']} {c['baseline_rel_err']:.3f} / {c['routing']['plain_rel_err']['baseline']:.3f}"
        f", {c['routing']['near_ties']['baseline']} ties, {c['routing']['extra_forwards']} fwd"
        f", p50 {c['routing']['refereed_quantiles']['baseline']['p50']:.3f}"
        f", report {_report(c['routing']['reported']['baseline'])}"
        + (_patched_side(c) if patched else "")
        for c in result["cases"]
    )


def _patched_side(case: dict) -> str:
    verdict = "pass" if case["passed"] else "FAIL"
    return (
        f"; patched {case['logits_rel_err']:.3f} / "
        f"{case['routing']['plain_rel_err']['cutile']:.3f} (tolerance {case['tolerance']:.3f}, "
        f"{verdict}), report {_report(case['routing']['reported']['cutile'])}"
    )


def _report(counts: dict | None) -> str:
    return "none" if counts is None else f"{counts['accepted']}/{counts['refused']}"


def _errors(errors: torch.Tensor) -> str:
    return f"max {float(errors.max()):.3f}, p50 {float(errors.median()):.3f}"


@torch.no_grad()
def followed(name: str, seed: int) -> str:
    base, _ = _model(name, seed)
    case = cases(1, PROMPT, NEW)[0]
    inputs = case_inputs(case, WIDTH["vocab_size"], seed)
    seq, logits, _ = generate_case(Generator(base, inputs[0], "cpu"), case, *inputs)
    ref = fp32_reference(base)
    plain = reference_logits(ref, seq, PROMPT)
    with routing.recording(base) as low:
        teacher = reference_logits(base, seq, PROMPT)
    with routing.following(ref, low.chosen):
        routed_alike = reference_logits(ref, seq, PROMPT)
    return (
        f"generated vs plain fp32: {_errors(token_errors(logits, plain))} | generated vs fp32 "
        f"routed as bf16: {_errors(token_errors(logits, routed_alike))} | bf16 teacher-forced "
        f"vs fp32 routed alike: {_errors(token_errors(teacher, routed_alike))}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="deepseek_v3")
    parser.add_argument("--seeds", type=int, nargs=2, default=(0, 6), metavar=("FIRST", "END"))
    parser.add_argument("--follow", action="store_true", help="errors with routing shared")
    parser.add_argument("--no-report", action="store_true", help="without routing reports")
    parser.add_argument(
        "--patched", action="store_true", help="judge the cuTile-patched model (CPU ops)"
    )
    args = parser.parse_args(argv)
    first, end = args.seeds
    if not 0 <= first < end:
        parser.error(f"--seeds {first} {end}: need 0 <= FIRST < END")
    if args.follow:
        print("| seed | workload case: bf16 errors |\n|---|---|")
        for seed in range(first, end):
            print(f"| {seed} | {followed(args.model, seed)} |", flush=True)
        return 0
    print(
        "| seed | referee | cases: refereed / plain bf16 error, near-ties, fp32 forwards, "
        "refereed p50, report accepted/refused |"
    )
    print("|---|---|---|")
    for seed in range(first, end):
        for groups in (False, True) if args.model == "deepseek_v3" else (True,):
            sites = "as it is" if groups else "without group sites"
            result = scored(args.model, seed, groups, not args.no_report, args.patched)
            print(f"| {seed} | {sites} | {result} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
