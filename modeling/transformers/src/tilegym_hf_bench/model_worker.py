"""The model worker: the only process that imports the experiment's code.

``python -m tilegym_hf_bench.model_worker CONFIG.json`` is started by the trusted measuring
process (``runner``), which keeps the PyTorch baseline, the fp32 reference, the clock and the
scores. This process builds the model from the same seed, applies the measured tree's cuTile
patch to it and then only answers requests: generate from these ids (timed by the caller, which
chose the ids a moment before), generate with logits (scored by the caller), profile one
generate (the caller classifies and adds up the raw kernel list). Whatever it answers is data
the caller checks; nothing it says is taken as a measurement.

Before the experiment's code is imported the worker confines itself (``isolation``: an audit
hook that ends the process on a refused action), keeps its own references to the profiler
entry points (checked again around every profiled call) and snapshots the classes a verdict runs
through (compared after every request: ``isolation.class_guard``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import sys
from pathlib import Path

from tilegym_hf_bench.worker_wire import Reader, WireError, send, tensor_file

#: Exit status of a worker that could not start (bad config); a refusal exits with the
#: audit hook's own status.
BAD_START_EXIT = 3


def _prepare(device: str) -> str:
    """What must exist before the hook, and what can be done before the caller has built
    anything: torch and transformers imported (their own start-up loads libraries and probes
    the host); on a GPU the CUDA context created and cuda.tile imported, while the caller
    imports its own; on a CPU, Inductor's vector-ISA probe run once (it compiles test programs
    and starts ``python -c``; cached per process). A GPU run's compiled step is CUDA code: it
    never probed in an H200 run with the audit recording, and the probe costs 10-40 s of
    compiling. Returns the device, ``auto`` resolved here as the caller resolves it."""
    import torch
    import transformers  # noqa: F401

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.zeros(1, device=device)
        with contextlib.suppress(ImportError):
            import cuda.tile  # noqa: F401
    if device == "cpu":
        try:
            from torch._inductor import cpu_vec_isa
            from torch._inductor.exc import InvalidCxxCompiler
        except ImportError:
            return device
        # no C++ compiler (the CPU image): nothing for Inductor to probe; an eager run needs
        # none, a static one fails at its compile
        with contextlib.suppress(InvalidCxxCompiler):
            cpu_vec_isa.valid_vec_isa_list()
    return device


def _confine(config: dict) -> None:
    from tilegym_hf_bench.isolation.audit_hook import Confinement, install

    conf = config["confinement"]
    install(
        Confinement(
            experiment_roots=tuple(Path(p) for p in conf["experiment_roots"]),
            owned_modules=tuple(conf["owned_modules"]),
            writable=tuple(Path(p) for p in conf["writable"]),
            allowed_executables=tuple(conf["allowed_executables"]),
            record_only=bool(conf.get("record_only", False)),
        ),
        refusal_log=Path(conf["refusal_log"]),
    )


class Worker:
    """The request loop's state: the patched model, one generator per mode, the profiler."""

    def __init__(self, config: dict, scratch: Path, profiler, classes):
        import torch

        self.torch = torch
        self.config = config
        self.scratch = scratch
        self.profiler = profiler  # bound before any experiment code runs
        self.classes = classes
        self.model = None
        self.device = config["device"]
        self.gens: dict[str, object] = {}

    def init(self, msg: dict) -> dict:
        from tilegym_hf_bench.model_factory import pretrained_model, random_model
        from tilegym_hf_bench.tilegym_patch import apply_patch

        if msg.get("model_id"):
            loaded = pretrained_model(msg["model_key"], msg["model_id"], self.device)
        else:
            loaded = random_model(msg["model_key"], self.device, int(msg["seed"]))
        self.model = loaded.model
        # the family's upstream classes, just loaded by the harness, before experiment code
        self.classes.watch(type(self.model).__module__)
        self.classes.snapshot()
        report = apply_patch(self.model, loaded.model_type, msg["patch_table"])
        return {"lines": report.lines(), "model_type": loaded.model_type}

    def _generator(self, mode: str, ids):
        from tilegym_hf_bench.generation import Generator

        gen = self.gens.get(mode)
        if gen is None:
            gen = self.gens[mode] = Generator(self.model, ids, self.device, mode)
        return gen

    def _ids(self, msg: dict):
        torch = self.torch
        ids = torch.tensor(msg["ids"], dtype=torch.long, device=self.device)
        mask = msg.get("mask")
        mask = None if mask is None else torch.tensor(mask, dtype=torch.long, device=self.device)
        return ids, mask

    def generate(self, msg: dict) -> dict:
        from tilegym_hf_bench.compile_guard import no_compile

        if not msg.get("guard"):
            gc.enable()
        ids, mask = self._ids(msg)
        gen = self._generator(msg["mode"], ids)
        gen.use_prompt(ids, mask)
        tokens = int(msg["new_tokens"])
        if msg.get("logits"):
            from safetensors.torch import save_file

            report = None
            if msg.get("routing"):
                from tilegym_hf_bench.routing_report import generate_reporting

                seq, logits, report = generate_reporting(
                    self.model, lambda: gen.generate_with_logits(tokens), *ids.shape, tokens
                )
            else:
                seq, logits = gen.generate_with_logits(tokens)
            name = str(msg["name"])
            tensors = {
                "sequences": seq.contiguous().cpu(),
                "logits": logits.to(self.torch.bfloat16).contiguous().cpu(),
            }
            for i, layer in enumerate(report or []):
                tensors[f"routing-{i}"] = layer.to(self.torch.int32).contiguous().cpu()
            save_file(tensors, str(tensor_file(self.scratch, name)))
            return {"file": name}
        if msg.get("guard"):  # a timed run: no compile (the cyclic GC was paused by "gc")
            with no_compile(str(msg["guard"])):
                out = gen.generate(tokens)
        else:
            out = gen.generate(tokens)
        return {"tokens": out[:, ids.shape[1] :].tolist()}

    def pause_gc(self, msg: dict) -> dict:
        """Collect now, then keep the cyclic collector off until an untimed request: asked for
        by the caller before each timed round, outside its clock, as its own side does
        (``throughput.gc_paused``)."""
        gc.collect()
        gc.disable()
        return {}

    def profile(self, msg: dict) -> dict:
        gc.enable()
        ids, mask = self._ids(msg)
        gen = self._generator(msg["mode"], ids)
        gen.use_prompt(ids, mask)
        tokens = int(msg["new_tokens"])
        events = self.profiler.record(self.model, lambda: gen.generate(tokens))
        name = str(msg["name"])
        path = self.scratch / f"{name}.json"
        path.write_text(json.dumps(events))
        return {"file": name}


