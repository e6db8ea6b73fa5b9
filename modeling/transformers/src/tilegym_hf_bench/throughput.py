"""Warm-up until timings settle, then timed runs interleaved A B A B across the sides.

Warm-up pays every one-time cost (torch.compile, CUDA-graph capture, cuTile JIT) and reports
it as ``compile_s``; each timed run is guarded so that it cannot compile (``compile_guard``)
and runs with Python's cyclic garbage collector paused (``gc_paused``), as ``timeit`` does.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

from tilegym_hf_bench.compile_guard import no_compile
from tilegym_hf_bench.generation import Generator
from tilegym_hf_bench.stats import first_run_outlier, settled

EXTRA_WARMUP_RUNS = 4  # at most this many runs beyond --warmup-runs while timings still move


@dataclass
class SideSamples:
    tokens_per_s: list[float] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)
    decode_tokens_per_s: list[float] = field(default_factory=list)
    warmup_s: list[float] = field(default_factory=list)
    last_output: object = None
    outputs: list = field(default_factory=list)  # every timed run's sequences, for checking


@dataclass(frozen=True)
class WarmUp:
    runs: int
    times: dict[str, list[float]]  # each side's full generate() seconds, in order

    def compile_s(self, name: str) -> float | None:
        """Seconds ``name``'s first warm-up generate() took beyond its last (warm) one: the
        one-time cost of compiling, capturing CUDA graphs and JIT-compiling kernels. None
        without two warm-up runs to compare."""
        return first_run_excess(self.times.get(name, []))


@contextmanager
def gc_paused() -> Iterator[None]:
    """Collect, then keep the cyclic collector off for the body. A full collection over the
    millions of objects that torch.compile and transformers keep alive takes tens of ms and
    lands in whichever side's timed run crosses the allocation threshold: noise that is no
    property of either side. Reference counting still frees everything acyclic."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def first_run_excess(times: list[float]) -> float | None:
    """The first time minus the last, never below zero (None with fewer than two times)."""
    if len(times) < 2:
        return None
    return max(times[0] - times[-1], 0.0)


def warm_up(sides: dict[str, Generator], tokens: int, min_runs: int, log: Callable) -> int:
    """Full generate() runs of every side, interleaved, until each side's time settled; the
    number of runs (``warm_up_sides`` also returns their times)."""
    return warm_up_sides(sides, tokens, min_runs, log).runs


def first_runs(
    sides: dict[str, Generator], tokens: int, ahead: Callable[[], None] | None = None
) -> dict[str, float]:
    """Each side's first, compiling generate() (full length, then one token so that the
    prefill-only shapes of the TTFT runs compile too), in seconds of the full one. A side that
    can take requests ahead (``submit_generate``: the model worker) gets both at once and
    compiles while the sides of this process compile theirs: nothing here is timed. ``ahead()``
    runs once this process's sides are done, while the worker may still be busy (the runner
    sends the worker its correctness cases and computes its own side then); everything sent
    ahead is answered before this returns, so no later run waits behind it."""
    pending = {
        name: (gen.submit_generate(tokens), gen.submit_generate(1))
        for name, gen in sides.items()
        if hasattr(gen, "submit_generate")
    }
    times = {}
    for name, gen in sides.items():
        if name not in pending:
            times[name], _ = gen.timed(tokens)  # first: a kept cache is made at its full length
            gen.timed(1)
    if ahead is not None:
        ahead()
    for name, (full, one) in pending.items():
        sides[name].wait_started()
        times[name] = full.result()["_elapsed_s"]
        one.result()
        sides[name].drain()
    return {name: times[name] for name in sides}


def warm_up_sides(
    sides: dict[str, Generator],
    tokens: int,
    min_runs: int,
    log: Callable,
    ahead: Callable[[], None] | None = None,
) -> WarmUp:
    """Full generate() runs of every side, interleaved after the first, until each side's time
    settled; ``ahead`` as in ``first_runs`` (not called without warm-up runs)."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    runs = 0
    limit = min_runs + EXTRA_WARMUP_RUNS if min_runs else 0
    while runs < limit and not all(settled(t, min_runs) for t in times.values()):
        if runs == 0:
            for name, seconds in first_runs(sides, tokens, ahead).items():
                times[name].append(seconds)
        else:
            for name, gen in sides.items():
                seconds, _ = gen.timed(tokens)
                times[name].append(seconds)
        runs += 1
        log(
            "warm-up run {}: {}".format(
                runs, ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items())
            )
        )
    if limit and not all(settled(t, min_runs) for t in times.values()):
        log(f"warning: warm-up timings still moved by more than 10% after {runs} runs")
    result = WarmUp(runs, times)
    for name in sides:
        seconds = result.compile_s(name)
        if seconds is not None:
            log(
                f"{name}: first warm-up generate() took {seconds:.2f} s beyond a warm one "
                "(compile, graph capture, JIT: warm-up, not timed)"
            )
    return result


def measure(
    sides: dict[str, Generator],
    batch: int,
    tokens: int,
    runs: int,
    log: Callable,
    prompt: Callable[[int], object] | None = None,
    guard: Callable[[str], AbstractContextManager] = no_compile,
    quiet: Callable[[str], AbstractContextManager] = lambda name: nullcontext(),
) -> dict[str, SideSamples]:
    """``runs`` rounds; each round times every side (in order) once: a 1-token generate (time to
    first token), then the full generate. tokens/s = batch*tokens / wall time of generate().
    ``prompt(i)``: the input ids of round i, the same for every side (default: each side's own),
    or a pair (first-token prompt, full prompt); they are handed to each side inside its timed
    window. ``guard(label)`` wraps each side's two timed calls: by default a compile there is an
    error (a worker side gets the label and guards its own calls). ``quiet(name)`` wraps the
    side's timed calls too: the runner stops the model worker while its own side is timed."""
    out = {name: SideSamples() for name in sides}
    for i in range(runs):
        parts = []
        ids = prompt(i) if prompt is not None else None
        first_ids, full_ids = ids if isinstance(ids, tuple) else (ids, ids)
        for name, gen in sides.items():
            label = f"timed run {i + 1}/{runs}, {name}"
            with guard(label), gc_paused():
                pause_worker_gc = getattr(gen, "pause_gc", None)
                if pause_worker_gc is not None:
                    pause_worker_gc()
                with quiet(name):
                    ttft_s, first = gen.timed(1, first_ids, label)
                    total_s, output = gen.timed(tokens, full_ids, label)
            s = out[name]
            s.tokens_per_s.append(batch * tokens / total_s)
            s.ttft_ms.append(1000.0 * ttft_s)
            if tokens > 1 and total_s > ttft_s:
                s.decode_tokens_per_s.append(batch * (tokens - 1) / (total_s - ttft_s))
            s.last_output = output
            s.outputs.extend([first, output])
            parts.append(f"{name} {s.tokens_per_s[-1]:.2f} tok/s (ttft {1000 * ttft_s:.1f} ms)")
        log(f"timed run {i + 1}/{runs}: " + ", ".join(parts))
    for name, s in out.items():
        if first_run_outlier(s.tokens_per_s):
            log(
                f"warning: {name}: the first timed run ({s.tokens_per_s[0]:.2f} tok/s) is slower "
                "than the others beyond their spread; warm-up may be too short (--warmup-runs)"
            )
        elif len(s.tokens_per_s) >= 3:
            log(f"{name}: first timed run is not a slow outlier ({s.tokens_per_s[0]:.2f} tok/s)")
    return out
