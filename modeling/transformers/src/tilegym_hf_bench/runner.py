"""One benchmark run inside the worker: models, throughput, correctness, coverage."""

from __future__ import annotations

import time

import torch

from tilegym_hf_bench import correctness as corr
from tilegym_hf_bench.envinfo import gpu_env
from tilegym_hf_bench.errors import BenchError
from tilegym_hf_bench.experiment_tree import measured_tree
from tilegym_hf_bench.generation import Generator, make_input_ids
from tilegym_hf_bench.metrics import throughput_block
from tilegym_hf_bench.model_factory import (
    fp32_reference,
    pretrained_model,
    random_model,
    resolve_device,
    twin_sharing_weights,
    weight_fingerprint,
)
from tilegym_hf_bench.modes import mode_line
from tilegym_hf_bench.options import BenchOptions
from tilegym_hf_bench.profiling.attribution import aggregate, coverage_block
from tilegym_hf_bench.progress import Progress
from tilegym_hf_bench.report import coverage_table_lines
from tilegym_hf_bench.tilegym_patch import apply_patch
from tilegym_hf_bench.tolerance import verdict

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
    cutile_reason = _cutile_unmeasured_reason(options, device) or unpatched
    cutile_model = None
    if cutile_reason is None:
        cutile_model = twin_sharing_weights(baseline)
        before = weight_fingerprint(baseline)
        report = apply_patch(cutile_model, loaded.model_type, patch_table)
        for line in report.lines():
            log(line)
        if not torch.equal(before, weight_fingerprint(baseline)):
            raise BenchError("the cuTile patch changed the shared weights in place")
    else:
        progress.not_measured(CUTILE, cutile_reason)
        log(f"cuTile: not measured ({cutile_reason})")

    vocab = baseline.config.get_text_config().vocab_size
    ids = make_input_ids(vocab, wl.batch_size, wl.input_length, wl.seed, device)
    sides: dict[str, Generator] = {}
    if not options.skip_baseline:
        sides[BASELINE] = Generator(baseline, ids, device, wl.mode)
    else:
        progress.not_measured(BASELINE, "--skip-baseline")
    if cutile_model is not None:
        sides[CUTILE] = Generator(cutile_model, ids, device, wl.mode)

    if sides:
        from tilegym_hf_bench.throughput import measure, warm_up_sides

        log(
            f"workload {wl.name}: batch {wl.batch_size}, {wl.input_length} in, "
            f"{wl.output_length} out; warm-up >= {wl.warmup_runs}, timed {wl.timed_runs} a side"
        )
        log(mode_line(wl.mode))
        warmups = warm_up_sides(sides, wl.output_length, wl.warmup_runs, log)
        progress.update(warmup_runs=warmups.runs)
        samples = measure(
            sides,
            wl.batch_size,
            wl.output_length,
            wl.timed_runs,
            log,
            prompt=lambda i: make_input_ids(
                vocab, wl.batch_size, wl.input_length, timed_prompt_seed(wl.seed, i), device
            ),
        )
        interleaved = len(sides) > 1
        for name, s in samples.items():
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

    def side(name: str, model) -> Generator:
        """The side's timed generator (its compiled step and kept cache, so nothing records a
        CUDA graph again) on the warm-up prompt; a new one for a side that was not timed."""
        gen = sides.get(name) or Generator(model, ids, device, wl.mode)
        gen.use_prompt(ids)
        return gen

    if options.skip_correctness:
        progress.not_measured("correctness", "--skip-correctness")
    else:
        cutile_gen = side(CUTILE, cutile_model) if cutile_model is not None else None
        result = check_correctness(side(BASELINE, baseline), cutile_gen, wl)
        progress.part("correctness", result)

    # without a patch the PyTorch model is profiled: 0% coverage and the map of where its GPU
    # time goes, which is where a new family's first experiment starts
    coverage_reason = _coverage_unmeasured_reason(options, device, cutile_reason, unpatched)
    if coverage_reason is None:
        profiled = side(BASELINE, baseline) if unpatched else side(CUTILE, cutile_model)
        block = _coverage(options, profiled, device, wl.output_length, tree)
        if block is None:
            progress.update(coverage_pending="nsys")
        else:
            progress.part("coverage", block)
    else:
        progress.not_measured("coverage", coverage_reason)
        log(f"coverage: not measured ({coverage_reason})")


