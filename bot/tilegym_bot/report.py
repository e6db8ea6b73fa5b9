"""The Markdown PR comment: verdict first, base vs head metrics, where coverage is missing, env.

The comment starts with a hidden marker (how the GitHub forge finds its one sticky comment again)
and ends with a hidden machine-readable record (how ``ledger rebuild`` regenerates the ledger from
PR comments). Pure: builds strings from decision and metrics documents.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

from tilegym_bot.policy import Decision, dig
from tilegym_bot.stats import mean_ci95

MARKER = "<!-- tilegym-bot:autokernel -->"
_RECORD_RE = re.compile(r"<!-- tilegym-bot:record (\{.*?\}) -->", re.DOTALL)
RECORD_VERSION = 1


def build_record(
    decision: Decision,
    *,
    model_key: str,
    description: str,
    base_sha: str | None,
    head_sha: str,
    decided_at: str,
    pr: int | None = None,
    final: bool = True,
    baseline_row: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What a ledger row needs, plus identity; embedded in the comment for ``ledger rebuild``."""
    return {
        "version": RECORD_VERSION,
        "model_key": model_key,
        "pr": pr,
        "base_sha": base_sha,
        "head_sha": head_sha,
        "status": decision.status,
        "ledger_status": decision.ledger_status,
        "baseline": decision.baseline,
        "coverage": decision.coverage_head,
        "throughput": decision.throughput_head,
        "description": description,
        "decided_at": decided_at,
        "final": final,
        "baseline_row": baseline_row,
    }


def embed_record(record: dict[str, Any]) -> str:
    # "<" and ">" escaped so that no text in the record can close the HTML comment.
    text = json.dumps(record, sort_keys=True).replace("<", "\\u003c").replace(">", "\\u003e")
    return f"<!-- tilegym-bot:record {text} -->"


def parse_record(body: str) -> dict[str, Any] | None:
    """The record embedded in a bot comment, or None when the body has none (or a broken one)."""
    if MARKER not in body:
        return None
    match = _RECORD_RE.search(body)
    if not match:
        return None
    try:
        record = json.loads(match.group(1))
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) and record.get("version") == RECORD_VERSION else None


def _num(value: Any, fmt: str = "{:.2f}", suffix: str = "") -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return "—"
    return fmt.format(value) + suffix


def _throughput(doc: Any, block: str) -> str:
    tp = dig(doc, block, "throughput")
    if not isinstance(tp, dict):
        return "—"
    text = _num(tp.get("mean"))
    ci = tp.get("ci95")
    samples = tp.get("samples")
    if not (isinstance(ci, list) and len(ci) == 2) and isinstance(samples, list):
        numbers = [v for v in samples if isinstance(v, (int, float)) and not isinstance(v, bool)]
        ci = mean_ci95(numbers) if len(numbers) == len(samples) else None
    if ci is not None and len(ci) == 2:
        text += f" (95% CI {_num(ci[0])}–{_num(ci[1])})"
    if isinstance(samples, list) and samples:
        text += f", n={len(samples)}"
    return text


