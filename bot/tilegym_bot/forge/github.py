"""The GitHub forge: the same verdict acted on a pull request, through PyGithub.

One sticky bot comment per PR (found again by its hidden marker, edited in place), one
``autokernel:<status>`` label, squash-merge on keep only while the PR head is still the benchmarked
SHA (the SHA is also passed to the merge call, so GitHub itself refuses a head that moved in
between), close on discard/incorrect/crash/timeout, left open on inconclusive (the rerun follows).
Retries: PyGithub's ``GithubRetry`` (a ``urllib3.Retry``) retries 5xx with exponential backoff and
403/429 rate limits honouring ``Retry-After`` and ``X-RateLimit-Reset``.

Only comments written by the bot's own account count (``TILEGYM_BOT_LOGIN``, default
``github-actions[bot]``): a contributor cannot plant a record that ``ledger rebuild`` would trust.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import requests
from github import Auth, Github, GithubException, GithubRetry
from github.IssueComment import IssueComment
from github.PullRequest import PullRequest

from tilegym_bot.errors import BotError
from tilegym_bot.forge.local import now_iso
from tilegym_bot.policy import DEFAULT_MARGIN, STATUSES, Decision, decide, dig
from tilegym_bot.report import MARKER, build_record, parse_record, render_comment

LABELS = {status: f"autokernel:{status}" for status in STATUSES}
DEFAULT_API_URL = "https://api.github.com"
DEFAULT_BOT_LOGIN = "github-actions[bot]"


def default_retry(*, total: int = 6, backoff_factor: float = 2.0) -> GithubRetry:
    """5xx and rate limits, every method we use (edits and labels are idempotent)."""
    return GithubRetry(
        total=total,
        backoff_factor=backoff_factor,
        max_rate_limit_wait=900,
        allowed_methods=frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"}),
    )


def _api_error(exc: Exception) -> BotError:
    if isinstance(exc, GithubException):
        message = exc.data.get("message") if isinstance(exc.data, dict) else exc.data
        return BotError(f"GitHub API error {exc.status}: {message}")
    return BotError(f"GitHub API unreachable: {exc}")


class GitHubForge:
    def __init__(
        self,
        repo: str,
        *,
        token: str | None = None,
        base_url: str | None = None,
        bot_login: str | None = None,
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
    def get_pr(self, number: int) -> PullRequest:
        return self.repo.get_pull(number)

    def find_pr(self, head_sha: str) -> PullRequest:
        """The PR (open or not, newest activity first) whose head is ``head_sha``."""
        for pr in self.repo.get_pulls(state="all", sort="updated", direction="desc"):
            if pr.head.sha == head_sha:
                return pr
        raise BotError(f"no pull request has head {head_sha}")

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

    def merge_or_close(self, pr: PullRequest, status: str, head_sha: str, title: str) -> str:
        fresh = self.repo.get_pull(pr.number)
        if fresh.merged:
            return "already merged"
        if status == "keep":
            if fresh.head.sha != head_sha:
                return (
                    f"not merged: the head moved to {fresh.head.sha[:8]} after {head_sha[:8]} "
                    "was benchmarked; the new head must be benchmarked"
                )
            if fresh.state != "open":
                return "not merged: the pull request is closed"
            try:
                fresh.merge(merge_method="squash", sha=head_sha, commit_title=title)
            except GithubException as exc:
                if exc.status in (405, 409):
                    return f"not merged: GitHub refused ({_api_error(exc)})"
                raise
            return f"squash-merged at {head_sha[:8]}"
        if status == "inconclusive":
            return "left open: inconclusive, waiting for the rerun"
        if fresh.state == "open":
            fresh.edit(state="closed")
            return f"closed ({status})"
        return "already closed"


@dataclass
class ApplyResult:
    decision: Decision
    pr_number: int
    comment: str
    actions: list[str] = field(default_factory=list)


def apply_verdict(
    forge: GitHubForge,
    base: Any,
    head: Any,
    *,
    head_sha: str,
    pr_number: int | None = None,
    margin: float = DEFAULT_MARGIN,
    rerun: bool = False,
) -> ApplyResult:
    """Decide and act on the PR; running it twice for the same PR and SHA changes nothing."""
    commit = dig(head, "commit")
    if isinstance(commit, str) and commit != head_sha:
        raise BotError(
            f"head metrics are of commit {commit[:8]}, not the benchmarked {head_sha[:8]}"
        )
    try:
        pr = forge.get_pr(pr_number) if pr_number else forge.find_pr(head_sha)
        decision = decide(base, head, margin=margin, rerun=rerun)
        existing = forge.bot_comment(pr)
        old = parse_record(existing.body) if existing else None
        same = old and old.get("head_sha") == head_sha and old.get("status") == decision.status
        final = not (decision.status == "inconclusive" and not rerun)
        description = pr.title + (
            f" [{decision.status}]" if decision.status in ("incorrect", "inconclusive") else ""
        )
        record = build_record(
            decision,
            model_key=str(dig(head, "model_key") or dig(base, "model_key") or "unknown"),
            description=description,
            base_sha=dig(base, "commit") if isinstance(dig(base, "commit"), str) else None,
            head_sha=head_sha,
            decided_at=old["decided_at"] if same else now_iso(),
            pr=pr.number,
            final=final,
        )
        body = render_comment(decision, base, head, record)
        result = ApplyResult(decision, pr.number, body, [forge.upsert_comment(pr, body)])
        result.actions += forge.set_status_label(pr, decision.status)
        result.actions.append(
            forge.merge_or_close(pr, decision.status, head_sha, f"{pr.title} (#{pr.number})")
        )
    except (GithubException, requests.RequestException) as exc:
        raise _api_error(exc) from exc
    return result