class Refusal(Exception):
    """What the worker's own checks refuse (the audit hook ends the process itself)."""


def serve(config: dict, reader: Reader, out_fd: int, scratch: Path, profiler, classes) -> None:
    """Answer requests until ``exit``. ``recv``/``send`` are bound here, before any experiment
    code runs: rebinding the wire module's names later changes nothing this loop does."""
    recv, reply = reader.recv, send
    worker = Worker(config, scratch, profiler, classes)
    handlers = {
        "init": worker.init,
        "generate": worker.generate,
        "profile": worker.profile,
        "gc": worker.pause_gc,
    }
    while True:
        msg = recv()
        op = msg.get("op")
        if op == "exit":
            reply(out_fd, {"ok": True})
            return
        handler = handlers.get(op)
        if handler is None:
            reply(out_fd, {"ok": False, "error": f"unknown request {op!r}"})
            continue
        try:
            answer = handler(msg)
            rebound = classes.changes()
            if rebound:
                raise Refusal(
                    f"class attributes rebound outside the experiment's own modules: "
                    f"{', '.join(rebound[:5])}"
                )
        except Exception as exc:  # the caller turns it into the run's error text
            text = str(exc).strip() or type(exc).__name__
            if type(exc).__name__ in ("Refusal", "ProfilerTampered"):
                reply(out_fd, {"ok": False, "refused": text})
                continue
            if type(exc).__name__ not in ("BenchError", "PatchUnavailable"):
                text = f"{type(exc).__name__}: {text}"
            reply(out_fd, {"ok": False, "error": text})
            continue
        reply(out_fd, {"ok": True, **answer})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        config = json.loads(Path(argv[0]).read_text())
        in_fd, out_fd = int(config["in_fd"]), int(config["out_fd"])
        scratch = Path(config["scratch"])
    except (IndexError, OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: model worker: bad start: {exc}", file=sys.stderr)
        return BAD_START_EXIT
    config["device"] = _prepare(str(config.get("device", "cpu")))
    from tilegym_hf_bench.isolation.class_guard import ClassGuard
    from tilegym_hf_bench.profiling.guarded import GuardedProfiler

    profiler = GuardedProfiler()
    classes = ClassGuard()
    if config.get("confinement"):
        _confine(config)
    try:
        serve(config, Reader(in_fd), out_fd, scratch, profiler, classes)
    except WireError:
        return 0  # the caller went away: nothing left to answer
    return 0


if __name__ == "__main__":
    sys.exit(main())
