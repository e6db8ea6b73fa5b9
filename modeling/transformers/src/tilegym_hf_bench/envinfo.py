"""Environment fingerprint and commit of a run.

``static_env`` and ``resolve_commit`` are torch-free (the supervisor uses them even when the
worker never got far); ``gpu_env`` imports torch and asks the driver.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

ENV_KEYS = (
    "gpu_name",
    "gpu_uuid",
    "compute_capability",
    "driver",
    "cuda",
    "torch",
    "transformers",
    "cuda_tile",
    "tileiras",
    "python",
)


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _tileiras_version() -> str | None:
    """The installed tileiras wheel, else the first version line of ``tileiras --version``."""
    version = _dist_version("nvidia-cuda-tileiras")
    if version is not None:
        return version
    exe = shutil.which("tileiras")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_tool_version(out.stdout)


def parse_tool_version(text: str) -> str | None:
    """``V13.4.92`` (else ``release 13.4``) from a CUDA tool's ``--version`` text."""
    full = re.search(r"\bV(\d+\.\d+(?:\.\d+)?)\b", text)
    if full:
        return full.group(1)
    release = re.search(r"release (\d+\.\d+)", text)
    return release.group(1) if release else None


def static_env() -> dict[str, Any]:
    """Everything knowable without importing torch; GPU fields are None."""
    env: dict[str, Any] = dict.fromkeys(ENV_KEYS)
    env["torch"] = _dist_version("torch")
    env["transformers"] = _dist_version("transformers")
    env["cuda_tile"] = _dist_version("cuda-tile")
    env["tileiras"] = _tileiras_version()
    env["python"] = platform.python_version()
    return env


def _driver_version(uuid: str | None) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    cmd = [exe, "--query-gpu=driver_version", "--format=csv,noheader"]
    if uuid:
        cmd += ["-i", uuid]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    text = out.stdout.strip().splitlines()
    return text[0].strip() if out.returncode == 0 and text else None


def gpu_env(device: str) -> dict[str, Any]:
    """``static_env`` plus the GPU of ``device`` (all GPU fields None on a CPU device)."""
    import torch

    env = static_env()
    env["torch"] = torch.__version__
    env["cuda"] = torch.version.cuda
    if not device.startswith("cuda"):
        return env
    index = torch.device(device).index or 0
    props = torch.cuda.get_device_properties(index)
    env["gpu_name"] = props.name
    uuid = getattr(props, "uuid", None)
    env["gpu_uuid"] = f"GPU-{uuid}" if uuid is not None else None
    env["compute_capability"] = f"{props.major}.{props.minor}"
    env["driver"] = _driver_version(env["gpu_uuid"])
    return env


class CommitError(Exception):
    """The commit of the running code cannot be determined."""


def resolve_commit(override: str | None, start: Path | None = None) -> tuple[str, bool]:
    """(40-hex commit, working tree dirty) of the repository this code runs from."""
    if override is not None:
        return override, False
    try:
        import git
    except ImportError as exc:
        raise CommitError(f"GitPython is not installed ({exc}); pass --commit") from None
    where = start or Path(__file__).resolve().parent
    try:
        repo = git.Repo(where, search_parent_directories=True)
        return repo.head.commit.hexsha, repo.is_dirty(untracked_files=False)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, ValueError) as exc:
        raise CommitError(
            f"{where} is not in a git checkout with a commit ({exc}); pass --commit"
        ) from None
