"""Benchmark one commit for the local loop: a throwaway worktree, the runner's LocalExecutor.

The executor runs the worktree's own code (its source roots first on PYTHONPATH) as a
subprocess with a hard timeout, and always leaves a metrics file (synthesized on crash/timeout).
It echoes the benchmark's progress to the terminal, each line prefixed with the side (head,
base, ...), the commit and the elapsed time. A GPU run holds the GPU's lock while it runs, so two
experiments started on one host never time their benchmarks on the same GPU at once; a CPU run
(``--device cpu``, or no NVIDIA GPU on the host) takes no lock and never waits for one.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tilegym_bot.errors import BotError
from tilegym_bot.forge.local import LocalForge
from tilegym_bot.metrics_file import load_metrics
from tilegym_bot.policy import dig
from tilegym_bot.runner.base import BenchRequest, flag_value
from tilegym_bot.runner.gpulock import GpuLockedExecutor, host_has_nvidia_gpu
from tilegym_bot.runner.local import LocalExecutor


@dataclass
class BenchConfig:
    """How ``experiment run`` benchmarks a commit when no metrics files are given."""

    bench_args: list[str] = field(default_factory=list)
    timeout_s: float = 900.0
    gpu_uuid: str | None = None
    # the sequential sampler's time budget an experiment (sequential.BUDGET_S); 0: the fixed
    # scheme (one pair, a rerun with twice the runs when in doubt)
    sampling_budget_s: float = 900.0


def timed_runs(*docs: Any) -> int | None:
    """``workload.timed_runs`` of the first document that has a usable one."""
    for doc in docs:
        n = dig(doc, "workload", "timed_runs")
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    return None


def with_timed_runs(args: list[str], runs: int) -> list[str]:
    """``args`` with any ``--timed-runs`` replaced by ``--timed-runs runs``."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--timed-runs":
            skip = True
        elif not arg.startswith("--timed-runs="):
            out.append(arg)
    return [*out, "--timed-runs", str(runs)]


_SIDES = ("head-rerun", "base-rerun", "head", "base")


def side_label(run_name: str) -> str:
    """The side a run name stands for (``...-head`` -> ``head``, ``...-base-rerun`` -> ``base
    rerun``), shown in front of each progress line; the whole name when it names no side."""
    for side in _SIDES:
        if run_name.endswith(f"-{side}"):
            return side.replace("-", " ")
    return run_name


def cpu_sized(model_key: str, bench_args: list[str]) -> tuple[list[str], str | None]:
    """On a host without an NVIDIA GPU, benchmark arguments that name neither a device nor a
    preset get the model's tiny preset on the CPU (seconds, where the full preset would take
    half an hour on a CPU and still decide nothing); with the note that says so. Unchanged,
    with no note, on a GPU host or when the caller chose."""
    chosen = {flag_value(bench_args, f) for f in ("--device", "--model-key")} - {None}
    if chosen or host_has_nvidia_gpu():
        return list(bench_args), None
    from tilegym_hf_bench.presets import PRESETS

    tiny = f"tiny-{model_key}"
    if tiny not in PRESETS:
        raise BotError(
            f"no CUDA GPU here and no {tiny} preset to run on the CPU: pass `-- --device cpu` to "
            f"benchmark the full {model_key} preset on the CPU (slow), or run on a GPU host"
        )
    note = (
        f"no CUDA GPU here: benchmarking the {tiny} preset on the CPU instead of {model_key} "
        "(pass -- --device cpu --model-key ... to choose); cuTile throughput, coverage and GPU "
        "time need a GPU, so the verdict can only be inconclusive"
    )
    return [*bench_args, "--model-key", tiny, "--device", "cpu"], note


LOOP_MODE = "static"
"""The loop's ``--mode`` on a GPU: a static KV cache with the compiled decode step, where the
kernels rather than the host set the pace (eager stays available with ``-- --mode eager``)."""


def with_loop_mode(bench_args: list[str], gpu: bool) -> list[str]:
    """``bench_args`` plus ``--mode static`` for a GPU run that names no mode. A CPU run keeps
    the benchmark's own default (eager): compiling the tiny preset's decode step would only add
    time to a verdict that cannot be more than inconclusive there."""
    device = flag_value(bench_args, "--device")
    if flag_value(bench_args, "--mode") is not None or not gpu or device == "cpu":
        return list(bench_args)
    return [*bench_args, "--mode", LOOP_MODE]


def loop_bench_args(model_key: str, bench_args: list[str]) -> tuple[list[str], str | None]:
    """The benchmark arguments of one ``experiment run`` (``cpu_sized``, then
    ``with_loop_mode``) and the note to print first, if any."""
    args, note = cpu_sized(model_key, bench_args)
    return with_loop_mode(args, note is None and host_has_nvidia_gpu()), note


def effective_bench_args(model_key: str, bench_args: list[str], runs: int | None) -> list[str]:
    """The benchmark's arguments, each flag once: ``--model-key K`` unless the arguments name
    their own (the CPU fallback's ``tiny-K``), ``--timed-runs`` replaced on a rerun."""
    args = list(bench_args)
    if flag_value(args, "--model-key") is None:
        args = ["--model-key", model_key, *args]
    return with_timed_runs(args, runs) if runs else args


def runs_dir(forge: LocalForge) -> Path:
    """Where every benchmark of the local loop keeps its metrics and logs, one folder a run."""
    return forge.store_root / "sandbox" / "runs"


def bench_commit(
    forge: LocalForge,
    cfg: BenchConfig,
    *,
    model_key: str,
    run_name: str,
    sha: str,
    runs: int | None = None,
    label: str | None = None,
    echo: bool = True,
    harness_sha: str | None = None,
) -> Any:
    """Metrics of ``sha``; logs and metrics stay in ``sandbox/runs/<run_name>/``. Progress lines
    are echoed (``echo``) with ``label`` (default: the side named by ``run_name``)."""
    args = effective_bench_args(model_key, cfg.bench_args, runs)
    run_dir = runs_dir(forge) / run_name
    run_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        tree = stack.enter_context(forge.worktree(sha))
        # the trusted harness (main's) measures the experiment's src/ (docs/DESIGN.md)
        harness = stack.enter_context(forge.worktree(harness_sha)) if harness_sha else None
        executor = LocalExecutor(echo=echo, label=label or side_label(run_name))
        result = GpuLockedExecutor(executor).run(
            BenchRequest(
                repo_dir=tree,
                commit=sha,
                bench_args=args,
                metrics_out=run_dir / "metrics.json",
                log_dir=run_dir,
                timeout_s=cfg.timeout_s,
                gpu_uuid=cfg.gpu_uuid,
                harness_dir=harness,
            )
        )
    return load_metrics(result.metrics_path)
