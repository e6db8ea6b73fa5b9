"""A small GitHub REST server over a real git repository, for driving real PyGithub in tests.

It serves the endpoints the bot uses: the repository, a workflow run and its workflow, pulls
(list, get, edit, merge), branches and git refs, issue comments and labels, and file contents.
Branch heads and merges are real: ``main`` and the experiment branches live in a bare origin
repository (the bot's checkout fetches from it), and a squash merge writes a real commit there.
Every request is recorded; ``faults`` queues canned answers for a (method, path).
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import git

OWNER, NAME = "acme", "bench"
BOT = "github-actions[bot]"
WORKFLOW_ID = 4242
BENCH_PATH = ".github/workflows/gpu-benchmark.yml"
COMMENT_LIMIT = 65536


class FakeGitHub:
    def __init__(self, origin: Path):
        self.origin = git.Repo(origin)
        self.requests: list[dict] = []
        self.faults: dict[tuple[str, str], list[tuple[int, dict, dict]]] = {}
        self.pulls: dict[int, dict] = {}
        self.comments: dict[int, dict] = {}
        self.runs: dict[int, dict] = {}
        self.refs: dict[str, str] = {}  # branches that live only here (the ledger branch)
        self.files: dict[tuple[str, str], str] = {}  # (branch, path) -> text
        self.next_comment = 100
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.api = f"http://127.0.0.1:{self.server.server_address[1]}/api/v3"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    # ---- test set-up ---------------------------------------------------------------------------
    def add_pull(self, number, head_sha, head_ref, title="qwen3: fused RMSNorm", labels=()):
        self.pulls[number] = {
            "title": title,
            "state": "open",
            "merged": False,
            "merge_commit_sha": None,
            "head_sha": head_sha,
            "head_ref": head_ref,
            "base_ref": "main",
            "base_repo": f"{OWNER}/{NAME}",
            "labels": list(labels),
        }

    def add_run(self, run_id, head_sha, *, path=BENCH_PATH, event="pull_request", workflow_id=None):
        self.runs[run_id] = {
            "id": run_id,
            "name": "gpu-benchmark",
            "path": path,
            "event": event,
            "status": "completed",
            "conclusion": "success",
            "head_sha": head_sha,
            "workflow_id": WORKFLOW_ID if workflow_id is None else workflow_id,
        }

    def add_comment(self, number, body, login=BOT):
        self.next_comment += 1
        self.comments[self.next_comment] = {"issue": number, "body": body, "login": login}
        return self.next_comment

    def calls(self, method=None):
        return [(r["method"], r["path"]) for r in self.requests if method in (None, r["method"])]

    def writes(self):
        return [(m, p) for m, p in self.calls() if m != "GET"]

    def bot_bodies(self, number):
        return [
            c["body"] for c in self.comments.values() if c["issue"] == number and c["login"] == BOT
        ]

    def main_sha(self) -> str:
        return self.origin.git.rev_parse("refs/heads/main")

    # ---- JSON shapes ---------------------------------------------------------------------------
    def _repo_url(self):
        return f"{self.api}/repos/{OWNER}/{NAME}"

    def _repo_json(self):
        return {
            "id": 1,
            "name": NAME,
            "full_name": f"{OWNER}/{NAME}",
            "url": self._repo_url(),
            "owner": {"login": OWNER},
            "default_branch": "main",
        }

    def _pull_json(self, n):
        p = self.pulls[n]
        return {
            "id": n,
            "number": n,
            "title": p["title"],
            "state": p["state"],
            "merged": p["merged"],
            "merge_commit_sha": p["merge_commit_sha"],
            "url": f"{self._repo_url()}/pulls/{n}",
            "issue_url": f"{self._repo_url()}/issues/{n}",
            "head": {"sha": p["head_sha"], "ref": p["head_ref"]},
            "base": {
                "sha": self.main_sha(),
                "ref": p["base_ref"],
                "repo": {"full_name": p["base_repo"], "name": NAME, "owner": {"login": OWNER}},
            },
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

    def _branch_sha(self, name):
        if name in self.refs:
            return self.refs[name]
        try:
            return self.origin.git.rev_parse("--verify", f"refs/heads/{name}")
        except git.GitCommandError:
            return None

    def _file_json(self, branch, path):
        text = self.files[(branch, path)]
        data = text.encode()
        return {
            "type": "file",
            "encoding": "base64",
            "name": path.rsplit("/", 1)[-1],
            "path": path,
            "sha": _blob_sha(data),
            "size": len(data),
            "content": base64.b64encode(data).decode(),
            "url": f"{self._repo_url()}/contents/{path}?ref={branch}",
        }

    # ---- routing --------------------------------------------------------------------------------
    def handle(self, method, path, query, body):
        prefix = f"/api/v3/repos/{OWNER}/{NAME}"
        if not path.startswith(prefix):
            return 404, {"message": "Not Found"}
        rest = [urllib.parse.unquote(p) for p in path[len(prefix) :].split("/") if p]
        match rest:
            case []:
                return 200, self._repo_json()
            case ["actions", "runs", run_id] if int(run_id) in self.runs:
                return 200, self.runs[int(run_id)]
            case ["actions", "workflows", "gpu-benchmark.yml"]:
                return 200, {"id": WORKFLOW_ID, "name": "gpu-benchmark", "path": BENCH_PATH}
            case ["pulls"]:
                state = query.get("state", ["open"])[0]
                numbers = [n for n in sorted(self.pulls, reverse=True)]
                if state != "all":
                    numbers = [n for n in numbers if self.pulls[n]["state"] == state]
                return 200, [self._pull_json(n) for n in numbers]
            case ["pulls", n] if method == "GET":
                return 200, self._pull_json(int(n))
            case ["pulls", n] if method == "PATCH":
                self.pulls[int(n)]["state"] = body.get("state", self.pulls[int(n)]["state"])
                return 200, self._pull_json(int(n))
            case ["pulls", n, "merge"]:
                return self._merge(int(n), body)
            case ["branches", name]:
                sha = self._branch_sha(name)
                if sha is None:
                    return 404, {"message": "Branch not found"}
                return 200, {"name": name, "commit": {"sha": sha, "url": ""}, "protected": False}
            case ["git", "refs"] if method == "POST":
                name = body["ref"].removeprefix("refs/heads/")
                if self._branch_sha(name) is not None:
                    return 422, {"message": "Reference already exists"}
                self.refs[name] = body["sha"]
                return 201, {"ref": body["ref"], "object": {"sha": body["sha"], "type": "commit"}}
            case ["contents", *parts] if method == "GET":
                branch, file = query.get("ref", ["main"])[0], "/".join(parts)
                if (branch, file) not in self.files:
                    return 404, {"message": "Not Found"}
                return 200, self._file_json(branch, file)
            case ["contents", *parts] if method == "PUT":
                return self._put_file("/".join(parts), body)
            case ["issues", n, "comments"] if method == "GET":
                return 200, [
                    self._comment_json(c)
                    for c in sorted(self.comments)
                    if self.comments[c]["issue"] == int(n)
                ]
            case ["issues", n, "comments"] if method == "POST":
                if len(body["body"]) > COMMENT_LIMIT:
                    return 422, {"message": "Validation Failed: body is too long"}
                cid = self.add_comment(int(n), body["body"])
                return 201, self._comment_json(cid)
            case ["issues", "comments", cid] if method == "PATCH":
                if len(body["body"]) > COMMENT_LIMIT:
                    return 422, {"message": "Validation Failed: body is too long"}
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

    def _merge(self, n, body):
        p = self.pulls[n]
        if p["merged"] or p["state"] != "open":
            return 405, {"message": "Pull Request is not mergeable"}
        if body.get("sha") != p["head_sha"]:
            return 409, {"message": "Head branch was modified. Review and try again."}
        main = self.main_sha()
        tree = self.origin.git.rev_parse(f"{p['head_sha']}^{{tree}}")
        title = body.get("commit_title") or p["title"]
        sha = self.origin.git.commit_tree(
            tree,
            "-p",
            main,
            "-m",
            title,
            env={
                "GIT_AUTHOR_NAME": "GitHub",
                "GIT_AUTHOR_EMAIL": "noreply@github.com",
                "GIT_COMMITTER_NAME": "GitHub",
                "GIT_COMMITTER_EMAIL": "noreply@github.com",
            },
        )
        self.origin.git.update_ref("refs/heads/main", sha, main)
        p.update(merged=True, state="closed", merge_commit_sha=sha)
        return 200, {"sha": sha, "merged": True, "message": "Pull Request successfully merged"}

    def _put_file(self, file, body):
        branch = body.get("branch", "main")
        if self._branch_sha(branch) is None:
            return 404, {"message": f"Branch {branch} not found"}
        current = self.files.get((branch, file))
        if current is not None and "sha" not in body:
            return 422, {"message": '"sha" wasn\'t supplied.'}
        if current is not None and body["sha"] != _blob_sha(current.encode()):
            return 409, {"message": f"{file} does not match {body['sha']}"}
        self.files[(branch, file)] = base64.b64decode(body["content"]).decode()
        commit = hashlib.sha1(f"{file}{time.time()}".encode()).hexdigest()
        self.refs[branch] = commit
        return (200 if current is not None else 201), {
            "content": self._file_json(branch, file),
            "commit": {"sha": commit, "message": body["message"]},
        }

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self):
                url = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else {}
                query = urllib.parse.parse_qs(url.query)
                with fake.lock:
                    fake.requests.append(
                        {
                            "method": self.command,
                            "path": url.path,
                            "query": query,
                            "body": body,
                            "auth": self.headers.get("Authorization"),
                            "at": time.monotonic(),
                            "wall": time.time(),  # to compare with a rate-limit reset
                        }
                    )
                    queued = fake.faults.get((self.command, url.path))
                    if queued:
                        status, headers, payload = queued.pop(0)
                    else:
                        status, payload = fake.handle(self.command, url.path, query, body)
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


def _blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
