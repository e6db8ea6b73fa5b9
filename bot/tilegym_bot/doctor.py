"""``tilegym-bot doctor``: is this host ready to run a GPU experiment? One line per check.

Probing (nvidia-smi, compilers, docker, git) gathers plain facts into ``Facts``; the checks
are pure functions of those facts, so every rule is tested with plain data. A required check
that fails prints ``FAIL`` with the fix and makes the exit status 1; profilers are
informational only.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

CHECKS = ("gpu", "cuda-tile", "toolchain", "image", "profilers", "git")
# Oldest CUDA toolkit (tileiras + ptxas) whose cuTile compiler targets each GPU generation,
# by compute-capability major: Blackwell from 13.1 (the oldest cuda.tile accepts), Ampere/Ada
# from 13.2, Hopper from 13.3.
MIN_TOOLKIT = {8: (13, 2), 9: (13, 3), 10: (13, 1), 11: (13, 1), 12: (13, 1)}
ARCH_NAMES = {8: "Ampere/Ada", 9: "Hopper", 10: "Blackwell", 11: "Blackwell", 12: "Blackwell"}
BRANCH_RE = re.compile(r"^experiment/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
TOOLCHAIN_FIX = "pip install -U 'cuda-tile[tileiras]' (brings matching tileiras and ptxas)"


@dataclass(frozen=True)
class Gpu:
    uuid: str
    name: str
    compute_capability: str | None  # "9.0"
    driver: str | None = None


@dataclass(frozen=True)
class Tool:
    path: str | None
    version: str | None = None  # "13.4" (major.minor) when it could be read


@dataclass
class Facts:
    gpus: list[Gpu] | None = None  # None: no way to list GPUs (no nvidia-smi, no CUDA torch)
    gpu_error: str | None = None
    cuda_tile: str | None = None  # version when it imports
    cuda_tile_error: str | None = None
    tileiras: Tool = field(default_factory=lambda: Tool(None))
    ptxas: Tool = field(default_factory=lambda: Tool(None))
    image: str | None = None
    image_found: bool | None = None
    image_error: str | None = None
    nsys: str | None = None
    ncu: str | None = None
    repo: str | None = None
    repo_error: str | None = None
    dirty: list[str] = field(default_factory=list)
    branch: str | None = None


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True

    def line(self) -> str:
        if self.ok:
            return f"ok    {self.name}: {self.detail}"
        if not self.required:
            return f"info  {self.name}: {self.detail}" + (f"; {self.fix}" if self.fix else "")
        return f"FAIL  {self.name}: {self.detail}; fix: {self.fix}"


# ---- pure checks ---------------------------------------------------------------------------


def parse_release(text: str) -> str | None:
    """``major.minor`` from a CUDA tool's ``--version`` text ("... release 13.4, V13.4.92")."""
    m = re.search(r"release (\d+)\.(\d+)", text) or re.search(r"\bV(\d+)\.(\d+)\.\d+", text)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def min_toolkit(compute_capability: str) -> tuple[int, int] | None:
    """Oldest toolkit for a GPU, or None when cuTile does not target it at all."""
    return MIN_TOOLKIT.get(version_tuple(compute_capability)[0])


def selected_gpu(facts: Facts, expected_uuid: str | None) -> Gpu | None:
    if not facts.gpus:
        return None
    if expected_uuid is None:
        return facts.gpus[0]
    return next((g for g in facts.gpus if g.uuid == expected_uuid), None)


def check_gpu(facts: Facts, expected_uuid: str | None) -> Check:
    if not facts.gpus:
        why = facts.gpu_error or "no NVIDIA GPU found"
        return Check(
            "gpu",
            False,
            why,
            "run on a host with an NVIDIA GPU and driver; `nvidia-smi -L` must list it",
        )
    listed = ", ".join(f"{g.uuid} ({g.name})" for g in facts.gpus)
    gpu = selected_gpu(facts, expected_uuid)
    if gpu is None:
        return Check(
            "gpu",
            False,
            f"expected GPU {expected_uuid} is not on this host (found {listed})",
            "set the GPU UUID (--gpu-uuid / the TILEGYM_GPU_UUID variable) to one of "
            "`nvidia-smi -L`",
        )
    detail = f"{gpu.name} {gpu.uuid} sm_{(gpu.compute_capability or '?').replace('.', '')}"
    if gpu.driver:
        detail += f", driver {gpu.driver}"
    if expected_uuid is None and len(facts.gpus) > 1:
        detail += f" (first of {len(facts.gpus)}; pin one with --gpu-uuid)"
    return Check("gpu", True, detail)


def check_cuda_tile(facts: Facts) -> Check:
    if facts.cuda_tile_error:
        return Check(
            "cuda-tile", False, f"import cuda.tile failed: {facts.cuda_tile_error}", TOOLCHAIN_FIX
        )
    return Check("cuda-tile", True, f"cuda.tile {facts.cuda_tile} imports")


