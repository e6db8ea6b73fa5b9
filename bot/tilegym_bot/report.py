"""The Markdown PR comment: verdict first, base vs head metrics, where coverage is missing, env.

The comment starts with a hidden marker (how the GitHub forge finds its one sticky comment again)
and ends with a hidden machine-readable record (how ``ledger rebuild`` regenerates the ledger from
PR comments). Pure: builds strings from decision and metrics documents.

Everything a benchmark wrote (env strings, error text, kernel and module names) and the PR's own
description is untrusted: it is shown as inert text (one line, HTML and Markdown syntax escaped,
@mentions broken) and capped in length, and the whole body is kept under GitHub's comment limit,
so no metrics file can inject markup, ping people or make the comment call fail.
"""

from __future__ import annotations

import html
import json
import math
import re
import statistics
from typing import Any

from tilegym_bot.policy import Decision, dig
from tilegym_bot.stats import positive_mean_ci95

MARKER = "<!-- tilegym-bot:autokernel -->"
_RECORD_RE = re.compile(r"<!-- tilegym-bot:record (\{.*?\}) -->", re.DOTALL)
RECORD_VERSION = 1
NA = "n/a"  # an unmeasured value, the same text as in the ledger
# GitHub rejects a comment body over 65536 characters; counting UTF-8 bytes keeps under the limit
# whichever way a character is counted.
COMMENT_LIMIT = 65536
NAME_LIMIT = 120  # a kernel, module or env string
TEXT_LIMIT = 1500  # one reason or finding (may quote an error message)
DESCRIPTION_LIMIT = 300
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|~])")
_ZERO_WIDTH_SPACE = "\u200b"


def clip(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters (an ellipsis marks a cut)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def md_text(value: Any, limit: int = NAME_LIMIT) -> str:
    """Untrusted text as inert inline Markdown: clipped, HTML and Markdown escaped, no mentions."""
    text = html.escape(clip(str(value), limit), quote=False)
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text).replace("@", "@" + _ZERO_WIDTH_SPACE)


def md_code(value: Any, limit: int = NAME_LIMIT) -> str:
    """Untrusted text as a code span (nothing inside is markup); safe in a table cell too."""
    text = clip(str(value), limit).replace("`", "'").replace("|", "\\|")
    return f"`{text}`"


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
        # how many base/head pairs and why the sequential sampling stopped (None: one round)
        "sampling": decision.sampling,
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


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _num(value: Any, fmt: str = "{:.2f}", suffix: str = "") -> str:
    number = _finite(value)
    return NA if number is None else fmt.format(number) + suffix


def _finite_samples(samples: Any) -> list[float] | None:
    """A metric's raw samples as floats, None unless it is a non-empty list of finite numbers."""
    if not isinstance(samples, list) or not samples:
        return None
    numbers = [v for v in map(_finite, samples) if v is not None]
    return numbers if len(numbers) == len(samples) else None


def _positive_interval(ci: Any) -> tuple[float, float] | None:
    """A reported interval of a positive quantity, None unless 0 < lo <= hi (a t interval of
    few noisy samples can reach below zero: it says nothing then)."""
    if not (isinstance(ci, list) and len(ci) == 2):
        return None
    lo, hi = map(_finite, ci)
    return (lo, hi) if lo is not None and hi is not None and 0 < lo <= hi else None


def _throughput(doc: Any, block: str) -> str:
    tp = dig(doc, block, "throughput")
    if not isinstance(tp, dict):
        return NA
    text = _num(tp.get("mean"))
    samples = tp.get("samples")
    numbers = _finite_samples(samples)
    ci = positive_mean_ci95(numbers) if numbers else _positive_interval(tp.get("ci95"))
    if ci is not None:
        text += f" (95% CI {_num(ci[0])}–{_num(ci[1])})"
    if isinstance(samples, list) and samples:
        text += f", n={len(samples)}"
    return text


def _median(doc: Any, block: str, metric: str) -> str:
    """The median of a metric's raw samples, computed here: a short prefill's time is a few
    fast runs and the odd one where the host stalled, which a mean (and a head's own summary)
    would report as the typical run."""
    numbers = _finite_samples(dig(doc, block, metric, "samples"))
    if numbers is None:
        return NA
    return f"{_num(statistics.median(numbers))}, n={len(numbers)}"


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


def _metrics_table(decision: Decision, base: Any, head: Any) -> list[str]:
    ratio = NA
    if decision.ratio is not None:
        ratio = f"{decision.ratio:.3f}"
        if decision.ratio_ci95:
            ratio += f" (95% CI {decision.ratio_ci95[0]:.3f}–{decision.ratio_ci95[1]:.3f})"
    rows = [
        ("benchmark status", _field(base, "status"), _field(head, "status")),
        ("commit", _field(base, "commit", prefix=8), _field(head, "commit", prefix=8)),
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
            "cuTile TTFT (ms), median",
            _median(base, "cutile", "ttft_ms"),
            _median(head, "cutile", "ttft_ms"),
        ),
        (
            "cuTile decode (tokens/s)",
            _num(dig(base, "cutile", "decode_tokens_per_s", "mean")),
            _num(dig(head, "cutile", "decode_tokens_per_s", "mean")),
        ),
        ("correctness", _correctness(base), _correctness(head)),
    ]
    lines = ["| metric | base (main) | head |", "|:--|--:|--:|"]
    lines += [f"| {name} | {b} | {h} |" for name, b, h in rows]
    return lines


