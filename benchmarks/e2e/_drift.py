"""The numbers of ``layer_drift.py`` on plain tensors: relative errors over a set of tokens, the
tokens whose expert selection agrees with fp32's, and the table's rows and lines.

A side's error on a row is the relative L2 error of its output against the fp32 output over
the real tokens (``||out - ref|| / ||ref||``, all hidden units of those tokens together); for an
MoE router the same error is also taken over the tokens whose top-k set equals fp32's, since a
flipped expert changes that token's output wholesale and hides every rounding difference.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
from tilegym_hf_bench.routing_rule import same_selection, score_noise


def rel_err(out: torch.Tensor, ref: torch.Tensor, rows: torch.Tensor | None = None) -> float:
    """Relative L2 error of ``out`` [T, H] against ``ref`` [T, H] over the ``rows`` [T] bool
    (all rows when None); NaN over no rows."""
    out, ref = out.float(), ref.float()
    if rows is not None:
        out, ref = out[rows], ref[rows]
    if out.shape[0] == 0:
        return math.nan
    den = float(torch.linalg.vector_norm(ref))
    return float(torch.linalg.vector_norm(out - ref)) / max(den, 1e-30)


def max_token_err(out: torch.Tensor, ref: torch.Tensor, rows: torch.Tensor) -> float:
    """The largest per-token relative L2 error over ``rows`` (the benchmark's statistic)."""
    out, ref = out.float()[rows], ref.float()[rows]
    if out.shape[0] == 0:
        return math.nan
    diff = torch.linalg.vector_norm(out - ref, dim=-1)
    return float((diff / torch.linalg.vector_norm(ref, dim=-1).clamp_min(1e-30)).max())


@dataclass
class SideStat:
    """One side's numbers on one row."""

    err: float
    max_token_err: float
    flips: int | None = None  # real tokens whose top-k set differs from fp32's (MoE rows)
    err_agreeing: float | None = None  # ``err`` over the tokens whose selection agrees
    noise: float | None = None  # largest |router score - fp32's| over real tokens


@dataclass
class Row:
    """One table row: a layer (``block`` "layer"), a sub-block or the logits, teacher-forced
    (each side fed fp32's input to it) or free-running (each side fed its own)."""

    layer: int | None
    block: str
    mode: str  # "forced" | "free"
    sides: dict[str, SideStat] = field(default_factory=dict)

    def ratio(self, agreeing: bool = False) -> float | None:
        """cuTile's error over PyTorch's (above 1: the patched side drifts more); ``agreeing``:
        over the tokens each side routes as fp32 does (None on a row without a router)."""
        c, p = self.sides["cutile"], self.sides["pytorch"]
        a, b = (c.err_agreeing, p.err_agreeing) if agreeing else (c.err, p.err)
        if a is None or b is None:
            return None
        return a / b if b > 0 else math.inf


def side_stat(
    out: torch.Tensor,
    ref: torch.Tensor,
    real: torch.Tensor,
    ids: torch.Tensor | None = None,
    ref_ids: torch.Tensor | None = None,
    scores: torch.Tensor | None = None,
    ref_scores: torch.Tensor | None = None,
) -> SideStat:
    """A side's numbers for outputs [T, H] (``real`` [T] bool: the tokens scored), with its
    router's selection and scores against fp32's where the row has a router."""
    stat = SideStat(rel_err(out, ref, real), max_token_err(out, ref, real))
    if ids is not None and ref_ids is not None:
        agree = same_selection(ids, ref_ids) & real
        stat.flips = int(real.sum()) - int(agree.sum())
        stat.err_agreeing = rel_err(out, ref, agree)
    if scores is not None and ref_scores is not None:
        # the largest |score - fp32's|: what the benchmark's routing-aware referee doubles into
        # its near-tie margin (measured there on the PyTorch side only)
        stat.noise = score_noise(scores, ref_scores, real)
    return stat


def _num(x: float | int | None, fmt: str) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return format(x, fmt)


HEADER = (
    "| layer | block | mode | pytorch err | cutile err | ratio | pytorch flips | cutile flips "
    "| pytorch err (agreeing) | cutile err (agreeing) | ratio (agreeing) | pytorch noise "
    "| cutile noise |"
)


def table_lines(rows: list[Row]) -> list[str]:
    """The printed table, one line per row after the header and its rule."""
    lines = [HEADER, "|" + "---|" * (HEADER.count("|") - 1)]
    for r in rows:
        p, c = r.sides["pytorch"], r.sides["cutile"]
        layer = "-" if r.layer is None else str(r.layer)
        lines.append(
            f"| {layer} | {r.block} | {r.mode} | {_num(p.err, '.3e')} | {_num(c.err, '.3e')} "
            f"| {_num(r.ratio(), '.2f')} | {_num(p.flips, 'd')} | {_num(c.flips, 'd')} "
            f"| {_num(p.err_agreeing, '.3e')} | {_num(c.err_agreeing, '.3e')} "
            f"| {_num(r.ratio(agreeing=True), '.2f')} | {_num(p.noise, '.2e')} "
            f"| {_num(c.noise, '.2e')} |"
        )
    return lines


def _finite(x: float | None) -> float | None:
    """JSON has no inf or NaN: those become null."""
    return x if x is not None and math.isfinite(x) else None


def row_json(r: Row) -> dict:
    return {
        "layer": r.layer,
        "block": r.block,
        "mode": r.mode,
        "ratio": _finite(r.ratio()),
        "ratio_agreeing": _finite(r.ratio(agreeing=True)),
        "sides": {
            side: {k: v if isinstance(v, int) else _finite(v) for k, v in asdict(stat).items()}
            for side, stat in r.sides.items()
        },
    }


def non_finite(rows: list[Row]) -> list[str]:
    """``layer/block/mode side`` of every row whose error is not a finite number."""
    return [
        f"{r.layer}/{r.block}/{r.mode} {side}"
        for r in rows
        for side, stat in r.sides.items()
        if not math.isfinite(stat.err)
    ]