def check_toolchain(facts: Facts, gpu: Gpu | None) -> Check:
    for name, tool in (("tileiras", facts.tileiras), ("ptxas", facts.ptxas)):
        if tool.path is None:
            return Check("toolchain", False, f"{name} not found", TOOLCHAIN_FIX)
        if tool.version is None:
            return Check(
                "toolchain", False, f"{name} at {tool.path} gave no version", TOOLCHAIN_FIX
            )
    t, p = facts.tileiras.version, facts.ptxas.version
    if version_tuple(t) != version_tuple(p):
        return Check(
            "toolchain", False, f"tileiras {t} and ptxas {p} differ in major.minor", TOOLCHAIN_FIX
        )
    detail = f"tileiras {t} and ptxas {p}"
    if gpu is None or gpu.compute_capability is None:
        return Check("toolchain", True, detail + " (no GPU to check the architecture against)")
    sm = f"sm_{gpu.compute_capability.replace('.', '')}"
    need = min_toolkit(gpu.compute_capability)
    if need is None:
        return Check(
            "toolchain",
            False,
            f"cuTile does not target {sm} ({gpu.name})",
            "use an Ampere, Ada, Hopper or Blackwell GPU",
        )
    arch = ARCH_NAMES[version_tuple(gpu.compute_capability)[0]]
    if version_tuple(t) < need:
        return Check(
            "toolchain",
            False,
            f"{sm} ({arch}) needs {need[0]}.{need[1]}+, found {t}",
            TOOLCHAIN_FIX,
        )
    return Check("toolchain", True, f"{detail}, new enough for {sm} ({arch})")


def check_image(facts: Facts) -> Check:
    build = f"docker build -f modeling/transformers/Dockerfile -t {facts.image} ."
    if facts.image_error:
        return Check(
            "image",
            False,
            f"docker is not reachable: {facts.image_error}",
            "start the docker daemon and give this user access (docker group or DOCKER_HOST)",
        )
    if not facts.image_found:
        return Check("image", False, f"image {facts.image} not found", build)
    return Check("image", True, f"image {facts.image} present")


def check_profilers(facts: Facts) -> Check:
    found = [f"{n} ({p})" for n, p in (("nsys", facts.nsys), ("ncu", facts.ncu)) if p]
    missing = [n for n, p in (("nsys", facts.nsys), ("ncu", facts.ncu)) if not p]
    if not missing:
        return Check("profilers", True, ", ".join(found), required=False)
    detail = "found " + ", ".join(found) if found else "none found"
    return Check(
        "profilers",
        False,
        f"{detail}; missing {', '.join(missing)}",
        "optional: coverage uses torch.profiler; install Nsight Systems for --profiler nsys",
        required=False,
    )


def check_git(facts: Facts) -> list[Check]:
    if facts.repo_error:
        return [Check("git", False, facts.repo_error, "run doctor inside the repository")]
    checks = []
    if facts.dirty:
        shown = ", ".join(facts.dirty[:5]) + (" ..." if len(facts.dirty) > 5 else "")
        checks.append(
            Check("git-clean", False, f"uncommitted changes: {shown}", "commit or stash them")
        )
    else:
        checks.append(Check("git-clean", True, f"{facts.repo} has no uncommitted changes"))
    if facts.branch and BRANCH_RE.match(facts.branch):
        checks.append(Check("git-branch", True, f"on {facts.branch}"))
    else:
        where = f"on {facts.branch}" if facts.branch else "HEAD is detached"
        checks.append(
            Check(
                "git-branch",
                False,
                f"{where}, not on an experiment/<model_key>/<slug> branch",
                "tilegym-bot experiment start --model-key K --name SLUG",
            )
        )
    return checks


def evaluate(facts: Facts, expected_uuid: str | None, skip: set[str]) -> list[Check]:
    checks = []
    if "gpu" not in skip:
        checks.append(check_gpu(facts, expected_uuid))
    if "cuda-tile" not in skip:
        checks.append(check_cuda_tile(facts))
    if "toolchain" not in skip:
        checks.append(check_toolchain(facts, selected_gpu(facts, expected_uuid)))
    if "image" not in skip and facts.image is not None:
        checks.append(check_image(facts))
    if "profilers" not in skip:
        checks.append(check_profilers(facts))
    if "git" not in skip:
        checks.extend(check_git(facts))
    return checks


def exit_code(checks: list[Check]) -> int:
    return 1 if any(c.required and not c.ok for c in checks) else 0


# ---- probes --------------------------------------------------------------------------------


def _run(cmd: list[str], timeout: float = 30.0) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout + proc.stderr if proc.returncode == 0 else None


