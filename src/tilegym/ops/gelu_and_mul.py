"""GeGLU activation: ``gelu_tanh(gate) * up`` over separate or concatenated gate/up inputs.

Matches ``act_fn(gate_proj(x)) * up_proj(x)`` of a transformers MLP whose activation is
``gelu_pytorch_tanh`` (Gemma 3): ``torch.nn.functional.gelu(gate, approximate="tanh")``, i.e.
``0.5 * g * (1 + tanh(sqrt(2 / pi) * (g + 0.044715 * g^3)))`` computed in fp32, rounded to the
activation dtype before the product, as the two PyTorch ops do. Tiles and launch as
``tilegym.ops.silu_and_mul``.
"""

from __future__ import annotations

import math

import cuda.tile as ct
import torch

from tilegym.ops._common import AOT_DTYPES, PAD_ZERO, array_sig, check_activation, signature, stream
from tilegym.ops.silu_and_mul import tile_sizes

#: sqrt(2 / pi) and the cubic coefficient of the tanh approximation (PyTorch's kBeta, kKappa)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
KAPPA = 0.044715


@ct.function
def gelu_tanh(g):
    """The tanh approximation of GELU of an fp32 tile."""
    inner = SQRT_2_OVER_PI * (g + KAPPA * (g * g * g))
    return 0.5 * g * (1.0 + ct.tanh(inner))


@ct.kernel
def gelu_tanh_and_mul_kernel(gate, up, out, TILE_M: ct.Constant[int], TILE_N: ct.Constant[int]):
    """out = cast(gelu_tanh(gate)) * up on a (TILE_M, TILE_N) tile; gate/up may be strided."""
    i = ct.bid(0)
    j = ct.bid(1)
    g = ct.load(gate, (i, j), (TILE_M, TILE_N), padding_mode=PAD_ZERO).astype(ct.float32)
    u = ct.load(up, (i, j), (TILE_M, TILE_N), padding_mode=PAD_ZERO).astype(ct.float32)
    act = gelu_tanh(g).astype(out.dtype).astype(ct.float32)
    ct.store(out, (i, j), (act * u).astype(out.dtype))


def _operands(gate: torch.Tensor, up: torch.Tensor | None):
    """(gate rows, up rows, leading shape, intermediate size) as 2-D views, last dim unit-stride."""
    check_activation("gate", gate)
    if up is None:
        if gate.shape[-1] % 2:
            raise ValueError(f"concatenated gate/up needs an even last dim, got {gate.shape[-1]}")
        inter = gate.shape[-1] // 2
        g2 = gate.reshape(-1, gate.shape[-1])
        g2 = g2 if g2.stride(-1) == 1 else g2.contiguous()
        return g2[:, :inter], g2[:, inter:], gate.shape[:-1], inter
    check_activation("up", up)
    if up.shape != gate.shape or up.dtype != gate.dtype:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} must match")
    inter = gate.shape[-1]
    g, u = (t.reshape(-1, inter) for t in (gate, up))
    g, u = (t if t.stride(-1) == 1 else t.contiguous() for t in (g, u))
    return g, u, gate.shape[:-1], inter


def gelu_tanh_and_mul(gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
    """``gelu_tanh(gate) * up``; with ``up=None``, ``gate`` holds ``[gate | up]`` on its last
    dim."""
    g, u, lead, inter = _operands(gate, up)
    m = g.shape[0]
    out = torch.empty((m, inter), dtype=gate.dtype, device=gate.device)
    if m and inter:
        tm, tn = tile_sizes(inter)
        grid = ((m + tm - 1) // tm, (inter + tn - 1) // tn, 1)
        ct.launch(stream(), grid, gelu_tanh_and_mul_kernel, (g, u, out, tm, tn))
    return out.view(*lead, inter)


def gelu_tanh_and_mul_reference(gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
    """The PyTorch ops the kernel replaces (``GELUTanh`` then the product)."""
    if up is None:
        gate, up = gate.chunk(2, dim=-1)
    return torch.nn.functional.gelu(gate, approximate="tanh") * up


def aot_signatures(inter_sizes=(6912,), dtypes=AOT_DTYPES) -> dict:
    """Signatures for the AOT gate (the intermediate size of Gemma 3 1B by default)."""
    sigs = []
    for dt in dtypes:
        a2 = array_sig(dt, 2)
        for n in sorted({tile_sizes(n) for n in inter_sizes}):
            sigs.append(signature(a2, a2, a2, *n))
    return {gelu_tanh_and_mul_kernel: sigs}
