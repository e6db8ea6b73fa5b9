"""Every family's RoPE tables from one cuTile launch per step (``tilegym.ops.rotary_tables``).

Most families' rotary modules are Llama's: ``f = pos * inv_freq`` in fp32, ``cat(f, f)`` (gpt-oss:
``f`` alone, half a head wide), cosine and sine times ``attention_scaling``, cast to the input's
dtype (OLMo 2 and OLMo 3 keep fp32). Nothing an experiment writes replaces that module, and in a
compiled decode step it is an fp32 GEMM (transformers 5.17's ``inv_freq @ position_ids``) and two
to six Inductor kernels per step (about 1% of qwen3's GPU time on the H200), the same on both
sides. With ``rope`` the patched model computes those tables on the cuTile kernel instead.

Which modules: each instance is checked once at patch time, on the CPU, by calling its own
forward on a few positions (0 to 131 071) and comparing with the table this op computes there
(``table_form``). A module whose tables differ (M-RoPE, a complex table, partial forms nobody
wrote), whose rope type moves its frequencies per call (``dynamic``, ``longrope``), whose
``inv_freq`` is not a power of two of 8 to 128 frequencies, or whose forward takes other
arguments keeps its forward. At run time position ids that are not ``[B, S]`` go to the
module's own forward too.

A half-width module (gpt-oss) hands out the left half of the op's table, as upstream's: the
module's output is upstream's wherever it is routed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

DYNAMIC_ROPE = ("dynamic", "longrope")
"""Rope types whose ``inv_freq`` upstream updates per call (``dynamic_rope_update``)."""

MIN_FREQS, MAX_FREQS = 8, 128
"""Frequencies the table kernel takes (a power of two)."""

_PROBE_POSITIONS = (0, 1, 2, 7, 100, 2047, 4095, 32769, 131071)
_PROBE_INPUT_DTYPE = torch.bfloat16


@dataclass(frozen=True)
class TableForm:
    """How one rotary module (or one layer type of it) builds its tables."""

    half: bool  # upstream's table is half a head wide (gpt-oss)
    keeps_fp32: bool  # upstream's table stays fp32 (OLMo 2/3), else the input's dtype

    def dtype(self, x: torch.Tensor) -> torch.dtype:
        return torch.float32 if self.keeps_fp32 else x.dtype

    def upstream_width(self, tables: tuple[torch.Tensor, torch.Tensor]):
        """The op's full-width ``(cos, sin)``, or their left halves where upstream's are half."""
        return _left_halves(tables) if self.half else tables


def _left_halves(tables: tuple[torch.Tensor, torch.Tensor]):
    half = tables[0].shape[-1] // 2
    return tables[0][..., :half], tables[1][..., :half]


def _suffix(layer_type: str | None, name: str) -> str:
    return name if layer_type is None else f"{layer_type}_{name}"


def _frequencies(rotary: torch.nn.Module, layer_type: str | None):
    """``(inv_freq, attention_scaling)`` the kernel can take, else None."""
    rope_type = getattr(rotary, "rope_type", "default")
    if isinstance(rope_type, dict):
        rope_type = rope_type.get(layer_type)
    if rope_type is None or rope_type in DYNAMIC_ROPE:
        return None
    inv = getattr(rotary, _suffix(layer_type, "inv_freq"), None)
    scaling = getattr(rotary, _suffix(layer_type, "attention_scaling"), None)
    if not isinstance(inv, torch.Tensor) or inv.ndim != 1 or not inv.is_floating_point():
        return None
    n = inv.shape[0]
    if not (MIN_FREQS <= n <= MAX_FREQS and n & (n - 1) == 0):
        return None
    if isinstance(scaling, bool) or not isinstance(scaling, (int, float)):
        return None
    return inv, float(scaling)


def _reference(pos: torch.Tensor, inv: torch.Tensor, scaling: float, half: bool):
    """The table the op computes, in fp32 on the CPU (``reference_rotary_tables`` before its
    cast), sliced to half width where upstream's is."""
    from tilegym.ops.rotary_tables import reference_rotary_tables

    tables = reference_rotary_tables(pos, inv.detach().cpu(), scaling, torch.float32)
    return _left_halves(tables) if half else tables


