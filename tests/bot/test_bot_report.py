"""The PR comment (verdict first, tables, uncovered kernels, env, embedded record) and the plot."""

from __future__ import annotations

import struct

import pytest
from tilegym_bot.ledger import LedgerRow
from tilegym_bot.plot import plot_ledger
from tilegym_bot.policy import Decision, decide
from tilegym_bot.report import (
    COMMENT_LIMIT,
    MARKER,
    build_record,
    parse_record,
    render_comment,
    render_refusal,
)


def _kernel(name, gpu_ms, cutile=False, module="Qwen3Attention"):
    return {"name": name, "calls": 10, "gpu_ms": gpu_ms, "cutile": cutile, "module": module}


def test_comment_layout_and_record_roundtrip(make_metrics):
    base = make_metrics(commit="a" * 40)
    head = make_metrics(coverage=61.2)
    decision = decide(base, head)
    kernels = [_kernel(f"k{i}", float(i)) for i in range(1, 8)] + [_kernel("ct", 99.0, True)]
    head["coverage"]["kernels"] = kernels  # the table shows the largest non-cuTile ones
    record = build_record(
        decision,
        model_key="qwen3",
        description="fused --> <b>|x</b>",
        base_sha="a" * 40,
        head_sha="b" * 40,
        decided_at="2026-11-29T18:00:00Z",
        pr=4,
    )
    body = render_comment(decision, base, head, record)
    lines = body.splitlines()
    assert lines[0] == MARKER and lines[1] == "## tilegym-bot verdict: **keep**"
    assert lines[5].startswith("- kept by the coverage rule: coverage 50.00% → 61.20%")
    assert "| cuTile coverage, GPU time | 50.00% | 61.20% |" in lines
    assert "| cuTile coverage, launches | 55.00% | 66.20% |" in lines
    assert any(x.startswith("| cuTile throughput (tokens/s) | 50.00 (95% CI 49.") for x in lines)
    assert any(x.startswith("| PyTorch baseline throughput") for x in lines)
    assert any(x.startswith("| throughput ratio head/base |  | 1.000 (95% CI") for x in lines)
    assert "| cuTile TTFT (ms), median | 12.75, n=2 | 12.75, n=2 |" in lines
    assert any(x.startswith("| correctness | passed: rel err 4.00e-03") for x in lines)
    uncovered = [x for x in lines if x.startswith("| `k")]
    assert [x.split("`")[1] for x in uncovered] == ["k7", "k6", "k5", "k4", "k3"]
    assert "| Qwen3Attention |" in uncovered[0]
    assert "| tileiras | 13.4 | 13.4 |" in lines and "| driver | 580.65 | 580.65 |" in lines
    assert "<b>" not in body.split("<!-- tilegym-bot:record")[0]
    assert parse_record(body) == record
    assert parse_record(body.replace(MARKER, "")) is None
    assert parse_record(MARKER + "<!-- tilegym-bot:record {broken -->") is None


def test_comment_for_crash_without_metrics(make_metrics):
    base, head = make_metrics(commit="a" * 40), make_metrics(status="timeout")
    decision = decide(base, head)
    record = build_record(
        decision,
        model_key="qwen3",
        description="x",
        base_sha=None,
        head_sha="b" * 40,
        decided_at="t",
    )
    body = render_comment(decision, base, head, record)
    assert "verdict: **timeout**" in body and "| cuTile coverage, GPU time | 50.00% | n/a |" in body
    assert "| cuTile TTFT (ms), median | 12.75, n=2 | n/a |" in body
    assert "| cuTile throughput (tokens/s) | 50.00 (95% CI" in body and " | n/a |\n" in body


def test_plot_writes_a_png(tmp_path):
    rows = [
        LedgerRow("aaaaaaaa", 49.2, 53.4, "keep", "baseline"),
        LedgerRow("bbbbbbbb", 49.2, 52.0, "discard", "x"),
        LedgerRow("cccccccc", 0.0, 0.0, "crash", "y"),
        LedgerRow("dddddddd", 61.0, 55.0, "keep", "z"),
    ]
    out = plot_ledger(rows, tmp_path / "plots" / "qwen3.png", title="qwen3")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (800, 550)


def _record(decision, description="x"):
    return build_record(
        decision,
        model_key="qwen3",
        description=description,
        base_sha="a" * 40,
        head_sha="b" * 40,
        decided_at="t",
        pr=3,
    )


