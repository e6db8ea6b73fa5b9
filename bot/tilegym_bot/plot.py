"""PNG of cuTile coverage and throughput over a model's ledger rows (job summary, artifact)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend chosen first: no display on CI or runners)

from tilegym_bot.ledger import LedgerRow  # noqa: E402

_COLORS = {"keep": "tab:green", "discard": "tab:gray", "crash": "tab:red", "timeout": "tab:orange"}


def plot_ledger(rows: Sequence[LedgerRow], out: Path, *, title: str) -> Path:
    """Two panels (coverage %, throughput tokens/s) per experiment, kept ones joined by a line."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True, constrained_layout=True)
    xs = list(range(1, len(rows) + 1))
    for ax, attr, label in (
        (axes[0], "coverage", "cuTile coverage (% GPU time)"),
        (axes[1], "throughput", "cuTile throughput (tokens/s)"),
    ):
        kept = [(x, getattr(r, attr)) for x, r in zip(xs, rows, strict=True) if r.status == "keep"]
        if kept:
            ax.plot(*zip(*kept, strict=True), color=_COLORS["keep"], linewidth=1, zorder=1)
        for status, color in _COLORS.items():
            pts = [
                (x, getattr(r, attr)) for x, r in zip(xs, rows, strict=True) if r.status == status
            ]
            if pts:
                ax.scatter(*zip(*pts, strict=True), color=color, label=status, zorder=2)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_title(title)
    axes[0].legend(loc="best", fontsize="small")
    axes[1].set_xticks(xs, [r.commit[:8] for r in rows], rotation=30 if len(xs) > 6 else 0)
    axes[1].set_xlabel("experiment (ledger row, head commit)")
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(out)
    return out
