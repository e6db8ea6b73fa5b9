"""The decision replay (tilegym_bot.replay and scripts/replay_decisions.py) on plain documents."""

from __future__ import annotations

from pathlib import Path

import pytest
from tilegym_bot import policy
from tilegym_bot import replay as rp

ROOT = Path(__file__).resolve().parents[2]
QUIET_CUTILE = (50.0, 50.01, 49.99, 50.005, 49.995)  # CV 0.016%
QUIET_BASELINE = (25.0, 25.0, 25.0, 25.0, 25.0)
LOUD_CUTILE = (20.0, 80.0, 35.0, 65.0, 50.0)  # CV 47%


@pytest.fixture
def quiet(make_metrics):
    return make_metrics(cutile=QUIET_CUTILE, baseline=QUIET_BASELINE, interleaved=True)


@pytest.fixture
def loud(make_metrics):
    return make_metrics(cutile=LOUD_CUTILE, baseline=QUIET_BASELINE, interleaved=True)


def test_low_noise_slowdown_always_discarded_and_neutral_always_kept(quiet):
    p = rp.prepare(quiet)
    assert p.paired and p.runs == 5 and p.notes == ()
    slow = rp.replay(p, 0.95, trials=300)
    neutral = rp.replay(p, 1.0, trials=300)
    assert slow.final == {"discard": 300} and slow.reruns == 0
    assert neutral.final == {"keep": 300}
    assert slow.rate("keep").below(rp.TARGET_SLOWDOWN_KEPT)
    assert neutral.rate("discard").below(rp.TARGET_NEUTRAL_DISCARDED)


@pytest.mark.slow
def test_huge_noise_is_reported_not_hidden(loud):
    p = rp.prepare(loud)
    assert p.cv_statistic == pytest.approx(rp.cv(list(LOUD_CUTILE)))
    neutral = rp.replay(p, 1.0, trials=400, seed=3)
    slow = rp.replay(p, 0.95, trials=400, seed=3)
    discarded = neutral.rate("discard")
    assert discarded.count == neutral.final.get("discard", 0)
    assert 0.05 < discarded.rate < 0.6
    lo, hi = discarded.ci95
    assert lo < discarded.rate < hi
    # most slowdowns look like noise: kept far above the target, and the report says so
    assert slow.rate("keep").rate > 0.2 and not slow.rate("keep").below(rp.TARGET_SLOWDOWN_KEPT)
    # the rerun path: first-round doubts are redrawn and end as keep or discard, never open
    assert neutral.reruns == neutral.first["inconclusive"] > 0
    assert "inconclusive" not in neutral.final
    assert sum(neutral.final.values()) == neutral.trials == 400
    assert neutral.final["discard"] > neutral.first.get("discard", 0)


def test_only_the_throughput_rule_decides(quiet):
    p = rp.prepare(quiet)
    decision = policy.decide(p.base, p.head)
    assert any(r.startswith("throughput ratio head/base") for r in decision.reasons)
    assert decision.gpu_ms_head == pytest.approx(decision.gpu_ms_base, rel=1e-12)
    assert decision.non_cutile_ms_head < decision.non_cutile_ms_base
    assert decision.coverage_delta_pp == pytest.approx(rp.COVERAGE_NUDGE_PP, abs=1e-3)
    # the same code twice, as measured, is a coverage discard by design
    assert p.identical.status == "discard" and "no gain" in p.identical.reasons[0]
    assert quiet["coverage"]["gpu_time_pct"] == 50.0  # the input is not changed


def test_the_real_policy_is_asked(quiet, monkeypatch):
    calls = []

    def always_discard(base, head, **kw):
        calls.append(kw)
        return policy.Decision("discard", ("stub",))

    p = rp.prepare(quiet)
    monkeypatch.setattr(policy, "decide", always_discard)
    assert rp.replay(p, 1.0, trials=50, margin=0.03).final == {"discard": 50}
    assert calls and all(c["margin"] == 0.03 for c in calls)


def test_a_file_without_the_cutile_side_replays_the_baseline_against_itself(make_metrics):
    doc = make_metrics(cutile=None, coverage=None, passed=None, baseline=QUIET_CUTILE)
    p = rp.prepare(doc)
    assert not p.paired and p.cv_cutile is None
    assert p.cv_baseline == pytest.approx(rp.cv(list(QUIET_CUTILE)))
    assert [n.split(":")[0] for n in p.notes] == [
        "cuTile side not measured",
        "coverage not measured",
        "cuTile correctness not measured",
    ]
    assert rp.replay(p, 0.95, trials=100).final == {"discard": 100}
    assert rp.replay(p, 1.0, trials=100).final == {"keep": 100}


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"gpu": None}, "without a CUDA GPU"),
        ({"status": "crash"}, "ended with crash"),
        ({"coverage": 100.0}, "no cuTile kernel or no non-cuTile kernel"),
    ],
)
def test_unreplayable_documents_say_why(make_metrics, kw, message):
    with pytest.raises(rp.ReplayError, match=message):
        rp.prepare(make_metrics(interleaved=True, **kw))


