"""The routing-aware referee's rule, on plain tensors (no model): which tokens of an MoE model
sit on a near-tie of their router, what the other side of that tie is, how wide "near" is, and
how a token's errors against several fp32 references combine.

Why: with random weights a router's k-th and (k+1)-th expert scores are sometimes closer than
bf16's rounding of them, bf16 then picks the other expert, and that token's logits differ from
fp32's wholesale (mixtral's and gpt_oss's bf16 PyTorch baselines were 1.29 and 0.94 from fp32
on the H200). Such a token is scored against fp32 with that tie swapped as well, and keeps the
smaller error; every other token is scored against plain fp32 only.
"""

from __future__ import annotations

import torch

#: The margin is this times the largest |bf16 - fp32| router score measured on the trusted bf16
#: baseline: bf16 can order two experts unlike fp32 only where their fp32 scores are closer
#: than the sum of its errors on the two, at most twice the largest error.
TIE_MARGIN_FACTOR = 2.0
#: At most this many near-tied scored positions of a row get a forward of their own (a longer
#: generation would take one forward per token); the rest are scored with their layer's and all
#: near-ties swapped, and counted as unplanned. 256 covers every generated token of the default
#: (128) and decode (256) workloads (at 64, mixtral's workload case on the H200 left 50 / 57
#: positions unplanned; at 256 none, for 235 fp32 forwards instead of 138).
MAX_POSITION_PLANS = 256
#: At most this many forwards refine the worst tokens of one scored sequence
#: (``worst_to_refine``): one per layer near-tied at the worst token's position, that layer's
#: tie alone. A side that flipped one of
#: a position's near-tied layers differs from the plan that swaps them all (mixtral on the
#: H200: one token of 128 at 0.329 against fp32 with its three near-tied layers swapped, 0.030
#: with only layer 0's; ``benchmarks/e2e/moe_referee_tokens.py``).
MAX_REFINE_FORWARDS = 256


