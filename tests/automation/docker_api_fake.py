"""A small Docker Engine API server on a unix socket, for driving the real docker SDK in tests.

It answers the endpoints a benchmark run uses (ping/version, image inspect, container list
with label filters, create, inspect, start, wait, logs, stop, kill, delete, events), records
every call and the create body, and plays a "container" whose behaviour the test picks:

- ``ok``: writes a metrics file into the folder bound at /workspace/out, logs, exits 0;
- ``crash``: logs a traceback to stderr and exits 1 without metrics;
- ``oom``: exits 137 with State.OOMKilled set;
- ``oom-late``: exits 137 with State.OOMKilled unset, the engine's ``oom`` event its only
  trace (dockerd sets the flag only when the OOM reaches it before the exit);
- ``hang``: never exits on its own and ignores stop; only kill ends it;
- ``flood``: keeps writing into /workspace/out until killed;
- ``chatty``: writes 8 MiB to stdout, then behaves like ``ok``.

``seed(labels)`` adds a running container that no run created (one a killed runner left).
"""

from __future__ import annotations

import json
import re
import socketserver
import struct
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

API_VERSION = "1.45"


class FakeContainer:
    def __init__(self, cid: str, body: dict[str, Any]):
        self.id = cid
        self.body = body
        self.running = False
        self.exit_code = 0
        self.oom = False
        self.exited = threading.Event()
        self.stdout: list[bytes] = []
        self.stderr: list[bytes] = []

    def finish(self, code: int, oom: bool = False) -> None:
        self.exit_code, self.oom, self.running = code, oom, False
        self.exited.set()

    @property
    def labels(self) -> dict[str, str]:
        return self.body.get("Labels") or {}

    def bind_source(self, target: str) -> Path:
        for bind in self.body["HostConfig"]["Binds"]:
            src, dst, _mode = bind.rsplit(":", 2)
            if dst == target:
                return Path(src)
        raise KeyError(target)


