"""SwiGLU activation: ``silu(gate) * up`` over separate or concatenated gate/up inputs.

Matches ``act_fn(gate_proj(x)) * up_proj(x)`` in transformers' MLPs: the SiLU result is rounded
to the activation dtype before the product, as the two PyTorch ops do.
"""

from __future__ import annotations

import cuda.tile as ct
import torch

from tilegym.ops._common import (
    AOT_DTYPES,
    PAD_ZERO,
    array_sig,
    check_activation,
    next_pow2,
    signature,
    stream,
)


@ct.kernel
def silu_and_mul_kernel(gate, up, out, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int]):
    """out = cast(silu(gate)) * up on a (TILE_M, TILE_N) tile; gate/up may be strided views."""
    i = ct.bid(0)
    j = ct.bid(1)
    g = ct.load(gate, (i, j), (TILE_M, TILE_N), padding_mode=PAD_ZERO).astype(ct.float32)
    u = ct.load(up, (i, j), (TILE_M, TILE_N), padding_mode=PAD_ZERO).astype(ct.float32)
    act = (g / (1.0 + ct.exp(-g))).astype(out.dtype).astype(ct.float32)
    ct.store(out, (i, j), (act * u).astype(out.dtype))


def tile_sizes(n: int) -> tuple[int, int]:
    """(TILE_M, TILE_N): up to 1024 columns, about 4K elements per block."""
    tile_n = min(1024, next_pow2(n))
    return max(1, 4096 // tile_n), tile_n


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(gate) * up``; with ``up=None``, ``gate`` holds ``[gate | up]`` on its last dim."""
    check_activation("gate", gate)
    if up is None:
        if gate.shape[-1] % 2:
            raise ValueError(f"concatenated gate/up needs an even last dim, got {gate.shape[-1]}")
        inter = gate.shape[-1] // 2
        g2 = gate.reshape(-1, gate.shape[-1])
        g2 = g2 if g2.stride(-1) == 1 else g2.contiguous()
        g, u = g2[:, :inter], g2[:, inter:]
        lead = gate.shape[:-1]
    else:
        check_activation("up", up)
        if up.shape != gate.shape or up.dtype != gate.dtype:
            raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} must match")
        inter = gate.shape[-1]
        g, u = (t.reshape(-1, inter) for t in (gate, up))
        g, u = (t if t.stride(-1) == 1 else t.contiguous() for t in (g, u))
        lead = gate.shape[:-1]
    m = g.shape[0]
    out = torch.empty((m, inter), dtype=gate.dtype, device=gate.device)
    if m and inter:
        tm, tn = tile_sizes(inter)
        grid = ((m + tm - 1) // tm, (inter + tn - 1) // tn, 1)
        ct.launch(stream(), grid, silu_and_mul_kernel, (g, u, out, tm, tn))
    return out.view(*lead, inter)


def silu_and_mul_reference(gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
    """The PyTorch ops the kernel replaces."""
    if up is None:
        gate, up = gate.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def aot_signatures(inter_sizes=(3072, 8192), dtypes=AOT_DTYPES) -> dict:
    """Signatures for the AOT gate (intermediate sizes of Qwen3-0.6B and Llama-3.2-1B)."""
    sigs = []
    for dt in dtypes:
        a2 = array_sig(dt, 2)
        for n in sorted({tile_sizes(n) for n in inter_sizes}):
            sigs.append(signature(a2, a2, a2, *n))
    return {silu_and_mul_kernel: sigs}
