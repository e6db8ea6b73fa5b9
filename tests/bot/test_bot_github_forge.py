"""The GitHub path through real PyGithub over real HTTP, against a small local REST server that
keeps its branches in a real git repository (``github_fake``), and a real bot checkout."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import git
import pytest
from github_fake import BOT, NAME, OWNER, FakeGitHub
from tilegym_bot.cli import main
from tilegym_bot.errors import BotError
from tilegym_bot.forge.github import GitHubForge, apply_artifact, default_retry
from tilegym_bot.report import COMMENT_LIMIT, MARKER, parse_record

REPO = f"{OWNER}/{NAME}"
API = f"/api/v3/repos/{OWNER}/{NAME}"
LEDGER = ("tilegym-ledger", "sandbox/qwen3_results.md")
RMS_KERNEL = """import cuda.tile as ct


@ct.kernel
def rms_norm_kernel(x):
    pass
"""


def kernel_file(name: str) -> str:
    return f"import cuda.tile as ct\n\n\n@ct.kernel\ndef {name}(x):\n    pass\n"


@dataclass
class Case:
    number: int
    run_id: int
    artifact: Path
    base: str
    head: str


class World:
    """Origin repository, the bot's clone, a contributor's clone, and the fake GitHub."""

    def __init__(self, tmp: Path, make_metrics):
        self.tmp = tmp
        self.make_metrics = make_metrics
        git.Repo.init(tmp / "origin.git", bare=True, initial_branch="main")
        self.dev = git.Repo.init(tmp / "dev", initial_branch="main")
        with self.dev.config_writer() as cfg:
            cfg.set_value("user", "name", "Dev").set_value("user", "email", "dev@example.com")
        self.dev.create_remote("origin", str(tmp / "origin.git"))
        self.commit(
            {
                "README.md": "readme\n",
                ".github/workflows/gpu-benchmark.yml": "name: gpu-benchmark\n",
                "src/tilegym/__init__.py": "",
                "src/tilegym/ops/rms_norm.py": RMS_KERNEL,
                "src/tilegym/transformers/qwen3/modeling_qwen3.py": "# model glue\n",
            },
            "main",
        )
        self.dev.git.push("origin", "main")
        self.checkout = tmp / "bot"
        git.Repo.clone_from(tmp / "origin.git", self.checkout).close()
        self.fake = FakeGitHub(tmp / "origin.git")

    def commit(self, files: dict[str, str | None], message: str) -> str:
        root = Path(self.dev.working_tree_dir)
        for rel, text in files.items():
            if text is None:
                self.dev.index.remove([rel], working_tree=True)
                continue
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
            self.dev.index.add([rel])
        return self.dev.index.commit(message).hexsha

    def branch(self, ref: str, files: dict[str, str | None], start: str = "origin/main") -> str:
        self.dev.git.fetch("origin")
        self.dev.git.checkout("-B", ref, start)
        sha = self.commit(files, f"experiment {ref}")
        self.dev.git.push("--force", "origin", f"{ref}:{ref}")
        return sha

    def advance_main(self, files: dict[str, str]) -> str:
        """Someone else lands a commit on main."""
        return self.branch("main", files)

    def forge(self) -> GitHubForge:
        return GitHubForge(
            REPO,
            retry=default_retry(total=3, backoff_factor=0.01),
            seconds_between_requests=None,
            seconds_between_writes=None,
        )

    def case(
        self,
        number: int,
        *,
        files: dict[str, str | None] | None = None,
        title: str = "qwen3: fused RMSNorm",
        labels=(),
        base_kw: dict | None = None,
        record: dict | None = None,
        **head_kw,
    ) -> Case:
        """PR ``number``: a branch with a kernel, its benchmark run and artifact."""
        ref = f"experiment/qwen3/x{number}"
        base = self.fake.main_sha()
        head = self.branch(
            ref, files or {f"src/tilegym/transformers/qwen3/kernels/k{number}.py": RMS_KERNEL}
        )
        self.fake.add_pull(number, head, ref, title=title, labels=labels)
        run_id = 9000 + number
        self.fake.add_run(run_id, head)
        folder = self.tmp / f"artifact-{number}"
        folder.mkdir()
        pr_json = {"pr": number, "base_sha": base, "head_sha": head, **(record or {})}
        (folder / "pr.json").write_text(json.dumps(pr_json))
        base_doc = self.make_metrics(**{"commit": base, **(base_kw or {})})
        (folder / "base.json").write_text(json.dumps(base_doc))
        head_kw.setdefault("commit", head)
        (folder / "head.json").write_text(json.dumps(self.make_metrics(**head_kw)))
        return Case(number, run_id, folder, base, head)

    def apply(self, case: Case, **kw):
        return apply_artifact(
            self.forge(), case.artifact, run_id=case.run_id, checkout=self.checkout, **kw
        )

    def cli(self, case: Case, *extra: str) -> int:
        return main(
            [
                "github",
                "apply",
                "--repo",
                REPO,
                "--run-id",
                str(case.run_id),
                "--artifact",
                str(case.artifact),
                "--checkout",
                str(self.checkout),
                *extra,
            ]
        )

    def ledger_rows(self) -> list[str]:
        text = self.fake.files.get(LEDGER)
        return text.splitlines()[2:] if text else []


@pytest.fixture
def world(tmp_path, make_metrics, monkeypatch):
    w = World(tmp_path, make_metrics)
    w.fake.thread.start()
    monkeypatch.setenv("GITHUB_TOKEN", "t0ken")
    monkeypatch.setenv("GITHUB_API_URL", w.fake.api)
    monkeypatch.delenv("TILEGYM_LEDGER_BRANCH", raising=False)
    monkeypatch.delenv("TILEGYM_BOT_LOGIN", raising=False)
    yield w
    w.fake.server.shutdown()
    w.fake.server.server_close()


def _index(fake: FakeGitHub, method: str, path_end: str) -> int:
    calls = fake.calls()
    return next(i for i, (m, p) in enumerate(calls) if m == method and p.endswith(path_end))


# ---- merge first, then the verdict; the ledger row -------------------------------------------
def test_keep_merges_first_then_comments_labels_and_appends_the_ledger(world):
    case = world.case(7, coverage=61.2, labels=["qwen3"])
    world.fake.add_comment(7, f"{MARKER}\nforged by someone else", login="mallory")
    result = world.apply(case)
    fake = world.fake
    assert (result.outcome, result.decision.status, result.failure) == ("merged", "keep", None)
    assert all(r["auth"] == "token t0ken" for r in fake.requests)
    [merge] = [r for r in fake.requests if r["method"] == "PUT" and r["path"].endswith("/merge")]
    assert (merge["body"]["sha"], merge["body"]["merge_method"]) == (case.head, "squash")
    # The merge happens before the comment and the label that report it.
    assert (
        _index(fake, "PUT", "/pulls/7/merge")
        < _index(fake, "POST", "/issues/7/comments")
        < _index(fake, "POST", "/issues/7/labels")
    )
    assert fake.pulls[7]["merged"] and fake.pulls[7]["labels"] == ["qwen3", "autokernel:keep"]
    [body] = fake.bot_bodies(7)
    merged = fake.pulls[7]["merge_commit_sha"]
    assert f"**Outcome:** squash-merged into `main` as `{merged[:8]}`." in body
    assert git.Repo(world.tmp / "origin.git").git.rev_parse("main") == merged
    assert fake.comments[101]["body"] == f"{MARKER}\nforged by someone else"
    # The ledger: on the bot's branch, the local loop's format, a baseline row first.
    text = fake.files[LEDGER]
    assert text.splitlines()[:2] == [
        "| commit | cuTile coverage | cuTile throughput | status | description |",
        "|:-------|----------------:|------------------:|:-------|:------------|",
    ]
    assert world.ledger_rows() == [
        f"| {case.base[:8]} | 50.00 | 50.00 | keep | baseline |",
        f"| {case.head[:8]} | 61.20 | 50.00 | keep | qwen3: fused RMSNorm |",
    ]
    assert "tilegym-ledger" in fake.refs
    assert parse_record(body)["final"] is True


def test_running_the_same_run_again_writes_nothing(world):
    case = world.case(8, coverage=61.2)
    world.apply(case)
    writes = world.fake.writes()
    again = world.apply(case)
    assert again.outcome == "merged"
    assert again.actions[:2] == ["already merged", "bot comment already up to date"]
    assert world.fake.writes() == writes
    assert len(world.ledger_rows()) == 2


def test_a_refused_merge_is_reported_with_githubs_reason_and_fails(world, capsys):
    case = world.case(9, coverage=61.2)
    world.fake.faults[("PUT", f"{API}/pulls/9/merge")] = [
        (405, {}, {"message": 'Required status check "ci" is expected.'})
    ]
    capsys.readouterr()
    assert world.cli(case) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        'error: GitHub refused to merge PR #9 (405: Required status check "ci" is expected.)'
    )
    pr = world.fake.pulls[9]
    assert not pr["merged"] and pr["state"] == "open"
    assert pr["labels"] == ["autokernel:merge-failed"]
    [body] = world.fake.bot_bodies(9)
    assert "**Outcome:** **not merged**: GitHub refused the merge (405: Required status" in body
    assert parse_record(body)["final"] is False
    assert world.ledger_rows() == []
    # ledger rebuild from the comments does not invent a keep row for a commit never merged.
    rebuilt = git.Repo.init(world.tmp / "rebuilt")
    assert main(["-C", rebuilt.working_tree_dir, "ledger", "rebuild", "--model-key", "qwen3",
                 "--github", REPO]) == 0  # fmt: skip
    lines = (world.tmp / "rebuilt/sandbox/qwen3_results.md").read_text().splitlines()
    assert lines[2:] == []


# ---- merges only on the benchmarked base, one at a time ---------------------------------------
def test_main_moved_after_the_benchmark_labels_rebench_and_merges_nothing(world):
    case = world.case(10, coverage=61.2)
    moved = world.advance_main({"README.md": "readme, edited on main\n"})
    result = world.apply(case)
    assert result.outcome == "rebench" and result.failure is None
    assert not [path for _, path in world.fake.calls("PUT") if path.endswith("/merge")]
    assert world.fake.pulls[10]["labels"] == ["autokernel:rebench"]
    assert world.fake.pulls[10]["state"] == "open"
    [body] = world.fake.bot_bodies(10)
    assert f"`main` moved from `{case.base[:8]}` (benchmarked) to `{moved[:8]}`" in body
    assert parse_record(body)["final"] is False
    assert world.ledger_rows() == []


def test_two_keeps_benchmarked_on_the_same_main_merge_only_the_first(world):
    first = world.case(11, coverage=61.2)
    second = world.case(12, coverage=61.2)
    assert first.base == second.base
    assert world.apply(first).outcome == "merged"
    assert world.apply(second).outcome == "rebench"
    assert world.fake.pulls[11]["merged"] and not world.fake.pulls[12]["merged"]
    assert [r.split(" | ")[0] for r in world.ledger_rows()] == [
        f"| {first.base[:8]}",
        f"| {first.head[:8]}",
    ]


# ---- other verdicts ----------------------------------------------------------------------------
def test_discard_closes_then_comments_and_records_and_a_correction_edits_in_place(world):
    case = world.case(13, coverage=50.0)
    result = world.apply(case)
    fake = world.fake
    assert result.outcome == "closed" and fake.pulls[13]["state"] == "closed"
    assert not fake.pulls[13]["merged"] and fake.pulls[13]["labels"] == ["autokernel:discard"]
    assert _index(fake, "PATCH", "/pulls/13") < _index(fake, "POST", "/issues/13/comments")
    assert world.ledger_rows()[-1] == f"| {case.head[:8]} | 50.00 | 50.00 | discard | " + (
        "qwen3: fused RMSNorm |"
    )
    # A corrected artifact of the same head (crash) edits the one comment and swaps the label.
    crash = world.make_metrics(commit=case.head, status="crash")
    (case.artifact / "head.json").write_text(json.dumps(crash))
    world.apply(case)
    [body] = fake.bot_bodies(13)
    assert body.count(MARKER) == 1 and "verdict: **crash**" in body
    assert fake.pulls[13]["labels"] == ["autokernel:crash"]


def test_inconclusive_stays_open_and_its_rerun_is_closed_as_discard(world):
    # Throughput points down but the drop is not significant: inconclusive, then the rerun.
    slow = (48.0, 49.5, 47.0, 49.0, 48.5)
    case = world.case(14, coverage=61.2, cutile=slow)
    first = world.apply(case)
    assert (first.decision.status, first.outcome) == ("inconclusive", "open")
    assert world.fake.pulls[14]["labels"] == ["autokernel:inconclusive"]
    assert world.ledger_rows() == []
    writes = world.fake.writes()
    assert world.apply(case).outcome == "open"  # the same run again: still the first round
    assert world.fake.writes() == writes
    # The next benchmark run of the labelled PR is the rerun.
    world.fake.add_run(case.run_id + 1, case.head)
    second = apply_artifact(
        world.forge(), case.artifact, run_id=case.run_id + 1, checkout=world.checkout
    )
    assert (second.decision.status, second.outcome) == ("discard", "closed")
    assert world.fake.pulls[14]["state"] == "closed"
    assert world.ledger_rows()[-1].endswith("| discard | qwen3: fused RMSNorm |")


# ---- provenance --------------------------------------------------------------------------------
def _refused(world, case, message, capsys):
    writes = world.fake.writes()
    capsys.readouterr()
    assert world.cli(case) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and message in err[-1], err
    assert world.fake.writes() == writes  # nothing was written anywhere


def test_a_run_of_another_workflow_named_gpu_benchmark_is_refused(world, capsys):
    case = world.case(20, coverage=61.2)
    world.fake.add_run(case.run_id, case.head, path=".github/workflows/evil.yml")
    _refused(world, case, "its workflow is '.github/workflows/evil.yml'", capsys)


def test_a_run_whose_workflow_is_not_the_default_branchs_is_refused(world, capsys):
    case = world.case(21, coverage=61.2)
    world.fake.add_run(case.run_id, case.head, workflow_id=77)
    _refused(world, case, "its workflow id 77 is not the default branch's", capsys)


def test_a_run_not_triggered_by_a_pull_request_is_refused(world, capsys):
    case = world.case(22, coverage=61.2)
    world.fake.add_run(case.run_id, case.head, event="pull_request_target")
    _refused(world, case, "triggered by 'pull_request_target'", capsys)


def test_pr_json_naming_another_pr_is_refused(world, capsys):
    world.case(23, coverage=50.0)  # a PR the artifact would like to close
    case = world.case(24, coverage=61.2, record={"pr": 23})
    _refused(world, case, "the benchmark artifact is not sound", capsys)
    assert world.fake.pulls[23]["state"] == "open"


def test_a_base_metrics_file_of_another_commit_is_refused(world, capsys):
    case = world.case(25, coverage=61.2, base_kw={"coverage": 10.0})
    other = world.make_metrics(commit="c" * 40, coverage=10.0)
    (case.artifact / "base.json").write_text(json.dumps(other))
    _refused(world, case, "the benchmark artifact is not sound", capsys)


def test_a_benchmarked_base_that_is_not_on_main_is_refused(world, capsys):
    # Base and head from the PR's own history: the diff base...head would hide what it changed.
    side = world.branch("experiment/qwen3/x26", {".github/workflows/gpu-benchmark.yml": "x\n"})
    case = world.case(26, coverage=61.2, base_kw={"commit": side}, record={"base_sha": side})
    _refused(world, case, f"the benchmarked base {side[:8]} is not on main", capsys)


def test_metrics_of_another_model_than_the_branch_are_refused(world, capsys):
    case = world.case(27, coverage=61.2, model_key="llama", base_kw={"model_key": "llama"})
    _refused(world, case, "metrics are of model 'llama'", capsys)


def test_a_head_that_moved_after_the_benchmark_is_left_alone(world, capsys):
    case = world.case(28, coverage=61.2)
    world.branch("experiment/qwen3/x28", {"src/tilegym/transformers/qwen3/kernels/k.py": "\n"})
    world.fake.pulls[28]["head_sha"] = world.dev.head.commit.hexsha
    capsys.readouterr()
    assert world.cli(case) == 0
    assert "nothing to do: no pull request has head" in capsys.readouterr().err
    assert world.fake.writes() == []


# ---- scope, re-checked with main's rules -----------------------------------------------------
def test_a_pr_that_changes_its_benchmark_workflow_is_closed_as_refused(world, capsys):
    case = world.case(
        30,
        coverage=61.2,
        files={".github/workflows/gpu-benchmark.yml": "name: gpu-benchmark\n# mine now\n"},
    )
    capsys.readouterr()
    assert world.cli(case) == 1
    err = capsys.readouterr().err
    line = ".github/workflows/gpu-benchmark.yml:1: BOT001 an experiment may not change .github/"
    assert line in err and "error: refused: " in err
    pr = world.fake.pulls[30]
    assert (pr["state"], pr["merged"], pr["labels"]) == ("closed", False, ["autokernel:refused"])
    [body] = world.fake.bot_bodies(30)
    assert "verdict: **refused**" in body and "BOT001" in body
    assert not world.fake.calls("PUT") and world.ledger_rows() == []


def test_an_out_of_scope_change_is_refused_even_without_the_hook(world):
    case = world.case(31, coverage=61.2, files={"README.md": "rewritten by the experiment\n"})
    result = world.apply(case)
    assert result.outcome == "refused" and result.failure.startswith("refused")
    assert any(line.startswith("README.md:1: SCOPE001") for line in result.refusals)
    assert world.fake.pulls[31]["state"] == "closed" and not world.fake.pulls[31]["merged"]


def test_coverage_counts_only_kernels_that_the_benchmarked_commits_define(world):
    # The head's metrics call a kernel cuTile that no commit defines (a cuTile-looking name).
    case = world.case(32, coverage=61.2)
    doc = json.loads((case.artifact / "head.json").read_text())
    for kernel in doc["coverage"]["kernels"]:
        if kernel["cutile"]:
            kernel["name"] = kernel["name"].replace("rms_norm_kernel", "sneaky_kernel", 1)
    (case.artifact / "head.json").write_text(json.dumps(doc))
    result = world.apply(case)
    assert result.decision.status == "inconclusive"
    assert result.decision.coverage_head == 0.0
    assert not world.fake.pulls[32]["merged"]


# ---- the comment ----------------------------------------------------------------------------
def test_a_huge_error_and_hostile_names_still_make_one_safe_comment(world):
    error = "<img src=x onerror=alert(1)> @everyone " + "Traceback line\n" * 200_000
    case = world.case(40, status="crash")
    doc = json.loads((case.artifact / "head.json").read_text())
    doc["error"] = error
    doc["env"]["gpu_name"] = "H200 | [click](https://evil.example) `x`"
    (case.artifact / "head.json").write_text(json.dumps(doc))
    result = world.apply(case)
    assert result.outcome == "closed"
    [body] = world.fake.bot_bodies(40)
    assert len(body.encode()) <= COMMENT_LIMIT
    assert "<img" not in body and "@everyone" not in body and "[click](" not in body
    assert "&lt;img src=x onerror=alert(1)&gt; @\u200beveryone" in body
    assert "H200 \\| \\[click\\](https://evil.example) \\`x\\`" in body
    assert parse_record(body)["status"] == "crash"


# ---- transport ------------------------------------------------------------------------------
def test_retries_502_and_rate_limit_with_retry_after(world):
    case = world.case(41, coverage=61.2)
    pulls = f"{API}/pulls/41"
    comments = f"{API}/issues/41/comments"
    world.fake.faults[("GET", pulls)] = [(502, {}, {"message": "Bad Gateway"})]
    world.fake.faults[("POST", comments)] = [
        (403, {"Retry-After": "1"}, {"message": "You have exceeded a secondary rate limit."})
    ]
    world.apply(case)
    gets = [r for r in world.fake.requests if (r["method"], r["path"]) == ("GET", pulls)]
    assert len(gets) >= 2  # the 502 then the retried success
    posts = [r for r in world.fake.requests if (r["method"], r["path"]) == ("POST", comments)]
    assert len(posts) == 2 and posts[1]["at"] - posts[0]["at"] >= 0.95
    assert len(world.fake.bot_bodies(41)) == 1 and world.fake.pulls[41]["merged"]


def test_primary_rate_limit_waits_for_the_reset(world):
    case = world.case(42, coverage=61.2)
    labels = f"{API}/issues/42/labels"
    reset = int(time.time()) + 3  # after the first POST even on a busy machine
    world.fake.faults[("POST", labels)] = [
        (
            403,
            {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(reset)},
            {"message": "API rate limit exceeded for installation ID 1."},
        )
    ]
    world.apply(case)
    posts = [r for r in world.fake.requests if (r["method"], r["path"]) == ("POST", labels)]
    # the retry comes at the reset (an epoch second), not a fixed time after the refusal:
    # the refusal may come up to a second before it
    assert len(posts) == 2 and posts[0]["wall"] < reset <= posts[1]["wall"] + 0.05
    assert world.fake.pulls[42]["labels"] == ["autokernel:keep"]


def test_a_ledger_written_meanwhile_is_read_again_and_keeps_both_rows(world):
    first = world.case(43, coverage=61.2)
    world.apply(first)
    second = world.case(44, coverage=50.0)
    path = f"{API}/contents/sandbox/qwen3_results.md"
    world.fake.faults[("PUT", path)] = [(409, {}, {"message": "does not match"})]
    world.apply(second)
    puts = [r for r in world.fake.requests if (r["method"], r["path"]) == ("PUT", path)]
    assert len(puts) == 3  # the first write, the conflict, the write on the re-read text
    assert [r.split(" | ")[3] for r in world.ledger_rows()] == ["keep", "keep", "discard"]


def test_ledger_rebuild_from_comments(world, monkeypatch):
    world.apply(world.case(45, coverage=61.2, title="qwen3: rope"))
    world.apply(world.case(46, coverage=50.0, title="qwen3: mlp"))
    repo = git.Repo.init(world.tmp / "r")
    monkeypatch.setenv("TILEGYM_BOT_LOGIN", BOT)
    args = ["-C", repo.working_tree_dir, "ledger", "rebuild", "--model-key", "qwen3"]
    assert main([*args, "--github", REPO]) == 0
    lines = (world.tmp / "r" / "sandbox" / "qwen3_results.md").read_text().splitlines()
    assert lines[2:] == world.ledger_rows()


def test_missing_token_and_api_errors_are_bot_errors(world, monkeypatch):
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    with pytest.raises(BotError, match="GITHUB_TOKEN"):
        GitHubForge(REPO, base_url=world.fake.api)
    with pytest.raises(BotError, match="GitHub API error 404"):
        GitHubForge(
            "acme/other",
            token="x",
            base_url=world.fake.api,
            retry=default_retry(total=1, backoff_factor=0.01),
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run-id", "abc"], "error: argument --run-id: not a workflow run id: 'abc'"),
        (
            ["--run-id", "9050", "--artifact", "nowhere"],
            "error: --artifact nowhere is not a folder",
        ),
        (["--run-id", "123456"], "error: GitHub API error 404: no route GET"),
    ],
)
def test_github_apply_bad_input_is_one_error_line(world, capsys, tmp_path, args, message):
    capsys.readouterr()
    full = ["github", "apply", "--repo", REPO, "--artifact", str(tmp_path), *args]
    try:
        rc = main(full)
    except SystemExit as exc:  # argparse's own errors leave through SystemExit, as in the shell
        rc = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc in (1, 2) and len(err) == 1 and err[0].startswith(message), err


def test_github_apply_cli_prints_the_decision_and_writes_the_report(world, capsys):
    case = world.case(47, coverage=61.2, passed=False)
    out = world.tmp / "summary" / "comment.md"
    outputs = world.tmp / "github_output"
    capsys.readouterr()
    assert world.cli(case, "--report-out", str(out), "--github-output", str(outputs)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["status"], doc["ledger_status"], doc["outcome"]) == (
        "incorrect",
        "discard",
        "closed",
    )
    assert out.read_text() == world.fake.bot_bodies(47)[0]
    assert outputs.read_text() == "outcome=closed\npr=47\n"


# ---- sequential sampling: an artifact of several pairs ------------------------------------------
NOISY_HEAD = (47.0, 53.0, 48.0, 52.0, 50.0)  # mean 50: r = 1, 95% CI 0.94-1.06


def sampled_case(world, number: int, pairs: list[tuple[dict, dict]], **kw) -> Case:
    """PR ``number`` whose artifact holds pair 1 (``kw`` as ``World.case``) and the later
    ``pairs`` (base and head keyword arguments each), as gpu-benchmark.yml uploads them."""
    case = world.case(number, record={"pairs": 1 + len(pairs), "budget_s": 900}, **kw)
    for k, (base_kw, head_kw) in enumerate(pairs, start=2):
        for side, sha, kw in (("base", case.base, base_kw), ("head", case.head, head_kw)):
            doc = world.make_metrics(**{"commit": sha, **kw})
            if doc["cutile"]:  # the runs the pair asked for
                doc["workload"]["timed_runs"] = len(doc["cutile"]["throughput"]["samples"])
            (case.artifact / f"{side}-{k}.json").write_text(json.dumps(doc))
    return case


TIGHT = {"cutile": (50.0, 50.1, 49.9, 50.0, 50.05, 49.95, 50.0, 50.1, 49.9, 50.0)}
TIGHT_BASE = {"baseline": (25.0,) * 10, **TIGHT}


def test_pooled_pairs_decide_and_the_comment_and_record_say_how_sampling_stopped(world, capsys):
    later = [(TIGHT_BASE, {**TIGHT_BASE, "coverage": 61.2})]
    case = sampled_case(world, 60, later, coverage=61.2, cutile=NOISY_HEAD)
    out = world.tmp / "comment.md"
    capsys.readouterr()
    assert world.cli(case, "--report-out", str(out)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["status"], doc["outcome"]) == ("keep", "merged")
    sampling = doc["sampling"]
    assert (sampling["pairs"], sampling["runs"], sampling["stopped"]) == (
        2,
        {"base": 15, "head": 15},
        "decisive-not-slower",
    )
    assert sampling["why"].startswith("after 2 pair(s): r = ")
    [body] = world.fake.bot_bodies(60)
    assert out.read_text() == body
    assert "- sampling: 2 base/head pair(s), 15 base and 15 head runs pooled" in body
    assert "stopped: decisive-not-slower" in body
    assert ", n=15 |" in body  # the metrics table shows the pooled runs
    assert parse_record(body)["sampling"] == sampling
    assert (
        world.ledger_rows()[-1]
        == f"| {case.head[:8]} | 61.20 | 50.00 | keep | qwen3: fused RMSNorm |"
    )


def test_an_undecided_ratio_at_the_end_of_the_budget_is_final_not_a_rerun(world):
    slow = {"cutile": (44.0, 52.0, 47.0, 49.0, 45.0), "coverage": 61.2}
    case = sampled_case(world, 61, [({}, slow)], coverage=61.2, cutile=NOISY_HEAD)
    result = world.apply(case)
    decision = result.decision
    assert decision.sampling["stopped"] == "budget", decision.sampling
    assert "the benchmark job's clock left no room" in decision.sampling["why"]
    assert (decision.status, result.outcome) == ("discard", "closed")
    assert "still not significant after the sequential sampling stopped" in decision.reasons[-2]
    assert world.fake.pulls[61]["state"] == "closed"
    assert world.fake.pulls[61]["labels"] == ["autokernel:discard"]
    assert world.ledger_rows()[-1].endswith("| discard | qwen3: fused RMSNorm |")


def test_a_later_pair_that_crashed_decides(world):
    case = sampled_case(world, 62, [({}, {"status": "crash"})], coverage=61.2, cutile=NOISY_HEAD)
    result = world.apply(case)
    assert (result.decision.status, result.outcome) == ("crash", "closed")
    assert result.decision.sampling["stopped"] == "pair-rejected"
    [body] = world.fake.bot_bodies(62)
    assert "verdict: **crash**" in body and parse_record(body)["sampling"]["pairs"] == 2


def _unsound(world, case, finding, capsys):
    """The command fails naming the finding, then one error line; nothing is written."""
    _refused(world, case, "the benchmark artifact is not sound", capsys)
    capsys.readouterr()
    assert world.cli(case) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and finding in err[0], err


def test_pairs_that_the_rule_would_not_have_run_are_refused(world, capsys):
    # The first pair is decisive (tight samples, same speed): a second one is not the rule's.
    tight = [(TIGHT_BASE, {**TIGHT_BASE, "coverage": 61.2})]
    case = sampled_case(world, 63, tight, coverage=61.2, base_kw=TIGHT_BASE, **TIGHT_BASE)
    _unsound(
        world,
        case,
        "ART005 2 pairs, but the sampling stops after pair 1 (decisive-not-slower",
        capsys,
    )


def test_a_sampled_artifact_with_a_missing_half_is_refused(world, capsys):
    case = sampled_case(world, 64, [({}, {"coverage": 61.2})], coverage=61.2, cutile=NOISY_HEAD)
    (case.artifact / "head-2.json").unlink()
    _unsound(world, case, "ART001 missing from the artifact: pair 2 of 2 is not whole", capsys)
