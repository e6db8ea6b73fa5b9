"""The ``tilegym-inventory`` console script, run as a real subprocess."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import git
import pytest
from inventory_helpers import DEFINITION, FINDING_LINE, make_tree, model_dir

SCRIPT = Path(sys.executable).with_name("tilegym-inventory")


def run_cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    command = (
        [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "tilegym.kernel_inventory.cli"]
    )
    full_env = {k: v for k, v in os.environ.items() if k != "TILEGYM_SOURCE_REPOS"}
    full_env.update({"TILEGYM_CACHE_DIR": str(cwd / ".cache-tilegym"), **(env or {})})
    return subprocess.run(
        [*command, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=120
    )


def assert_clean_lines(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stdout + result.stderr
    for line in result.stdout.splitlines():
        assert FINDING_LINE.match(line), line
    for line in result.stderr.splitlines():
        assert line.startswith("error: "), line


def test_check_valid_tree_exits_zero(tmp_path):
    make_tree(tmp_path)
    result = run_cli("check", cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_check_reports_findings_for_bad_files(tmp_path):
    definition = copy.deepcopy(DEFINITION)
    definition["reference"] = "def run(gate, up):\n    return gate\n"
    make_tree(tmp_path, definition=definition)
    junk = model_dir(tmp_path) / "kernel_definitions" / "junk.json"
    junk.write_bytes(bytes(range(256)) * 4)
    result = run_cli("check", cwd=tmp_path)
    assert result.returncode == 1
    assert_clean_lines(result)
    assert [line.split(": ")[1].split()[0] for line in result.stdout.splitlines()] == [
        "INV003",
        "INV022",
        "INV031",
    ]


def test_check_one_path_relative_to_cwd(tmp_path):
    definition_path, _ = make_tree(tmp_path)
    result = run_cli("check", str(definition_path.relative_to(tmp_path)), cwd=tmp_path)
    assert result.returncode == 0
    missing = run_cli("check", "nope.json", cwd=tmp_path)
    assert missing.returncode == 1
    assert missing.stdout.startswith("nope.json:1: INV001 ")


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["frobnicate"],
        ["check", "--no-such-flag"],
        ["check", "--source-repo", "a/b=/tmp"],
        ["check", "--verify-sources", "--source-repo", "not-a-spec"],
        ["parity", "--shapes", "zero"],
    ],
)
def test_usage_errors_exit_two_with_one_line(tmp_path, args):
    (tmp_path / ".git").mkdir()
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("error: ")


def test_verify_sources_with_clone_from_flag_and_environment(tmp_path):
    upstream = tmp_path / "upstream"
    repo = git.Repo.init(upstream)
    (upstream / "m.py").write_text("def f():\n    return 1\n")
    repo.index.add(["m.py"])
    actor = git.Actor("T", "t@example.com")
    sha = repo.index.commit("m", author=actor, committer=actor).hexsha
    repo.close()
    definition = copy.deepcopy(DEFINITION)
    link = f"https://github.com/acme/models/blob/{sha}/m.py#L1-L2"
    bad = f"https://github.com/acme/models/blob/{sha}/m.py#L2-L9"
    definition["reference"] = f"# Source: {link}\n# Source: {bad}\ndef run(gate, up):\n    pass\n"
    root = tmp_path / "repo"
    make_tree(root, definition=definition)
    flag = run_cli(
        "check", "--verify-sources", "--source-repo", f"acme/models={upstream}", cwd=root
    )
    env = run_cli(
        "check",
        "--verify-sources",
        cwd=root,
        env={"TILEGYM_SOURCE_REPOS": f"acme/models={upstream}"},
    )
    for result in (flag, env):
        assert result.returncode == 1
        assert_clean_lines(result)
        assert "INV053" in result.stdout and "reference line 2" in result.stdout
    shutil.rmtree(upstream)
    gone = run_cli(
        "check", "--verify-sources", "--source-repo", f"acme/models={upstream}", cwd=root
    )
    assert gone.returncode == 1
    assert [line.split()[1] for line in gone.stdout.splitlines()] == ["INV050"]  # L1-L2 cached


def test_parity_on_cpu_and_missing_gpu(tmp_path):
    make_tree(tmp_path)
    result = run_cli("parity", "--device", "cpu", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (0, "")
    import torch

    if not torch.cuda.is_available():
        no_gpu = run_cli("parity", cwd=tmp_path)
        assert no_gpu.returncode == 1
        assert no_gpu.stderr.startswith("error: ") and len(no_gpu.stderr.splitlines()) == 1


def test_codes_table(tmp_path):
    result = run_cli("codes", cwd=tmp_path)
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0].startswith("INV001  ") and len(lines) >= 50
    assert len({line.split()[0] for line in lines}) == len(lines)


def test_compile_prints_one_progress_line_per_kernel_compiled_and_none_when_cached(tmp_path):
    from test_inventory_compile import ENTRY, GOOD_KERNEL, HEADER, SIGNATURES

    from tilegym.kernel_inventory.compile import toolchain_problem

    if toolchain_problem() is not None:
        pytest.skip(f"no cuTile compile toolchain: {toolchain_problem()}")
    make_tree(tmp_path, kernel_source=HEADER + GOOD_KERNEL + ENTRY + SIGNATURES)
    first = run_cli("compile", "--jobs", "1", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout == ""
    lines = first.stderr.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"aot compile {i}/3" for i in (1, 2, 3)]
    assert all(": ok in " in line and "mul_kernel for SM" in line for line in lines)
    again = run_cli("compile", "--jobs", "1", cwd=tmp_path)
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")
