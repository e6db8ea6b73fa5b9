"""One benchmark run in the trusted measuring process: the PyTorch baseline and the fp32
reference live here, the cuTile side in a model worker process (``remote_side``); timing,
profiling's classification and every score happen here."""

from __future__ import annotations

import os
import secrets
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from tilegym_hf_bench.envinfo import gpu_env
from tilegym_hf_bench.errors import BenchError
from tilegym_hf_bench.experiment_tree import measured_tree
from tilegym_hf_bench.generation import Generator, make_input_ids
from tilegym_hf_bench.gpu_activity import Silence
from tilegym_hf_bench.metrics import throughput_block
from tilegym_hf_bench.model_factory import (
    fp32_reference,
    pretrained_model,
    random_model,
    resolve_device,
)
from tilegym_hf_bench.modes import EAGER, mode_line
from tilegym_hf_bench.options import BenchOptions
from tilegym_hf_bench.profiling.attribution import (
    HostEvent,
    KernelEvent,
    ModuleRange,
    aggregate,
    coverage_block,
)
from tilegym_hf_bench.progress import Progress
from tilegym_hf_bench.remote_side import ModelWorker, RemoteSide, WorkerRefused
from tilegym_hf_bench.report import coverage_table_lines
from tilegym_hf_bench.scoring import (
    Case,
    CaseScore,
    agreement,
    agreement_problem,
    cases,
    drift,
    finite_or_none,
    left_pad_mask,
    reference_logits,
    timed_output_agreement,
    token_errors,
    worst,
)

BASELINE, CUTILE = "baseline", "cutile"


def log(message: str) -> None:
    print(message, flush=True)


def run(options: BenchOptions, progress: Progress) -> None:
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
    cutile_reason = _cutile_unmeasured_reason(options, tree) or unpatched
    vocab = baseline.config.get_text_config().vocab_size
    ids = make_input_ids(vocab, wl.batch_size, wl.input_length, wl.seed, device)
    with tempfile.TemporaryDirectory(prefix="tilegym-worker-") as scratch:
        worker = None
        try:
            remote = None
            if cutile_reason is None:
                worker = ModelWorker(
                    device=device,
                    scratch=Path(scratch),
                    src_root=tree.package_dir.parent,
                    watched=[type(baseline).__module__],
                    log=log,
                )
                started = worker.submit(
                    {
                        "op": "init",
                        "model_key": options.model_key,
                        "model_id": options.model_id,
                        "seed": wl.seed,
                        "flags": patch_table[loaded.model_type],
                    }
                )
                remote = RemoteSide(worker, wl.mode, ids, started=started, log=log)
            else:
                progress.not_measured(CUTILE, cutile_reason)
                log(f"cuTile: not measured ({cutile_reason})")
            _measure(options, progress, device, baseline, remote, ids, vocab, unpatched, tree)
        finally:
            if remote is not None and remote.started_s is not None:
                progress.add_phase("worker_start", remote.started_s)
            if worker is not None:
                worker.close()
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
    if sides:
        from tilegym_hf_bench.throughput import measure, warm_up_sides

        log(
            f"workload {wl.name}: batch {wl.batch_size}, {wl.input_length} in, "
            f"{wl.output_length} out; warm-up >= {wl.warmup_runs}, timed {wl.timed_runs} a side"
        )
        log(mode_line(wl.mode))
        with progress.phase("warm_up"):
            warmups = warm_up_sides(sides, wl.output_length, wl.warmup_runs, log)
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

    def side(name: str):
        """The side's timed generator (its compiled step and kept cache, so nothing records a
        CUDA graph again) on the warm-up prompt; a new one for a side that was not timed."""
        gen = sides.get(name) or Generator(baseline, ids, device, wl.mode)
        gen.use_prompt(ids)
        return gen

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

    if options.skip_correctness:
        progress.not_measured("correctness", "--skip-correctness")
    else:
        with progress.phase("correctness"):
            result = check_correctness(side(BASELINE), remote, wl, timed_runs)
        progress.part("correctness", result)


def _cutile_unmeasured_reason(options: BenchOptions, tree) -> str | None:
    if options.skip_cutile:
        return "--skip-cutile"
    if tree.package_dir is None:
        return "no tilegym package in the measured tree"
    return None


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


def _case_inputs(case: Case, vocab: int):
    """(prompt ids, attention mask or None) of one correctness case, drawn from the OS."""
    ids = make_input_ids(vocab, case.batch, case.input_length, secrets.randbits(31), "cpu")
    mask = left_pad_mask(case.batch, case.input_length) if case.padded else None
    if mask is not None:
        ids = ids.masked_fill(mask == 0, 0)
    return ids, mask


def _start_case(gen, case: Case, ids, mask):
    """A function returning (sequences, logits) of one side on one correctness case; the
    worker's side is asked at once and computes while this process scores its own."""
    if isinstance(gen, RemoteSide):
        gen.use_prompt(ids, None if case.timed_path else mask)
        return gen.start_logits(case.new_tokens, mode=None if case.timed_path else EAGER)
    return lambda: _generate_case(gen, case, ids, mask)


