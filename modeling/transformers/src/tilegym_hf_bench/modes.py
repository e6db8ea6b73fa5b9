"""``--mode``: how both sides run ``generate()``. Pure data and text, torch-free.

Eager ``generate()`` is host-bound (the GPU idles most of the wall time), so a slower kernel
barely moves its throughput. Static mode runs what a user gets from one ``generate()`` flag, a
static KV cache with the decode step compiled (CUDA graphs on a GPU), where the kernels set the
pace. Both sides of one run always use the same mode, and the bot compares two runs only when
their modes are equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EAGER, STATIC = "eager", "static"
DEFAULT_MODE = EAGER

# transformers' CompileConfig defaults (the same in 5.17 and 5.24), which generate() compiles
# the decode step with when the cache is static and the device is a GPU. Pinned here so both
# sides and every supported transformers version compile the same way.
DECODE_STEP_COMPILE: dict[str, Any] = {
    "fullgraph": False,
    "dynamic": None,
    "backend": "inductor",
    "mode": "reduce-overhead",
}


@dataclass(frozen=True)
class Mode:
    name: str
    summary: str  # what the mode line says after the name
    cache_implementation: str | None  # generate(cache_implementation=...); None: the default
    compile_config: dict[str, Any] | None  # CompileConfig kwargs of the decode step; None: eager
    keep_cache: bool = False  # one static cache per side across generate() calls (Generator)


MODES: dict[str, Mode] = {
    EAGER: Mode(EAGER, "each side's default KV cache, eager generate()", None, None),
    STATIC: Mode(
        STATIC, "static KV cache, compiled decode step", "static", DECODE_STEP_COMPILE, True
    ),
}


def mode_line(name: str) -> str:
    """The line that tells a reader of the output which generate() the numbers come from."""
    return f"mode: {name} ({MODES[name].summary})"


def mode_of(workload: dict[str, Any] | None) -> str:
    """The mode of a metrics file's ``workload``; a version-1 file has none and ran eager."""
    mode = (workload or {}).get("mode")
    return mode if isinstance(mode, str) else DEFAULT_MODE


def warmup_problem(name: str, warmup_runs: int) -> str | None:
    """Compiling and capturing graphs belong to warm-up: static mode needs at least one run."""
    if name == STATIC and warmup_runs < 1:
        return (
            "--mode static needs --warmup-runs >= 1 (compiling the decode step and capturing "
            "its CUDA graphs is warm-up, never part of a timed run)"
        )
    return None
