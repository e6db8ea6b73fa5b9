"""The two sides every static-mode script here compares: a random-weight preset under PyTorch
and a twin sharing its weights, patched, each behind a static-mode ``Generator`` on one prompt."""

from __future__ import annotations

from tilegym_hf_bench.generation import Generator, make_input_ids
from tilegym_hf_bench.model_factory import random_model, twin_sharing_weights
from tilegym_hf_bench.modes import STATIC
from tilegym_hf_bench.tilegym_patch import PatchReport, apply_patch, patch_flags
from tilegym_hf_bench.workloads import Workload, resolve_workload

PYTORCH, CUTILE = "PyTorch static", "cuTile static"


def variant_name(settings: dict) -> str:
    """The side name of a cuTile variant: ``cuTile static norm_gemv=1``."""
    return " ".join([CUTILE, *(f"{k}={v}" for k, v in settings.items())])


def static_sides(
    model_key: str,
    workload: str,
    seed: int,
    device: str = "cuda",
    cpu_sized: bool = False,
    variants: tuple[dict, ...] = (),
) -> tuple[Workload, dict[str, Generator], PatchReport]:
    """(the workload, ``{PYTORCH: ..., CUTILE: ..., <variant>: ...}`` generators, the cuTile
    side's patch); each of ``variants`` (patch settings over the model's
    ``MODEL_PATCH_KWARGS`` entry) is one more patched twin on the same weights;
    ``cpu_sized``: the workload's scaled-down shape, for the tiny presets."""
    wl = resolve_workload(workload, cpu_sized, mode=STATIC)
    base = random_model(model_key, device, seed).model
    model_type = base.config.model_type
    twin = twin_sharing_weights(base)
    report = apply_patch(twin, model_type)
    ids = make_input_ids(base.config.vocab_size, wl.batch_size, wl.input_length, seed, device)
    sides = {
        PYTORCH: Generator(base, ids, device, STATIC),
        CUTILE: Generator(twin, ids, device, STATIC),
    }
    for settings in variants:
        other = twin_sharing_weights(base)
        apply_patch(other, model_type, {model_type: {**patch_flags(model_type), **settings}})
        sides[variant_name(settings)] = Generator(other, ids, device, STATIC)
    return wl, sides, report