def selection_gap(scores: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """Per token [T]: the weakest chosen expert's score minus the strongest unchosen one's
    (+inf where every expert is chosen). ``scores`` [T, E], ``chosen`` [T, k] expert ids."""
    weakest = scores.gather(1, chosen).min(dim=1).values
    others = scores.scatter(1, chosen, float("-inf")).max(dim=1).values
    return weakest - others


def near_tied(
    scores: torch.Tensor, chosen: torch.Tensor, margin: float, real: torch.Tensor
) -> torch.Tensor:
    """[T] bool: real tokens whose selection gap is below ``margin`` (a pad position's routing
    reaches no real token, so it never counts)."""
    return (selection_gap(scores, chosen) < margin) & real


def swapped_selection(scores: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """``chosen`` [T, k] with each token's weakest chosen expert replaced by its strongest
    unchosen one: the other side of the tie."""
    slot = scores.gather(1, chosen).argmin(dim=1, keepdim=True)
    other = scores.scatter(1, chosen, float("-inf")).argmax(dim=1, keepdim=True)
    return chosen.scatter(1, slot, other)


def group_gap(group_scores: torch.Tensor, keep: int) -> torch.Tensor:
    """Per token [T]: the weakest kept group's score minus the strongest dropped one's, for a
    router keeping its ``keep`` best of the [T, G] ``group_scores``."""
    return selection_gap(group_scores, torch.topk(group_scores, keep, dim=-1).indices)


def swapped_groups(group_scores: torch.Tensor, keep: int) -> torch.Tensor:
    """[T, G] bool: the ``keep`` best groups with the weakest replaced by the strongest dropped
    one (the other side of a group tie)."""
    kept = torch.topk(group_scores, keep, dim=-1).indices
    other = swapped_selection(group_scores, kept)
    return torch.zeros_like(group_scores, dtype=torch.bool).scatter(1, other, True)


def within_reach(scores: torch.Tensor, picked: torch.Tensor, margin: float) -> torch.Tensor:
    """[T] bool: the [T, k] selections ``picked`` that bf16 could make where fp32 scored
    ``scores`` [T, E]: k distinct experts, the weakest no more than ``margin`` below the
    strongest left out (an error of at most ``margin`` / 2 on each score can order them so;
    fp32's own top-k always is). A masked (-inf) expert is never within reach."""
    ordered = picked.sort(dim=1).values
    distinct = (ordered[:, 1:] != ordered[:, :-1]).all(dim=1)
    return distinct & (selection_gap(scores, picked) >= -margin)


def groups_within_reach(
    group_scores: torch.Tensor, picked: torch.Tensor, experts: int, keep: int, margin: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ok [T] bool, kept [T, G] bool) for a router that keeps its ``keep`` best of the [T, G]
    ``group_scores`` of its ``experts`` experts (numbered group by group): the groups of
    ``picked`` [T, k] filled up with the best other groups, and whether bf16 could have kept
    them (the weakest kept group no more than ``margin`` below the strongest dropped one).
    Filling with the best gives the set that passes if any set holding those groups does."""
    size = experts // group_scores.shape[1]
    need = torch.zeros_like(group_scores, dtype=torch.bool).scatter(1, picked // size, True)
    kept_ids = torch.topk(group_scores.masked_fill(need, float("inf")), keep, dim=-1).indices
    kept = torch.zeros_like(need).scatter(1, kept_ids, True)
    ok = (need.sum(dim=1) <= keep) & (selection_gap(group_scores, kept_ids) >= -margin)
    return ok, kept


def same_selection(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[T] bool: the two [T, k] selections name the same experts (in any order)."""
    return (a.sort(dim=1).values == b.sort(dim=1).values).all(dim=1)


def score_noise(low: torch.Tensor, high: torch.Tensor, rows: torch.Tensor) -> float:
    """The largest |low - high| over the ``rows`` [T] bool of two [T, E] score tensors (0.0
    without rows)."""
    if not bool(rows.any()):
        return 0.0
    return float((low[rows].float() - high[rows].float()).abs().max())


def tie_margin(noise: float) -> float:
    return TIE_MARGIN_FACTOR * noise


def eligible_tokens(tied: torch.Tensor, prompt_len: int, new_tokens: int) -> torch.Tensor:
    """[B, N] bool: the generated tokens an alternate routing may score. ``tied`` [B, S] marks
    the input positions (``S`` = sequence length - 1) whose routing the alternate swapped;
    generated token j is predicted at position ``prompt_len - 1 + j``, and a swap at a position
    changes that position and every later one (attention is causal), nothing before it."""
    reached = tied.long().cumsum(dim=1) > 0
    return reached[:, prompt_len - 1 : prompt_len - 1 + new_tokens]


def swap_plans(
    ties: list[torch.Tensor], rows: int, first_scored: int
) -> tuple[list[dict[int, torch.Tensor]], int]:
    """(the alternate routings to run, each {MoE layer: [T] bool tokens to swap}, none twice;
    the near-tied scored positions left without a plan of their own). ``ties``: per MoE layer,
    [T] bool (T = ``rows`` x positions, row-major); ``first_scored``: the position predicting
    the first generated token.

    - each near-tied scored position alone, all its layers' near-ties (one plan serves every
      row, rows not seeing each other: plan j swaps the j-th near-tied scored position of each
      row; at most ``MAX_POSITION_PLANS``): a flip there changes that token's logits
      wholesale, and swapping other near-ties with it would move them through attention;
    - each layer's near-ties, then all of them together: a flip in the prompt reaches the
      generated tokens through attention only, and a token may sit on near-ties in several
      layers."""
    plans: list[dict[int, torch.Tensor]] = []

    def add(plan: dict[int, torch.Tensor]) -> None:
        if plan and not any(_same_plan(plan, p) for p in plans):
            plans.append(plan)

    tied = [i for i, t in enumerate(ties) if bool(t.any())]
    if not tied:
        return plans, 0
    scored = torch.stack([ties[i] for i in tied]).any(dim=0).view(rows, -1).clone()
    scored[:, :first_scored] = False
    rank = scored.long().cumsum(dim=1) * scored  # the j-th near-tied scored position: j
    for j in range(1, min(int(rank.max()), MAX_POSITION_PLANS) + 1):
        at = (rank == j).flatten()
        add({i: ties[i] & at for i in tied if bool((ties[i] & at).any())})
    for i in tied:
        add({i: ties[i]})
    add({i: ties[i] for i in tied})
    return plans, int((rank > MAX_POSITION_PLANS).sum())


def _same_plan(a: dict[int, torch.Tensor], b: dict[int, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[i], b[i]) for i in a)


def combine(
    plain: torch.Tensor, alternates: list[tuple[torch.Tensor, torch.Tensor]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(errors [B, N], took an alternate [B, N] bool): a token's error is the smallest of its
    error against plain fp32 and those against the alternates (error, eligible) it is eligible
    for; with no alternates it is ``plain`` itself."""
    best = plain
    for err, eligible in alternates:
        best = torch.where(eligible & (err < best), err, best)
    return best, best < plain


def layer_swaps_at(ties: list[torch.Tensor], token: int) -> list[dict[int, torch.Tensor]]:
    """Where flat token ``token`` is near-tied in two or more MoE layers: one plan per such
    layer swapping that layer's tie at that token alone (none otherwise: the position plan
    already swaps a single layer's tie, except at a position past ``MAX_POSITION_PLANS``)."""
    layers = [i for i, t in enumerate(ties) if bool(t[token])]
    if len(layers) < 2:
        return []
    plans = []
    for i in layers:
        only = torch.zeros_like(ties[i])
        only[token] = True
        plans.append({i: only})
    return plans


def worst_to_refine(best: torch.Tensor, refined: torch.Tensor) -> tuple[int, int] | None:
    """(row, generated token) of ``best`` [B, N]'s largest error if that token is not
    ``refined`` [B, N] bool yet, else None: a side's maximum is final once it sits on a token
    whose single-layer swaps were all tried (or that has none)."""
    flat = int(best.flatten().argmax())
    row, j = divmod(flat, best.shape[1])
    return None if bool(refined[row, j]) else (row, j)


ID_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def report_problem(report: list[torch.Tensor], shapes: list[tuple[int, int]], experts: list[int]):
    """Why ``report`` cannot be one routing of the scored sequence, or None: one [T, k] integer
    tensor per MoE layer (``shapes``, fp32's own) naming experts below ``experts[i]``."""
    if len(report) != len(shapes):
        return f"{len(report)} MoE layers reported, the model has {len(shapes)}"
    for i, (ids, shape, count) in enumerate(zip(report, shapes, experts, strict=True)):
        if tuple(ids.shape) != shape or ids.dtype not in ID_DTYPES:
            return f"MoE layer {i}: a {tuple(ids.shape)} {ids.dtype} tensor, expected {shape}"
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= count):
            return f"MoE layer {i}: expert ids outside 0..{count - 1}"
    return None
