"""Failures the benchmark expects and explains in one line (no traceback). Torch-free."""

import os


class BenchError(Exception):
    """A run that cannot go on, with a message that says why."""


def looks_like_path(model_id: str) -> bool:
    return model_id.startswith(("/", "./", "../", "~")) or os.path.exists(model_id)


def check_model_id(model_id: str | None) -> None:
    """A --model-id written as a path must be a directory (checked before torch is imported)."""
    if model_id and looks_like_path(model_id) and not os.path.isdir(os.path.expanduser(model_id)):
        raise BenchError(f"--model-id {model_id}: no such directory")
