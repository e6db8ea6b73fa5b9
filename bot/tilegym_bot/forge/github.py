"""The GitHub forge: the verdict on a benchmark artifact, acted on its pull request (PyGithub).

Trust. The artifact was written by a job that ran PR code, so nothing in it counts on its own
word (``apply_artifact`` checks all of this before anything is written):

- the workflow run (by id, from the API) is ``.github/workflows/gpu-benchmark.yml`` of this
  repository, whose workflow id is the default branch's workflow of that path, triggered by
  ``pull_request`` and successful;
- the pull request is the one the API finds by the run's head SHA, into the default branch;
  ``pr.json`` and both metrics files name that PR, that head and one base, and that base is an
  ancestor of the default branch's head; the model key is the branch name's;
- the diff main...head is checked again with main's scope rules in the bot's own checkout (git
  objects only: nothing from the PR is imported or run); any finding, or any change under
  ``.github/`` (a PR's changed gpu-benchmark.yml would have produced this very artifact), closes
  the PR as ``refused``.

Acting. The merge or close happens first; the one sticky comment and the one
``autokernel:<outcome>`` label then say what really happened. keep is squash-merged with
``sha=`` the benchmarked head, and only while the default branch's head is still the benchmarked
base; when it moved the PR is labelled ``autokernel:rebench`` instead (the merged tree would not
be the measured one). A refused merge (e.g. 405) is reported with GitHub's reason, labelled
``autokernel:merge-failed``, and the command fails. Final outcomes append the ledger row.

Ledger. ``sandbox/<model_key>_results.md`` on the bot-owned branch ``tilegym-ledger``
(``TILEGYM_LEDGER_BRANCH``; created from the default branch when missing), written through the
contents API: the file is read, the row appended with ``ledger.append`` (same format and lock
as the local loop) in a private folder, and written back with the blob SHA it was read at, so a
concurrent writer makes the write fail and it is redone on the new text.

Retries: PyGithub's ``GithubRetry`` (a ``urllib3.Retry``) retries 5xx with exponential backoff and
403/429 rate limits honouring ``Retry-After`` and ``X-RateLimit-Reset``.

Only comments written by the bot's own account count (``TILEGYM_BOT_LOGIN``, default
``github-actions[bot]``): a contributor cannot plant a record that ``ledger rebuild`` would trust.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import git
import requests
from github import Auth, Github, GithubException, GithubRetry
from github.IssueComment import IssueComment
from github.PullRequest import PullRequest

from tilegym_bot import ledger, sequential
from tilegym_bot.errors import BotError
from tilegym_bot.forge.local import now_iso
from tilegym_bot.ledger import LedgerRow
from tilegym_bot.policy import DEFAULT_MARGIN, STATUSES, Decision, decide, dig
from tilegym_bot.report import (
    DESCRIPTION_LIMIT,
    MARKER,
    build_record,
    clip,
    md_text,
    parse_record,
    render_comment,
    render_refusal,
)
from tilegym_bot.runner.artifact import budget_of

BENCH_WORKFLOW = ".github/workflows/gpu-benchmark.yml"
OUTCOME_LABELS = ("rebench", "merge-failed", "refused")
LABELS = {status: f"autokernel:{status}" for status in (*STATUSES, *OUTCOME_LABELS)}
RERUN_LABEL = LABELS["inconclusive"]
DEFAULT_API_URL = "https://api.github.com"
DEFAULT_BOT_LOGIN = "github-actions[bot]"
DEFAULT_LEDGER_BRANCH = "tilegym-ledger"
PR_SCAN_LIMIT = 200  # recently updated PRs searched for the head SHA (newest first)
LEDGER_WRITE_ATTEMPTS = 3
CLOSING = ("discard", "incorrect", "refused", "crash", "timeout")  # closed in any round


def default_retry(*, total: int = 6, backoff_factor: float = 2.0) -> GithubRetry:
    """5xx and rate limits, every method we use (edits and labels are idempotent)."""
    return GithubRetry(
        total=total,
        backoff_factor=backoff_factor,
        max_rate_limit_wait=900,
        allowed_methods=frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"}),
    )


def api_reason(exc: GithubException) -> str:
    """GitHub's own words for a refusal: status and message."""
    message = exc.data.get("message") if isinstance(exc.data, dict) else exc.data
    return f"{exc.status}: {clip(str(message), 300)}"


