"""One benchmark run in the trusted measuring process: the PyTorch baseline and the fp32
reference live here, the cuTile side in a model worker process (``remote_side``); timing,
profiling's classification and every score happen here."""

from __future__ import annotations

import os
import secrets
import time
from contextlib import nullcontext

from tilegym_hf_bench.correctness_check import BASELINE, CUTILE, CorrectnessCheck
from tilegym_hf_bench.envinfo import gpu_env
from tilegym_hf_bench.errors import BenchError
from tilegym_hf_bench.experiment_tree import measured_tree
from tilegym_hf_bench.generation import Generator, make_input_ids
from tilegym_hf_bench.gpu_activity import Silence
from tilegym_hf_bench.metrics import throughput_block
from tilegym_hf_bench.model_factory import pretrained_model, random_model, resolve_device
from tilegym_hf_bench.modes import mode_line
from tilegym_hf_bench.options import BenchOptions
from tilegym_hf_bench.profiling.attribution import (
    HostEvent,
    KernelEvent,
    ModuleRange,
    aggregate,
    coverage_block,
)
from tilegym_hf_bench.progress import Progress
from tilegym_hf_bench.remote_side import RemoteSide
from tilegym_hf_bench.report import coverage_table_lines
from tilegym_hf_bench.worker_client import StartedWorker, WorkerRefused, cutile_unmeasured_reason


def log(message: str) -> None:
    print(message, flush=True)


def run(options: BenchOptions, progress: Progress, started: StartedWorker | None = None) -> None:
    """One run. ``started``: the model worker ``worker.main`` started before importing torch
    (``worker_client.start_model_worker``), None when the cuTile side is not measured; the
    caller closes it."""
    device = resolve_device(options.device)
    wl = options.workload
    env = gpu_env(device)
    progress.update(env=env, device=device)
    where = env["gpu_name"] or "CPU"
    log(f"device: {device} ({where}); torch {env['torch']}, transformers {env['transformers']}")

    start = time.perf_counter()
    with progress.phase("model"):
        if options.model_id:
            loaded = pretrained_model(options.model_key, options.model_id, device)
        else:
            loaded = random_model(options.model_key, device, wl.seed)
    progress.update(weights=loaded.weights, model_type=loaded.model_type)
    log(
        f"weights: {loaded.weights} ({loaded.source}; seed {wl.seed}); "
        f"model built in {time.perf_counter() - start:.1f} s"
    )
    baseline = loaded.model

    tree = measured_tree()
    patch_table = tree.patch_table()
    unpatched = None if loaded.model_type in patch_table else no_patch_reason(loaded.model_type)
    if unpatched:
        log(f"cuTile patch not applied: {unpatched}")
    cutile_reason = cutile_unmeasured_reason(options, tree) or unpatched
    vocab = baseline.config.get_text_config().vocab_size
    ids = make_input_ids(vocab, wl.batch_size, wl.input_length, wl.seed, device)
    remote = None
    if cutile_reason is None and started is not None:
        remote = RemoteSide(started.worker, wl.mode, ids, started=started.init, log=log)
    else:
        if started is not None:
            started.worker.close(grace_s=0.0)  # started before the model type was known
        cutile_reason = cutile_reason or "no model worker was started"
        progress.not_measured(CUTILE, cutile_reason)
        log(f"cuTile: not measured ({cutile_reason})")
    try:
        _measure(options, progress, device, baseline, remote, ids, vocab, unpatched, tree)
    finally:
        if remote is not None and remote.started_s is not None:
            progress.add_phase("worker_start", remote.started_s)
    spent = progress.data["phases_s"]
    log("time spent: " + ", ".join(f"{name} {s:.1f} s" for name, s in spent.items()))


