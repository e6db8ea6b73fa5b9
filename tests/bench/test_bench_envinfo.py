"""Commit and environment fingerprint from a real git repository and the installed packages."""

import git
import pytest
from tilegym_hf_bench import envinfo
from tilegym_hf_bench.envinfo import ENV_KEYS, CommitError, resolve_commit, static_env


def test_commit_of_the_checkout_and_its_dirty_flag(tmp_path):
    repo = git.Repo.init(tmp_path)
    (tmp_path / "a.txt").write_text("one\n")
    repo.index.add(["a.txt"])
    sha = repo.index.commit("first").hexsha
    sub = tmp_path / "deep" / "dir"
    sub.mkdir(parents=True)
    assert resolve_commit(None, start=sub) == (sha, False)
    (tmp_path / "a.txt").write_text("two\n")
    assert resolve_commit(None, start=sub) == (sha, True)
    assert resolve_commit("f" * 40, start=sub) == ("f" * 40, False)


def test_no_checkout_asks_for_commit(tmp_path):
    with pytest.raises(CommitError, match="pass --commit"):
        resolve_commit(None, start=tmp_path)
    git.Repo.init(tmp_path / "empty")
    with pytest.raises(CommitError, match="pass --commit"):
        resolve_commit(None, start=tmp_path / "empty")


def test_static_env_without_torch_import():
    env = static_env()
    assert tuple(env) == ENV_KEYS
    assert env["gpu_name"] is None and env["python"] and env["transformers"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "tileiras: NVIDIA (R) Tile IR compiler\nBuild local\n"
            "Cuda compilation tools, release 13.4, V13.4.92\n",
            "13.4.92",
        ),
        (
            "ptxas: NVIDIA (R) Ptx optimizing assembler\nCuda compilation tools, release 13.3\n",
            "13.3",
        ),
        ("no version here", None),
    ],
)
def test_tool_version_is_the_number_not_the_banner(text, expected):
    assert envinfo.parse_tool_version(text) == expected