def _api_error(exc: Exception) -> BotError:
    if isinstance(exc, GithubException):
        return BotError(f"GitHub API error {api_reason(exc)}")
    return BotError(f"GitHub API unreachable: {exc}")


class GitHubForge:
    def __init__(
        self,
        repo: str,
        *,
        token: str | None = None,
        base_url: str | None = None,
        bot_login: str | None = None,
        ledger_branch: str | None = None,
        retry: GithubRetry | None = None,
        timeout: int = 30,
        seconds_between_requests: float | None = 0.25,
        seconds_between_writes: float | None = 1.0,
    ):
        token = token or os.environ.get("GITHUB_TOKEN")
        if not token:
            raise BotError("GITHUB_TOKEN is not set: a token with pull-requests and contents write")
        if repo.count("/") != 1:
            raise BotError(f"repository must be OWNER/NAME, got {repo!r}")
        self.bot_login = bot_login or os.environ.get("TILEGYM_BOT_LOGIN") or DEFAULT_BOT_LOGIN
        self.ledger_branch = (
            ledger_branch or os.environ.get("TILEGYM_LEDGER_BRANCH") or DEFAULT_LEDGER_BRANCH
        )
        self.gh = Github(
            auth=Auth.Token(token),
            base_url=(base_url or os.environ.get("GITHUB_API_URL") or DEFAULT_API_URL).rstrip("/"),
            retry=retry or default_retry(),
            timeout=timeout,
            seconds_between_requests=seconds_between_requests,
            seconds_between_writes=seconds_between_writes,
        )
        try:
            self.repo = self.gh.get_repo(repo)
        except (GithubException, requests.RequestException) as exc:
            raise _api_error(exc) from exc

    # ---- reads -------------------------------------------------------------------------------
    def benchmark_run(self, run_id: int) -> str:
        """The head SHA of workflow run ``run_id`` once it is proven to be the default branch's
        gpu-benchmark workflow run for a pull request that succeeded; BotError otherwise."""
        run = self.repo.get_workflow_run(run_id)
        problems = []
        if run.path != BENCH_WORKFLOW:
            problems.append(f"its workflow is {run.path!r}, not {BENCH_WORKFLOW}")
        if run.event != "pull_request":
            problems.append(f"it was triggered by {run.event!r}, not pull_request")
        if run.conclusion != "success":
            problems.append(f"it concluded {run.conclusion!r}, not success")
        if not problems:
            workflow = self.repo.get_workflow(Path(BENCH_WORKFLOW).name)
            if workflow.id != run.workflow_id or workflow.path != BENCH_WORKFLOW:
                problems.append(
                    f"its workflow id {run.workflow_id} is not the default branch's "
                    f"{BENCH_WORKFLOW} ({workflow.id})"
                )
        if problems:
            raise BotError(
                f"workflow run {run_id} is not a trusted benchmark: {'; '.join(problems)}"
            )
        return run.head_sha

    def find_pr(self, head_sha: str) -> PullRequest | None:
        """The PR of this repository whose head is ``head_sha`` (an open one first), or None."""
        found = []
        pulls = self.repo.get_pulls(state="all", sort="updated", direction="desc")
        for index, pr in enumerate(pulls):
            if index >= PR_SCAN_LIMIT:
                break
            if pr.head.sha == head_sha:
                found.append(pr)
        found.sort(key=lambda pr: pr.state != "open")
        return found[0] if found else None

    def default_head(self) -> tuple[str, str]:
        """(name, head SHA) of the default branch, read now."""
        name = self.repo.default_branch
        return name, self.repo.get_branch(name).commit.sha

    def bot_comment(self, pr: PullRequest) -> IssueComment | None:
        """The bot's sticky comment on ``pr`` (the oldest if a retry ever made two)."""
        for comment in pr.get_issue_comments():
            if comment.user.login == self.bot_login and MARKER in (comment.body or ""):
                return comment
        return None

    def records(self) -> list[dict[str, Any]]:
        """The machine-readable records of every PR's bot comment (for ``ledger rebuild``)."""
        found = []
        try:
            for pr in self.repo.get_pulls(state="all", sort="created", direction="asc"):
                comment = self.bot_comment(pr)
                record = parse_record(comment.body) if comment else None
                if record:
                    found.append(record)
        except (GithubException, requests.RequestException) as exc:
            raise _api_error(exc) from exc
        return found

    # ---- writes ------------------------------------------------------------------------------
    def upsert_comment(self, pr: PullRequest, body: str) -> str:
        existing = self.bot_comment(pr)
        if existing is None:
            pr.create_issue_comment(body)
            return "created the bot comment"
        if existing.body == body:
            return "bot comment already up to date"
        existing.edit(body)
        return "edited the bot comment"

    def set_status_label(self, pr: PullRequest, status: str) -> list[str]:
        want = LABELS[status]
        have = {label.name for label in pr.labels}
        done = []
        for stale in sorted(have - {want}):
            if stale.startswith("autokernel:"):
                pr.remove_from_labels(stale)
                done.append(f"removed label {stale}")
        if want not in have:
            pr.add_to_labels(want)
            done.append(f"added label {want}")
        return done

    # ---- ledger ------------------------------------------------------------------------------
    def _ledger_file(self, model_key: str) -> str:
        return f"sandbox/{model_key}_results.md"

    def read_ledger(self, model_key: str) -> tuple[str, str | None]:
        """The ledger's text on the ledger branch and its blob SHA ("" and None when missing)."""
        try:
            content = self.repo.get_contents(self._ledger_file(model_key), ref=self.ledger_branch)
        except GithubException as exc:
            if exc.status == 404:
                return "", None
            raise
        if isinstance(content, list):
            raise BotError(f"{self._ledger_file(model_key)} on {self.ledger_branch} is a folder")
        return content.decoded_content.decode("utf-8"), content.sha

    def _ensure_ledger_branch(self) -> None:
        try:
            self.repo.get_branch(self.ledger_branch)
        except GithubException as exc:
            if exc.status != 404:
                raise
            _, sha = self.default_head()
            self.repo.create_git_ref(f"refs/heads/{self.ledger_branch}", sha)

    def append_ledger(self, model_key: str, rows: list[LedgerRow]) -> list[str]:
        """Append ``rows`` (once per commit) to the model's ledger on the ledger branch."""
        path_in_repo = self._ledger_file(model_key)
        for attempt in range(LEDGER_WRITE_ATTEMPTS):
            text, blob_sha = self.read_ledger(model_key)
            with tempfile.TemporaryDirectory(prefix="tilegym-ledger-") as folder:
                path = ledger.ledger_path(Path(folder), model_key)
                path.parent.mkdir(parents=True)
                path.write_text(text, encoding="utf-8")
                try:
                    added = [
                        row for row in rows if ledger.append(path, row, skip_if_commit_present=True)
                    ]
                except ledger.LedgerError as exc:
                    details = [
                        str(f).replace(str(path), f"{self.ledger_branch}:{path_in_repo}")
                        for f in exc.findings
                    ]
                    raise BotError(f"the ledger {path_in_repo} is malformed", details) from exc
                new_text = path.read_text(encoding="utf-8")
            if not added:
                return [f"ledger: {rows[-1].commit} already recorded on {self.ledger_branch}"]
            message = f"ledger {model_key}: {added[-1].commit} {added[-1].status}"
            try:
                self._ensure_ledger_branch()
                if blob_sha is None:
                    self.repo.create_file(
                        path_in_repo, message, new_text, branch=self.ledger_branch
                    )
                else:
                    self.repo.update_file(
                        path_in_repo, message, new_text, blob_sha, branch=self.ledger_branch
                    )
            except GithubException as exc:
                # 409: the file changed since it was read; 422: it was created meanwhile.
                if exc.status in (409, 422) and attempt + 1 < LEDGER_WRITE_ATTEMPTS:
                    continue
                raise
            return [f"ledger ({self.ledger_branch}): {row.format()}" for row in added]
        raise BotError(f"the ledger {path_in_repo} kept changing while it was written")


