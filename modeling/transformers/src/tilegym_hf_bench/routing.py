"""The routing-aware referee's I/O: forward hooks on the routers of a transformers MoE model
(``router_forms``) that record what each router scored and chose, or give listed tokens the
other side of their near-tie, and the fp32 forwards that make a side's references
(``routing_rule`` decides). A router can be near-tied at two sites: among its experts, and, for
one that keeps only its best groups of experts (DeepSeek), among those groups. A side may also
report how it routed (``routing_report``): fp32 then routes as reported wherever that choice
is within bf16's reach of its own scores (``reported``). All of it runs in the measuring
process, on the fp32 reference and the bf16 PyTorch baseline: the judged worker returns its
tokens, its logits and its report, which is checked, never trusted.

A model without a known router takes no hook and no extra forward: its reference is exactly the
plain one.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from tilegym_hf_bench.errors import BenchError
from tilegym_hf_bench.router_forms import RouterForm, form_of
from tilegym_hf_bench.routing_rule import (
    MAX_REFINE_FORWARDS,
    combine,
    eligible_tokens,
    group_gap,
    groups_within_reach,
    layer_swaps_at,
    near_tied,
    report_problem,
    same_selection,
    score_noise,
    swap_plans,
    swapped_groups,
    swapped_selection,
    tie_margin,
    within_reach,
    worst_to_refine,
)
from tilegym_hf_bench.scoring import finite_or_none, input_mask, reference_logits, token_errors


@dataclass
class Routed:
    """What the routers of one forward saw, one [T, E] or [T, k] tensor per MoE layer in model
    order (T: batch x positions, row-major); ``groups``: [T, G] group scores of a layer whose
    router keeps only its best groups, None for the others."""

    ranking: list[torch.Tensor] = field(default_factory=list)
    raw: list[torch.Tensor] = field(default_factory=list)
    chosen: list[torch.Tensor] = field(default_factory=list)
    groups: list[torch.Tensor | None] = field(default_factory=list)


def routers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, RouterForm]]:
    return [(m, form) for m in model.modules() if (form := form_of(m)) is not None]


@dataclass(frozen=True)
class Site:
    """Where a router can be near-tied: MoE layer ``layer``'s experts, or (``groups``) the
    groups it keeps. A plan or a tie list indexes sites: first every layer's experts in model
    order (site i is layer i's), then the groups of each group-limiting layer."""

    layer: int
    groups: bool = False
    #: the group scores' margin in expert-score margins (``GroupLimit.lipschitz``)
    scale: float = 1.0

    def label(self) -> str:
        return f"g{self.layer}" if self.groups else str(self.layer)


def tie_sites(model: torch.nn.Module) -> list[Site]:
    found = routers(model)
    groups = [
        Site(i, True, form.group.lipschitz)
        for i, (router, form) in enumerate(found)
        if form.limits_groups(router)
    ]
    return [Site(i) for i in range(len(found))] + groups


def _check_form(router, form: RouterForm, logits, weights, indices) -> None:
    """The form must reproduce the router's own choice and weights (fp32): an alternate built
    from a form that drifted from transformers would referee with a model that does not exist."""
    ranking = form.ranking(router, logits)
    mine = torch.topk(ranking, indices.shape[1], dim=-1).indices
    ok = bool(same_selection(mine, indices).all()) and torch.allclose(
        form.weights(router, logits, indices), weights.float(), rtol=1e-5, atol=1e-6
    )
    if not ok:
        raise BenchError(
            f"internal: the routing referee's form of {type(router).__name__} does not "
            "reproduce the router's own selection and weights in this transformers version"
        )


@contextmanager
def hooked(hooks: list):
    """Within: each (module, forward hook) of ``hooks`` registered."""
    handles = [module.register_forward_hook(hook) for module, hook in hooks]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def recording(model: torch.nn.Module, check: bool = False):
    """Within: each forward of ``model`` appends its routers' scores and choices to the
    yielded ``Routed`` (``check``: verify the forms against the routers' outputs)."""
    routed = Routed()
    hooks = []
    for router, form in routers(model):

        def hook(module, args, output, form=form):
            logits, weights, indices = output
            if check:
                _check_form(module, form, logits, weights, indices)
            routed.ranking.append(form.ranking(module, logits).detach())
            routed.raw.append(form.raw(module, logits).detach())
            routed.chosen.append(indices.detach())
            limited = form.limits_groups(module)
            routed.groups.append(form.group.scores(module, logits).detach() if limited else None)

        hooks.append((router, hook))
    with hooked(hooks):
        yield routed


@contextmanager
def forcing(model: torch.nn.Module, swaps: dict[int, torch.Tensor]):
    """Within: the tokens ``swaps[n]`` ([T] bool) of tie site n (``tie_sites``) get the other
    side of their tie as the router's scores stand in that forward: its weakest kept group
    traded for its strongest dropped one and the experts chosen anew among those groups
    (``swapped_groups``), then its weakest chosen expert for its strongest unchosen one
    (``swapped_selection``); weighted as the router weights any selection."""
    sites = tie_sites(model)
    hooks = []
    for i, (router, form) in enumerate(routers(model)):
        at = {s.groups: swaps[n] for n, s in enumerate(sites) if s.layer == i and n in swaps}
        if not at:
            continue
        experts, groups = at.get(False), at.get(True)

        def hook(module, args, output, form=form, experts=experts, groups=groups):
            logits, weights, indices = output
            ranking = form.ranking(module, logits).clone()
            indices = indices.clone()
            if groups is not None:
                rows = groups.nonzero().flatten()
                kept = swapped_groups(form.group.scores(module, logits[rows]), module.topk_group)
                ranking[rows] = form.group.within(module, logits[rows], kept)
                indices[rows] = torch.topk(ranking[rows], indices.shape[1], dim=-1).indices
            if experts is not None:
                rows = experts.nonzero().flatten()
                indices[rows] = swapped_selection(ranking[rows], indices[rows])
            changed = [t for t in (experts, groups) if t is not None]
            rows = torch.stack(changed).any(dim=0).nonzero().flatten()
            weights = weights.clone()
            weights[rows] = form.weights(module, logits[rows], indices[rows]).to(weights.dtype)
            return logits, weights, indices

        hooks.append((router, hook))
    with hooked(hooks):
        yield


@contextmanager
def following(model: torch.nn.Module, chosen: list[torch.Tensor]):
    """Within: MoE layer i of ``model`` routes every token to ``chosen[i]`` ([T, k], another
    forward's choice), weighted as its router weights any selection."""
    hooks = []
    for i, (router, form) in enumerate(routers(model)):

        def hook(module, args, output, form=form, picked=chosen[i]):
            logits, weights, _ = output
            return logits, form.weights(module, logits, picked).to(weights.dtype), picked

        hooks.append((router, hook))
    with hooked(hooks):
        yield


def accepted(router, form: RouterForm, logits, picked: torch.Tensor, margin: float):
    """[T] bool: the reported selections ``picked`` [T, k] the router could make in bf16 where
    its fp32 ``logits`` stand: within ``margin`` of its ranking and, for a router that keeps
    its best groups, in groups it could keep (``routing_rule``)."""
    if not form.limits_groups(router):
        return within_reach(form.ranking(router, logits), picked, margin)
    scores = form.group.scores(router, logits)
    experts = form.raw(router, logits).shape[1]
    ok, kept = groups_within_reach(
        scores, picked, experts, router.topk_group, form.group.lipschitz * margin
    )
    return ok & within_reach(form.group.within(router, logits, kept), picked, margin)


@contextmanager
def reported(model: torch.nn.Module, report: list, margins: list[float], real, counts: list):
    """Within: MoE layer i routes each real token (``real`` [T] bool) as ``report[i]`` ([T, k])
    says where that choice is ``accepted`` as this forward's fp32 scores stand, and as fp32
    chooses elsewhere, weighted as the router weights any selection; ``counts`` gets
    [accepted, refused] reported choices that differ from fp32's own."""
    hooks = []
    for i, (router, form) in enumerate(routers(model)):

        def hook(module, args, output, form=form, picked=report[i], margin=margins[i]):
            logits, weights, indices = output
            picked = picked.to(device=indices.device, dtype=indices.dtype)
            differs = ~same_selection(picked, indices) & real
            ok = accepted(module, form, logits, picked, margin)
            counts[0] += int((differs & ok).sum())
            counts[1] += int((differs & ~ok).sum())
            rows = (differs & ok).nonzero().flatten()
            indices, weights = indices.clone(), weights.clone()
            indices[rows] = picked[rows]
            weights[rows] = form.weights(module, logits[rows], picked[rows]).to(weights.dtype)
            return logits, weights, indices

        hooks.append((router, hook))
    with hooked(hooks):
        yield


@dataclass
class SideErrors:
    """One side's per-token errors [B, N]: against plain fp32, routing-aware, and where an
    alternate gave the smaller one."""

    plain: torch.Tensor
    best: torch.Tensor
    took: torch.Tensor
    #: {accepted, refused}: the side's reported choices unlike fp32's (None: no report)
    report: dict | None = None


@dataclass
class Refereed:
    """One sequence's near-ties, the fp32 forwards run for them, and each side's errors."""

    near_ties: int
    forwards: int
    unplanned: int
    sides: list[SideErrors]


@dataclass(frozen=True)
class Margins:
    """Per MoE layer: the largest |bf16 - fp32| router score on the measured sequence, and the
    near-tie margin it gives."""

    noise: list[float]
    margin: list[float]


class Referee:
    """The fp32 reference ``ref_model`` with its routers' near-ties, the margin measured against
    ``baseline_model`` (the trusted bf16 PyTorch side)."""

    def __init__(self, ref_model: torch.nn.Module, baseline_model: torch.nn.Module):
        self.ref_model = ref_model
        self.baseline_model = baseline_model
        self.routers = routers(ref_model)
        self.moe_layers = len(self.routers)
        self.sites = tie_sites(ref_model)

    def ties(self, high: Routed, margins: list[float], real: torch.Tensor) -> list[torch.Tensor]:
        """Per tie site, [T] bool: the real tokens near-tied there in the forward ``high``
        (a group score moves up to ``Site.scale`` times as far as an expert score)."""
        found = []
        for site in self.sites:
            margin = site.scale * margins[site.layer]
            if site.groups:
                keep = self.routers[site.layer][0].topk_group
                found.append((group_gap(high.groups[site.layer], keep) < margin) & real)
            else:
                i = site.layer
                found.append(near_tied(high.ranking[i], high.chosen[i], margin, real))
        return found

    def plain(self, seq, prompt_len: int, mask=None) -> tuple[torch.Tensor, Routed | None]:
        """(fp32 logits, its routing or None without MoE layers): one forward."""
        if not self.moe_layers:
            return reference_logits(self.ref_model, seq, prompt_len, mask), None
        with recording(self.ref_model, check=True) as routed:
            logits = reference_logits(self.ref_model, seq, prompt_len, mask)
        return logits, routed

    def margins(self, seq, prompt_len: int, mask, high: Routed) -> Margins:
        """One bf16 forward of the baseline on ``seq``, routed as fp32 routed it (``high``):
        its router scores against fp32's on the real tokens, layer by layer. Routed alike, the
        difference is bf16's rounding alone; routed its own way, a flip at one position moved
        later positions' scores through attention (tiny-gpt_oss: 0.036 where rounding was
        0.003) and would have widened the margin with it."""
        with following(self.baseline_model, high.chosen), recording(self.baseline_model) as low:
            reference_logits(self.baseline_model, seq, prompt_len, mask)
        if len(low.raw) != len(high.raw):
            raise BenchError("internal: the bf16 baseline and the fp32 reference route apart")
        real = input_mask(seq, prompt_len, mask).flatten().bool()
        noise = [score_noise(lo, hi, real) for lo, hi in zip(low.raw, high.raw, strict=True)]
        return Margins(noise, [tie_margin(n) for n in noise])

    def refereed(
        self,
        seq,
        prompt_len: int,
        mask,
        reference: torch.Tensor,
        high: Routed,
        margins: list[float],
        sides: list[torch.Tensor],
        reports: list | None = None,
    ) -> Refereed:
        """Score the logits ``sides`` (each [B, N, V], generated along ``seq``) against
        ``reference``, each alternate routing of ``seq`` (``routing_rule.swap_plans``, then
        the single-layer swaps at each side's worst tokens, ``_refine``) and, for a side with
        one of ``reports`` (its ``routing_report``, or None), fp32 routed as it reports: one
        fp32 forward per plan, scored for every side at once and dropped, and one per report,
        scored for its side alone."""
        real_positions = input_mask(seq, prompt_len, mask)
        real = real_positions.flatten().bool()
        ties = self.ties(high, margins, real)
        plans, unplanned = swap_plans(ties, seq.shape[0], prompt_len - 1)
        new_tokens = seq.shape[1] - prompt_len
        alternates: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in sides]

        def run(plan: dict[int, torch.Tensor]) -> None:
            with forcing(self.ref_model, plan):
                alt = reference_logits(self.ref_model, seq, prompt_len, mask)
            swapped = torch.stack(list(plan.values())).any(dim=0).view(real_positions.shape)
            eligible = eligible_tokens(swapped, prompt_len, new_tokens)
            for logits, found in zip(sides, alternates, strict=True):
                found.append((token_errors(logits, alt), eligible))

        for plan in plans:
            run(plan)
        counts: list[dict | None] = []
        reports = reports or [None] * len(sides)
        for logits, report, found in zip(sides, reports, alternates, strict=True):
            if report is None:
                counts.append(None)
                continue
            with_report = (seq, prompt_len, mask, high, margins, real)
            counts.append(self._reported(*with_report, logits, report, found))
        plain = [token_errors(logits, reference) for logits in sides]
        forwards = len(plans) + sum(c is not None for c in counts)
        forwards += self._refine(ties, seq, prompt_len, plain, alternates, run)
        scored = []
        for errors, found, count in zip(plain, alternates, counts, strict=True):
            best, took = combine(errors, found)
            scored.append(SideErrors(errors, best, took, count))
        return Refereed(int(sum(int(t.sum()) for t in ties)), forwards, unplanned, scored)

    def _reported(self, seq, prompt_len, mask, high, margins, real, logits, report, found):
        """One fp32 forward routed as ``report`` says where each choice is within reach
        (``reported``), its errors for ``logits`` added to ``found`` (every generated token is
        eligible: a reported choice anywhere may reach it); the choices accepted and refused."""
        shapes = [tuple(chosen.shape) for chosen in high.chosen]
        problem = report_problem(report, shapes, [raw.shape[1] for raw in high.raw])
        if problem is not None:
            raise BenchError(f"a side's routing report does not fit its sequence: {problem}")
        counts = [0, 0]
        with reported(self.ref_model, report, margins, real, counts):
            alt = reference_logits(self.ref_model, seq, prompt_len, mask)
        found.append((token_errors(logits, alt), torch.ones_like(logits[..., 0], dtype=torch.bool)))
        return {"accepted": counts[0], "refused": counts[1]}

    @staticmethod
    def _refine(ties, seq, prompt_len: int, plain, alternates, run) -> int:
        """Swap each near-tied site alone at a side's worst token while that token has not had
        it (``worst_to_refine``), up to ``MAX_REFINE_FORWARDS``; the forwards run."""
        positions = seq.shape[1] - 1
        refined = [torch.zeros_like(p, dtype=torch.bool) for p in plain]
        best = [combine(errors, found)[0] for errors, found in zip(plain, alternates, strict=True)]
        forwards = 0
        while forwards < MAX_REFINE_FORWARDS:
            targets = set()
            for side_best, done in zip(best, refined, strict=True):
                worst = worst_to_refine(side_best, done)
                if worst is not None:
                    targets.add(worst)
            if not targets:
                break
            for row, j in sorted(targets):
                for done in refined:
                    done[row, j] = True
                for plan in layer_swaps_at(ties, row * positions + prompt_len - 1 + j):
                    if forwards == MAX_REFINE_FORWARDS:
                        break
                    run(plan)
                    forwards += 1
                    # the running minimum takes the new alternate alone (``combine`` is one)
                    best = [
                        combine(b, found[-1:])[0] for b, found in zip(best, alternates, strict=True)
                    ]
        return forwards


