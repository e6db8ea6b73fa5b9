"""--verify-sources against a real git repository and a real local HTTP server."""

from __future__ import annotations

import copy
import http.server
import json
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import git
import pytest
from inventory_helpers import DEFINITION, codes_of, make_tree

from tilegym.kernel_inventory.cache import JsonCache
from tilegym.kernel_inventory.check import check_paths
from tilegym.kernel_inventory.permalink import parse_permalink
from tilegym.kernel_inventory.sources import (
    CiteError,
    SourceVerifier,
    parse_repo_specs,
    repos_from_env,
)

MODELING = (
    "def silu(x):\n    return x\n\n\n\nclass MLP:\n    def forward(self, x):\n        return x\n"
)


@pytest.fixture
def upstream(tmp_path) -> tuple[Path, str]:
    """A real git repository with one commit holding a small modeling file."""
    path = tmp_path / "upstream"
    repo = git.Repo.init(path)
    target = path / "src" / "modeling.py"
    target.parent.mkdir(parents=True)
    target.write_text(MODELING)
    repo.index.add(["src/modeling.py"])
    author = git.Actor("Test", "test@example.com")
    sha = repo.index.commit("add modeling", author=author, committer=author).hexsha
    repo.close()
    return path, sha


def _link(sha: str, anchor: str, path: str = "src/modeling.py", repo: str = "acme/models") -> str:
    return f"https://github.com/{repo}/blob/{sha}/{path}#{anchor}"


def _tree_citing(root: Path, *links: str) -> Path:
    definition = copy.deepcopy(DEFINITION)
    header = "".join(f"# Source: {link}\n" for link in links)
    definition["reference"] = header + "def run(gate, up):\n    return gate\n"
    definition_path, _ = make_tree(root / "repo", definition=definition)
    return definition_path


def _verifier(clones: dict, cache_path: Path | None = None, **kwargs) -> SourceVerifier:
    cache = JsonCache(cache_path) if cache_path is not None else None
    return SourceVerifier(clones=clones, cache=cache, **kwargs)


def test_cited_regions_from_a_clone(tmp_path, upstream):
    clone, sha = upstream
    missing_sha = "f" * 40
    cases = {
        _link(sha, "L1-L2"): [],
        _link(sha, "L6"): [],
        _link(missing_sha, "L1"): ["INV051"],
        _link(sha, "L1", path="src/absent.py"): ["INV052"],
        _link(sha, "L8-L99"): ["INV053"],
        _link(sha, "L3-L5"): ["INV054"],
    }
    verifier = _verifier(parse_repo_specs([f"acme/models={clone}"]))
    for index, (link, codes) in enumerate(cases.items()):
        definition_path = _tree_citing(tmp_path / f"case{index}", link)
        findings = check_paths(
            [definition_path], tmp_path / f"case{index}" / "repo", verifier=verifier
        )
        assert codes_of(findings) == codes, link
        assert all("reference line 1" in f.message for f in findings)


def test_cache_lets_a_second_run_pass_without_the_clone(tmp_path, upstream):
    clone, sha = upstream
    cache_path = tmp_path / "cache" / "permalinks.json"
    link = parse_permalink(_link(sha, "L1-L2"))
    _verifier({"acme/models": clone}, cache_path).verify(link)
    assert JsonCache(cache_path).get(link.url) == {"file_lines": 8}
    shutil.rmtree(clone)
    _verifier({"acme/models": clone}, cache_path).verify(link)  # served from the cache
    with pytest.raises(CiteError) as excinfo:
        _verifier({"acme/models": clone}).verify(link)
    assert excinfo.value.code == "INV050"


def test_failures_are_not_cached(tmp_path, upstream):
    clone, sha = upstream
    cache_path = tmp_path / "permalinks.json"
    link = parse_permalink(_link(sha, "L3-L5"))
    for _ in range(2):
        with pytest.raises(CiteError):
            _verifier({"acme/models": clone}, cache_path).verify(link)
    assert JsonCache(cache_path).get(link.url) is None


def test_corrupt_cache_reads_as_empty_and_is_rewritten(tmp_path, upstream):
    clone, sha = upstream
    cache_path = tmp_path / "permalinks.json"
    cache_path.write_text("{not json")
    link = parse_permalink(_link(sha, "L1"))
    _verifier({"acme/models": clone}, cache_path).verify(link)
    assert JsonCache(cache_path).get(link.url) is not None


class _RawHandler(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}

    def do_GET(self):  # noqa: N802 (http.server API)
        body = self.files.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(body or b"not found")

    def log_message(self, *args):
        pass


@pytest.fixture
def raw_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RawHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_https_fallback_against_a_local_server(raw_server):
    sha = "1" * 40
    _RawHandler.files = {
        f"/acme/models/{sha}/src/modeling.py": MODELING.encode(),
        f"/Qwen/Qwen3-0.6B/raw/{sha}/modeling_qwen.py": b"x = 1\n",
    }
    verifier = _verifier({}, github_raw_base=raw_server, hf_base=raw_server, timeout_s=5)
    verifier.verify(parse_permalink(_link(sha, "L1-L2")))
    hf = f"https://huggingface.co/Qwen/Qwen3-0.6B/blob/{sha}/modeling_qwen.py#L1"
    verifier.verify(parse_permalink(hf))
    for link, code in (
        (_link(sha, "L1", path="src/absent.py"), "INV052"),
        (_link(sha, "L3-L4"), "INV054"),
        (_link(sha, "L1-L100"), "INV053"),
    ):
        with pytest.raises(CiteError) as excinfo:
            verifier.verify(parse_permalink(link))
        assert excinfo.value.code == code


def test_network_failure_is_a_finding(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    verifier = _verifier({}, github_raw_base=f"http://127.0.0.1:{closed_port}", timeout_s=5)
    definition_path = _tree_citing(tmp_path, _link("2" * 40, "L1"))
    findings = check_paths([definition_path], tmp_path / "repo", verifier=verifier)
    assert codes_of(findings) == ["INV050"]
    assert "--source-repo acme/models=PATH" in findings[0].message


def test_repo_specs_from_flags_and_environment(tmp_path):
    assert parse_repo_specs([f"Acme/Models={tmp_path}", ""]) == {"acme/models": tmp_path}
    env = {"TILEGYM_SOURCE_REPOS": f"a/b={tmp_path}/x; c/d={tmp_path}/y"}
    assert repos_from_env(env) == {"a/b": tmp_path / "x", "c/d": tmp_path / "y"}
    for bad in ("acme", "acme/models", "=path", "a/b/c=path", "/b=path"):
        with pytest.raises(ValueError):
            parse_repo_specs([bad])


def test_cache_survives_concurrent_writers(tmp_path):
    cache_path = tmp_path / "shared.json"
    writer = (
        "import sys\n"
        "from tilegym.kernel_inventory.cache import JsonCache\n"
        "cache = JsonCache(sys.argv[1])\n"
        "for i in range(25):\n"
        "    assert cache.put(f'{sys.argv[2]}-{i}', i)\n"
    )
    processes = [
        subprocess.Popen([sys.executable, "-c", writer, str(cache_path), name])
        for name in ("a", "b", "c")
    ]
    assert [p.wait(timeout=60) for p in processes] == [0, 0, 0]
    entries = json.loads(cache_path.read_text())
    assert len(entries) == 75 and entries["b-24"] == 24
    assert not list(tmp_path.glob("*.tmp"))
