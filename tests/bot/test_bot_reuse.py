"""Reusing a stored benchmark of main's tree as the base: the matching rule on plain documents,
and the loop on a real temporary repository (a small bench committed in it stands in for
tilegym-hf-bench, as in test_bot_local_loop)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import LOOP_MODEL_DIR
from test_bot_local_loop import BENCH_TEMPLATE, _cli, _commit, _ledger, _records, _with_bench
from tilegym_bot.reuse import RunIndex, find_reusable, match_reason


def _set(doc, keys, value):
    for key in keys[:-1]:
        doc = doc[key]
    doc[keys[-1]] = value


@pytest.mark.parametrize(
    ("keys", "value", "reason"),
    [
        (("status",), "crash", "not a successful run"),
        (("correctness", "passed"), False, "correctness did not pass"),
        (("coverage",), None, "no coverage"),
        (("cutile",), None, "no cuTile throughput"),
        (("model_key",), "llama", "model key differs"),
        (("workload", "timed_runs"), 10, "workload differs"),
        (("env", "gpu_name"), "NVIDIA H100", "GPU differs"),
        (("env", "torch"), "2.12.0", "env.torch differs"),
        (("env", "cuda_tile"), "1.8.0", "env.cuda_tile differs"),
        (("weights",), "pretrained", "weights differs"),
    ],
)
def test_match_reason_names_the_first_difference(make_metrics, keys, value, reason):
    head = make_metrics()
    candidate = make_metrics(commit="c" * 40)
    assert match_reason(candidate, head) is None
    _set(candidate, keys, value)
    assert reason in match_reason(candidate, head)


def test_find_reusable_takes_the_newest_matching_run_of_the_tree(tmp_path, make_metrics):
    runs = tmp_path / "runs"
    index = RunIndex(tmp_path / "state" / "runs.json", runs)
    trees = {"1" * 40: "tree-main", "2" * 40: "tree-main", "3" * 40: "tree-other"}

    def store(name, **kw):
        doc = make_metrics(**kw)
        path = runs / name / "metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(doc))
        index.record(path)
        return path, doc

    store("old", commit="1" * 40)
    newer = runs / "newer" / "metrics.json"
    newer.parent.mkdir(parents=True)
    newer.write_text(json.dumps({**make_metrics(commit="2" * 40), "started_at": "2026-11-29T19Z"}))
    index.record(newer)
    store("other-tree", commit="3" * 40)
    store("crashed", commit="1" * 40, status="crash")
    (runs / "garbage").mkdir()
    (runs / "garbage" / "metrics.json").write_text("{not json")
    index.record(runs / "garbage" / "metrics.json")
    head = make_metrics(commit="4" * 40)
    found = find_reusable(index, tree="tree-main", head=head, tree_of=trees.get)
    assert found is not None and found[0] == newer
    assert find_reusable(index, tree="tree-main", head=head, tree_of=trees.get, exclude=[newer])[
        0
    ] == (runs / "old" / "metrics.json")
    assert find_reusable(index, tree="tree-none", head=head, tree_of=trees.get) is None


def test_a_run_the_bot_did_not_record_is_never_reused(tmp_path, make_metrics):
    """The benchmarked code can write sandbox/runs/: a planted or edited metrics file there is
    not in the bot's index (outside the work tree) with its hash, so it is never a base."""
    runs = tmp_path / "runs"
    index = RunIndex(tmp_path / "state" / "runs.json", runs)
    trees = {"1" * 40: "tree-main"}
    head = make_metrics(commit="4" * 40)
    planted = runs / "planted" / "metrics.json"
    planted.parent.mkdir(parents=True)
    planted.write_text(json.dumps(make_metrics(commit="1" * 40)))
    assert find_reusable(index, tree="tree-main", head=head, tree_of=trees.get) is None
    recorded = runs / "recorded" / "metrics.json"
    recorded.parent.mkdir(parents=True)
    recorded.write_text(json.dumps(make_metrics(commit="1" * 40)))
    index.record(recorded)
    assert find_reusable(index, tree="tree-main", head=head, tree_of=trees.get)[0] == recorded
    worse = make_metrics(commit="1" * 40, cutile=(10.0, 10.5))
    recorded.write_text(json.dumps(worse))  # edited after the bot recorded it
    assert find_reusable(index, tree="tree-main", head=head, tree_of=trees.get) is None