@dataclass
class ApplyResult:
    """What ``apply_artifact`` did. ``outcome``: merged, closed, open, rebench, merge-failed,
    refused, skipped. ``failure``: why the command must exit non-zero (the PR already says so)."""

    outcome: str
    decision: Decision | None = None
    pr_number: int | None = None
    comment: str = ""
    actions: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    failure: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.decision is not None:
            doc = self.decision.to_json()
        else:
            doc = {"status": self.outcome, "ledger_status": None, "reasons": self.refusals}
        return {**doc, "pr": self.pr_number, "outcome": self.outcome}


# ---- the trusted checkout ---------------------------------------------------------------------
def _open(checkout: Path) -> git.Repo:
    try:
        return git.Repo(checkout)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise BotError(f"{checkout} is not a git checkout of the default branch") from None


def _has_commit(repo: git.Repo, sha: str) -> bool:
    try:
        repo.git.cat_file("-e", f"{sha}^{{commit}}")
    except git.GitCommandError:
        return False
    return True


def _token_env(repo: git.Repo) -> dict[str, str]:
    """Git config (in the environment: never in argv or a file) that sends GITHUB_TOKEN to an
    https origin, as actions/checkout does; nothing for other remotes."""
    token = os.environ.get("GITHUB_TOKEN")
    try:
        url = urlsplit(repo.remotes.origin.url)
    except (AttributeError, ValueError):
        return {}
    if not token or url.scheme != "https":
        return {}
    basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": f"http.https://{url.hostname}/.extraheader",
        "GIT_CONFIG_VALUE_0": f"AUTHORIZATION: basic {basic}",
    }