def _sides(values: list) -> dict:
    return {"baseline": values[0], "cutile": values[1] if len(values) > 1 else None}


def routing_block(
    moe_layers: int, margins: Margins, runs: list[Refereed], errors: list[SideErrors]
) -> dict:
    """A case's metrics ``routing`` object. ``runs``: one per sequence scored (one when both
    sides generated the same); ``errors``: baseline's, then the kernel's if measured."""
    per_side = runs if len(runs) == len(errors) else runs * len(errors)
    return {
        "moe_layers": moe_layers,
        "noise": margins.noise,
        "margin": margins.margin,
        "near_ties": _sides([run.near_ties for run in per_side]),
        "unplanned": _sides([run.unplanned for run in per_side]),
        "extra_forwards": sum(run.forwards for run in runs),
        "alternate_tokens": _sides([int(e.took.sum()) for e in errors]),
        "plain_rel_err": _sides([finite_or_none(float(e.plain.max())) for e in errors]),
        "refereed_quantiles": _sides([_quantiles(e.best) for e in errors]),
        "reported": _sides([e.report for e in errors]),
    }


#: The refereed token errors' quantiles a case records beside its maximum: a maximum far above
#: its side's p90 is one token (mixtral's 0.329 had p90 0.043, as PyTorch's 0.041), a maximum
#: near it is the whole sequence.
QUANTILES = {"p50": 0.5, "p90": 0.9}


