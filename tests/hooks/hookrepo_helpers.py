"""Helpers of the hook tests: a real git repository shaped like this project, and the runner.

A module with its own name (not ``conftest``): several test folders have a conftest.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import git

MONKEY_PATCH = "src/tilegym/transformers/monkey_patch.py"
TILEGYM_PATCH = "modeling/transformers/src/tilegym_hf_bench/tilegym_patch.py"
PREFIXES = "modeling/transformers/src/tilegym_hf_bench/kernel_filters/tilegym_kernel_prefixes.yaml"
QWEN3_KERNEL = "src/tilegym/transformers/qwen3/kernels/rms_norm.py"

MAIN_FILES = {
    "README.md": "# toy project\n",
    "sandbox/README.md": "scratch space\n",
    "sandbox/.gitignore": "*\n!.gitignore\n!README.md\n",
    MONKEY_PATCH: '''\
        """Kernel patches per model."""

        import importlib


        def _swap(module, name, fn):
            # keep the original for undo
            original = getattr(module, name)
            setattr(module, name, fn)
            return original


        def apply_tilegym_kernel_to_qwen3(model=None, rms_norm=True):
            module = importlib.import_module("transformers.models.qwen3.modeling_qwen3")
            if rms_norm:
                _swap(module, "Qwen3RMSNorm", object)


        def apply_tilegym_kernel_to_llama(model=None, rms_norm=True):
            module = importlib.import_module("transformers.models.llama.modeling_llama")
            if rms_norm:
                _swap(module, "LlamaRMSNorm", object)
        ''',
    TILEGYM_PATCH: """\
        MODEL_PATCH_KWARGS = {
            "qwen3": {"rms_norm": True},
            "llama": {"rms_norm": True},
        }


        def patch_kwargs(model_key):
            return MODEL_PATCH_KWARGS.get(model_key, {})
        """,
    PREFIXES: """\
        prefixes:
          - qwen3_rms_norm_kernel
        """,
    QWEN3_KERNEL: """\
        import cuda.tile as ct


        @ct.kernel
        def qwen3_rms_norm_kernel(x, y):
            pass


        def rms_norm(x):
            return x
        """,
    "src/tilegym/ops/rope.py": """\
        import cuda.tile


        @cuda.tile.kernel(num_ctas=2)
        def rope_kernel(q, k):
            pass


        def rope_reference(q, k):
            return q, k
        """,
}


def clean_env() -> dict[str, str]:
    """The environment without git's own variables (set when tests run inside a git hook)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}


class HookRepo:
    """A git work tree in ``root``; ``run`` starts ``tilegym-hooks`` in it as a subprocess."""

    def __init__(self, root: Path):
        self.root = root
        self.repo = git.Repo.init(root, initial_branch="main")
        with self.repo.config_writer() as config:
            config.set_value("user", "name", "Test")
            config.set_value("user", "email", "test@example.invalid")
            config.set_value("commit", "gpgsign", "false")

    def write(self, path: str, content: str | bytes, *, dedent: bool = True) -> Path:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(textwrap.dedent(content) if dedent else content)
        return target

    def read(self, path: str) -> str:
        return (self.root / path).read_text()

    def replace(self, path: str, old: str, new: str) -> None:
        text = self.read(path)
        assert old in text, f"{old!r} not in {path}"
        self.write(path, text.replace(old, new, 1), dedent=False)

    def stage(self, *paths: str) -> None:
        self.repo.git.add("-A", "--", *(paths or ["."]))

    def commit(self, message: str = "change", *paths: str) -> None:
        self.stage(*paths)
        self.repo.git.commit("-q", "--allow-empty", "-m", message)

    def checkout(self, branch: str, *, create: bool = False) -> None:
        if create:
            self.repo.git.checkout("-q", "-b", branch)
        else:
            self.repo.git.checkout("-q", branch)

    def run(
        self, *args: str, env: dict[str, str] | None = None, console_script: bool = False
    ) -> subprocess.CompletedProcess:
        """``python -m tilegym_hooks ARGS`` (or the installed ``tilegym-hooks`` script)."""
        return run_hooks(self.root, *args, env=env, console_script=console_script)


def run_hooks(
    cwd: Path, *args: str, env: dict[str, str] | None = None, console_script: bool = False
) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "tilegym-hooks"
    program = [str(script)] if console_script else [sys.executable, "-m", "tilegym_hooks"]
    return subprocess.run(
        [*program, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean_env(), **(env or {})},
    )