def fetch_commits(checkout: Path, shas: list[str]) -> None:
    """Make ``shas`` present in the bot's checkout: git objects only, nothing is checked out or
    run. The workflow fetches them with its token first; this fetches what is still missing."""
    repo = _open(checkout)
    try:
        missing = [sha for sha in dict.fromkeys(shas) if not _has_commit(repo, sha)]
        if missing:
            try:
                repo.git.fetch("--no-tags", "--quiet", "origin", *missing, env=_token_env(repo))
            except git.GitCommandError as exc:
                raise BotError(
                    f"cannot fetch {', '.join(s[:8] for s in missing)} into {checkout}: "
                    f"{clip(exc.stderr or str(exc), 300)}"
                ) from exc
        still = [sha for sha in missing if not _has_commit(repo, sha)]
        if still:
            raise BotError(f"commits {', '.join(s[:8] for s in still)} are not in {checkout}")
    finally:
        repo.close()


def is_ancestor(checkout: Path, older: str, newer: str) -> bool:
    repo = _open(checkout)
    try:
        return repo.is_ancestor(older, newer)
    finally:
        repo.close()


def workflow_changes(checkout: Path, base_sha: str, head_sha: str) -> list[str]:
    """Paths under ``.github/`` that ``base_sha...head_sha`` changes (renames count twice)."""
    repo = _open(checkout)
    try:
        names = repo.git.diff("--name-only", "--no-renames", "-z", f"{base_sha}...{head_sha}")
    finally:
        repo.close()
    return sorted(p for p in names.split("\0") if p.startswith(".github/"))


def refusals(checkout: Path, main_sha: str, head_sha: str, model_key: str) -> list[str]:
    """Finding lines that forbid judging the experiment: main's scope rules on main...head, and
    any change under .github/."""
    from tilegym_hooks.git_io import GitError

    from tilegym_bot.trusted_tree import scope_refusals

    try:
        lines = [str(f) for f in scope_refusals(checkout, main_sha, head_sha, model_key)]
    except GitError as exc:
        raise BotError(f"cannot check the experiment's scope: {exc}") from exc
    lines += [
        f"{path}:1: BOT001 an experiment may not change .github/ (the workflows that judge it)"
        for path in workflow_changes(checkout, main_sha, head_sha)
    ]
    return sorted(set(lines))


def kernels_at(checkout: Path, sha: str) -> frozenset[str]:
    from tilegym_hooks.git_io import GitError

    from tilegym_bot.trusted_tree import kernel_names_at

    try:
        return kernel_names_at(checkout, sha)
    except GitError as exc:
        raise BotError(str(exc)) from exc


