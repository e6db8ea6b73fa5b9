"""``tilegym-bot doctor``: pure rules on plain facts, then real runs on this machine."""

from __future__ import annotations

import git
import pytest
from docker_api_fake import FakeEngine
from tilegym_bot.doctor import (
    Facts,
    Gpu,
    Tool,
    check_git,
    check_gpu,
    check_profilers,
    check_toolchain,
    evaluate,
    exit_code,
    main,
    parse_release,
)

H200 = Gpu("GPU-0b1c2d3e-aaaa-bbbb-cccc-000000000001", "NVIDIA H200", "9.0", "580.65")
B200 = Gpu("GPU-0b1c2d3e-aaaa-bbbb-cccc-000000000002", "NVIDIA B200", "10.0", "580.65")
T4 = Gpu("GPU-0b1c2d3e-aaaa-bbbb-cccc-000000000003", "Tesla T4", "7.5", "580.65")


def tools(tileiras="13.4", ptxas="13.4"):
    return Facts(tileiras=Tool("/x/tileiras", tileiras), ptxas=Tool("/x/ptxas", ptxas))


def test_release_is_read_from_both_tools_version_text():
    tileiras = "tileiras: NVIDIA (R) Cuda Tile IR optimizing assembler\nCuda compilation tools, release 13.4, V13.4.92\n"  # noqa: E501
    assert parse_release(tileiras) == "13.4"
    assert parse_release("ptxas ... Build cuda_13.3.r13.3/compiler V13.3.1") == "13.3"
    assert parse_release("no version here") is None


@pytest.mark.parametrize(
    ("gpu", "tileiras", "ptxas", "ok", "says"),
    [
        (H200, "13.4", "13.4", True, "new enough for sm_90 (Hopper)"),
        (H200, "13.3", "13.3", True, "new enough for sm_90"),
        (H200, "13.2", "13.2", False, "sm_90 (Hopper) needs 13.3+, found 13.2"),
        (B200, "13.1", "13.1", True, "sm_100 (Blackwell)"),
        (H200, "13.4", "13.3", False, "tileiras 13.4 and ptxas 13.3 differ"),
        (T4, "13.4", "13.4", False, "cuTile does not target sm_75"),
        (None, "13.4", "13.4", True, "no GPU to check the architecture against"),
    ],
)
def test_toolchain_versions_must_match_and_suit_the_gpu(gpu, tileiras, ptxas, ok, says):
    check = check_toolchain(tools(tileiras, ptxas), gpu)
    assert check.ok is ok and says in check.detail
    assert ok or "fix: " in check.line()


def test_missing_ptxas_fails_with_the_install_fix():
    facts = Facts(tileiras=Tool("/x/tileiras", "13.4"), ptxas=Tool(None))
    line = check_toolchain(facts, H200).line()
    assert line.startswith("FAIL  toolchain: ptxas not found; fix: pip install")


def test_gpu_must_be_present_and_be_the_expected_one():
    assert not check_gpu(Facts(gpus=[]), None).ok
    none = check_gpu(Facts(gpu_error="no nvidia-smi, and torch sees no CUDA GPU"), None)
    assert none.line().startswith("FAIL  gpu: no nvidia-smi") and "nvidia-smi -L" in none.fix
    wrong = check_gpu(Facts(gpus=[H200, B200]), "GPU-elsewhere")
    assert not wrong.ok and "GPU-elsewhere is not on this host" in wrong.detail
    assert H200.uuid in wrong.detail
    right = check_gpu(Facts(gpus=[H200, B200]), B200.uuid)
    assert right.ok and "NVIDIA B200" in right.detail and "sm_100" in right.detail
    unpinned = check_gpu(Facts(gpus=[H200, B200]), None)
    assert unpinned.ok and "pin one with --gpu-uuid" in unpinned.detail


def test_toolchain_is_judged_against_the_expected_gpu():
    facts = tools("13.2", "13.2")
    facts.gpus = [B200, H200]
    by_uuid = {c.name: c for c in evaluate(facts, H200.uuid, {"git", "profilers", "cuda-tile"})}
    assert not by_uuid["toolchain"].ok and "sm_90" in by_uuid["toolchain"].detail


def test_git_tree_must_be_clean_and_on_an_experiment_branch():
    ok = check_git(Facts(repo="/r", branch="experiment/qwen3/fused-rmsnorm"))
    assert [c.ok for c in ok] == [True, True]
    dirty = check_git(Facts(repo="/r", branch="main", dirty=["a.py", "b.py"]))
    assert [c.ok for c in dirty] == [False, False]
    assert "uncommitted changes: a.py, b.py" in dirty[0].detail
    assert "experiment start" in dirty[1].fix
    detached = check_git(Facts(repo="/r", branch=None))
    assert "HEAD is detached" in detached[1].detail


def test_profilers_are_informational_only():
    missing = check_profilers(Facts())
    assert missing.line().startswith("info  profilers: none found; missing nsys, ncu")
    assert exit_code([missing]) == 0
    assert check_profilers(Facts(nsys="/usr/bin/nsys", ncu="/usr/bin/ncu")).ok


@pytest.fixture
def experiment_repo(tmp_path):
    repo = git.Repo.init(tmp_path / "repo", initial_branch="main")
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "t").set_value("user", "email", "t@example.com")
    (tmp_path / "repo" / "README.md").write_text("x\n")
    repo.index.add(["README.md"])
    repo.index.commit("init")
    repo.git.checkout("-b", "experiment/qwen3/rmsnorm")
    return tmp_path / "repo"


def test_doctor_on_this_machine_fails_the_gpu_check_with_a_fix(experiment_repo, capsys):
    code = main(["doctor", "--gpu-uuid", "GPU-not-on-this-host", "--repo", str(experiment_repo)])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    by_name = {line.split()[1].rstrip(":"): line for line in lines}
    assert by_name["gpu"].startswith("FAIL  gpu: ") and "; fix: " in by_name["gpu"]
    assert by_name["git-clean"].startswith("ok")
    assert by_name["git-branch"] == "ok    git-branch: on experiment/qwen3/rmsnorm"
    assert by_name["profilers"].split()[0] in ("ok", "info")
    assert all(line.split()[0] in ("ok", "FAIL", "info") for line in lines)


def test_doctor_checks_the_image_through_the_docker_api(tmp_path, monkeypatch, capsys):
    with FakeEngine(tmp_path / "d.sock", {"tilegym-exp:1"}, "ok", {}) as engine:
        monkeypatch.setenv("DOCKER_HOST", engine.base_url)
        skips = [
            a for s in ("gpu", "cuda-tile", "toolchain", "profilers", "git") for a in ("--skip", s)
        ]  # noqa: E501
        assert main(["doctor", "--image", "tilegym-exp:1", *skips]) == 0
        assert capsys.readouterr().out == "ok    image: image tilegym-exp:1 present\n"
        assert main(["doctor", "--image", "tilegym-exp:2", *skips]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL  image: image tilegym-exp:2 not found; fix: docker build -f ")