def test_untrusted_strings_are_inert_and_capped(make_metrics):
    base = make_metrics(commit="a" * 40)
    head = make_metrics(status="crash")
    head["error"] = "<script>x</script> @maintainers [see](http://x) " + "E" * 100_000
    head["env"]["torch"] = "2.11 | **bold** `code` <b>"
    base["coverage"]["kernels"] = [
        _kernel("evil`kernel|<b>@here" + "k" * 500, 50.0, module="[m](http://x) @team"),
    ]
    decision = decide(base, head)
    body = render_comment(decision, base, head, _record(decision, "<i>x</i> @you\n#1"))
    visible = body.split("<!-- tilegym-bot:record")[0]
    [kernel_row] = [line for line in visible.splitlines() if line.startswith("| `evil")]
    # A code span shows its text as is: no backtick may end it early, no pipe may split the cell.
    assert kernel_row.startswith("| `evil'kernel\\|<b>@here") and "…` |" in kernel_row
    assert "\\[m\\](http://x) @\u200bteam" in kernel_row
    visible = visible.replace(kernel_row, "")
    for raw in (
        "<script>",
        "<b>",
        "<i>",
        "@maintainers",
        "@team",
        "@here",
        "@you",
        "[see](",
        "[m](",
    ):
        assert raw not in visible, raw
    assert "&lt;script&gt;x&lt;/script&gt; @\u200bmaintainers \\[see\\](http://x)" in visible
    assert "| torch | 2.11.0 | 2.11 \\| \\*\\*bold\\*\\* \\`code\\` &lt;b&gt; |" in visible
    [reason] = [line for line in visible.splitlines() if line.startswith("- head benchmark")]
    assert len(reason) < 1600 and reason.endswith("…")  # 1500 characters, then escapes
    assert parse_record(body)["description"] == "<i>x</i> @you\n#1"


def test_the_body_fits_githubs_limit_and_keeps_its_record(make_metrics):
    many = tuple(f"reason {i}: " + "x" * 1400 for i in range(200))
    decision = Decision("discard", many)
    record = _record(decision)
    body = render_comment(decision, make_metrics(commit="a" * 40), make_metrics(), record)
    assert len(body.encode()) <= COMMENT_LIMIT
    assert body.startswith(MARKER + "\n## tilegym-bot verdict: **discard**")
    assert "comment cut to fit GitHub's size limit" in body
    assert parse_record(body) == record


def test_outcome_line_and_the_refusal_comment(make_metrics):
    base, head = make_metrics(commit="a" * 40), make_metrics(coverage=61.2)
    decision = decide(base, head)
    body = render_comment(decision, base, head, _record(decision), outcome="closed (discard).")
    assert body.splitlines()[5:7] == ["**Outcome:** closed (discard).", ""]
    findings = ["README.md:1: SCOPE001 outside the scope of a 'qwen3' experiment <b>"]
    record = {**_record(decision), "status": "refused", "final": False}
    refusal = render_refusal(findings, record, outcome="closed, nothing merged.")
    assert "## tilegym-bot verdict: **refused**" in refusal
    assert "- README.md:1: SCOPE001 outside the scope of a 'qwen3' experiment &lt;b&gt;" in refusal
    assert parse_record(refusal)["status"] == "refused"


def test_the_ttft_row_is_the_median_of_the_raw_samples_not_the_heads_summary(make_metrics):
    base, head = make_metrics(commit="a" * 40), make_metrics()
    head["cutile"]["ttft_ms"] = {"samples": [33.0, 82.4, 35.0], "mean": 1.0}
    base["cutile"]["ttft_ms"] = {"samples": [33.0, "fast"], "mean": 33.0}
    decision = decide(base, head)
    body = render_comment(decision, base, head, _record(decision))
    assert "| cuTile TTFT (ms), median | n/a | 35.00, n=3 |" in body


def test_a_throughput_interval_stays_positive(make_metrics):
    """Three samples spread 10-130 tok/s: the plain t interval of their mean reaches -83; the
    comment's interval is of a positive quantity and stays above zero (stored or recomputed)."""
    import re

    from tilegym_bot.stats import positive_mean_ci95

    samples = (10.0, 60.0, 130.0)
    base, head = make_metrics(commit="a" * 40), make_metrics(cutile=samples)
    head["cutile"]["throughput"]["ci95"] = [-83.21, 216.54]  # what a t interval gives
    decision = decide(base, head)
    record = build_record(
        decision,
        model_key="qwen3",
        description="noisy",
        base_sha="a" * 40,
        head_sha="b" * 40,
        decided_at="2026-11-29T18:00:00Z",
        pr=1,
    )
    (row,) = [x for x in render_comment(decision, base, head, record).splitlines()
              if x.startswith("| cuTile throughput (tokens/s)")]  # fmt: skip
    lo, hi = map(float, re.search(r"66\.67 \(95% CI ([\d.]+)–([\d.]+)\), n=3 \|$", row).groups())
    assert 0 < lo < 66.67 < hi
    assert (lo, hi) == pytest.approx(positive_mean_ci95(samples), abs=0.01)
    tight = positive_mean_ci95([50.0, 51.0, 49.0, 50.5, 49.5])  # little spread: the t interval
    assert tight == pytest.approx((49.02, 50.98), abs=0.02)
    assert positive_mean_ci95([50.0]) is None and positive_mean_ci95([50.0, -1.0]) is None