def _generate_case(gen, case: Case, ids, mask):
    """(sequences, logits) of one local side on one correctness case."""
    if case.timed_path:
        gen.use_prompt(ids.to(gen.device), None)
        return gen.generate_with_logits(case.new_tokens)
    eager = Generator(gen.model, ids.to(gen.device), gen.device, EAGER)
    eager.use_prompt(ids.to(gen.device), None if mask is None else mask.to(gen.device))
    return eager.generate_with_logits(case.new_tokens)


def check_correctness(baseline: Generator, cutile, wl, timed_runs: dict | None = None) -> dict:
    """Both sides on every case (``scoring.cases``), scored per generated token against this
    process's fp32 reference on each side's own sequence; then the timed runs' answers."""
    ref_model = fp32_reference(baseline.model)
    device = baseline.device
    vocab = baseline.model.config.get_text_config().vocab_size
    scores: list[CaseScore] = []
    case_list = cases(wl.batch_size, wl.input_length, wl.output_length)
    inputs = [_case_inputs(case, vocab) for case in case_list]
    # the worker gets every case at once and works through them while this process runs its
    # own side and the reference (its first eager runs of new shapes JIT-compile kernels)
    kernel_sides = [
        None if cutile is None else _start_case(cutile, case, ids, mask)
        for case, (ids, mask) in zip(case_list, inputs, strict=True)
    ]
    for case, (ids, mask), kernel_side in zip(case_list, inputs, kernel_sides, strict=True):
        gpu_mask = None if mask is None else mask.to(device)
        base_seq, base_logits = _generate_case(baseline, case, ids, mask)
        base_seq = base_seq.to(device)
        reference = reference_logits(ref_model, base_seq, case.input_length, gpu_mask)
        base_err = float(token_errors(base_logits.to(device), reference).max())
        drifts = [drift(base_logits.to(device), reference)]
        del base_logits
        kernel_err = top1 = None
        finite = True
        if kernel_side is not None:
            seq, kernel_logits = kernel_side()
            seq, kernel_logits = seq.to(device), kernel_logits.to(device)
            if not torch.equal(seq, base_seq):  # diverged: score it on its own sequence
                reference = reference_logits(ref_model, seq, case.input_length, gpu_mask)
            finite = bool(torch.isfinite(kernel_logits).all())
            kernel_err = float(token_errors(kernel_logits, reference).max())
            top1 = float(agreement(seq, reference, case.input_length).mean())
            drifts.append(drift(kernel_logits, reference))
            del kernel_logits
        del reference
        score = CaseScore(case.name, kernel_err, base_err, finite, top1)
        scores.append(score)
        v = score.rule()
        log(
            f"correctness case {case.name} ({case.batch} x {case.input_length} -> "
            f"{case.new_tokens}{', left-padded' if case.padded else ''}): "
            f"{'PASS' if v.passed else 'FAIL'}: {v.reason}; bf16 baseline max token rel err "
            f"{base_err:.3e}"
            + (f"; top-1 agreement {top1:.4f}" if top1 is not None else "")
            + "; drift along fp32 "
            + " / ".join(f"{d:+.2e}" for d in drifts)
        )
    chosen = worst(scores)
    rule = chosen.rule()
    passed = all(s.rule().passed for s in scores)
    agreement_block = None
    if cutile is not None and timed_runs and timed_runs.get(CUTILE):
        runs = {n: [(seq, wl.input_length) for seq in timed_runs.get(n, [])] for n in timed_runs}
        cut = timed_output_agreement(ref_model, runs.get(CUTILE, []))
        base = timed_output_agreement(ref_model, runs.get(BASELINE, []))
        agreement_block = {"baseline": base, "cutile": cut, "runs": len(runs.get(CUTILE, []))}
        problem = agreement_problem(cut, base)
        log(
            "timed answers: "
            + (
                f"FAIL: {problem}"
                if problem
                else f"PASS: cuTile chose fp32's token for "
                f"{cut:.3f} of its generated tokens, PyTorch for "
                f"{'n/a' if base is None else f'{base:.3f}'}"
            )
        )
        passed = passed and problem is None
    del ref_model
    if cutile is None:
        log("correctness: PyTorch side only (no cuTile code ran): nothing was judged")
    else:
        log(f"correctness: {'PASS' if passed else 'FAIL'} (reported case: {chosen.name})")
    return {
        "passed": passed if cutile is not None else rule.passed,
        "logits_rel_err": finite_or_none(chosen.kernel_err),
        "baseline_rel_err": finite_or_none(chosen.baseline_err),
        "tolerance": rule.tolerance,
        "top1_agreement": chosen.top1,
        "statistic": "max_token",
        "cases": [s.as_json(c) for s, c in zip(scores, case_list, strict=True)],
        "timed_agreement": agreement_block,
    }


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
            kernels = [KernelEvent(str(n), int(d), int(i)) for n, d, i in raw["kernels"]]
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