class FakeEngine:
    def __init__(self, socket_path: Path, images: set[str], behaviour: str, metrics: dict):
        self.socket_path = socket_path
        self.images = images
        self.behaviour = behaviour
        self.metrics = metrics
        self.calls: list[tuple[str, str]] = []
        self.containers: dict[str, FakeContainer] = {}
        self.created: list[dict[str, Any]] = []
        self.oom_events: list[str] = []
        self.lock = threading.Lock()
        engine = self

        class Handler(_Handler):
            fake = engine

        self.server = _Server(str(socket_path), Handler)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"unix://{self.socket_path}"

    def __enter__(self) -> FakeEngine:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        for container in self.containers.values():
            container.exited.set()
        self.server.shutdown()
        self.server.server_close()

    def record(self, method: str, path: str) -> None:
        with self.lock:
            self.calls.append((method, path))

    def listing(self, query: dict[str, str]) -> list[dict[str, Any]]:
        """``GET /containers/json``: every container (``all``) or the running ones, with the
        label filters (``key=value`` or ``key``) all matching."""
        wanted = json.loads(query.get("filters") or "{}").get("label", [])
        if isinstance(wanted, dict):  # the map form {"key=value": true}
            wanted = list(wanted)
        found = []
        for container in list(self.containers.values()):
            if not (container.running or query.get("all") in ("1", "true", "True")):
                continue
            labels = container.labels
            if all(
                labels.get(f.split("=", 1)[0]) == f.split("=", 1)[1] if "=" in f else f in labels
                for f in wanted
            ):
                found.append(
                    {
                        "Id": container.id,
                        "Image": container.body.get("Image"),
                        "Labels": labels,
                        "State": "running" if container.running else "exited",
                        "Created": int(time.time()),
                    }
                )
        return found

    def call_names(self) -> list[str]:
        names = []
        for method, path in self.calls:
            parts = path.strip("/").split("/")
            if parts[0] == "containers" and len(parts) == 2 and method == "DELETE":
                names.append("delete")
            elif parts[0] == "containers" and len(parts) >= 2:
                names.append(parts[-1] if parts[1] != "create" else "create")
            else:
                names.append(parts[0] if parts[0] != "images" else "image")
        return names

    def seed(self, labels: dict[str, str]) -> str:
        """A running container with ``labels`` that no run of this test created; its id."""
        cid = uuid.uuid4().hex * 2
        container = FakeContainer(cid, {"Image": "leftover", "Labels": labels})
        container.running = True
        self.containers[cid] = container
        return cid

    def _flood(self, container: FakeContainer) -> None:
        out = container.bind_source("/workspace/out") / "junk.bin"
        chunk = b"x" * (256 * 1024)
        with out.open("ab") as fh:
            for _ in range(2048):  # at most 512 MiB, should nothing stop it
                if container.exited.wait(0.005):
                    return
                fh.write(chunk)
                fh.flush()

    def start(self, container: FakeContainer) -> None:
        container.running = True
        if self.behaviour == "flood":
            threading.Thread(target=self._flood, args=(container,), daemon=True).start()
            return
        if self.behaviour == "chatty":
            container.stdout.extend([b"y" * (64 * 1024)] * 128)
        if self.behaviour in ("ok", "chatty"):
            out = container.bind_source("/workspace/out")
            cmd = container.body["Cmd"]
            doc = dict(self.metrics, commit=cmd[cmd.index("--commit") + 1])
            (out / "metrics.json").write_text(json.dumps(doc))
            container.stdout.append(b"Average throughput: 53.41 +- 0.25 tokens/sec\n")
            container.stderr.append(b"warming up\n")
            container.finish(0)
        elif self.behaviour == "crash":
            container.stderr.append(b"Traceback (most recent call last):\n")
            container.stderr.append(b"RuntimeError: CUDA error: an illegal memory access\n")
            container.finish(1)
        elif self.behaviour == "oom":
            container.stdout.append(b"loading model\n")
            container.finish(137, oom=True)
        elif self.behaviour == "oom-late":
            container.stdout.append(b"loading model\n")
            self.oom_events.append(container.id)
            container.finish(137)
        elif self.behaviour == "hang":
            container.stderr.append(b"stuck in generate()\n")


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    fake: FakeEngine

    def log_message(self, *args) -> None:  # unix sockets have no client address to log
        pass

    def _send(self, code: int, body: Any = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(code)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, method: str) -> None:
        url = urlsplit(self.path)
        path = re.sub(r"^/v[0-9.]+", "", url.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.fake.record(method, path)
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"null") if length else None
        fake = self.fake
        if path == "/_ping":
            data = b"OK"
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(data)
            return
        if path == "/version":
            return self._send(
                200,
                {
                    "ApiVersion": API_VERSION,
                    "MinAPIVersion": "1.24",
                    "Version": "27.0.0",
                    "Os": "linux",
                    "Arch": "amd64",
                },
            )
        if m := re.fullmatch(r"/images/(.+)/json", path):
            if m.group(1) in fake.images:
                return self._send(200, {"Id": "sha256:" + "ab" * 32, "RepoTags": [m.group(1)]})
            return self._send(404, {"message": f"No such image: {m.group(1)}"})
        if path == "/events" and method == "GET":
            return self._events(query)
        if path == "/containers/json" and method == "GET":
            return self._send(200, fake.listing(query))
        if path == "/containers/create" and method == "POST":
            cid = uuid.uuid4().hex * 2
            fake.containers[cid] = FakeContainer(cid, body)
            fake.created.append(body)
            return self._send(201, {"Id": cid, "Warnings": []})
        m = re.fullmatch(r"/containers/([0-9a-f]+)(?:/(\w+))?", path)
        if not m or m.group(1) not in fake.containers:
            return self._send(404, {"message": f"no such container or endpoint: {path}"})
        container, action = fake.containers[m.group(1)], m.group(2)
        if method == "GET" and action == "json":
            return self._send(200, _inspect(container))
        if method == "POST" and action == "start":
            fake.start(container)
            return self._send(204)
        if method == "POST" and action == "wait":
            container.exited.wait()
            return self._send(200, {"StatusCode": container.exit_code, "Error": None})
        if method == "GET" and action == "logs":
            return self._logs(container, query)
        if method == "POST" and action == "stop":
            return self._send(204)  # this container ignores stop; only kill ends it
        if method == "POST" and action == "kill":
            if not container.running:
                return self._send(409, {"message": "container is not running"})
            container.finish(137)
            return self._send(204)
        if method == "DELETE" and action is None:
            if container.running and query.get("force") not in ("1", "true", "True"):
                return self._send(409, {"message": "cannot remove a running container"})
            if container.running:
                container.finish(137)
            del fake.containers[container.id]
            return self._send(204)
        return self._send(404, {"message": f"unsupported {method} {path}"})

    def _events(self, query: dict[str, str]) -> None:
        """``GET /events``: the ``oom`` events of containers the ``container`` filter names
        (all when it names none), when the ``event`` filter lets ``oom`` through; one JSON
        object a line, then the stream ends (as at ``until``)."""
        filters = json.loads(query.get("filters") or "{}")
        ids = filters.get("container") or []
        actions = filters.get("event") or ["oom"]
        lines = [
            json.dumps({"Type": "container", "Action": "oom", "status": "oom", "id": cid,
                        "Actor": {"ID": cid, "Attributes": {}}, "time": int(time.time())})
            for cid in self.fake.oom_events
            if "oom" in actions and (not ids or cid in ids)
        ]  # fmt: skip
        data = "".join(line + "\n" for line in lines).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _logs(self, container: FakeContainer, query: dict[str, str]) -> None:
        streams = []
        if query.get("stdout") in ("1", "true", "True"):
            streams.append((1, container.stdout))
        if query.get("stderr") in ("1", "true", "True"):
            streams.append((2, container.stderr))
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.docker.multiplexed-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        sent = {kind: 0 for kind, _ in streams}
        follow = query.get("follow") in ("1", "true", "True")
        while True:
            for kind, chunks in streams:
                for chunk in chunks[sent[kind] :]:
                    self.wfile.write(struct.pack(">BxxxL", kind, len(chunk)) + chunk)
                sent[kind] = len(chunks)
            self.wfile.flush()
            if not follow or container.exited.wait(0.05):
                break
        for kind, chunks in streams:
            for chunk in chunks[sent[kind] :]:
                self.wfile.write(struct.pack(">BxxxL", kind, len(chunk)) + chunk)
        self.close_connection = True

    def _safe(self, method: str) -> None:
        try:
            self._route(method)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def do_GET(self) -> None:
        self._safe("GET")

    def do_POST(self) -> None:
        self._safe("POST")

    def do_DELETE(self) -> None:
        self._safe("DELETE")

    def do_HEAD(self) -> None:
        self._safe("HEAD")


def _inspect(container: FakeContainer) -> dict[str, Any]:
    return {
        "Id": container.id,
        "Name": "/bench",
        "Image": container.body.get("Image"),
        "Config": {"Tty": False, "Image": container.body.get("Image"), "Labels": container.labels},
        "State": {
            "Status": "running" if container.running else "exited",
            "Running": container.running,
            "ExitCode": container.exit_code,
            "OOMKilled": container.oom,
        },
        "HostConfig": container.body.get("HostConfig", {}),
    }
