"""The repository's pre-commit configuration, run by real ``pre-commit`` on a real repository.

pre-commit is started as ``<venv>/bin/pre-commit`` with a PATH that lacks the venv's bin/ and no
VIRTUAL_ENV, the way a git hook or ``.venv/bin/pre-commit run`` starts it: the hooks must still
find their tools (through hooks/tilegym_hooks/run_in_venv.sh and the repository's .venv).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from hookrepo_helpers import PREFIXES, clean_env

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = "hooks/tilegym_hooks/run_in_venv.sh"
VENV_BIN = Path(sys.executable).parent
BARE_PATH = "/usr/local/bin:/usr/bin:/bin"
WORKFLOW = """\
    name: ci
    on: [push]
    jobs:
      test:
        runs-on: ubuntu-latest
        steps:
          - run: bash .ci/run
    """


def bare_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in clean_env().items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    return {**env, "PATH": BARE_PATH, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"), **extra}


def install_config(repo) -> None:
    """Copy the configuration, the launcher and the ruff settings; link .venv to this venv."""
    for path in (".pre-commit-config.yaml", LAUNCHER, "pyproject.toml"):
        (repo.root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, repo.root / path)
    (repo.root / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    repo.write(".gitignore", ".venv\n")


def pre_commit(repo, tmp_path: Path) -> subprocess.CompletedProcess:
    # The inventory CLI has its own tests; this repository's toy kernels have no Solutions.
    env = bare_env(tmp_path, SKIP="tilegym-inventory-check,tilegym-inventory-compile")
    return subprocess.run(
        [str(VENV_BIN / "pre-commit"), "run", "--all-files", "--color", "never"],
        cwd=repo.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_pre_commit_passes_a_clean_experiment_and_rejects_planted_violations(hook_repo, tmp_path):
    hook_repo.checkout("main")
    install_config(hook_repo)
    hook_repo.write(".github/workflows/ci.yml", WORKFLOW)
    hook_repo.commit("pre-commit config")
    hook_repo.checkout("experiment/qwen3/x")
    hook_repo.repo.git.merge("-q", "main")
    hook_repo.replace(
        PREFIXES, "- qwen3_rms_norm_kernel", "- qwen3_rms_norm_kernel\n  - rope_kernel"
    )
    hook_repo.commit("allowed change")
    clean = pre_commit(hook_repo, tmp_path)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    hooks = ("experiment scope", "coverage prefixes", "sandbox holds", "ruff", "check", "GitHub")
    for hook in hooks:
        assert any(line.startswith(hook) and line.endswith("Passed") for line in
                   clean.stdout.splitlines()), (hook, clean.stdout)  # fmt: skip

    hook_repo.write("README.md", "# toy project\nout of scope\n")
    hook_repo.write(PREFIXES, "prefixes:\n  - qwen3_rms_norm_kernel\n  - rope_kernel\n  - aten\n")
    hook_repo.write("sandbox/qwen3_results.md", "| commit |\n")
    hook_repo.repo.git.add("-f", "sandbox/qwen3_results.md")
    hook_repo.write("bad.json", "{\n")
    hook_repo.write(".github/workflows/ci.yml", WORKFLOW.replace("steps:", "stepz:"))
    hook_repo.commit("violations")
    failed = pre_commit(hook_repo, tmp_path)
    assert failed.returncode == 1
    out = failed.stdout.splitlines()
    assert "README.md:2: SCOPE001 outside the scope of a 'qwen3' experiment" in out
    assert (
        f"{PREFIXES}:4: PREFIX005 prefix 'aten' names no @ct.kernel function under src/tilegym"
        in out
    )
    assert (
        "sandbox/qwen3_results.md:1: SANDBOX001 sandbox/ holds only scratch files: unstage it"
        in out
    )
    assert any(line.startswith("bad.json: Failed to json decode") for line in out), out
    assert any("('stepz' was unexpected)" in line for line in out), out
    assert "Traceback" not in failed.stdout + failed.stderr


def test_launcher_prefers_the_active_venv_and_says_when_no_tool_exists(hook_repo, tmp_path):
    install_config(hook_repo)
    (hook_repo.root / ".venv").unlink()
    launcher = ["bash", LAUNCHER, "tilegym-hooks", "sandbox"]
    active = subprocess.run(
        launcher, cwd=hook_repo.root, env=bare_env(tmp_path, VIRTUAL_ENV=sys.prefix),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (active.returncode, active.stdout, active.stderr) == (0, "", "")
    missing = subprocess.run(
        launcher, cwd=hook_repo.root, env=bare_env(tmp_path),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 1
    assert missing.stderr == (
        "error: tilegym-hooks not found: run scripts/setup.sh (creates .venv) or activate the "
        "project's environment\n"
    )


def test_config_and_manifest_validate_and_agree():
    for command, path in (
        ("validate-config", ".pre-commit-config.yaml"),
        ("validate-manifest", ".pre-commit-hooks.yaml"),
    ):
        result = subprocess.run(
            [str(VENV_BIN / "pre-commit"), command, str(ROOT / path)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    assert [repo["repo"] for repo in config["repos"]] == ["local"], "no network: local hooks only"
    local = {hook["id"]: hook for hook in config["repos"][0]["hooks"]}
    assert all(hook["entry"].startswith(f"bash {LAUNCHER} ") for hook in local.values())
    manifest = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    for hook in manifest:
        mine = local[hook["id"]]
        assert hook["language"] == "python"
        assert mine["entry"] == f"bash {LAUNCHER} {hook['entry']}"
        assert mine.get("files") == hook.get("files")
