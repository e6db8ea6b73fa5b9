"""Per-token account of the routing-aware referee on an MoE preset's ``workload`` correctness
case: which generated tokens carry a side's maximum error, and which alternate routings could
explain them.

The benchmark reports one number per case, the largest refereed token error. On a random-weight
MoE whose router is near-tied on many tokens (mixtral: 3945 near-ties on 2176 tokens x 4
layers), that maximum alone cannot tell a kernel that computes something else from a side that
landed on an unplanned combination of flips. This runs the case's prompt (the benchmark's seed,
``correctness_check.case_inputs``) through four sides in one process, PyTorch and the cuTile
patch each in static mode (the compiled decode step the benchmark times) and eager
(``--static-only``: not), scores each as the benchmark does (``routing.Referee``, margins from
the PyTorch static side), and prints:

- per side: the refereed error's quantiles over the generated tokens (the side's routing
  report included, as the benchmark scores it: ``routing_report``), how many tokens exceed the
  tolerance the benchmark would set (1.5 x the PyTorch static side's max + 1e-3), the worst
  tokens with their plain and refereed errors; the error against fp32 routed as the side
  reports (the choices accepted and refused; recorded by the scored generate() itself, the
  compiled step's own routing on a static side) and the first generated token past the
  tolerance there; and the error against fp32 routed, layer by layer and token by
  token, as the bf16 PyTorch model routes that sequence teacher-forced in one forward
  (unchecked: it tells whether routing flips explain a side's error at all);
- for each side's ``--worst`` tokens: the smallest error against fp32 with every subset of that
  position's near-tied sites swapped (a site: a layer's experts, ``3``, or the groups a
  DeepSeek router keeps, ``g3``; the benchmark tries all of them at once, and at a side's
  worst tokens each alone), and with the best subset plus one site's near-ties over the whole
  prefix.

A right kernel's static and eager sides look like PyTorch's (a few tokens above the bar, each
explained by some subset); a wrong one is above it on most tokens and no swap explains them.

    python benchmarks/e2e/moe_referee_tokens.py --model-key mixtral
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import dataclass, replace

import torch
from _sides import CUTILE, PYTORCH, static_sides
from tilegym_hf_bench.correctness_check import case_inputs, generate_case
from tilegym_hf_bench.model_factory import fp32_reference
from tilegym_hf_bench.presets import PRESETS
from tilegym_hf_bench.routing import Referee, following, forcing, recording, reported, routers
from tilegym_hf_bench.scoring import cases, input_mask, reference_logits, token_errors
from tilegym_hf_bench.tolerance import REL_ERR_FACTOR, REL_ERR_FLOOR
from tilegym_hf_bench.workloads import DEFAULT_SEED, WORKLOADS

QUANTILES = (0.5, 0.9, 0.99)


@dataclass
class Side:
    name: str
    seq: torch.Tensor
    logits: torch.Tensor
    report: list | None = None
    best: torch.Tensor | None = None
    plain: torch.Tensor | None = None


def quantile_text(errors: torch.Tensor) -> str:
    q = torch.quantile(errors.float(), torch.tensor(QUANTILES, device=errors.device))
    return " ".join(f"p{int(100 * p)} {v:.3f}" for p, v in zip(QUANTILES, q.tolist(), strict=True))


def subset_errors(referee, side, prompt_len, ties, j, prefix_sites):
    """(position j's near-tied sites, the best error over their subsets, that subset, the best
    error with that subset plus one site's prefix near-ties, that site): errors of token j
    only. Sites are indices into ``referee.sites`` (a layer's experts, or its groups)."""
    pos = prompt_len - 1 + j
    seq_len = side.seq.shape[1] - 1
    at = torch.zeros(seq_len, dtype=torch.bool, device=side.seq.device)
    at[pos] = True
    sites = [i for i, t in enumerate(ties) if bool(t[pos])]

    def err(plan):
        with forcing(referee.ref_model, plan):
            alt = reference_logits(referee.ref_model, side.seq, prompt_len)
        return float(token_errors(side.logits[:, j : j + 1], alt[:, j : j + 1])[0, 0])

    best, best_subset = float("inf"), ()
    for r in range(1, len(sites) + 1):
        for subset in itertools.combinations(sites, r):
            e = err({i: at for i in subset})
            if e < best:
                best, best_subset = e, subset
    best_prefix, prefix_site = float("inf"), None
    before = torch.arange(seq_len, device=at.device) < pos
    for site in prefix_sites:
        plan = {i: at for i in best_subset}
        plan[site] = plan.get(site, torch.zeros_like(at)) | (ties[site] & before)
        e = err(plan)
        if e < best_prefix:
            best_prefix, prefix_site = e, site
    return sites, best, best_subset, best_prefix, prefix_site


def following_bf16(referee, seq, prompt_len: int) -> torch.Tensor:
    """fp32 logits of ``seq`` with every MoE layer routed as the bf16 PyTorch model routes the
    same sequence teacher-forced: if a side's error against this is small where the referee's
    is large, routing flips the plans do not cover explain it; if not, something else does."""
    with recording(referee.baseline_model) as low:
        reference_logits(referee.baseline_model, seq, prompt_len)
    with following(referee.ref_model, low.chosen):
        return reference_logits(referee.ref_model, seq, prompt_len)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-key", default="mixtral")
    parser.add_argument("--workload", default="default")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="weights' and case's")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--worst", type=int, default=3, help="tokens a side explains")
    parser.add_argument("--show", type=int, default=8, help="worst tokens listed a side")
    parser.add_argument("--static-only", action="store_true", help="leave out the eager sides")
    args = parser.parse_args(argv)
    if args.model_key not in PRESETS:
        parser.error(f"--model-key {args.model_key!r} is not a preset ({', '.join(PRESETS)})")
    if args.workload not in WORKLOADS:
        parser.error(f"--workload {args.workload!r} is not one of {', '.join(WORKLOADS)}")
    if args.worst < 0 or args.show < 0:
        parser.error("--worst and --show must be at least 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: needs a CUDA GPU (or --device cpu with a tiny preset)", file=sys.stderr)
        return 2

    seed = args.seed
    wl, gens, _report = static_sides(
        args.model_key, args.workload, seed, args.device, cpu_sized=args.device == "cpu"
    )
    base_model = gens[PYTORCH].model
    if not routers(base_model):
        print(f"error: {args.model_key} has no MoE router the referee knows", file=sys.stderr)
        return 2
    case = cases(wl.batch_size, wl.input_length, wl.output_length)[0]
    ids, mask = case_inputs(case, base_model.config.get_text_config().vocab_size, seed)
    if mask is not None:
        print(
            "error: the workload case is padded; this tool scores unpadded cases only",
            file=sys.stderr,
        )
        return 2
    prompt_len = case.input_length
    eager_case = replace(case, timed_path=False)
    sides = []
    runs = [(PYTORCH, gens[PYTORCH], case), (CUTILE, gens[CUTILE], case)]
    if not args.static_only:  # generate_case makes its own eager Generator
        runs += [
            ("PyTorch eager", gens[PYTORCH], eager_case),
            ("cuTile eager", gens[CUTILE], eager_case),
        ]
    for name, gen, c in runs:
        seq, logits, report = generate_case(gen, c, ids, mask)
        seq = seq.to(args.device)
        sides.append(Side(name, seq, logits.to(args.device), report))
        print(f"# generated: {name}", flush=True)

    referee = Referee(fp32_reference(base_model), base_model)
    base = sides[0]
    ref0, routed0 = referee.plain(base.seq, prompt_len)
    margins = referee.margins(base.seq, prompt_len, None, routed0)
    print(
        f"# {args.model_key}, workload case {case.batch} x {prompt_len} -> {case.new_tokens} "
        f"(seed {seed}); near-tie margins " + " ".join(f"{m:.3g}" for m in margins.margin)
    )
    tolerance = None
    for side in sides:
        reference, routed = (
            (ref0, routed0)
            if torch.equal(side.seq, base.seq)
            else (referee.plain(side.seq, prompt_len))
        )
        run = referee.refereed(
            side.seq, prompt_len, None, reference, routed, margins.margin, [side.logits],
            [side.report],
        )  # fmt: skip
        side.best, side.plain = run.sides[0].best[0], run.sides[0].plain[0]
        if tolerance is None:
            tolerance = REL_ERR_FACTOR * float(side.best.max()) + REL_ERR_FLOOR
        real = input_mask(side.seq, prompt_len).flatten().bool()
        ties = referee.ties(routed, margins.margin, real)
        labels = [site.label() for site in referee.sites]
        over = int((side.best > tolerance).sum())
        agree = (
            "same tokens as PyTorch static"
            if torch.equal(side.seq, base.seq)
            else (
                f"{int((side.seq[0, prompt_len:] == base.seq[0, prompt_len:]).sum())} of "
                f"{case.new_tokens} tokens as PyTorch static"
            )
        )
        print(
            f"\n## {side.name}: max {float(side.best.max()):.3f} "
            f"(plain {float(side.plain.max()):.3f}),"
            f" {quantile_text(side.best)}; {over} of {case.new_tokens} tokens over {tolerance:.3f};"
            f" {run.forwards} fp32 forwards, {run.near_ties} near-ties, {run.unplanned} unplanned;"
            f" {agree}"
        )
        counts = [0, 0]
        with reported(referee.ref_model, side.report, margins.margin, real, counts):
            as_reported = reference_logits(referee.ref_model, side.seq, prompt_len)
        as_reported = token_errors(side.logits, as_reported)[0]
        past = (as_reported > tolerance).nonzero().flatten().tolist()
        print(
            f"against fp32 routed as this side reports ({counts[0]} choices accepted, "
            f"{counts[1]} refused): max {float(as_reported.max()):.3f}, "
            f"{quantile_text(as_reported)}; first token past {tolerance:.3f}: "
            f"{past[0] if past else 'none'}"
        )
        followed = token_errors(side.logits, following_bf16(referee, side.seq, prompt_len))[0]
        print(
            f"against fp32 routed as the bf16 PyTorch model routes this sequence (one forward, "
            f"teacher-forced): max {float(followed.max()):.3f}, {quantile_text(followed)}"
        )
        order = torch.argsort(side.best, descending=True).tolist()
        print(
            "| token | refereed | plain | routed as reported | routed as bf16 PyTorch "
            "| near-tied sites here |"
        )
        print("|---|---|---|---|---|---|")
        for j in order[: args.show]:
            here = [labels[i] for i, t in enumerate(ties) if bool(t[prompt_len - 1 + j])]
            print(
                f"| {j} | {float(side.best[j]):.3f} | {float(side.plain[j]):.3f} "
                f"| {float(as_reported[j]):.3f} | {float(followed[j]):.3f} "
                f"| {' '.join(here) or '-'} |"
            )
        for j in order[: args.worst]:
            sites, best, subset, best_prefix, site = subset_errors(
                referee, side, prompt_len, ties, j, range(len(ties))
            )
            names = " ".join(labels[i] for i in subset)
            own = f"best subset [{names}] -> {best:.3f}" if sites else "no subset to swap"
            print(
                f"token {j}: near-tied sites [{' '.join(labels[i] for i in sites)}]; {own}; "
                f"plus site {labels[site]}'s prefix near-ties -> {best_prefix:.3f}",
                flush=True,
            )
        del reference
    return 0


if __name__ == "__main__":
    sys.exit(main())