# ---- the verdict ------------------------------------------------------------------------------
def _model_key(pr: PullRequest) -> str:
    from tilegym_bot.experiment import BRANCH_RE

    match = BRANCH_RE.fullmatch(pr.head.ref)
    if not match:
        raise BotError(
            f"PR #{pr.number} comes from branch {pr.head.ref!r}, not experiment/<model_key>/<slug>"
        )
    return match["model_key"]


def _load_side(folder: Path, name: str) -> Any:
    return json.loads((folder / name).read_text(encoding="utf-8"))


def _check_provenance(
    forge: GitHubForge, folder: Path, head_sha: str, pr: PullRequest
) -> tuple[dict, str, list[Any], list[Any]]:
    """(pr.json, model key, base metrics of each pair, head metrics of each pair) once every
    name in the artifact agrees with the API; BotError listing what does not."""
    from tilegym_bot.runner.artifact import check_artifact, pair_count, pair_files

    record, findings = check_artifact(folder, head_sha, expect_pr=pr.number)
    if record is None:
        raise BotError("the benchmark artifact is not sound", [str(f) for f in findings])
    default = forge.repo.default_branch
    if pr.base.ref != default or pr.base.repo.full_name != forge.repo.full_name:
        raise BotError(
            f"PR #{pr.number} targets {pr.base.repo.full_name}:{pr.base.ref}, "
            f"not {forge.repo.full_name}:{default}"
        )
    model_key = _model_key(pr)
    bases, heads = [], []
    for k in range(1, pair_count(record) + 1):
        base_name, head_name = pair_files(k)
        bases.append(_load_side(folder, base_name))
        heads.append(_load_side(folder, head_name))
    for side, docs in (("base", bases), ("head", heads)):
        for doc in docs:
            if doc["model_key"] != model_key:
                raise BotError(
                    f"the {side} metrics are of model {clip(str(doc['model_key']), 40)!r}, "
                    f"but the branch {pr.head.ref} is an experiment on {model_key!r}"
                )
    return record, model_key, bases, heads


def _sampled_decision(
    record: dict, bases: list[Any], heads: list[Any], margin: float, kernels: dict
) -> Decision:
    """The verdict on a sequentially sampled artifact, as the local loop reaches it: why the
    sampling stopped re-derived from the pairs' files (``sequential.replay_stop``: pairs the
    rule would not have run refuse the artifact), then ``sequential.conclude``."""
    from tilegym_bot import sequential
    from tilegym_bot.runner.artifact import budget_of

    budget = budget_of(record)
    try:
        step = sequential.replay_stop(bases, heads, margin=margin, budget_s=budget, **kernels)
    except ValueError as exc:
        raise BotError("the benchmark artifact is not sound", [f"pr.json:1: ART005 {exc}"]) from exc
    return sequential.conclude(
        bases,
        heads,
        step,
        margin=margin,
        seconds=sequential.span_s([*bases, *heads]),
        budget_s=budget,
        **kernels,
    )


def _description(pr: PullRequest, decision: Decision) -> str:
    return clip(pr.title, DESCRIPTION_LIMIT) + decision.ledger_marker


def _decided_at(old: dict | None, head_sha: str, status: str) -> str:
    """The first decision's time when this head already had this verdict (re-runs are no-ops)."""
    if old and (old.get("head_sha"), old.get("status")) == (head_sha, status):
        return str(old.get("decided_at"))
    return now_iso()


def apply_artifact(
    forge: GitHubForge,
    artifact: Path,
    *,
    run_id: int,
    checkout: Path,
    margin: float = DEFAULT_MARGIN,
    rerun: bool | None = None,
) -> ApplyResult:
    """Check the artifact of workflow run ``run_id``, decide, act on the PR (see module doc).

    ``checkout``: the bot's git checkout of the default branch; the benchmarked commits are
    fetched into it as data. ``rerun``: None reads it from the PR's ``autokernel:inconclusive``
    label. Running it again for the same run changes nothing.
    """
    try:
        return _apply(forge, artifact, run_id, checkout, margin, rerun)
    except (GithubException, requests.RequestException) as exc:
        raise _api_error(exc) from exc


