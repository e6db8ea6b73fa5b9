"""The median experiment's replay (tilegym_bot.replay_mix, ``--mix``) on plain documents."""

from __future__ import annotations

import json
import statistics

import pytest
from tilegym_bot import replay as rp
from tilegym_bot import replay_mix as mix

QUIET_BASELINE = (25.0, 25.0, 25.0, 25.0, 25.0)
NOISY_CUTILE = (48.0, 52.5, 49.0, 51.5, 50.0)  # CV 3.6%


@pytest.fixture
def noisy(make_metrics):
    doc = make_metrics(cutile=NOISY_CUTILE, baseline=QUIET_BASELINE, interleaved=True)
    doc["wall_s"] = 60.0
    return rp.prepare(doc)


def _decision(ratio, **extra):
    return {"status": "keep", "throughput": {"ratio": ratio}, **extra}


def test_ratios_of_decisions_that_compared_two_measurements():
    docs = [
        _decision(1.25),
        _decision(None),  # a ledger's baseline row: nothing compared
        _decision(0.9, baseline=True),
        _decision(float("nan")),
        _decision(-1.0),
        {"status": "keep"},
        ["not", "a", "decision"],
        _decision(0.97),
    ]
    assert mix.experiment_ratios(docs) == [1.25, 0.97]


def test_fixed_scheme_seconds_count_the_reruns(noisy):
    result = rp.ReplayResult(1.0, 0.02, 10, 5, {"keep": 10}, {"keep": 7, "inconclusive": 3}, 3)
    cost = rp.cost_model(noisy)
    seconds = rp.fixed_trial_seconds(result, cost)
    assert len(seconds) == 10
    assert seconds.count(cost.pair_s(5)) == 7
    assert seconds.count(cost.pair_s(5) + cost.pair_s(10)) == 3


def test_clear_effects_take_one_pair_under_both_schemes(noisy):
    """A 30% gain or loss is decided by the first pair: the median is one pair either way."""
    result = mix.replay_mix(noisy, [1.3, 0.7], trials=10)
    pair = rp.cost_model(noisy).pair_s(5)
    assert set(result.sequential_s) == {pair} and set(result.fixed_s) == {pair}
    assert result.not_longer and result.median_sequential_s == pair


def test_hard_cases_take_longer_under_sequential_sampling(noisy):
    """At a neutral change the sequential sampler pays for its accuracy: the median is longer,
    and the bar says so."""
    result = mix.replay_mix(noisy, [1.0], trials=30, seed=1)
    assert len(result.sequential_s) == len(result.fixed_s) == 30
    assert statistics.median(result.sequential_s) > statistics.median(result.fixed_s)
    assert not result.not_longer


def test_no_ratios_is_an_error(noisy):
    with pytest.raises(rp.ReplayError, match="no experiment ratios"):
        mix.replay_mix(noisy, [], trials=3)


def test_cli_mix_section_and_check(replay_script, tmp_path, make_metrics, save_metrics, capsys):
    doc = make_metrics(cutile=NOISY_CUTILE, baseline=QUIET_BASELINE, interleaved=True)
    doc["wall_s"] = 60.0
    metrics = save_metrics(tmp_path / "noisy.json", doc)
    ledger = tmp_path / "loop" / "fam"
    ledger.mkdir(parents=True)
    for name, ratio in (("a", 1.3), ("b", 1.25), ("c", None)):
        (ledger / f"{name}.decision.json").write_text(json.dumps(_decision(ratio)))
    argv = [str(metrics), "--trials", "20", "--sequential", "--mix", str(tmp_path / "loop")]
    assert replay_script.main([*argv, "--mix-trials", "5"]) == 0
    out = capsys.readouterr().out
    assert "## The median experiment" in out
    assert "The 2 committed experiments' measured head/base throughput ratios" in out
    section = out.split("## The median experiment")[1]
    row = next(line for line in section.splitlines() if line.startswith(f"| `{metrics}` |"))
    assert row.startswith(f"| `{metrics}` | 2.0 (2.0) |") and row.endswith("| yes |")
    assert "the median experiment is longer" not in out

    (ledger / "d.decision.json").write_text(json.dumps(_decision(1.0)))
    for name in "ab":
        (ledger / f"{name}.decision.json").unlink()
    assert replay_script.main([*argv, "--mix-trials", "30", "--check"]) == 1
    out = capsys.readouterr().out
    assert "sequential: the median experiment is longer" in out
    section = out.split("## The median experiment")[1]
    row = next(line for line in section.splitlines() if line.startswith(f"| `{metrics}` |"))
    assert row.endswith("| no |")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--mix", "nowhere"], "error: --mix needs --sequential"),
        (["--sequential", "--mix", "nowhere"], "error: nowhere: no such file or directory"),
        (["--sequential", "--mix", "."], "error: .: no *.decision.json under it"),
        (
            ["--sequential", "--mix", "bad.decision.json"],
            "error: bad.decision.json: not a readable",
        ),
        (["--sequential", "--mix", "empty.decision.json"], "error: --mix: no decision with"),
    ],
)
def test_cli_mix_bad_input_is_one_error_line(
    replay_script, tmp_path, extra, message, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.decision.json").write_text("{not json")
    (tmp_path / "empty.decision.json").write_text(json.dumps(_decision(None)))
    if "." in extra:
        (tmp_path / "bad.decision.json").unlink()
        (tmp_path / "empty.decision.json").unlink()
    assert replay_script.main(["x.json", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err