def _correctness(doc: Any) -> str:
    c = dig(doc, "correctness")
    if not isinstance(c, dict):
        return "not measured"
    verdict = "passed" if c.get("passed") else "FAILED"
    return (
        f"{verdict}: rel err {_num(c.get('logits_rel_err'), '{:.2e}')} "
        f"(tolerance {_num(c.get('tolerance'), '{:.2e}')}, PyTorch bf16 "
        f"{_num(c.get('baseline_rel_err'), '{:.2e}')}), "
        f"top-1 {_num(c.get('top1_agreement'), '{:.3f}')}"
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _metrics_table(decision: Decision, base: Any, head: Any) -> list[str]:
    ratio = "—"
    if decision.ratio is not None:
        ratio = f"{decision.ratio:.3f}"
        if decision.ratio_ci95:
            ratio += f" (95% CI {decision.ratio_ci95[0]:.3f}–{decision.ratio_ci95[1]:.3f})"
    rows = [
        ("benchmark status", str(dig(base, "status") or "—"), str(dig(head, "status") or "—")),
        ("commit", str(dig(base, "commit") or "—")[:8], str(dig(head, "commit") or "—")[:8]),
        (
            "cuTile coverage, GPU time",
            _num(dig(base, "coverage", "gpu_time_pct"), suffix="%"),
            _num(dig(head, "coverage", "gpu_time_pct"), suffix="%"),
        ),
        (
            "cuTile coverage, launches",
            _num(dig(base, "coverage", "launch_pct"), suffix="%"),
            _num(dig(head, "coverage", "launch_pct"), suffix="%"),
        ),
        ("cuTile throughput (tokens/s)", _throughput(base, "cutile"), _throughput(head, "cutile")),
        (
            "PyTorch baseline throughput (tokens/s)",
            _throughput(base, "baseline"),
            _throughput(head, "baseline"),
        ),
        ("throughput ratio head/base", "", ratio),
        (
            "cuTile TTFT (ms)",
            _num(dig(base, "cutile", "ttft_ms", "mean")),
            _num(dig(head, "cutile", "ttft_ms", "mean")),
        ),
        (
            "cuTile decode (tokens/s)",
            _num(dig(base, "cutile", "decode_tokens_per_s", "mean")),
            _num(dig(head, "cutile", "decode_tokens_per_s", "mean")),
        ),
        ("correctness", _correctness(base), _correctness(head)),
    ]
    lines = ["| metric | base (main) | head |", "|:--|--:|--:|"]
    lines += [f"| {name} | {_cell(b)} | {_cell(h)} |" for name, b, h in rows]
    return lines


def uncovered_kernels(doc: Any, limit: int = 5) -> list[dict[str, Any]]:
    kernels = dig(doc, "coverage", "kernels")
    if not isinstance(kernels, list):
        return []
    plain = [k for k in kernels if isinstance(k, dict) and k.get("cutile") is False]
    return sorted(plain, key=lambda k: -(k.get("gpu_ms") or 0))[:limit]


def _uncovered_table(doc: Any) -> list[str]:
    top = uncovered_kernels(doc)
    if not top:
        return ["No kernel list in the metrics (coverage not measured)."]
    total = dig(doc, "coverage", "total_gpu_ms") or 0
    lines = ["| kernel | module | calls | GPU ms | share of GPU time |", "|:--|:--|--:|--:|--:|"]
    for k in top:
        name = str(k.get("name", "?"))
        name = name if len(name) <= 80 else name[:77] + "..."
        share = _num(100.0 * k["gpu_ms"] / total, suffix="%") if total else "—"
        lines.append(
            f"| `{_cell(name)}` | {_cell(str(k.get('module') or 'unattributed'))} | "
            f"{k.get('calls', '—')} | {_num(k.get('gpu_ms'))} | {share} |"
        )
    return lines


_ENV_FIELDS = (
    ("GPU", "gpu_name"),
    ("compute capability", "compute_capability"),
    ("driver", "driver"),
    ("CUDA", "cuda"),
    ("torch", "torch"),
    ("transformers", "transformers"),
    ("cuda-tile", "cuda_tile"),
    ("tileiras", "tileiras"),
)


def _env_table(base: Any, head: Any) -> list[str]:
    lines = ["| | base | head |", "|:--|:--|:--|"]
    b, h = (str(dig(doc, "commit") or "—")[:8] for doc in (base, head))
    lines.append(f"| measured commit | {_cell(b)} | {_cell(h)} |")
    for label, key in _ENV_FIELDS:
        b, h = dig(base, "env", key), dig(head, "env", key)
        lines.append(f"| {label} | {_cell(str(b or '—'))} | {_cell(str(h or '—'))} |")
    return lines


def render_comment(
    decision: Decision,
    base: Any,
    head: Any,
    record: dict[str, Any],
) -> str:
    """The whole PR comment for one decision (``base`` may be None for a baseline run)."""
    model_key, description = record["model_key"], record["description"]
    title = "keep (baseline recorded)" if decision.baseline else decision.status
    what = html.escape(" ".join(description.split()), quote=False)
    lines = [
        MARKER,
        f"## tilegym-bot verdict: **{title}**",
        "",
        f"`{model_key}` — {what} (ledger status: `{decision.ledger_status}`)",
        "",
        *[f"- {r}" for r in decision.reasons],
        "",
        "### Metrics",
        "",
        *_metrics_table(decision, base, head),
        "",
        "### Largest kernels not yet in cuTile (head)",
        "",
        *_uncovered_table(head if dig(head, "coverage") else base),
        "",
        "### Environment",
        "",
        *_env_table(base, head),
        "",
        embed_record(record),
        "",
    ]
    return "\n".join(lines)