def probe_gpus(facts: Facts) -> None:
    smi = shutil.which("nvidia-smi")
    if smi:
        query = "--query-gpu=uuid,name,compute_cap,driver_version"
        out = _run([smi, query, "--format=csv,noheader"])
        if out is None:
            facts.gpu_error = "nvidia-smi failed (driver not loaded?)"
            return
        rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
        facts.gpus = [Gpu(r[0], r[1], r[2], r[3]) for r in rows if len(r) >= 4]
        return
    try:
        import torch
    except ImportError:
        facts.gpu_error = "no nvidia-smi and no torch to ask for GPUs"
        return
    if not torch.cuda.is_available():
        facts.gpu_error = "no nvidia-smi, and torch sees no CUDA GPU"
        return
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        uuid = str(getattr(props, "uuid", ""))
        uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        gpus.append(Gpu(uuid, props.name, f"{props.major}.{props.minor}"))
    facts.gpus = gpus


def find_tool(name: str, beside: str | None = None) -> str | None:
    """Where cuda.tile would find ``name``: the pip wheel's bin, then PATH, then CUDA_HOME."""
    if beside and (path := shutil.which(name, path=str(Path(beside).parent))):
        return path
    try:
        import nvidia.cu13 as cu13

        if path := shutil.which(name, path=str(Path(list(cu13.__path__)[0]) / "bin")):
            return path
    except (ImportError, IndexError):
        pass
    if path := shutil.which(name):
        return path
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    return shutil.which(name, path=str(Path(cuda_home) / "bin")) if cuda_home else None


def probe_tool(name: str, beside: str | None = None) -> Tool:
    path = find_tool(name, beside)
    if path is None:
        return Tool(None)
    out = _run([path, "--version"])
    return Tool(path, parse_release(out) if out else None)


def probe_toolchain(facts: Facts) -> None:
    try:
        importlib.import_module("cuda.tile")
        facts.cuda_tile = importlib.metadata.version("cuda-tile")
    except Exception as exc:  # any failure to import is the finding itself
        facts.cuda_tile_error = f"{type(exc).__name__}: {exc}"
    facts.tileiras = probe_tool("tileiras")
    facts.ptxas = probe_tool("ptxas", beside=facts.tileiras.path)


def probe_image(facts: Facts, image: str) -> None:
    facts.image = image
    try:
        import docker
        from docker.errors import DockerException, ImageNotFound
    except ImportError as exc:
        facts.image_error = f"docker SDK missing: {exc}"
        return
    try:
        client = docker.from_env(timeout=20)
        try:
            client.images.get(image)
            facts.image_found = True
        except ImageNotFound:
            facts.image_found = False
        finally:
            client.close()
    except DockerException as exc:
        facts.image_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def probe_git(facts: Facts, repo_dir: Path) -> None:
    import git

    try:
        repo = git.Repo(repo_dir, search_parent_directories=True)
    except (git.exc.InvalidGitRepositoryError, git.exc.NoSuchPathError):
        facts.repo_error = f"{repo_dir} is not inside a git repository"
        return
    facts.repo = repo.working_tree_dir
    status = repo.git.status("--porcelain", "--untracked-files=normal")
    facts.dirty = [line[3:] for line in status.splitlines() if line.strip()]
    facts.branch = None if repo.head.is_detached else repo.active_branch.name


def probe(args: argparse.Namespace, skip: set[str]) -> Facts:
    facts = Facts()
    if not {"gpu", "toolchain"} <= skip:
        probe_gpus(facts)
    if not {"cuda-tile", "toolchain"} <= skip:
        probe_toolchain(facts)
    if args.image and "image" not in skip:
        probe_image(facts, args.image)
    if "profilers" not in skip:
        facts.nsys, facts.ncu = shutil.which("nsys"), shutil.which("ncu")
    if "git" not in skip:
        probe_git(facts, Path(args.repo))
    return facts


# ---- command line --------------------------------------------------------------------------


def _doctor(args: argparse.Namespace) -> int:
    skip = set(args.skip or [])
    checks = evaluate(probe(args, skip), args.gpu_uuid, skip)
    for check in checks:
        print(check.line())
    return exit_code(checks)


def register(subparsers) -> None:
    parser = subparsers.add_parser("doctor", help="check this host for a GPU experiment")
    parser.add_argument(
        "--gpu-uuid",
        default=os.environ.get("TILEGYM_GPU_UUID") or None,
        help="GPU this host must have (default: $TILEGYM_GPU_UUID)",
    )
    parser.add_argument("--image", help="experiment image that must exist (docker executor)")
    parser.add_argument("--repo", default=".", help="repository to check (default: .)")
    parser.add_argument("--skip", action="append", choices=CHECKS, help="leave a check out")
    parser.set_defaults(func=_doctor)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tilegym-bot")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
