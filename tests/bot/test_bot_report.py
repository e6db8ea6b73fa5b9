"""The PR comment (verdict first, tables, uncovered kernels, env, embedded record) and the plot."""

from __future__ import annotations

import struct

from tilegym_bot.ledger import LedgerRow
from tilegym_bot.plot import plot_ledger
from tilegym_bot.policy import decide
from tilegym_bot.report import MARKER, build_record, parse_record, render_comment


def _kernel(name, gpu_ms, cutile=False, module="Qwen3Attention"):
    return {"name": name, "calls": 10, "gpu_ms": gpu_ms, "cutile": cutile, "module": module}


def test_comment_layout_and_record_roundtrip(make_metrics):
    kernels = [_kernel(f"k{i}", float(i)) for i in range(1, 8)] + [_kernel("ct", 99.0, True)]
    base = make_metrics(commit="a" * 40)
    head = make_metrics(coverage=61.2, kernels=kernels)
    decision = decide(base, head)
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
    assert lines[5].startswith("- coverage 50.00% → 61.20%")
    assert "| cuTile coverage, GPU time | 50.00% | 61.20% |" in lines
    assert "| cuTile coverage, launches | 55.00% | 66.20% |" in lines
    assert any(x.startswith("| cuTile throughput (tokens/s) | 50.00 (95% CI 49.") for x in lines)
    assert any(x.startswith("| PyTorch baseline throughput") for x in lines)
    assert any(x.startswith("| throughput ratio head/base |  | 1.000 (95% CI") for x in lines)
    assert any(x.startswith("| cuTile TTFT (ms) | 12.75 | 12.75 |") for x in lines)
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
    assert "verdict: **timeout**" in body and "| cuTile coverage, GPU time | 50.00% | — |" in body


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
