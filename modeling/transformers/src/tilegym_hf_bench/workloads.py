"""Named workloads (batch, prompt length, generated length), flag overrides and the ``--mode``
both sides generate in. Pure."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from tilegym_hf_bench.modes import DEFAULT_MODE

DEFAULT_SEED = 0


@dataclass(frozen=True)
class Workload:
    name: str
    batch_size: int
    input_length: int
    output_length: int
    warmup_runs: int = 2
    timed_runs: int = 10
    seed: int = DEFAULT_SEED
    mode: str = DEFAULT_MODE  # modes.MODES: how both sides run generate()

    def as_metrics(self) -> dict:
        """The metrics file's ``workload`` object."""
        return asdict(self)


WORKLOADS: dict[str, Workload] = {
    # prefill-heavy: one long prompt, a short answer
    "default": Workload("default", batch_size=1, input_length=2048, output_length=128),
    # decode-heavy: several sequences, as many new tokens as prompt tokens
    "decode": Workload("decode", batch_size=8, input_length=256, output_length=256),
}

# the same shapes of work scaled down for the CPU presets (tiny-*): the whole CLI in seconds
CPU_WORKLOADS: dict[str, Workload] = {
    "default": Workload("default", 1, 128, 16, warmup_runs=1, timed_runs=5),
    "decode": Workload("decode", 2, 32, 16, warmup_runs=1, timed_runs=5),
}


def resolve_workload(name: str, cpu_sized: bool = False, **overrides: int | str | None) -> Workload:
    """The named workload (its CPU-sized variant for tiny presets) with every override that is
    not None applied (the sizes, the seed, the mode)."""
    base = (CPU_WORKLOADS if cpu_sized else WORKLOADS)[name]
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
