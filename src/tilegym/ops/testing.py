"""Parity checks for kernels against higher-precision references (pure; no GPU needed)."""

from __future__ import annotations

import torch

#: ‖out − ref‖ / ‖ref‖ allowed against an fp32 reference, by output dtype. bf16 keeps 8 bits of
#: mantissa (≈ 4e-3 per rounding) and the kernels round two or three times like transformers.
REL_TOL = {torch.bfloat16: 1.6e-2, torch.float16: 2.5e-3, torch.float32: 2e-5}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error in fp64; NaN/inf anywhere in ``out`` gives inf."""
    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    if o.shape != r.shape:
        raise AssertionError(f"shape {tuple(o.shape)} != reference {tuple(r.shape)}")
    if not torch.isfinite(o).all():
        return float("inf")
    denom = r.norm().item()
    return (o - r).norm().item() / (denom if denom > 0 else 1.0)


def assert_close_rel(out: torch.Tensor, ref: torch.Tensor, tol: float | None = None) -> float:
    """Raise AssertionError unless rel_err(out, ref) <= tol (default: by ``out.dtype``)."""
    tol = REL_TOL[out.dtype] if tol is None else tol
    err = rel_err(out, ref)
    if not err <= tol:
        raise AssertionError(f"relative error {err:.3e} exceeds {tol:.1e} ({out.dtype})")
    return err


def launch_fits(sig, args) -> bool:
    """Whether one ``ct.launch``'s arguments fit an AOT signature: arrays by dtype and rank,
    runtime scalars as numbers, constants by type and value (the CPU tests that check every
    launch has a declared signature)."""
    import cuda.tile as ct
    from cuda.tile.compilation import ArrayConstraint, ScalarConstraint

    dtypes = {torch.bfloat16: ct.bfloat16, torch.float16: ct.float16, torch.float32: ct.float32}
    dtypes |= {torch.int8: ct.int8, torch.int32: ct.int32, torch.int64: ct.int64}
    params = sig.parameters if hasattr(sig, "parameters") else sig.params
    if len(params) != len(args):
        return False
    for p, a in zip(params, args, strict=True):
        if isinstance(p, ArrayConstraint):
            if not isinstance(a, torch.Tensor) or a.dim() != p.ndim or dtypes[a.dtype] != p.dtype:
                return False
        elif isinstance(p, ScalarConstraint):
            if isinstance(a, bool) or not isinstance(a, int | float):
                return False
        elif type(p.value) is not type(a) or p.value != a:
            return False
    return True