def _measure(options, progress, device, baseline, remote, ids, vocab, unpatched, tree) -> None:
    """Time both sides, profile, score: everything here runs in this (trusted) process except
    the cuTile side's generate() calls, which ``remote`` sends to the worker."""
    wl = options.workload
    sides: dict = {}
    if not options.skip_baseline:
        sides[BASELINE] = Generator(baseline, ids, device, wl.mode)
    else:
        progress.not_measured(BASELINE, "--skip-baseline")
    if remote is not None:
        sides[CUTILE] = remote

    timed_runs: dict[str, list] = {name: [] for name in sides}
    check = None if options.skip_correctness else CorrectnessCheck(wl, vocab, log)

    def side(name: str):
        """The side's timed generator (its compiled step and kept cache, so nothing records a
        CUDA graph again) on the warm-up prompt; a new one for a side that was not timed."""
        gen = sides.get(name) or Generator(baseline, ids, device, wl.mode)
        gen.use_prompt(ids)
        return gen

    def correctness_ahead() -> None:
        """While the worker finishes its first runs: it gets its correctness cases (their new
        shapes' kernels compile there now, not in the correctness phase) and this process
        computes its own side of them and the fp32 reference."""
        if check is not None:
            check.send(remote)
            check.own(side(BASELINE))
            log(
                f"correctness: {len(check.cases)} cases ahead of the timed runs "
                f"({'sent to the model worker, ' if remote is not None else ''}"
                "this side and the fp32 reference computed)"
            )

    if sides:
        from tilegym_hf_bench.throughput import measure, warm_up_sides

        log(
            f"workload {wl.name}: batch {wl.batch_size}, {wl.input_length} in, "
            f"{wl.output_length} out; warm-up >= {wl.warmup_runs}, timed {wl.timed_runs} a side"
        )
        log(mode_line(wl.mode))
        with progress.phase("warm_up"):
            warmups = warm_up_sides(
                sides, wl.output_length, wl.warmup_runs, log, ahead=correctness_ahead
            )
        progress.update(warmup_runs=warmups.runs)
        seeds = timed_prompt_seeds(wl.timed_runs)
        log("timed prompt seeds (drawn for this run): " + " ".join(map(str, seeds)))
        silence = None
        if remote is not None and BASELINE in sides:
            silence = Silence(remote.frozen, device)

        def quiet(name: str):
            """The worker stopped while this process's side is timed."""
            return silence.around() if silence is not None and name != CUTILE else nullcontext()

        with progress.phase("timed"):
            samples = measure(
                sides,
                wl.batch_size,
                wl.output_length,
                wl.timed_runs,
                log,
                prompt=lambda i: tuple(
                    make_input_ids(vocab, wl.batch_size, wl.input_length, s, "cpu")
                    for s in seeds[i]
                ),
                quiet=quiet,
            )
        if silence is not None:
            log(silence.summary())
            if silence.problem and os.environ.get("TILEGYM_WORKER_AUDIT") == "record":
                log(f"audit (record only): would refuse: {silence.problem}")
            elif silence.problem:
                raise WorkerRefused(silence.problem)
        interleaved = len(sides) > 1
        for name, s in samples.items():
            timed_runs[name] = s.outputs
            progress.part(
                name,
                throughput_block(
                    s.tokens_per_s,
                    s.ttft_ms,
                    s.decode_tokens_per_s,
                    interleaved,
                    warmups.compile_s(name),
                ),
            )

    # without a patch the PyTorch model is profiled: 0% coverage and the map of where its GPU
    # time goes, which is where a new family's first experiment starts
    coverage_reason = _coverage_unmeasured_reason(options, device, remote, unpatched)
    if coverage_reason is None:
        with progress.phase("coverage"):
            block = _coverage(options, side(BASELINE) if unpatched else remote, device, wl, tree)
        progress.part("coverage", block)
    else:
        progress.not_measured("coverage", coverage_reason)
        log(f"coverage: not measured ({coverage_reason})")

    if check is None:
        progress.not_measured("correctness", "--skip-correctness")
    else:
        with progress.phase("correctness"):
            result = check.finish(side(BASELINE), remote, timed_runs)
        progress.part("correctness", result)


def no_patch_reason(model_type: str) -> str:
    return f"no patch for model type {model_type!r}"


def _coverage_unmeasured_reason(
    options: BenchOptions, device: str, remote, unpatched: str | None = None
) -> str | None:
    if options.skip_coverage:
        return "--skip-coverage"
    if not device.startswith("cuda"):
        return f"coverage is GPU kernel time; device is {device}"
    if remote is None and unpatched is None:
        return "no kernelized model (cuTile not measured)"
    return None


def timed_prompt_seeds(runs: int) -> list[tuple[int, int]]:
    """Per timed run, the seeds of its time-to-first-token prompt and its full prompt, drawn
    from the OS for this run: no process can know a timed prompt before its request, and the
    full run's prompt is not the one the first-token run just saw."""
    return [(secrets.randbits(31), secrets.randbits(31)) for _ in range(runs)]


def _coverage(options: BenchOptions, side, device: str, wl, tree) -> dict:
    classifier = tree.classifier()
    if not classifier.can_demangle:
        log("warning: cuda.tile.compilation is not importable; classifying by prefixes only")
    if options.profiler == "nsys":
        raise BenchError(
            "--profiler nsys cannot profile the model worker from outside it; use torch"
        )
    if isinstance(side, RemoteSide):
        side.use_prompt(side.prompt)
        raw = side.profile(wl.output_length)
        try:
            kernels = [KernelEvent(str(n), int(d), int(i), int(s)) for n, d, i, s in raw["kernels"]]
            hosts = [HostEvent(int(i), int(t), int(s)) for i, t, s in raw["hosts"]]
            ranges = [ModuleRange(str(m), int(t), int(s), int(e)) for m, t, s, e in raw["ranges"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise BenchError(f"cuTile side: the profile is malformed: {exc}") from None
        if not kernels:
            raise BenchError("cuTile side: the profile holds no GPU kernel")
    else:
        from tilegym_hf_bench.profiling.torch_trace import profile_call

        kernels, hosts, ranges = profile_call(side.model, lambda: side.generate(wl.output_length))
    cov = aggregate(kernels, hosts, ranges, classifier.is_cutile)
    for line in coverage_table_lines(cov):
        log(line)
    return coverage_block(cov, options.profiler)