def _apply(
    forge: GitHubForge,
    artifact: Path,
    run_id: int,
    checkout: Path,
    margin: float,
    rerun: bool | None,
) -> ApplyResult:
    head_sha = forge.benchmark_run(run_id)
    pr = forge.find_pr(head_sha)
    if pr is None:
        return ApplyResult(
            "skipped", actions=[f"nothing to do: no pull request has head {head_sha[:8]} now"]
        )
    pr_record, model_key, bases, heads = _check_provenance(forge, artifact, head_sha, pr)
    base_sha = pr_record["base_sha"]
    default, main_sha = forge.default_head()
    fetch_commits(checkout, [main_sha, base_sha, head_sha])
    if not is_ancestor(checkout, base_sha, main_sha):
        raise BotError(
            f"the benchmarked base {base_sha[:8]} is not on {default} (head {main_sha[:8]})"
        )
    existing = forge.bot_comment(pr)
    old = parse_record(existing.body) if existing else None

    found = refusals(checkout, main_sha, head_sha, model_key)
    if found:
        return _refuse(forge, pr, found, old, model_key, base_sha, head_sha)

    kernels = {
        "base_kernels": kernels_at(checkout, base_sha),
        "head_kernels": kernels_at(checkout, head_sha),
    }
    if budget_of(pr_record) > 0:  # sequential sampling: the verdict is final, no rerun round
        decision = _sampled_decision(pr_record, bases, heads, margin, kernels)
        rerun = True
        if decision.sampling and decision.sampling["stopped"] != sequential.PAIR_REJECTED:
            base, head = sequential.pool(bases), sequential.pool(heads)
        else:
            base, head = bases[-1], heads[-1]
    else:
        base, head = bases[0], heads[0]
        if rerun is None:
            # The rerun is a later benchmark run of a PR the bot labelled inconclusive; the run
            # that earned the label, applied again, is still the first round.
            labelled = any(label.name == RERUN_LABEL for label in pr.labels)
            rerun = labelled and not (old and old.get("run") == run_id)
        decision = decide(base, head, margin=margin, rerun=rerun, **kernels)
    result = ApplyResult("skipped", decision, pr.number)
    outcome_text = _act(forge, pr, decision, result, head_sha, base_sha, default, rerun)
    if result.outcome == "skipped":
        return result

    final = result.outcome in ("merged", "closed")
    same = old is not None and (old.get("head_sha"), old.get("status")) == (
        head_sha,
        decision.status,
    )
    baseline_row = old.get("baseline_row") if same else None
    if final and not same:
        rows, _ = ledger.parse(forge.read_ledger(model_key)[0], "ledger")
        if not rows and dig(base, "status") == "ok":
            baseline_row = {
                "commit": base_sha[:8],
                "coverage": decision.coverage_base,
                "throughput": decision.throughput_base,
                "status": "keep",
                "description": "baseline",
            }
    record = build_record(
        decision,
        model_key=model_key,
        description=_description(pr, decision),
        base_sha=base_sha,
        head_sha=head_sha,
        decided_at=_decided_at(old, head_sha, decision.status),
        pr=pr.number,
        final=final,
        baseline_row=baseline_row,
    )
    record["run"] = run_id
    result.comment = render_comment(decision, base, head, record, outcome=outcome_text)
    result.actions.append(forge.upsert_comment(pr, result.comment))
    label = result.outcome if result.outcome in OUTCOME_LABELS else decision.status
    result.actions += forge.set_status_label(pr, label)
    if final:
        rows = [LedgerRow(**baseline_row)] if baseline_row else []
        rows.append(
            LedgerRow(
                head_sha,
                decision.coverage_head,
                decision.throughput_head,
                decision.ledger_status,
                record["description"],
            )
        )
        result.actions += forge.append_ledger(model_key, rows)
    return result


