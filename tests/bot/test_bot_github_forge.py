"""The GitHub forge through real PyGithub over real HTTP, against a small local REST server."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from tilegym_bot.cli import main
from tilegym_bot.errors import BotError
from tilegym_bot.forge.github import GitHubForge, apply_verdict, default_retry
from tilegym_bot.report import MARKER

OWNER, NAME = "acme", "bench"
BOT = "github-actions[bot]"
HEAD = "b" * 40
BASE = "a" * 40


class FakeGitHub:
    """In-memory pulls, comments and labels behind the handful of REST endpoints the bot uses."""

    def __init__(self):
        self.requests: list[dict] = []
        self.faults: dict[tuple[str, str], list[tuple[int, dict, dict]]] = {}
        self.pulls: dict[int, dict] = {}
        self.comments: dict[int, dict] = {}
        self.next_comment = 100
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.api = f"http://127.0.0.1:{self.server.server_address[1]}/api/v3"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def add_pull(self, number, head_sha, title="qwen3: fused RMSNorm", labels=()):
        self.pulls[number] = {
            "number": number,
            "title": title,
            "state": "open",
            "merged": False,
            "head_sha": head_sha,
            "labels": list(labels),
        }

    def add_comment(self, number, body, login=BOT):
        self.next_comment += 1
        self.comments[self.next_comment] = {"issue": number, "body": body, "login": login}
        return self.next_comment

    def calls(self, method=None):
        return [(r["method"], r["path"]) for r in self.requests if method in (None, r["method"])]

    # ---- JSON shapes ---------------------------------------------------------------------------
    def _repo_url(self):
        return f"{self.api}/repos/{OWNER}/{NAME}"

    def _pull_json(self, n):
        p = self.pulls[n]
        return {
            "id": n,
            "number": n,
            "title": p["title"],
            "state": p["state"],
            "merged": p["merged"],
            "url": f"{self._repo_url()}/pulls/{n}",
            "issue_url": f"{self._repo_url()}/issues/{n}",
            "head": {"sha": p["head_sha"], "ref": f"experiment/qwen3/x{n}"},
            "base": {"sha": BASE, "ref": "main"},
            "labels": [{"name": label} for label in p["labels"]],
            "user": {"login": "alice"},
        }

    def _comment_json(self, cid):
        c = self.comments[cid]
        return {
            "id": cid,
            "body": c["body"],
            "user": {"login": c["login"]},
            "url": f"{self._repo_url()}/issues/comments/{cid}",
        }

    # ---- routing --------------------------------------------------------------------------------
    def handle(self, method, path, body):
        prefix = f"/api/v3/repos/{OWNER}/{NAME}"
        if not path.startswith(prefix):
            return 404, {"message": "Not Found"}
        rest = [urllib.parse.unquote(p) for p in path[len(prefix) :].split("/") if p]
        match rest:
            case []:
                return 200, {
                    "id": 1,
                    "name": NAME,
                    "full_name": f"{OWNER}/{NAME}",
                    "url": self._repo_url(),
                    "owner": {"login": OWNER},
                }
            case ["pulls"]:
                return 200, [self._pull_json(n) for n in sorted(self.pulls, reverse=True)]
            case ["pulls", n] if method == "GET":
                return 200, self._pull_json(int(n))
            case ["pulls", n] if method == "PATCH":
                self.pulls[int(n)]["state"] = body.get("state", self.pulls[int(n)]["state"])
                return 200, self._pull_json(int(n))
            case ["pulls", n, "merge"]:
                p = self.pulls[int(n)]
                if body.get("sha") != p["head_sha"]:
                    return 409, {"message": "Head branch was modified. Review and try again."}
                p.update(merged=True, state="closed")
                return 200, {"sha": "c" * 40, "merged": True, "message": "merged"}
            case ["issues", n, "comments"] if method == "GET":
                return 200, [
                    self._comment_json(c)
                    for c in sorted(self.comments)
                    if self.comments[c]["issue"] == int(n)
                ]
            case ["issues", n, "comments"] if method == "POST":
                cid = self.add_comment(int(n), body["body"])
                return 201, self._comment_json(cid)
            case ["issues", "comments", cid] if method == "PATCH":
                self.comments[int(cid)]["body"] = body["body"]
                return 200, self._comment_json(int(cid))
            case ["issues", n, "labels"] if method == "POST":
                labels = self.pulls[int(n)]["labels"]
                names = body["labels"] if isinstance(body, dict) else body
                labels += [name for name in names if name not in labels]
                return 200, [{"name": name} for name in labels]
            case ["issues", n, "labels", name] if method == "DELETE":
                self.pulls[int(n)]["labels"].remove(name)
                return 200, [{"name": x} for x in self.pulls[int(n)]["labels"]]
        return 404, {"message": f"no route {method} {path}"}

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self):
                url = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else {}
                with fake.lock:
                    fake.requests.append(
                        {
                            "method": self.command,
                            "path": url.path,
                            "query": urllib.parse.parse_qs(url.query),
                            "body": body,
                            "auth": self.headers.get("Authorization"),
                            "at": time.monotonic(),
                        }
                    )
                    queued = fake.faults.get((self.command, url.path))
                    if queued:
                        status, headers, payload = queued.pop(0)
                    else:
                        status, payload = fake.handle(self.command, url.path, body)
                        headers = {}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

            def log_message(self, *args):
                pass

        return Handler


@pytest.fixture
def fake():
    server = FakeGitHub()
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture
def forge_for(fake, monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "t0ken")
    monkeypatch.setenv("GITHUB_API_URL", fake.api)

    def make():
        return GitHubForge(
            f"{OWNER}/{NAME}",
            retry=default_retry(total=3, backoff_factor=0.01),
            seconds_between_requests=None,
            seconds_between_writes=None,
        )

    return make


def _pair(make_metrics, **head_kw):
    return make_metrics(commit=BASE), make_metrics(commit=HEAD, **head_kw)


def test_keep_comments_labels_and_squash_merges_with_sha(fake, forge_for, make_metrics):
    fake.add_pull(7, HEAD, labels=["autokernel:inconclusive", "qwen3"])
    fake.add_pull(6, "d" * 40)
    fake.add_comment(7, f"{MARKER}\nforged by someone else", login="mallory")
    base, head = _pair(make_metrics, coverage=61.2)
    result = apply_verdict(forge_for(), base, head, head_sha=HEAD)
    assert result.decision.status == "keep" and result.pr_number == 7
    assert all(r["auth"] == "token t0ken" for r in fake.requests)
    merges = [r for r in fake.requests if r["method"] == "PUT"]
    assert [(r["path"], r["body"]["sha"], r["body"]["merge_method"]) for r in merges] == [
        (f"/api/v3/repos/{OWNER}/{NAME}/pulls/7/merge", HEAD, "squash")
    ]
    assert fake.pulls[7]["merged"] and fake.pulls[7]["labels"] == ["qwen3", "autokernel:keep"]
    bot = [c for c in fake.comments.values() if c["login"] == BOT]
    assert len(bot) == 1 and bot[0]["body"].startswith(MARKER)
    assert "coverage 50.00% → 61.20%" in bot[0]["body"]
    assert fake.comments[101]["body"] == f"{MARKER}\nforged by someone else"

    # Same PR and SHA again: no write at all.
    writes = len([r for r in fake.requests if r["method"] != "GET"])
    again = apply_verdict(forge_for(), base, head, head_sha=HEAD)
    assert again.actions == ["bot comment already up to date", "already merged"]
    assert len([r for r in fake.requests if r["method"] != "GET"]) == writes


def test_discard_edits_the_sticky_comment_and_closes(fake, forge_for, make_metrics):
    fake.add_pull(8, HEAD)
    forge = forge_for()
    base, head = _pair(make_metrics, coverage=50.0)
    apply_verdict(forge, base, head, head_sha=HEAD, pr_number=8)
    assert fake.pulls[8]["state"] == "closed" and not fake.pulls[8]["merged"]
    assert fake.pulls[8]["labels"] == ["autokernel:discard"]
    assert ("PATCH", f"/api/v3/repos/{OWNER}/{NAME}/pulls/8") in fake.calls()
    # A corrected decision (crash) edits the one comment and swaps the label.
    crash = make_metrics(commit=HEAD, status="crash")
    apply_verdict(forge, base, crash, head_sha=HEAD, pr_number=8)
    assert [c["body"] for c in fake.comments.values()][0].count(MARKER) == 1
    assert len(fake.comments) == 1 and "verdict: **crash**" in fake.comments[101]["body"]
    assert ("PATCH", f"/api/v3/repos/{OWNER}/{NAME}/issues/comments/101") in fake.calls()
    assert fake.pulls[8]["labels"] == ["autokernel:crash"]


def test_head_moved_is_not_merged(fake, forge_for, make_metrics):
    fake.add_pull(9, "e" * 40)
    base, head = _pair(make_metrics, coverage=61.2)
    result = apply_verdict(forge_for(), base, head, head_sha=HEAD, pr_number=9)
    assert "not merged: the head moved" in result.actions[-1]
    assert not fake.calls("PUT") and fake.pulls[9]["state"] == "open"


def test_schema_invalid_metrics_label_inconclusive_and_never_merge(fake, forge_for, make_metrics):
    fake.add_pull(10, HEAD)
    base, head = _pair(make_metrics, coverage=61.2)
    del head["correctness"]
    result = apply_verdict(forge_for(), base, head, head_sha=HEAD)
    assert result.decision.status == "inconclusive"
    assert fake.pulls[10]["labels"] == ["autokernel:inconclusive"]
    assert not fake.calls("PUT") and fake.pulls[10]["state"] == "open"
    assert "rejected by the schema" in next(iter(fake.comments.values()))["body"]


def test_retries_502_and_rate_limit_with_retry_after(fake, forge_for, make_metrics):
    fake.add_pull(11, HEAD)
    pulls = f"/api/v3/repos/{OWNER}/{NAME}/pulls/11"
    comments = f"/api/v3/repos/{OWNER}/{NAME}/issues/11/comments"
    fake.faults[("GET", pulls)] = [(502, {}, {"message": "Bad Gateway"})]
    fake.faults[("POST", comments)] = [
        (403, {"Retry-After": "1"}, {"message": "You have exceeded a secondary rate limit."})
    ]
    base, head = _pair(make_metrics, coverage=61.2)
    apply_verdict(forge_for(), base, head, head_sha=HEAD, pr_number=11)
    gets = [r for r in fake.requests if (r["method"], r["path"]) == ("GET", pulls)]
    assert len(gets) >= 2  # the 502 then the retried success
    posts = [r for r in fake.requests if (r["method"], r["path"]) == ("POST", comments)]
    assert len(posts) == 2 and posts[1]["at"] - posts[0]["at"] >= 0.95
    assert len(fake.comments) == 1 and fake.pulls[11]["merged"]


def test_primary_rate_limit_waits_for_the_reset(fake, forge_for, make_metrics):
    fake.add_pull(15, HEAD)
    labels = f"/api/v3/repos/{OWNER}/{NAME}/issues/15/labels"
    reset = int(time.time()) + 1
    fake.faults[("POST", labels)] = [
        (
            403,
            {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(reset)},
            {"message": "API rate limit exceeded for installation ID 1."},
        )
    ]
    base, head = _pair(make_metrics, coverage=61.2)
    apply_verdict(forge_for(), base, head, head_sha=HEAD, pr_number=15)
    posts = [r for r in fake.requests if (r["method"], r["path"]) == ("POST", labels)]
    assert len(posts) == 2 and posts[1]["at"] - posts[0]["at"] >= 0.95
    assert fake.pulls[15]["labels"] == ["autokernel:keep"]


def test_ledger_rebuild_from_comments(fake, forge_for, make_metrics, tmp_path, monkeypatch):
    fake.add_pull(12, HEAD, title="qwen3: rope")
    fake.add_pull(13, "f" * 40, title="qwen3: mlp")
    base, head = _pair(make_metrics, coverage=61.2)
    apply_verdict(forge_for(), base, head, head_sha=HEAD)
    apply_verdict(forge_for(), base, make_metrics(commit="f" * 40), head_sha="f" * 40)
    import git

    repo = git.Repo.init(tmp_path / "r")
    monkeypatch.setenv("TILEGYM_BOT_LOGIN", BOT)
    rc = main(
        [
            "-C",
            repo.working_tree_dir,
            "ledger",
            "rebuild",
            "--model-key",
            "qwen3",
            "--github",
            f"{OWNER}/{NAME}",
        ]
    )
    assert rc == 0
    lines = (tmp_path / "r" / "sandbox" / "qwen3_results.md").read_text().splitlines()
    assert sorted(lines[2:]) == [
        "| bbbbbbbb | 61.20 | 50.00 | keep | qwen3: rope |",
        "| ffffffff | 50.00 | 50.00 | discard | qwen3: mlp |",
    ]


def test_missing_token_and_api_errors_are_bot_errors(fake, monkeypatch):
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    with pytest.raises(BotError, match="GITHUB_TOKEN"):
        GitHubForge(f"{OWNER}/{NAME}", base_url=fake.api)
    with pytest.raises(BotError, match="GitHub API error 404"):
        GitHubForge(
            "acme/other",
            token="x",
            base_url=fake.api,
            retry=default_retry(total=1, backoff_factor=0.01),
        )


def test_github_apply_cli(fake, forge_for, make_metrics, save_metrics, tmp_path, capsys):
    forge_for()  # sets GITHUB_TOKEN and GITHUB_API_URL for the CLI
    fake.add_pull(14, HEAD)
    base = save_metrics(tmp_path / "b.json", make_metrics(commit=BASE))
    head = save_metrics(tmp_path / "h.json", make_metrics(commit=HEAD, passed=False))
    out = tmp_path / "summary" / "comment.md"
    args = [
        "github",
        "apply",
        "--repo",
        f"{OWNER}/{NAME}",
        "--head-sha",
        HEAD,
        "--base-metrics",
        str(base),
        "--head-metrics",
        str(head),
        "--report-out",
        str(out),
    ]
    capsys.readouterr()
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["status"], doc["ledger_status"]) == ("incorrect", "discard")
    assert (
        fake.pulls[14]["labels"] == ["autokernel:incorrect"] and fake.pulls[14]["state"] == "closed"
    )
    assert out.read_text() == next(iter(fake.comments.values()))["body"]
    wrong = save_metrics(tmp_path / "w.json", make_metrics(commit="9" * 40))
    assert main([*args[:9], str(wrong)]) == 1
    assert capsys.readouterr().err.startswith("error: head metrics are of commit 99999999")
