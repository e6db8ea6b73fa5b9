"""Command-line flags of ``tilegym-hf-bench`` (DESIGN.md contract) into validated options. Pure.

Every bad flag is a ``UsageError`` whose message becomes the single ``error: ...`` line (exit 2).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import asdict, dataclass

from tilegym_hf_bench.modes import DEFAULT_MODE, MODES, warmup_problem
from tilegym_hf_bench.presets import PRESETS
from tilegym_hf_bench.workloads import WORKLOADS, Workload, resolve_workload

DEFAULT_TIMEOUT_S = 900.0
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class UsageError(Exception):
    """A flag the benchmark cannot run with."""


@dataclass(frozen=True)
class BenchOptions:
    model_key: str
    model_id: str | None
    workload: Workload
    device: str
    profiler: str
    skip_baseline: bool
    skip_cutile: bool
    skip_coverage: bool
    skip_correctness: bool
    metrics_out: str | None
    timeout_s: float
    commit: str | None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> BenchOptions:
        return cls(**{**data, "workload": Workload(**data["workload"])})


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse calls this for every bad flag
        raise UsageError(message)


def _checked(convert, ok, expected: str):
    """An argparse ``type`` that converts, then checks, with one message for both failures."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


_positive_int = _checked(int, lambda v: v >= 1, "a positive integer")
_non_negative_int = _checked(int, lambda v: v >= 0, "an integer >= 0")
_timeout = _checked(float, lambda v: v > 0, "seconds > 0")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="tilegym-hf-bench",
        description="Benchmark one model: PyTorch baseline vs cuTile-kernelized throughput, "
        "teacher-forced correctness, and cuTile kernel coverage by GPU time.",
    )
    p.add_argument(
        "--model-key", required=True, help=f"preset ({', '.join(PRESETS)}) or model type"
    )
    p.add_argument("--model-id", help="local directory or hub id of real weights (default: random)")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="default")
    p.add_argument(
        "--mode",
        choices=list(MODES),
        default=DEFAULT_MODE,
        help="eager: eager generate() (default); static: static KV cache, compiled decode step",
    )
    p.add_argument("--batch-size", type=_positive_int)
    p.add_argument("--input-length", type=_positive_int)
    p.add_argument("--output-length", type=_positive_int)
    p.add_argument("--warmup-runs", type=_non_negative_int, help="minimum full warm-up runs a side")
    p.add_argument("--timed-runs", type=_positive_int, help="timed runs a side (default 10)")
    p.add_argument("--seed", type=_non_negative_int, help="seed of weights and input ids")
    p.add_argument("--device", default="auto", help="auto (cuda when present), cpu, cuda, cuda:N")
    p.add_argument("--profiler", choices=["torch", "nsys"], default="torch")
    p.add_argument("--skip-baseline", action="store_true")
    p.add_argument("--skip-cutile", action="store_true")
    p.add_argument("--skip-coverage", action="store_true")
    p.add_argument("--skip-correctness", action="store_true")
    p.add_argument("--metrics-out", help="write the metrics JSON here")
    p.add_argument("--timeout", type=_timeout, default=DEFAULT_TIMEOUT_S, help="seconds (900)")
    p.add_argument("--commit", help="40-hex commit to record (default: HEAD of this checkout)")
    return p


def parse_options(argv: list[str]) -> BenchOptions:
    """Validated options; raises ``UsageError`` with a one-line message."""
    ns = build_parser().parse_args(argv)
    if ns.model_key not in PRESETS and ns.model_id is None:
        raise UsageError(
            f"unknown --model-key {ns.model_key!r}: presets are {', '.join(PRESETS)} "
            "(another model type needs --model-id)"
        )
    if not _DEVICE.match(ns.device):
        raise UsageError(f"--device must be auto, cpu, cuda or cuda:N, got {ns.device!r}")
    if ns.commit is not None and not _COMMIT.match(ns.commit):
        raise UsageError(f"--commit must be 40 lowercase hex digits, got {ns.commit!r}")
    if ns.metrics_out is not None and not ns.metrics_out.strip():
        raise UsageError("--metrics-out must not be empty")
    preset = PRESETS.get(ns.model_key)
    workload = resolve_workload(
        ns.workload,
        cpu_sized=preset is not None and preset.cpu_sized,
        batch_size=ns.batch_size,
        input_length=ns.input_length,
        output_length=ns.output_length,
        warmup_runs=ns.warmup_runs,
        timed_runs=ns.timed_runs,
        seed=ns.seed,
        mode=ns.mode,
    )
    problem = warmup_problem(workload.mode, workload.warmup_runs)
    if problem is not None:
        raise UsageError(problem)
    return BenchOptions(
        model_key=ns.model_key,
        model_id=ns.model_id,
        workload=workload,
        device=ns.device,
        profiler=ns.profiler,
        skip_baseline=ns.skip_baseline,
        skip_cutile=ns.skip_cutile,
        skip_coverage=ns.skip_coverage,
        skip_correctness=ns.skip_correctness,
        metrics_out=ns.metrics_out,
        timeout_s=ns.timeout,
        commit=ns.commit,
    )