def _field(doc: Any, *keys: str, prefix: int | None = None) -> str:
    """A string field of a metrics document (its first ``prefix`` characters), escaped; n/a
    when missing."""
    value = dig(doc, *keys)
    return NA if value is None or value == "" else md_text(str(value)[:prefix])


def uncovered_kernels(doc: Any, limit: int = 5) -> list[dict[str, Any]]:
    kernels = dig(doc, "coverage", "kernels")
    if not isinstance(kernels, list):
        return []
    plain = [k for k in kernels if isinstance(k, dict) and k.get("cutile") is False]
    return sorted(plain, key=lambda k: -(_finite(k.get("gpu_ms")) or 0.0))[:limit]


def _uncovered_table(doc: Any) -> list[str]:
    top = uncovered_kernels(doc)
    if not top:
        return ["No kernel list in the metrics (coverage not measured)."]
    total = _finite(dig(doc, "coverage", "total_gpu_ms")) or 0.0
    lines = ["| kernel | module | calls | GPU ms | share of GPU time |", "|:--|:--|--:|--:|--:|"]
    for k in top:
        gpu_ms = _finite(k.get("gpu_ms"))
        share = _num(100.0 * gpu_ms / total, suffix="%") if total and gpu_ms is not None else NA
        calls = k.get("calls")
        lines.append(
            f"| {md_code(k.get('name', '?'))} | {md_text(k.get('module') or 'unattributed')} | "
            f"{calls if isinstance(calls, int) and not isinstance(calls, bool) else NA} | "
            f"{_num(gpu_ms)} | {share} |"
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
    b, h = (_field(doc, "commit", prefix=8) for doc in (base, head))
    lines.append(f"| measured commit | {b} | {h} |")
    for label, key in _ENV_FIELDS:
        lines.append(f"| {label} | {_field(base, 'env', key)} | {_field(head, 'env', key)} |")
    return lines


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def fit_comment(lines: list[str], record: dict[str, Any]) -> str:
    """``lines`` plus the embedded record, under ``COMMENT_LIMIT``: when too long, the lines are
    cut from the end (a note says so); the marker, the verdict and the record always stay."""
    tail = embed_record(record) + "\n"
    body = "\n".join(lines) + "\n" + tail
    if _utf8_len(body) <= COMMENT_LIMIT:
        return body
    note = "\n_(comment cut to fit GitHub's size limit: read the full report in the job log)_\n\n"
    budget = COMMENT_LIMIT - _utf8_len(note) - _utf8_len(tail) - 1
    kept: list[str] = []
    used = 0
    for line in lines:
        size = _utf8_len(line) + 1
        if used + size > budget:
            break
        kept.append(line)
        used += size
    return "\n".join(kept) + "\n" + note + tail


def render_comment(
    decision: Decision,
    base: Any,
    head: Any,
    record: dict[str, Any],
    outcome: str | None = None,
) -> str:
    """The whole PR comment for one decision (``base`` may be None for a baseline run).

    ``outcome`` is what was done about it (merged, closed, why not merged), written by the
    caller after acting, so the comment never claims more than happened.
    """
    model_key, description = record["model_key"], record["description"]
    title = "keep (baseline recorded)" if decision.baseline else decision.status
    what = md_text(description, DESCRIPTION_LIMIT)
    lines = [
        MARKER,
        f"## tilegym-bot verdict: **{title}**",
        "",
        f"{md_code(model_key, 40)} — {what} (ledger status: `{decision.ledger_status}`)",
        "",
        *([f"**Outcome:** {outcome}", ""] if outcome else []),
        *[f"- {md_text(r, TEXT_LIMIT)}" for r in decision.reasons],
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
    ]
    return fit_comment(lines, record)


def render_refusal(findings: list[str], record: dict[str, Any], outcome: str | None = None) -> str:
    """The PR comment for an experiment the bot refuses to judge (scope broken): the findings."""
    lines = [
        MARKER,
        "## tilegym-bot verdict: **refused**",
        "",
        f"{md_code(record['model_key'], 40)} — {md_text(record['description'], DESCRIPTION_LIMIT)}",
        "",
        *([f"**Outcome:** {outcome}", ""] if outcome else []),
        "The experiment changes what an experiment may not change (checked with main's rules on "
        "the diff main...head, parsing only), so its benchmark is not judged. Fix these and open "
        "a new pull request:",
        "",
        *[f"- {md_text(f, TEXT_LIMIT)}" for f in findings],
        "",
    ]
    return fit_comment(lines, record)
