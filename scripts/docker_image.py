"""Build (or reuse) the CPU experiment image from modeling/transformers/Dockerfile, no registry.

    .venv/bin/python scripts/docker_image.py [--tag tilegym-experiment:cpu]

The Dockerfile is built on the local Debian base (scripts/docker_base.sh base) with the CPU torch
build. pip in the build reaches no index: every wheel the Dockerfile pins (and what they need) is
downloaded once by the host's pip into a wheel folder under the cache, and served to the build
on a fixed loopback port (the build runs on the host's network; a fixed URL keeps the build
argument, and so Docker's layer cache, the same from run to run). The engine's own layer cache
makes a second build take seconds when nothing changed. Prints the image id.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import http.server
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = "modeling/transformers/Dockerfile"
CACHE = Path(os.environ.get("TILEGYM_DOCKER_CACHE", Path.home() / ".cache/tilegym/docker"))
# The CPU build of torch for the base's Python (Debian bookworm: 3.11), as the project's
# machines have it on disk; PyPI's plain torch would be a CUDA build of several GB.
CPU_TORCH = os.environ.get("TILEGYM_DOCKER_TORCH", "2.13.0+cpu")
BUILD_TOOLS = ["setuptools>=69", "wheel"]
_ARG = re.compile(r"^ARG (\w+)=(.*)$", re.M)
_PIN = re.compile(r'"([A-Za-z0-9_.\-]+(?:\[[a-z,]+\])?==[^"]+)"')


def dockerfile_pins(text: str, overrides: dict[str, str]) -> list[str]:
    """Every ``"name==version"`` the Dockerfile pip-installs, its ``${ARG}``s filled in. Pure."""
    args = {name: value.strip('"') for name, value in _ARG.findall(text)}
    args.update(overrides)
    pins = []
    for pin in _PIN.findall(text):
        pins.append(re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], pin))
    return pins


def fill_wheels(folder: Path, requirements: list[str]) -> None:
    """Download the wheels of ``requirements`` into ``folder`` unless a stamp says it has them."""
    key = hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:16]
    stamp = folder / f".complete-{key}"
    if stamp.is_file():
        print(f"docker: wheel folder {folder} complete", file=sys.stderr)
        return
    folder.mkdir(parents=True, exist_ok=True)
    print(f"docker: downloading {len(requirements)} pins into {folder}", file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(folder)]
    proc = subprocess.run([*cmd, *requirements], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise SystemExit(f"{tail}\nerror: pip download of the image's wheels failed")
    stamp.write_text("\n".join(requirements) + "\n")


def serve(folder: Path, port: int) -> http.server.ThreadingHTTPServer:
    """A quiet read-only file server of ``folder`` on 127.0.0.1:port, in a daemon thread."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *_args) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as exc:
        raise SystemExit(
            f"error: cannot serve the wheel folder on 127.0.0.1:{port}: {exc} "
            "(set TILEGYM_DOCKER_WHEEL_PORT to a free port)"
        ) from exc
    threading.Thread(target=server.serve_forever, name="wheels", daemon=True).start()
    return server


def build(tag: str, base: str, port: int) -> str:
    """Build ``tag`` on ``base``; returns the image id. Progress on stderr."""
    import docker
    from docker.errors import BuildError, DockerException

    text = (ROOT / DOCKERFILE).read_text()
    build_args = {
        "BASE_IMAGE": base,
        "APT_PACKAGES": "",
        "PYTHON": "python3",
        "TORCH_VERSION": CPU_TORCH,
        "PIP_ARGS": f"--no-index --find-links http://127.0.0.1:{port}/",
    }
    fill_wheels(CACHE / "wheels", [*dockerfile_pins(text, build_args), *BUILD_TOOLS])
    try:
        client = docker.from_env(timeout=600)
        client.images.get(base)
    except DockerException as exc:
        raise SystemExit(
            f"error: base image {base}: {exc} (bash scripts/docker_base.sh base)"
        ) from exc
    server = serve(CACHE / "wheels", port)
    t0 = time.monotonic()
    try:
        image, logs = client.images.build(
            path=str(ROOT),
            dockerfile=DOCKERFILE,
            tag=tag,
            buildargs=build_args,
            network_mode="host",
            rm=True,
            forcerm=True,
        )
        for entry in logs:
            line = entry.get("stream", "").rstrip()
            if line.startswith("Step ") or "Using cache" in line:
                print(f"docker: {line.strip()}", file=sys.stderr)
    except BuildError as exc:
        for entry in exc.build_log:
            if entry.get("stream"):
                print(entry["stream"].rstrip(), file=sys.stderr)
        raise SystemExit(f"error: building {tag} failed: {exc.msg}") from exc
    finally:
        server.shutdown()
    # Each rebuild leaves the previous image untagged; on vfs that is gigabytes.
    client.images.prune(filters={"dangling": True})
    size = image.attrs.get("Size", 0) / 1e9
    print(f"docker: {tag} ready in {time.monotonic() - t0:.0f} s ({size:.2f} GB)", file=sys.stderr)
    return image.id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default=os.environ.get("TILEGYM_IMAGE", "tilegym-experiment:cpu"))
    parser.add_argument(
        "--base", default=os.environ.get("TILEGYM_DOCKER_BASE", "tilegym-base:bookworm")
    )
    parser.add_argument(
        "--port", type=int, default=int(os.environ.get("TILEGYM_DOCKER_WHEEL_PORT", "38419"))
    )
    args = parser.parse_args(argv)
    print(build(args.tag, args.base, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
