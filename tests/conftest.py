"""Shared fixtures: GPU availability and fresh git repositories."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def gpu_skip_reason() -> str | None:
    """Why GPU tests cannot run here, or None when a CUDA GPU and cuTile are usable."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    try:
        import cuda.tile  # noqa: F401
    except Exception as exc:  # a broken toolchain is a skip reason, not a crash
        return f"cuda.tile is not usable: {exc}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = gpu_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
