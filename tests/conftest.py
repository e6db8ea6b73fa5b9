"""Shared fixtures and the two test tiers: GPU availability, and slow tests run only on ``--slow``.

The default tier (``bash scripts/test.sh``) leaves out tests marked ``slow`` so that it finishes in
a few minutes on a 2-core machine; ``bash scripts/test.sh --all`` (and CI) passes ``--slow``.
"""

from __future__ import annotations

import contextlib
import functools

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--slow",
        action="store_true",
        default=False,
        help="also run the slow tier (tests marked slow); scripts/test.sh --all passes it",
    )


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
    if not config.getoption("slow"):
        slow = [item for item in items if "slow" in item.keywords]
        if slow:
            items[:] = [item for item in items if "slow" not in item.keywords]
            config.hook.pytest_deselected(items=slow)
            reporter = config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(
                    f"{len(slow)} slow tests left out (AOT compiles, long CPU runs): "
                    "`bash scripts/test.sh --all` runs them"
                )
    reason = gpu_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_setup(item):
    """A slow test's fixtures (a compile of every Solution) print progress as they go instead
    of into pytest's capture, so a long setup is never silent (``trylast``: inside the capture
    plugin's own wrapper, which would otherwise resume capturing around it)."""
    capture = item.config.pluginmanager.get_plugin("capturemanager")
    quiet = "slow" not in item.keywords or capture is None
    with contextlib.nullcontext() if quiet else capture.global_and_fixture_disabled():
        return (yield)
