"""Fixtures for op tests: fresh random inputs every run and NaN-poisoned output buffers."""

from __future__ import annotations

import os

import pytest
import torch


def _seeded(device: str) -> torch.Generator:
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


@pytest.fixture
def gen():
    """A generator seeded from the OS: different inputs on every run, printed for replay (on
    the GPU where there is one)."""
    return _seeded("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def cpu_gen():
    """``gen`` on the CPU whatever the host: for the CPU tests, which a GPU host runs too."""
    return _seeded("cpu")


@pytest.fixture
def poison_empty(monkeypatch):
    """Make every ``torch.empty``/``empty_like`` return NaN-filled memory during the test.

    The kernels allocate their outputs themselves; poisoning the allocator proves every output
    element was written (an unwritten element stays NaN and fails the parity check).
    """
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    def empty_like(*args, **kwargs):
        t = real_empty_like(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch, "empty_like", empty_like)