@pytest.mark.slow
def test_seeded_and_runs_override(loud):
    p = rp.prepare(loud)
    assert rp.replay(p, 1.0, trials=200, seed=7) == rp.replay(p, 1.0, trials=200, seed=7)
    more = rp.replay(p, 1.0, trials=200, seed=7, runs=40)
    assert more.runs == 40
    assert more.rate("discard").rate < rp.replay(p, 1.0, trials=200, seed=7).rate("discard").rate
    with pytest.raises(ValueError, match="factor"):
        rp.replay(p, 0.0)


def test_wilson_interval():
    lo, hi = rp.wilson(0, 2000)
    assert lo == 0.0 and hi == pytest.approx(0.00192, abs=1e-5)
    lo, hi = rp.wilson(50, 100)
    assert lo == pytest.approx(1 - hi) and lo == pytest.approx(0.4038, abs=1e-4)
    assert rp.wilson(7, 7)[1] == 1.0
    with pytest.raises(ValueError):
        rp.wilson(3, 2)


def test_margin_window_from_cv():
    lo, hi = rp.margin_window(0.009, 5)  # the static PyTorch measurement
    assert lo < policy.DEFAULT_MARGIN < hi
    lo, hi = rp.margin_window(0.0731, 3)  # eager qwen3, 3 runs: nothing works
    assert lo > hi
    need = rp.runs_needed(0.0731)
    assert rp.margin_window(0.0731, need)[0] <= rp.margin_window(0.0731, need)[1]
    assert rp.margin_window(0.0731, need - 1)[0] > rp.margin_window(0.0731, need - 1)[1]


def test_cli_reports_and_checks(replay_script, tmp_path, quiet, loud, save_metrics, capsys):
    script = replay_script
    good = save_metrics(tmp_path / "quiet.json", quiet)
    bad = save_metrics(tmp_path / "loud.json", loud)
    assert script.main([str(good), "--trials", "100", "--check"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Decision replay")
    assert f"Command: `python scripts/replay_decisions.py {good} --trials 100 --check`" in out
    row = next(line for line in out.splitlines() if line.startswith(f"| `{good}`"))
    assert "| 0.0% [0.0%, 3.7%] | 0.0% [0.0%, 3.7%] |" in row
    assert row.endswith("| pass |")

    assert script.main([str(bad), "--trials", "40"]) == 0
    assert "FAIL: slowdown kept" in capsys.readouterr().out
    assert script.main([str(bad), "--trials", "40", "--check"]) == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing.json"], "error: missing.json: No such file or directory"),
        (["README.md"], "error: README.md: not JSON"),
        (["x.json", "--margins", "0.02,1.5"], "error: argument --margins: a margin must be in"),
        (["x.json", "--trials", "0"], "error: argument --trials: must be at least 1"),
    ],
)
def test_cli_bad_input_is_one_error_line(replay_script, args, message, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    script = replay_script
    try:
        rc = script.main(args)
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith(message) and err.count("\n") == 1, err


def test_cli_refuses_a_file_it_cannot_replay(
    replay_script, tmp_path, make_metrics, save_metrics, capsys
):
    path = save_metrics(tmp_path / "cpu.json", make_metrics(gpu=None))
    assert replay_script.main([str(path)]) == 2
    assert capsys.readouterr().err == f"error: {path}: measured without a CUDA GPU: " + (
        "the decision cannot reach its rule 9\n"
    )


def test_sequential_replay_quiet_stops_after_one_pair(quiet):
    """Quiet runs: every CI is decisive on the first pair, in the modelled time of one pair."""
    p = rp.prepare(quiet)
    slow = rp.replay_sequential(p, 0.95, trials=40)
    neutral = rp.replay_sequential(p, 1.0, trials=40)
    assert slow.final == {"discard": 40} and set(slow.pairs) == {1}
    assert neutral.final == {"keep": 40} and neutral.stopped == {"decisive-not-slower": 40}
    assert set(neutral.seconds) == {slow.cost.pair_s(5)}
    assert slow.cost.job_s(5) == pytest.approx(120.0)  # the file's wall_s at its 5 runs


def test_sequential_replay_noisy_adds_pairs_within_the_budget(make_metrics):
    noisy = make_metrics(
        cutile=(48.0, 52.5, 49.0, 51.5, 50.0), baseline=QUIET_BASELINE, interleaved=True
    )
    noisy["wall_s"] = 60.0
    p = rp.prepare(noisy)
    result = rp.replay_sequential(p, 1.0, trials=30, seed=1, budget_s=900.0)
    assert max(result.pairs) > 1
    assert all(s <= 900.0 for s in result.seconds)
    assert sum(result.final.values()) == 30