def _run(r, capsys, *extra):
    capsys.readouterr()
    code = _cli(r, "experiment", "run", "--description", "x", *extra, "--", "--device", "cpu")
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out), out.err


def test_loop_benchmarks_only_the_head_when_mains_tree_was_measured(repo, make_metrics, capsys):
    r = repo
    runs = Path(r.working_tree_dir) / "sandbox" / "runs"
    _with_bench(r, make_metrics(coverage=50.0))
    main0 = r.git.rev_parse("main")
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "baseline")
    _run(r, capsys)
    assert _cli(r, "experiment", "advance") == 0

    # main did not move since the baseline measured it: only the head is benchmarked
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "k1")
    head1 = _commit(r, {BENCH_TEMPLATE: json.dumps(make_metrics(coverage=60.0))}, "k1")
    decision, err = _run(r, capsys)
    assert decision["status"] == "keep"
    assert f"base: reused sandbox/runs/qwen3-baseline-{main0[:8]}-head/metrics.json" in err
    assert not any(p.name.endswith("-base") for p in runs.iterdir())
    assert _records(r)[-1]["base_reused_from"].endswith(f"baseline-{main0[:8]}-head/metrics.json")
    assert "| measured commit | " + main0[:8] in _records(r)[-1]["comment"]
    assert _cli(r, "experiment", "advance") == 0

    # main is now a merge commit whose tree is head1's: head1's run stands in for it
    main1 = r.git.rev_parse("main")
    assert main1 != head1 and r.git.rev_parse(f"{main1}^{{tree}}") == r.git.rev_parse(
        f"{head1}^{{tree}}"
    )
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "k2")
    _commit(r, {BENCH_TEMPLATE: json.dumps(make_metrics(coverage=55.0))}, "k2")
    decision, err = _run(r, capsys)
    assert decision["status"] == "discard" and decision["coverage"]["base"] == 60.0
    assert f"qwen3-k1-{head1[:8]}-head/metrics.json" in err
    assert _cli(r, "experiment", "advance") == 0

    # --fresh-base benchmarks main although a reusable run exists
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "k3")
    head3 = _commit(r, {BENCH_TEMPLATE: json.dumps(make_metrics(coverage=70.0))}, "k3")
    decision, err = _run(r, capsys, "--fresh-base")
    assert decision["status"] == "keep" and "reused" not in err
    assert (runs / f"qwen3-k3-{main1[:8]}-base" / "metrics.json").is_file()
    assert [row.status for row in _ledger(r)] == ["keep", "keep", "discard", "keep"]
    row = _ledger(r)[-1]
    assert (row.commit, row.coverage, row.status, row.description) == (head3[:8], 70.0, "keep", "x")
    assert row.throughput == pytest.approx(50.0, abs=1.0)  # the pooled runs of every pair


def test_metrics_file_of_an_equal_tree_is_accepted_as_base(
    repo, tmp_path, make_metrics, save_metrics, capsys
):
    r = repo
    main0 = r.git.rev_parse("main")
    r.git.commit("--allow-empty", "-qm", "empty: same tree as main")
    twin = r.git.rev_parse("HEAD")
    r.git.reset("--hard", main0)
    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "eq")
    head = _commit(r, {f"{LOOP_MODEL_DIR}/kernels/x.py": "X = 1\n"}, "change")
    base_file = save_metrics(tmp_path / "b.json", make_metrics(commit=twin))
    head_file = save_metrics(tmp_path / "h.json", make_metrics(commit=head, coverage=60.0))
    args = ["--base-metrics", str(base_file), "--head-metrics", str(head_file)]
    assert _cli(r, "experiment", "run", "--description", "eq", *args) == 0
    assert _cli(r, "experiment", "advance") == 0

    _cli(r, "experiment", "start", "--model-key", "qwen3", "--name", "eq2")
    head2 = _commit(r, {f"{LOOP_MODEL_DIR}/kernels/y.py": "Y = 1\n"}, "another change")
    head_file = save_metrics(tmp_path / "h2.json", make_metrics(commit=head2, coverage=70.0))
    capsys.readouterr()
    args = ["--base-metrics", str(base_file), "--head-metrics", str(head_file)]
    assert _cli(r, "experiment", "run", "--description", "eq2", *args) == 1
    err = capsys.readouterr().err
    assert f"metrics are of commit {twin[:8]}" in err and "(a different tree)" in err
