"""``tilegym-hooks sandbox``: the index holds nothing under sandbox/ but README.md, .gitignore."""

from __future__ import annotations

from tilegym_hooks.sandbox_guard import sandbox_findings


def test_staged_sandbox_file_fails_and_unstaging_it_passes(hook_repo):
    result = hook_repo.run("sandbox")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    hook_repo.write("sandbox/qwen3_results.md", "| commit |\n")
    hook_repo.write("sandbox/qwen3/drafts/x.json", "{}\n")
    result = hook_repo.run("sandbox")
    assert (result.returncode, result.stdout) == (0, ""), "untracked scratch files are fine"
    hook_repo.repo.git.add("-f", "sandbox/qwen3_results.md", "sandbox/qwen3/drafts/x.json")
    result = hook_repo.run("sandbox", console_script=True)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "sandbox/qwen3/drafts/x.json:1: SANDBOX001 sandbox/ holds only scratch files: unstage it",
        "sandbox/qwen3_results.md:1: SANDBOX001 sandbox/ holds only scratch files: unstage it",
    ]
    hook_repo.repo.git.rm(
        "-q", "--cached", "sandbox/qwen3_results.md", "sandbox/qwen3/drafts/x.json"
    )
    result = hook_repo.run("sandbox")
    assert (result.returncode, result.stdout) == (0, "")


def test_committed_sandbox_file_fails_from_a_subdirectory(hook_repo):
    hook_repo.write("sandbox/notes.txt", "x\n")
    hook_repo.repo.git.add("-f", "sandbox/notes.txt")
    hook_repo.commit("oops")
    result = hook_repo.run("sandbox", "--repo-root", "src")
    assert (result.returncode, result.stdout) == (
        1,
        "sandbox/notes.txt:1: SANDBOX001 sandbox/ holds only scratch files: unstage it\n",
    )


def test_rule_on_plain_paths():
    paths = ["sandbox/README.md", "sandbox/.gitignore", "sandboxes/x", "src/sandbox/x", "sandbox/a"]
    assert [f.path for f in sandbox_findings(paths)] == ["sandbox/a"]