def _cutile_unmeasured_reason(options: BenchOptions, device: str) -> str | None:
    if options.skip_cutile:
        return "--skip-cutile"
    if not device.startswith("cuda"):
        return f"cuTile kernels need a CUDA GPU; device is {device}"
    return None


def no_patch_reason(model_type: str) -> str:
    return f"no patch for model type {model_type!r}"


def _coverage_unmeasured_reason(
    options: BenchOptions, device: str, cutile_reason: str | None, unpatched: str | None = None
) -> str | None:
    if options.skip_coverage:
        return "--skip-coverage"
    if not device.startswith("cuda"):
        return f"coverage is GPU kernel time; device is {device}"
    if cutile_reason is not None and unpatched is None:
        return f"no kernelized model ({cutile_reason})"
    return None


def timed_prompt_seed(seed: int, run: int) -> int:
    """Timed run ``run`` (0-based) generates from its own prompt, seeded apart from the warm-up
    and correctness prompt (``seed``): a kernel cannot be tuned to one fixed input."""
    return seed + 1 + run


def check_correctness(baseline: Generator, cutile: Generator | None, wl) -> dict:
    """Each side's logits from its own generate() (the timed path) against fp32 on its sequence."""
    prompt = wl.input_length
    ref_model = fp32_reference(baseline.model)
    base_seq, base_logits = baseline.generate_with_logits(wl.output_length)
    reference = corr.full_logits(ref_model, base_seq, prompt)
    base_err = corr.rel_err(base_logits, reference)
    del base_logits
    kernel_err = top1 = None
    finite = True
    if cutile is not None:
        seq, kernel_logits = cutile.generate_with_logits(wl.output_length)
        if not torch.equal(seq, base_seq):  # diverged: score it on its own sequence
            reference = corr.full_logits(ref_model, seq, prompt)
        finite = corr.is_finite(kernel_logits)
        kernel_err = corr.rel_err(kernel_logits, reference)
        top1 = corr.top1_agreement(kernel_logits, reference)
        del kernel_logits
    del ref_model, reference
    v = verdict(kernel_err, base_err, finite)
    log(
        f"correctness: {'PASS' if v.passed else 'FAIL'}: {v.reason}; bf16 baseline rel err "
        f"{base_err:.3e} vs fp32" + (f"; top-1 agreement {top1:.4f}" if top1 is not None else "")
    )
    return {
        "passed": v.passed,
        "logits_rel_err": kernel_err if kernel_err is None or _finite(kernel_err) else None,
        "baseline_rel_err": base_err if _finite(base_err) else None,
        "tolerance": v.tolerance,
        "top1_agreement": top1,
    }


def _finite(x: float) -> bool:
    return x == x and x not in (float("inf"), float("-inf"))


def _coverage(options: BenchOptions, gen: Generator, device: str, tokens: int, tree) -> dict | None:
    model = gen.model
    classifier = tree.classifier()
    if not classifier.can_demangle:
        log("warning: cuda.tile.compilation is not importable; classifying by prefixes only")
    if options.profiler == "nsys":
        from tilegym_hf_bench.profiling.nsys_trace import profile_call as nsys_profile_call

        nsys_profile_call(model, lambda: gen.generate(tokens))
        log("coverage: one generate() recorded by Nsight Systems; read after the worker exits")
        return None
    from tilegym_hf_bench.profiling.torch_trace import profile_call

    kernels, hosts, ranges = profile_call(model, lambda: gen.generate(tokens))
    cov = aggregate(kernels, hosts, ranges, classifier.is_cutile)
    for line in coverage_table_lines(cov):
        log(line)
    return coverage_block(cov, options.profiler)
