"""PNG of cuTile coverage and throughput over a model's ledger rows (job summary, artifact)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend chosen first: no display on CI or runners)

from tilegym_bot.ledger import LedgerRow  # noqa: E402

_COLORS = {"keep": "tab:green", "discard": "tab:gray", "crash": "tab:red", "timeout": "tab:orange"}


def series(rows: Sequence[LedgerRow], attr: str) -> dict[str, list[tuple[int, float]]]:
    """The measured points of one panel per status, x = ledger row number (from 1). A value
    that was not measured is left out, never drawn as 0."""
    points: dict[str, list[tuple[int, float]]] = {}
    for x, row in enumerate(rows, start=1):
        value = getattr(row, attr)
        if value is not None:
            points.setdefault(row.status, []).append((x, value))
    return points


def plot_ledger(rows: Sequence[LedgerRow], out: Path, *, title: str) -> Path:
    """Two panels (coverage %, throughput tokens/s) per experiment, kept ones joined by a line;
    unmeasured values (``n/a`` in the ledger) are gaps."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True, constrained_layout=True)
    xs = list(range(1, len(rows) + 1))
    for ax, attr, label in (
        (axes[0], "coverage", "cuTile coverage (% GPU time)"),
        (axes[1], "throughput", "cuTile throughput (tokens/s)"),
    ):
        points = series(rows, attr)
        kept = points.get("keep", [])
        if kept:
            ax.plot(*zip(*kept, strict=True), color=_COLORS["keep"], linewidth=1, zorder=1)
        for status, color in _COLORS.items():
            if points.get(status):
                ax.scatter(*zip(*points[status], strict=True), color=color, label=status, zorder=2)
        if not points:
            ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center", color="gray")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_title(title)
    with_points = [ax for ax in axes if ax.get_legend_handles_labels()[0]]
    if with_points:
        with_points[0].legend(loc="best", fontsize="small")
    axes[1].set_xticks(xs, [r.commit[:8] for r in rows], rotation=30 if len(xs) > 6 else 0)
    axes[1].set_xlabel("experiment (ledger row, head commit)")
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(out)
    return out