def _quantiles(best: torch.Tensor) -> dict:
    levels = torch.tensor(list(QUANTILES.values()), device=best.device)
    values = torch.quantile(best.flatten().float(), levels)
    return {k: finite_or_none(float(v)) for k, v in zip(QUANTILES, values, strict=True)}


def routing_line(block: dict) -> str:
    """The log's words for a ``routing`` block."""
    sides = [s for s in ("baseline", "cutile") if block["alternate_tokens"][s] is not None]

    def both(key: str, fmt: str = "{}") -> str:
        return " / ".join(
            "n/a" if block[key][s] is None else fmt.format(block[key][s]) for s in sides
        )

    return (
        f"routing: {block['moe_layers']} MoE layers, near-tie margin "
        + "/".join(f"{m:.1e}" for m in block["margin"])
        + f", near-ties {both('near_ties')}, {block['extra_forwards']} fp32 forwards with "
        f"near-ties swapped, tokens scored on a swap {both('alternate_tokens')}, plain fp32 "
        f"max token rel err {both('plain_rel_err', '{:.3e}')}"
        + (
            ", refereed token rel err p50/p90 "
            + " / ".join(
                "{p50:.3e}/{p90:.3e}".format(**block["refereed_quantiles"][s]) for s in sides
            )
            if "refereed_quantiles" in block
            else ""
        )
        + (
            ", reported choices unlike fp32's accepted/refused "
            + " / ".join(
                "none" if (r := block["reported"][s]) is None else f"{r['accepted']}/{r['refused']}"
                for s in sides
            )
            if "reported" in block
            else ""
        )
    )
