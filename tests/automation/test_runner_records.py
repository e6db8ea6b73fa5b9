"""Pure parts of the runner: exit-to-status rules, synthesized metrics, the artifact checks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tilegym_bot.runner.artifact import check_artifact, check_pr_record
from tilegym_bot.runner.base import BenchRequest, classify, flag_value, synthesize_metrics
from tilegym_bot.runner.cli import main
from tilegym_hf_bench.metrics_schema import validation_errors

BASE, HEAD = "b" * 40, "c" * 40


def metrics_for(sha: str, status: str = "ok") -> dict:
    req = BenchRequest(
        Path("."), sha, ["--model-key", "qwen3", "--batch-size", "4"], Path("m"), Path(".")
    )
    doc = synthesize_metrics(req, status, "", "2026-01-01T00:00:00+00:00", 12.5)
    return dict(doc, error=None) if status == "ok" else doc


def test_synthesized_metrics_are_schema_valid_and_keep_the_request():
    req = BenchRequest(
        Path("."), HEAD, ["--model-key=llama", "--model-id", "meta/x", "--input-length", "64"],
        Path("m"), Path("."), gpu_uuid="GPU-1",
    )  # fmt: skip
    doc = synthesize_metrics(req, "timeout", "too slow", "2026-01-01T00:00:00+00:00", 901.0)
    assert validation_errors(doc) == []
    assert (doc["model_key"], doc["model_id"], doc["weights"]) == ("llama", "meta/x", "pretrained")
    assert doc["workload"]["input_length"] == 64 and doc["env"]["gpu_uuid"] == "GPU-1"
    assert doc["cutile"] is None and doc["coverage"] is None and doc["error"] == "too slow"


def test_flag_values_in_both_spellings():
    assert flag_value(["--a", "1", "--b=2", "--a=3"], "--a") == "3"
    assert flag_value(["--b=2"], "--b") == "2" and flag_value(["--a"], "--a") is None


@pytest.mark.parametrize(
    ("rc", "timed_out", "doc", "problem", "expect"),
    [
        (None, True, {"status": "ok", "error": None}, None, ("timeout", True)),
        (0, False, {"status": "ok", "error": None}, None, ("ok", False)),
        (1, False, {"status": "crash", "error": "OOM"}, None, ("crash", False)),
        (0, False, None, "no metrics file was written", ("crash", True)),
        (-11, False, None, "no metrics file was written", ("crash", True)),
    ],
)
def test_classify(rc, timed_out, doc, problem, expect):
    status, error, synth = classify(rc, timed_out, doc, problem, 900.0, "last line")
    assert (status, synth) == expect
    if rc == -11:
        assert error.startswith("benchmark was killed by SIGSEGV and no metrics file was written")
    if synth:
        assert error.endswith("stderr tail:\nlast line")


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"pr": 3, "base_sha": BASE}, "exactly pr, base_sha, head_sha"),
        ({"pr": "3", "base_sha": BASE, "head_sha": HEAD}, "pr must be a positive integer"),
        ({"pr": True, "base_sha": BASE, "head_sha": HEAD}, "pr must be a positive integer"),
        ({"pr": 3, "base_sha": BASE, "head_sha": "HEAD"}, "head_sha must be 40"),
    ],
)
def test_pr_record_shape(doc, message):
    [finding] = check_pr_record(doc, "pr.json")
    assert message in str(finding) and str(finding).startswith("pr.json:1: ART002 ")


def write_artifact(folder: Path, base: dict | str, head: dict | str | None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pr.json").write_text(json.dumps({"pr": 7, "base_sha": BASE, "head_sha": HEAD}))
    for name, doc in (("base.json", base), ("head.json", head)):
        if doc is not None:
            (folder / name).write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return folder


def test_a_sound_artifact_yields_the_pr_record(tmp_path, capsys):
    folder = write_artifact(tmp_path / "a", metrics_for(BASE), metrics_for(HEAD, "crash"))
    record, findings = check_artifact(folder, HEAD)
    assert findings == [] and record == {"pr": 7, "base_sha": BASE, "head_sha": HEAD}
    out = tmp_path / "gh_output"
    args = ["runner", "check-artifact", str(folder), "--expect-head-sha", HEAD]
    assert main([*args, "--github-output", str(out)]) == 0
    assert out.read_text() == f"pr=7\nbase_sha={BASE}\nhead_sha={HEAD}\n"


@pytest.mark.parametrize(
    ("base", "head", "expect_head", "code"),
    [
        (HEAD, HEAD, HEAD, "ART004"),  # the base file describes another commit
        (BASE, {"schema": "x"}, HEAD, "ART003"),
        (BASE, "{oops", HEAD, "ART001"),
        (BASE, None, HEAD, "ART001"),
        (BASE, HEAD, "d" * 40, "ART004"),  # not the head GitHub says was benchmarked
    ],
)
def test_unsound_artifacts_are_refused_with_findings(
    tmp_path, capsys, base, head, expect_head, code
):
    def doc(value):
        return metrics_for(value) if value in (BASE, HEAD) else value

    folder = write_artifact(tmp_path / "a", doc(base), doc(head))
    record, findings = check_artifact(folder, expect_head)
    assert record is None and {f.code for f in findings} == {code}
    assert main(["runner", "check-artifact", str(folder), "--expect-head-sha", expect_head]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(re.match(r"^\S+:1: ART00\d ", line) for line in lines)


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--expect-base-sha", "c" * 40, f"base_sha {BASE} is not the benchmarked run's {'c' * 40}"),
        ("--expect-pr", "8", "pr 7 is not the benchmarked run's 8"),
    ],
)
def test_pr_json_must_name_the_base_and_pr_the_api_gives(tmp_path, capsys, flag, value, message):
    folder = write_artifact(tmp_path / "a", metrics_for(BASE), metrics_for(HEAD))
    args = ["runner", "check-artifact", str(folder), "--expect-head-sha", HEAD]
    assert main([*args, flag, value]) == 1
    [line] = capsys.readouterr().out.splitlines()
    assert line.endswith(f"pr.json:1: ART004 {message}")
    assert main([*args, flag, BASE if "sha" in flag else "7"]) == 0


def test_bench_usage_errors_are_one_line(tmp_path, capsys):
    out = str(tmp_path / "m.json")
    assert main(["runner", "bench", "--repo", str(tmp_path), "--metrics-out", out]) == 2
    assert capsys.readouterr().err.startswith("error: no benchmark arguments")
    args = [
        "runner",
        "bench",
        "--executor",
        "docker",
        "--metrics-out",
        out,
        "--",
        "--model-key",
        "x",
    ]
    assert main(args) == 2
    assert capsys.readouterr().err == "error: --image is required with --executor docker\n"
    assert main(["runner", "bench", "--repo", str(tmp_path), "--metrics-out", out, "--", "-x"]) == 2
    assert capsys.readouterr().err.startswith(f"error: cannot read HEAD of {tmp_path}")


# ---- sequential sampling: several pairs ---------------------------------------------------------
def write_pairs(folder: Path, pairs: int, record: dict | None = None) -> Path:
    """An artifact of ``pairs`` whole pairs, ``pr.json`` announcing them with a 900 s budget."""
    write_artifact(folder, metrics_for(BASE), metrics_for(HEAD))
    pr = {
        "pr": 7,
        "base_sha": BASE,
        "head_sha": HEAD,
        "pairs": pairs,
        "budget_s": 900,
        **(record or {}),
    }
    (folder / "pr.json").write_text(json.dumps(pr))
    for k in range(2, pairs + 1):
        (folder / f"base-{k}.json").write_text(json.dumps(metrics_for(BASE)))
        (folder / f"head-{k}.json").write_text(json.dumps(metrics_for(HEAD)))
    return folder


def test_a_sound_multi_pair_artifact_yields_the_pr_record(tmp_path):
    folder = write_pairs(tmp_path / "a", 3)
    record, findings = check_artifact(folder, HEAD, expect_model_key="qwen3")
    assert findings == [] and (record["pairs"], record["budget_s"]) == (3, 900)
    assert main(["runner", "check-artifact", str(folder), "--expect-head-sha", HEAD]) == 0


def _findings(folder: Path, capsys, *extra: str) -> list[str]:
    capsys.readouterr()
    assert main(["runner", "check-artifact", str(folder), "--expect-head-sha", HEAD, *extra]) == 1
    return capsys.readouterr().out.splitlines()


def test_a_missing_half_of_a_pair_is_refused(tmp_path, capsys):
    folder = write_pairs(tmp_path / "a", 3)
    (folder / "head-2.json").unlink()
    [line] = _findings(folder, capsys)
    assert (
        line
        == f"{folder}/head-2.json:1: ART001 missing from the artifact: pair 2 of 3 is not whole"
    )


def test_a_later_pair_of_another_commit_is_refused(tmp_path, capsys):
    folder = write_pairs(tmp_path / "a", 2)
    (folder / "base-2.json").write_text(json.dumps(metrics_for(HEAD)))
    [line] = _findings(folder, capsys)
    assert line == f"{folder}/base-2.json:1: ART004 is for {HEAD}, expected {BASE}"


@pytest.mark.parametrize(
    ("pairs", "files", "message"),
    [
        (2, 3, "base-3.json:1: ART005 is not one of the 2 pair(s) pr.json announces"),
        (3, 2, "base-3.json:1: ART001 missing from the artifact: pair 3 of 3 is not whole"),
    ],
)
def test_a_pair_count_that_is_not_the_files_is_refused(tmp_path, capsys, pairs, files, message):
    folder = write_pairs(tmp_path / "a", files, {"pairs": pairs})
    lines = _findings(folder, capsys)
    assert lines[0] == f"{folder}/{message}", lines
    assert all(re.match(r"^\S+:1: ART00[15] ", line) for line in lines)


def test_a_stray_pair_file_without_pairs_is_refused(tmp_path, capsys):
    folder = write_artifact(tmp_path / "a", metrics_for(BASE), metrics_for(HEAD))
    (folder / "head-2.json").write_text(json.dumps(metrics_for(HEAD)))
    [line] = _findings(folder, capsys)
    assert line.endswith("head-2.json:1: ART005 is not one of the 1 pair(s) pr.json announces")


def test_pairs_of_another_model_key_are_refused(tmp_path, capsys):
    folder = write_pairs(tmp_path / "a", 2)
    other = dict(metrics_for(HEAD), model_key="llama")
    (folder / "head-2.json").write_text(json.dumps(other))
    [line] = _findings(folder, capsys)
    assert line == f"{folder}/head-2.json:1: ART006 is of model 'llama', expected 'qwen3'"
    lines = _findings(write_pairs(tmp_path / "b", 1), capsys, "--expect-model-key", "llama")
    assert [line.split("/")[-1] for line in lines] == [
        f"{name}.json:1: ART006 is of model 'qwen3', expected 'llama'" for name in ("base", "head")
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"pairs": 0}, "pairs must be an integer 1..8"),
        ({"pairs": 9}, "pairs must be an integer 1..8"),
        ({"pairs": True}, "pairs must be an integer 1..8"),
        ({"budget_s": -1}, "budget_s must be a finite number >= 0"),
        ({"budget_s": "900"}, "budget_s must be a finite number >= 0"),
        ({"pairs": 2, "budget_s": 0}, "2 pairs with budget_s 0: the fixed scheme is one"),
        (
            {"sampling": {}},
            "must be an object with exactly pr, base_sha, head_sha (and optionally pairs, "
            "budget_s)",
        ),
    ],
)
def test_pr_record_sampling_fields(extra, message):
    doc = {"pr": 3, "base_sha": BASE, "head_sha": HEAD, "pairs": 1, "budget_s": 900, **extra}
    [finding] = check_pr_record(doc, "pr.json")
    assert str(finding) == f"pr.json:1: ART002 {message}"
