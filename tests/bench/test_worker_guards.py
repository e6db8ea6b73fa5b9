"""The worker's own checks, on plain modules and classes: what the audit hook cannot see.

Class attribute assignment raises no audit event, so the worker compares the classes a verdict
runs through against a snapshot taken before experiment code (``isolation.class_guard``); the
profiler's namespaces are compared around the profiled call (``profiling.guarded``).
"""

from __future__ import annotations

import sys
import types
from unittest import mock

import pytest
from tilegym_hf_bench.isolation.class_guard import ClassGuard
from tilegym_hf_bench.profiling.guarded import _changes, _snapshot


@pytest.fixture
def watched_module():
    """A module named like one the guard watches, holding one class, removed afterwards."""
    module = types.ModuleType("tilegym_hf_bench._guard_probe")

    class Probe:
        def forward(self):
            return "real"

        limit = 3

    Probe.__module__, Probe.__qualname__ = module.__name__, "Probe"
    module.Probe = Probe
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def _fake(self):
    return "fake"


SPELLINGS = {
    "assignment": lambda cls: setattr(cls, "forward", _fake),
    "computed setattr": lambda cls: setattr(cls, "for" + "ward", _fake),
    "type.__setattr__": lambda cls: type.__setattr__(cls, "forward", _fake),
    "deletion": lambda cls: delattr(cls, "forward"),
    "data attribute": lambda cls: setattr(cls, "limit", 4),
}


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_every_spelling_of_a_class_rebinding_is_seen(watched_module, spelling):
    guard = ClassGuard()
    assert guard.changes() == []
    SPELLINGS[spelling](watched_module.Probe)
    changed = guard.changes()
    assert len(changed) == 1 and changed[0].startswith("tilegym_hf_bench._guard_probe.Probe.")


def test_a_patch_undone_before_the_check_is_not_a_change_but_one_in_place_is(watched_module):
    guard = ClassGuard()
    with mock.patch.object(watched_module.Probe, "forward", _fake):
        assert guard.changes() == ["tilegym_hf_bench._guard_probe.Probe.forward"]
    assert guard.changes() == []


def test_new_attributes_and_unwatched_modules_are_not_changes(watched_module):
    guard = ClassGuard()
    watched_module.Probe.cache = {}  # a lazily added member
    assert guard.changes() == []
    other = types.ModuleType("somebody_elses")
    other.Thing = type("Thing", (), {"__module__": "somebody_elses", "x": 1})
    sys.modules["somebody_elses"] = other
    try:
        guard = ClassGuard()
        other.Thing.x = 2
        assert guard.changes() == []
        guard = ClassGuard(extra_modules=("somebody_elses",))
        other.Thing.x = 3
        assert guard.changes() == ["somebody_elses.Thing.x"]
    finally:
        del sys.modules["somebody_elses"]


def test_a_freed_id_cannot_pass_for_the_original(watched_module):
    """The snapshot holds the objects, so a replacement cannot reuse the original's id."""
    guard = ClassGuard()
    original = watched_module.Probe.__dict__["forward"]
    del watched_module.Probe.forward
    watched_module.Probe.forward = types.FunctionType(
        original.__code__, original.__globals__, "forward"
    )
    assert guard.changes() == ["tilegym_hf_bench._guard_probe.Probe.forward"]


def test_profiler_namespaces_compare_callables_not_state(watched_module):
    watched_module.flag = False
    before = _snapshot([watched_module.__name__])
    watched_module.flag = True  # state that changes as CUDA starts: not a tamper
    assert _changes(before) == []
    watched_module.Probe = type("Probe", (), {})
    assert _changes(before) == ["tilegym_hf_bench._guard_probe.Probe"]