def _act(
    forge: GitHubForge,
    pr: PullRequest,
    decision: Decision,
    result: ApplyResult,
    head_sha: str,
    base_sha: str,
    default: str,
    rerun: bool,
) -> str:
    """Merge or close (or neither) according to ``decision``; sets ``result.outcome`` and
    returns the comment's outcome line. A PR already in the decided state is left as it is."""
    fresh = forge.repo.get_pull(pr.number)
    status = decision.status
    if fresh.merged:
        if status == "keep" and fresh.head.sha == head_sha:
            result.outcome = "merged"
            result.actions.append("already merged")
            return f"squash-merged into `{default}` as `{str(fresh.merge_commit_sha)[:8]}`."
        result.actions.append(f"nothing to do: PR #{pr.number} was merged by someone else")
        return ""
    if fresh.head.sha != head_sha:
        result.actions.append(
            f"nothing to do: the head moved to {fresh.head.sha[:8]} after {head_sha[:8]} was "
            "benchmarked; the new head is benchmarked"
        )
        return ""
    if fresh.state != "open":
        if status in CLOSING or (status == "inconclusive" and rerun):
            result.outcome = "closed"
            result.actions.append("already closed")
            return f"closed ({status})."
        result.actions.append(f"nothing to do: PR #{pr.number} is closed")
        return ""
    if status == "inconclusive" and not rerun:
        result.outcome = "open"
        result.actions.append("left open: inconclusive, waiting for the rerun")
        return (
            "left open: inconclusive (labelled `autokernel:inconclusive`); the next benchmark of "
            "this PR runs twice the samples, and a second inconclusive is recorded as discard."
        )
    if status != "keep":
        fresh.edit(state="closed")
        result.outcome = "closed"
        result.actions.append(f"closed ({status})")
        return f"closed ({status})."
    _, now = forge.default_head()
    if now != base_sha:
        result.outcome = "rebench"
        result.actions.append(f"not merged: {default} moved from {base_sha[:8]} to {now[:8]}")
        return (
            f"not merged: `{default}` moved from `{base_sha[:8]}` (benchmarked) to `{now[:8]}`, "
            "so the merged tree would not be the measured one. Labelled `autokernel:rebench`: "
            f"update the branch with `{default}` (a fork needs `ok-to-bench` again) and it is "
            "benchmarked against the new base."
        )
    try:
        merged = fresh.merge(
            merge_method="squash", sha=head_sha, commit_title=f"{pr.title} (#{pr.number})"
        )
    except GithubException as exc:
        reason = api_reason(exc)
        result.outcome = "merge-failed"
        result.failure = f"GitHub refused to merge PR #{pr.number} ({reason})"
        result.actions.append(f"not merged: GitHub refused ({reason})")
        return (
            f"**not merged**: GitHub refused the merge ({md_text(reason, 300)}). The verdict "
            "stands; a "
            "maintainer must resolve this (branch protection, conflicts) and merge or rebench."
        )
    if not merged.merged:
        reason = clip(str(merged.message), 300)
        result.outcome = "merge-failed"
        result.failure = f"GitHub did not merge PR #{pr.number} ({reason})"
        result.actions.append(f"not merged: {reason}")
        return f"**not merged**: GitHub did not merge it ({md_text(reason, 300)})."
    result.outcome = "merged"
    result.actions.append(f"squash-merged at {head_sha[:8]} as {merged.sha[:8]}")
    return f"squash-merged into `{default}` as `{merged.sha[:8]}`."


def _refuse(
    forge: GitHubForge,
    pr: PullRequest,
    found: list[str],
    old: dict | None,
    model_key: str,
    base_sha: str,
    head_sha: str,
) -> ApplyResult:
    """Close the PR with the finding lines; nothing is merged and no ledger row is written."""
    result = ApplyResult("refused", None, pr.number, refusals=found)
    fresh = forge.repo.get_pull(pr.number)
    outcome = "closed; nothing merged, no ledger row."
    if fresh.merged:
        outcome = "it was already merged by someone else; the bot would not have merged it."
    elif fresh.state == "open" and fresh.head.sha == head_sha:
        fresh.edit(state="closed")
        result.actions.append("closed (refused)")
    record = {
        "version": 1,
        "model_key": model_key,
        "pr": pr.number,
        "base_sha": base_sha,
        "head_sha": head_sha,
        "status": "refused",
        "ledger_status": None,
        "description": clip(pr.title, DESCRIPTION_LIMIT),
        "decided_at": _decided_at(old, head_sha, "refused"),
        "final": False,
        "findings": len(found),
    }
    result.comment = render_refusal(found, record, outcome=outcome)
    result.actions.append(forge.upsert_comment(pr, result.comment))
    result.actions += forge.set_status_label(pr, "refused")
    result.failure = f"refused: {len(found)} finding(s) in the experiment's diff"
    return result
