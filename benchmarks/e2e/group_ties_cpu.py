"""The routing referee's group near-ties, measured on the CPU: a DeepSeek-V3-routed model at a
size a CPU runs (the published router: sigmoid scores plus correction bias, 8 groups of 4
experts keeping 4 groups scored by their two best, top-8, renormalized; 4 layers of width
1024, the first dense), its bf16 PyTorch side scored as the benchmark scores it
(``check_correctness``: the workload, padded and long cases) with the referee as it is and with
its group sites left out (expert near-ties only, the referee before them).

    python benchmarks/e2e/group_ties_cpu.py --seeds 0 6

Per seed and case: the refereed bf16 error / the plain one against fp32, near-ties, extra fp32
forwards. A case above 0.2 cannot be refereed (``tolerance.MAX_BASELINE_REL_ERR``).
"""

from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from unittest import mock

from tilegym_hf_bench import routing
from tilegym_hf_bench.correctness_check import check_correctness
from tilegym_hf_bench.generation import Generator, make_input_ids
from tilegym_hf_bench.model_factory import random_model, twin_sharing_weights
from tilegym_hf_bench.workloads import Workload

CONFIG = dict(
    hidden_size=1024,
    intermediate_size=2048,
    moe_intermediate_size=256,
    n_routed_experts=32,
    n_group=8,
    topk_group=4,
    num_experts_per_tok=8,
    num_hidden_layers=4,
    first_k_dense_replace=1,
    num_attention_heads=8,
    num_key_value_heads=8,
    q_lora_rank=256,
    kv_lora_rank=128,
    qk_rope_head_dim=32,
    qk_nope_head_dim=64,
    v_head_dim=64,
    vocab_size=4096,
)
PROMPT, NEW = 192, 24


def experts_only(model):
    """``routing.tie_sites`` without the group sites: the referee before them."""
    return [site for site in TIE_SITES(model) if not site.groups]


TIE_SITES = routing.tie_sites


def scored(seed: int, groups: bool) -> str:
    wl = Workload("group-ties", batch_size=1, input_length=PROMPT, output_length=NEW, seed=seed)
    base = random_model("tiny-deepseek_v3", "cpu", seed, CONFIG).model
    ids = make_input_ids(CONFIG["vocab_size"], 1, PROMPT, seed, "cpu")
    sites = nullcontext() if groups else mock.patch.object(routing, "tie_sites", experts_only)
    with sites:
        result = check_correctness(
            Generator(base, ids, "cpu"), Generator(twin_sharing_weights(base), ids, "cpu"), wl
        )
    return " | ".join(
        f"{c['name']} {c['baseline_rel_err']:.3f} / {c['routing']['plain_rel_err']['baseline']:.3f}"
        f", {c['routing']['near_ties']['baseline']} ties, {c['routing']['extra_forwards']} fwd"
        for c in result["cases"]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs=2, default=(0, 6), metavar=("FIRST", "END"))
    args = parser.parse_args(argv)
    first, end = args.seeds
    if not 0 <= first < end:
        parser.error(f"--seeds {first} {end}: need 0 <= FIRST < END")
    print("| seed | referee | cases: refereed / plain bf16 error, near-ties, fp32 forwards |")
    print("|---|---|---|")
    for seed in range(first, end):
        for groups in (False, True):
            name = "experts and groups" if groups else "experts only"
            print(f"| {seed} | {name} | {scored(seed, groups)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