def table_form(rotary: torch.nn.Module, layer_type: str | None = None) -> TableForm | None:
    """The module's form if its forward's tables are the op's at the probe positions (same
    values within fp32 rounding of the angles' cosine, same width and dtype), else None."""
    params = list(inspect.signature(type(rotary).forward).parameters)[1:]
    if params != (
        ["x", "position_ids"] if layer_type is None else ["x", "position_ids", "layer_type"]
    ):
        return None
    found = _frequencies(rotary, layer_type)
    if found is None:
        return None
    inv, scaling = found
    pos = torch.tensor([_PROBE_POSITIONS])
    x = torch.zeros(1, 1, dtype=_PROBE_INPUT_DTYPE)
    extra = () if layer_type is None else (layer_type,)
    try:
        with torch.no_grad():
            cos, sin = type(rotary).forward(rotary, x, pos, *extra)
    except Exception:  # a forward that cannot run on the CPU probe: not this form
        return None
    if not all(isinstance(t, torch.Tensor) for t in (cos, sin)) or cos.shape != sin.shape:
        return None
    if cos.dtype not in (_PROBE_INPUT_DTYPE, torch.float32) or cos.shape[:-1] != pos.shape:
        return None
    width = cos.shape[-1]
    if width not in (inv.shape[0], 2 * inv.shape[0]):
        return None
    half = width == inv.shape[0]
    want_cos, want_sin = _reference(pos, inv, scaling, half)
    for got, want in ((cos, want_cos), (sin, want_sin)):
        want = want.to(cos.dtype).float()
        if not torch.allclose(got.float(), want, rtol=0.0, atol=_tolerance(cos.dtype)):
            return None
    return TableForm(half=half, keeps_fp32=cos.dtype == torch.float32)


def _tolerance(dtype: torch.dtype) -> float:
    """One rounding step of the table's dtype at magnitude 1 (bf16: a cosine a hair from a
    rounding boundary may land on the other side), fp32's a few ulps of the cosine."""
    return 2.0**-7 if dtype == torch.bfloat16 else 1e-6


def layer_types(rotary: torch.nn.Module) -> list[str] | None:
    """The layer types a per-type module (a ``layer_type`` argument) holds tables for."""
    params = list(inspect.signature(type(rotary).forward).parameters)
    if "layer_type" not in params:
        return None
    types_ = getattr(rotary, "layer_types", None)
    return [t for t in types_ or () if isinstance(t, str)]


def make_forward(rotary: torch.nn.Module) -> Callable | None:
    """An instance ``forward`` computing ``rotary``'s tables on the cuTile op, or None when no
    table of it is the op's form (the module keeps its own forward)."""
    from tilegym.ops import library

    original = type(rotary).forward
    per_type = layer_types(rotary)
    if per_type is None:
        form = table_form(rotary)
        if form is None:
            return None

        def forward(self, x, position_ids):
            if position_ids.ndim != 2:
                return original(self, x, position_ids)
            inv = self.inv_freq.to(x.device)
            tables = library.rotary_tables(position_ids, inv, _scaling(self, None), form.dtype(x))
            return form.upstream_width(tables)

        return forward

    forms = {t: table_form(rotary, t) for t in per_type}
    if not any(forms.values()):
        return None

    def forward_typed(self, x, position_ids, layer_type):
        form = forms.get(layer_type)
        if form is None or position_ids.ndim != 2:
            return original(self, x, position_ids, layer_type)
        inv = getattr(self, f"{layer_type}_inv_freq").to(x.device)
        scaling = _scaling(self, layer_type)
        return form.upstream_width(library.rotary_tables(position_ids, inv, scaling, form.dtype(x)))

    return forward_typed


def _scaling(rotary: torch.nn.Module, layer_type: str | None) -> float:
    return float(getattr(rotary, _suffix(layer_type, "attention_scaling")))


def rotary_modules(model: torch.nn.Module, prefix: str) -> list[torch.nn.Module]:
    """The model's text rotary modules: instances of a class named ``<prefix>...RotaryEmbedding``,
    less a vision tower's (not called with token positions) and M-RoPE ones (an
    ``mrope_section``: Qwen3.5's model always hands them three rows of positions, which go to
    the module's own forward)."""
    found = []
    for module in model.modules():
        name = type(module).__name__
        if not (name.startswith(prefix) and name.endswith("RotaryEmbedding")):
            continue
        if "Vision" not in name and not hasattr(module, "mrope_section"):
            found.append(module)
    return found


__all__ = ["DYNAMIC_ROPE", "TableForm", "make_forward", "rotary_modules", "table_form"]
