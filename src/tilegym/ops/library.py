"""The cuTile ops as PyTorch custom operators (``torch.ops.tilegym.*``), for ``torch.compile``.

Dynamo cannot trace into a cuTile launch; a compiled, CUDA-graph-captured decode step needs
each op as one opaque node with a known output (its fake implementation) and its mutations
declared. Each op has a CUDA implementation (the cuTile function, run under
``private_buffers()`` so a captured graph owns its scratch memory) and a CPU one (the PyTorch
reference), so a patched model also traces, compiles and runs on a machine without a GPU.

The plain functions at the end are what the model glue calls. In eager mode on CUDA they call
the cuTile function directly: a custom-op dispatch costs host microseconds, and an eager decode
step is host-bound. While compiling, or on the CPU, they call the custom op.

(No ``from __future__ import annotations`` here: ``custom_op`` reads the schema from the
annotations.)
"""

import math

import torch
from torch import Tensor

from tilegym.ops import add_norm_gate_up as _add_norm_gate_up
from tilegym.ops import attention as _attention
from tilegym.ops import attention_sinks as _sinks
from tilegym.ops import causal_conv1d as _conv
from tilegym.ops import gated_delta as _gdn
from tilegym.ops import gelu_and_mul as _gelu
from tilegym.ops import gemm as _gemm
from tilegym.ops import kv_cache as _kv_cache
from tilegym.ops import latent_cache as _latent_cache
from tilegym.ops import mla as _mla
from tilegym.ops import mla_absorb as _mla_absorb
from tilegym.ops import moe as _moe
from tilegym.ops import moe_bias as _moe_bias
from tilegym.ops import qk_norm_whole_rope as _qk_whole
from tilegym.ops import rms_norm as _rms_norm
from tilegym.ops import rms_norm_gated as _rms_norm_gated
from tilegym.ops import rope as _rope
from tilegym.ops import rotary_tables as _rotary
from tilegym.ops import router_linear as _router
from tilegym.ops import sigmoid_gate as _sigmoid_gate
from tilegym.ops import silu_and_mul as _silu
from tilegym.ops._common import private_buffers

_NS = "tilegym"


_OPS: list = []


def _op(name: str, mutates_args=()):
    def define(fn):
        op = torch.library.custom_op(
            f"{_NS}::{name}", mutates_args=mutates_args, device_types="cuda"
        )(fn)
        _OPS.append(op)
        return op

    return define


def register_inductor_fallbacks() -> None:
    """Give Inductor each op's fallback lowering before it compiles a graph that calls them.

    Inductor creates the same fallback itself on first sight of an op, but torch 2.11 first
    formats the op's arguments for an INFO log line that is not lazy: each argument's whole IR
    tree, printed recursively. In gemma-3-1b's 26-layer decode step that printing did not end
    within 300 s on the H200 host. Registered here with the layout constraint Inductor would
    choose (the op's tag, else its default), the op is found in ``lowerings`` and the slow
    branch is never taken. Idempotent; imports ``torch._inductor`` (about 1.5 s), so the model
    patch calls it, not this module's import."""
    from torch._inductor import lowering

    for op in _OPS:
        overload = op._opoverload
        if overload in lowering.lowerings:
            continue
        tag = lowering.get_layout_constraint_tag(overload, with_default=True)
        lowering.make_fallback(
            overload, layout_constraint=lowering.tag_to_layout_constraint(tag), warn=False
        )


# ---------------------------------------------------------------------------------------------
# Norms
# ---------------------------------------------------------------------------------------------


@_op("rms_norm")
def rms_norm_op(x: Tensor, weight: Tensor, eps: float, unit_offset: bool = False) -> Tensor:
    with private_buffers():
        return _rms_norm.rms_norm(x, weight, eps, unit_offset=unit_offset)


@rms_norm_op.register_kernel("cpu")
def _(x, weight, eps, unit_offset=False):
    return _rms_norm.rms_norm_reference(x, weight, eps, unit_offset).contiguous()


@rms_norm_op.register_fake
def _(x, weight, eps, unit_offset=False):
    return x.new_empty(x.shape, dtype=_rms_norm.norm_dtype(x, weight, unit_offset))


@_op("add_rms_norm")
def add_rms_norm_op(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, unit_offset: bool = False
) -> tuple[Tensor, Tensor]:
    with private_buffers():
        return _rms_norm.add_rms_norm(x, residual, weight, eps, unit_offset=unit_offset)


@add_rms_norm_op.register_kernel("cpu")
def _(x, residual, weight, eps, unit_offset=False):
    total, normed = _rms_norm.add_rms_norm_reference(x, residual, weight, eps, unit_offset)
    return total.contiguous(), normed.contiguous()


@add_rms_norm_op.register_fake
def _(x, residual, weight, eps, unit_offset=False):
    normed = x.new_empty(x.shape, dtype=_rms_norm.norm_dtype(x, weight, unit_offset))
    return x.new_empty(x.shape), normed


@_op("rms_norm_add")
def rms_norm_add_op(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, unit_offset: bool
) -> Tensor:
    with private_buffers():
        return _rms_norm.rms_norm_add(x, residual, weight, eps, unit_offset=unit_offset)[0]


@rms_norm_add_op.register_kernel("cpu")
def _(x, residual, weight, eps, unit_offset):
    total, _ = _rms_norm.rms_norm_add_reference(x, residual, weight, eps, None, unit_offset)
    return total.contiguous()


@rms_norm_add_op.register_fake
def _(x, residual, weight, eps, unit_offset):
    return x.new_empty(x.shape)


@_op("rms_norm_add_rms_norm")
def rms_norm_add_rms_norm_op(
    x: Tensor, residual: Tensor, weight: Tensor, next_weight: Tensor, eps: float, unit_offset: bool
) -> tuple[Tensor, Tensor]:
    with private_buffers():
        return _rms_norm.rms_norm_add(
            x, residual, weight, eps, next_weight, unit_offset=unit_offset
        )


@rms_norm_add_rms_norm_op.register_kernel("cpu")
def _(x, residual, weight, next_weight, eps, unit_offset):
    total, normed = _rms_norm.rms_norm_add_reference(
        x, residual, weight, eps, next_weight, unit_offset
    )
    return total.contiguous(), normed.contiguous()


@rms_norm_add_rms_norm_op.register_fake
def _(x, residual, weight, next_weight, eps, unit_offset):
    normed = x.new_empty(x.shape, dtype=_rms_norm.norm_dtype(x, next_weight, unit_offset))
    return x.new_empty(x.shape), normed


# ---------------------------------------------------------------------------------------------
# RoPE
# ---------------------------------------------------------------------------------------------


@_op("apply_rope")
def apply_rope_op(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, decode_heads: int = 0
) -> tuple[Tensor, Tensor]:
    with private_buffers():
        return _rope.apply_rope(q, k, cos, sin, decode_heads=decode_heads)


@apply_rope_op.register_kernel("cpu")
def _(q, k, cos, sin, decode_heads=0):
    qo, ko = _rope.apply_rope_reference(q, k, cos, sin)
    return qo.to(q.dtype).contiguous(), ko.to(k.dtype).contiguous()


@apply_rope_op.register_fake
def _(q, k, cos, sin, decode_heads=0):
    return q.new_empty(q.shape), k.new_empty(k.shape)


@_op("qk_norm_rope")
def qk_norm_rope_op(
    q: Tensor,
    k: Tensor,
    q_weight: Tensor,
    k_weight: Tensor,
    eps: float,
    cos: Tensor,
    sin: Tensor,
    unit_offset: bool = False,
    decode_heads: int = 0,
) -> tuple[Tensor, Tensor]:
    with private_buffers():
        return _rope.qk_norm_rope(
            q,
            k,
            q_weight,
            k_weight,
            eps,
            cos,
            sin,
            unit_offset=unit_offset,
            decode_heads=decode_heads,
        )


@qk_norm_rope_op.register_kernel("cpu")
def _(q, k, q_weight, k_weight, eps, cos, sin, unit_offset=False, decode_heads=0):
    qo, ko = _rope.qk_norm_rope_reference(q, k, q_weight, k_weight, eps, cos, sin, unit_offset)
    dtype = _rms_norm.norm_dtype(q, q_weight, unit_offset)
    return qo.to(dtype).contiguous(), ko.to(dtype).contiguous()


@qk_norm_rope_op.register_fake
def _(q, k, q_weight, k_weight, eps, cos, sin, unit_offset=False, decode_heads=0):
    b, s, hq, d = q.shape
    dtype = _rms_norm.norm_dtype(q, q_weight, unit_offset)
    return q.new_empty((b, hq, s, d), dtype=dtype), q.new_empty((b, k.shape[2], s, d), dtype=dtype)


@_op("qk_norm_whole_rope")
def qk_norm_whole_rope_op(
    q: Tensor,
    k: Tensor,
    q_weight: Tensor,
    k_weight: Tensor,
    eps: float,
    cos: Tensor,
    sin: Tensor,
    round_once: bool = True,
) -> tuple[Tensor, Tensor]:
    with private_buffers():
        return _qk_whole.qk_norm_whole_rope(
            q, k, q_weight, k_weight, eps, cos, sin, round_once=round_once
        )


@qk_norm_whole_rope_op.register_kernel("cpu")
def _(q, k, q_weight, k_weight, eps, cos, sin, round_once=True):
    qo, ko = _qk_whole.qk_norm_whole_rope_reference(
        q, k, q_weight, k_weight, eps, cos, sin, round_once
    )
    dtype = _qk_whole.out_dtype(q.dtype, q_weight.dtype, round_once)
    return qo.to(dtype).contiguous(), ko.to(dtype).contiguous()


@qk_norm_whole_rope_op.register_fake
def _(q, k, q_weight, k_weight, eps, cos, sin, round_once=True):
    b, s, hq, d = q.shape
    dtype = _qk_whole.out_dtype(q.dtype, q_weight.dtype, round_once)
    return q.new_empty((b, hq, s, d), dtype=dtype), q.new_empty((b, k.shape[2], s, d), dtype=dtype)


# ---------------------------------------------------------------------------------------------
# MLP activation and GEMMs
# ---------------------------------------------------------------------------------------------


@_op("silu_and_mul")
def silu_and_mul_op(gate: Tensor, up: Tensor | None) -> Tensor:
    with private_buffers():
        return _silu.silu_and_mul(gate, up)


@silu_and_mul_op.register_kernel("cpu")
def _(gate, up):
    return _silu.silu_and_mul_reference(gate, up).contiguous()


@silu_and_mul_op.register_fake
def _(gate, up):
    inter = gate.shape[-1] if up is not None else gate.shape[-1] // 2
    return gate.new_empty((*gate.shape[:-1], inter))


@_op("gelu_tanh_and_mul")
def gelu_tanh_and_mul_op(gate: Tensor, up: Tensor | None) -> Tensor:
    with private_buffers():
        return _gelu.gelu_tanh_and_mul(gate, up)


@gelu_tanh_and_mul_op.register_kernel("cpu")
def _(gate, up):
    return _gelu.gelu_tanh_and_mul_reference(gate, up).contiguous()


@gelu_tanh_and_mul_op.register_fake
def _(gate, up):
    inter = gate.shape[-1] if up is not None else gate.shape[-1] // 2
    return gate.new_empty((*gate.shape[:-1], inter))


@_op("sigmoid_gate")
def sigmoid_gate_op(x: Tensor, gate: Tensor) -> Tensor:
    with private_buffers():
        return _sigmoid_gate.sigmoid_gate(x, gate)


@sigmoid_gate_op.register_kernel("cpu")
def _(x, gate):
    return _sigmoid_gate.sigmoid_gate_reference(x, gate).contiguous()


@sigmoid_gate_op.register_fake
def _(x, gate):
    return x.new_empty(x.shape)


@_op("sigmoid_gate_add")
def sigmoid_gate_add_op(residual: Tensor, x: Tensor, gate: Tensor) -> Tensor:
    with private_buffers():
        return _sigmoid_gate.sigmoid_gate_add(residual, x, gate)


@sigmoid_gate_add_op.register_kernel("cpu")
def _(residual, x, gate):
    return _sigmoid_gate.sigmoid_gate_add_reference(residual, x, gate).contiguous()


@sigmoid_gate_add_op.register_fake
def _(residual, x, gate):
    return x.new_empty(x.shape)


@_op("linear")
def linear_op(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    with private_buffers():
        return _gemm.linear(x, weight, bias)


@linear_op.register_kernel("cpu")
def _(x, weight, bias):
    return torch.nn.functional.linear(x, weight, bias)


@linear_op.register_fake
def _(x, weight, bias):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@_op("linear_residual")
def linear_residual_op(x: Tensor, weight: Tensor, residual: Tensor) -> Tensor:
    with private_buffers():
        return _gemm.linear_residual(x, weight, residual)


@linear_residual_op.register_kernel("cpu")
def _(x, weight, residual):
    return residual + torch.nn.functional.linear(x, weight)


@linear_residual_op.register_fake
def _(x, weight, residual):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@_op("rms_norm_linear")
def rms_norm_linear_op(
    x: Tensor,
    norm_weight: Tensor,
    eps: float,
    weight: Tensor,
    bias: Tensor | None,
    unit_offset: bool = False,
) -> Tensor:
    with private_buffers():
        return _gemm.rms_norm_linear(x, norm_weight, eps, weight, bias, unit_offset=unit_offset)


@rms_norm_linear_op.register_kernel("cpu")
def _(x, norm_weight, eps, weight, bias, unit_offset=False):
    normed = _rms_norm.rms_norm_reference(x, norm_weight, eps, unit_offset)
    return torch.nn.functional.linear(normed, weight, bias)


@rms_norm_linear_op.register_fake
def _(x, norm_weight, eps, weight, bias, unit_offset=False):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@_op("rms_norm_linear_rope")
def rms_norm_linear_rope_op(
    x: Tensor,
    norm_weight: Tensor | None,
    eps: float,
    weight: Tensor,
    bias: Tensor | None,
    cos: Tensor,
    sin: Tensor,
    rotated_heads: int,
    unit_offset: bool = False,
    q_norm_weight: Tensor | None = None,
    k_norm_weight: Tensor | None = None,
    head_eps: float = 0.0,
    q_heads: int = 0,
    head_unit_offset: bool = False,
    head_whole: bool = False,
    head_round_once: bool = False,
) -> Tensor:
    form = (head_unit_offset, head_whole, head_round_once)
    heads = _head_norms(q_norm_weight, k_norm_weight, head_eps, q_heads, *form)
    args = (x, norm_weight, eps, weight, bias, cos, sin, rotated_heads)
    return _fused_rope(args, unit_offset, heads)


def _fused_rope(args, unit_offset, heads, cache=None) -> Tensor:
    """The custom ops' CUDA body: `gemm.rms_norm_linear_rope` on scratch tensors of its own."""
    with private_buffers():
        return _gemm.rms_norm_linear_rope(
            *args, unit_offset=unit_offset, head_norms=heads, cache=cache
        )


def _rope_reference(args, unit_offset, heads) -> Tensor:
    """The custom ops' CPU body: the norm, then `rms_norm_linear_rope_reference`."""
    x, norm_weight, eps, weight, bias, cos, sin, rotated_heads = args
    normed = x
    if norm_weight is not None:
        normed = _rms_norm.rms_norm_reference(x, norm_weight, eps, unit_offset)
    return rms_norm_linear_rope_reference(normed, weight, bias, cos, sin, rotated_heads, heads)


def _head_norms(q_weight, k_weight, eps, q_heads, unit_offset, whole=False, round_once=False):
    if q_weight is None:
        return None
    return _gemm.HeadNorms(q_weight, k_weight, eps, q_heads, unit_offset, whole, round_once)


@rms_norm_linear_rope_op.register_kernel("cpu")
def _(
    x,
    norm_weight,
    eps,
    weight,
    bias,
    cos,
    sin,
    rotated_heads,
    unit_offset=False,
    q_norm_weight=None,
    k_norm_weight=None,
    head_eps=0.0,
    q_heads=0,
    head_unit_offset=False,
    head_whole=False,
    head_round_once=False,
):
    form = (head_unit_offset, head_whole, head_round_once)
    heads = _head_norms(q_norm_weight, k_norm_weight, head_eps, q_heads, *form)
    return _rope_reference(
        (x, norm_weight, eps, weight, bias, cos, sin, rotated_heads), unit_offset, heads
    )


def rms_norm_linear_rope_reference(
    normed, weight, bias, cos, sin, rotated_heads, head_norms=None
) -> Tensor:
    """``linear(normed, weight, bias)`` with its first ``rotated_heads`` heads (of
    ``cos.shape[-1]``) RMS-normed per head (``head_norms``: q's weight, then k's) and rotated,
    as transformers' q_norm / k_norm and ``apply_rotary_pos_emb`` on the projection."""
    qkv = torch.nn.functional.linear(normed, weight, bias)
    d = cos.shape[-1]
    heads = qkv.view(*qkv.shape[:-1], -1, d)
    rot = heads[..., :rotated_heads, :]
    if head_norms is not None:
        nq = head_norms.q_heads
        q, k = rot[..., :nq, :], rot[..., nq:, :]
        if head_norms.whole:  # OLMo's: each norm over the whole projection
            h_eps = head_norms.eps
            q, k = (
                _qk_whole.whole_rms_norm_reference(
                    t.flatten(-2), w, h_eps, head_norms.round_once
                ).unflatten(-1, t.shape[-2:])
                for t, w in ((q, head_norms.q_weight), (k, head_norms.k_weight))
            )
        else:
            norm = _rms_norm.rms_norm_reference
            q = norm(q, head_norms.q_weight, head_norms.eps, head_norms.unit_offset)
            k = norm(k, head_norms.k_weight, head_norms.eps, head_norms.unit_offset)
        rot = torch.cat((q, k), dim=-2)
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    halves = torch.cat((-rot[..., d // 2 :], rot[..., : d // 2]), dim=-1)
    rotated = (rot * c + halves * s).to(qkv.dtype)
    return torch.cat((rotated, heads[..., rotated_heads:, :]), dim=-2).reshape(qkv.shape)


@rms_norm_linear_rope_op.register_fake
def _(x, norm_weight, eps, weight, bias, cos, sin, rotated_heads, *args):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@_op("rms_norm_linear_rope_cache", mutates_args=("k_cache", "v_cache", "length"))
def rms_norm_linear_rope_cache_op(
    x: Tensor,
    norm_weight: Tensor | None,
    eps: float,
    weight: Tensor,
    bias: Tensor | None,
    cos: Tensor,
    sin: Tensor,
    rotated_heads: int,
    k_cache: Tensor,
    v_cache: Tensor,
    position: Tensor,
    length: Tensor,
    q_heads: int,
    unit_offset: bool = False,
    q_norm_weight: Tensor | None = None,
    k_norm_weight: Tensor | None = None,
    head_eps: float = 0.0,
    head_unit_offset: bool = False,
    head_whole: bool = False,
    head_round_once: bool = False,
) -> Tensor:
    form = (head_unit_offset, head_whole, head_round_once)
    heads = _head_norms(q_norm_weight, k_norm_weight, head_eps, q_heads, *form)
    write = _gemm.CacheWrite(k_cache, v_cache, position, length, q_heads)
    args = (x, norm_weight, eps, weight, bias, cos, sin, rotated_heads)
    return _fused_rope(args, unit_offset, heads, write)


@rms_norm_linear_rope_cache_op.register_kernel("cpu")
def _(
    x,
    norm_weight,
    eps,
    weight,
    bias,
    cos,
    sin,
    rotated_heads,
    k_cache,
    v_cache,
    position,
    length,
    q_heads,
    unit_offset=False,
    q_norm_weight=None,
    k_norm_weight=None,
    head_eps=0.0,
    head_unit_offset=False,
    head_whole=False,
    head_round_once=False,
):
    form = (head_unit_offset, head_whole, head_round_once)
    heads = _head_norms(q_norm_weight, k_norm_weight, head_eps, q_heads, *form)
    args = (x, norm_weight, eps, weight, bias, cos, sin, rotated_heads)
    out = _rope_reference(args, unit_offset, heads)
    _write_new_token(out, k_cache, v_cache, position, length, q_heads, rotated_heads)
    return out


def _write_new_token(qkv, k_cache, v_cache, position, length, q_heads, rotated_heads) -> None:
    """The reference of the fused cache write: a one-token projection's key and value heads
    (``[B, 1, heads * D]``) into the caches at ``position[0]``, ``length`` to position + 1."""
    d = k_cache.shape[-1]
    heads = qkv.reshape(k_cache.shape[0], 1, -1, d).transpose(1, 2)
    k_new, v_new = heads[:, q_heads:rotated_heads], heads[:, rotated_heads:]
    _kv_cache.reference_kv_cache_write_at(k_new, v_new, k_cache, v_cache, position, length)


@rms_norm_linear_rope_cache_op.register_fake
def _(x, norm_weight, eps, weight, bias, cos, sin, rotated_heads, *args):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@_op("rms_norm_gate_up")
def rms_norm_gate_up_op(
    x: Tensor,
    norm_weight: Tensor,
    eps: float,
    gate_up_weight: Tensor,
    gelu_tanh: bool = False,
    unit_offset: bool = False,
) -> Tensor:
    with private_buffers():
        return _norm_gate_up(x, norm_weight, eps, gate_up_weight, gelu_tanh, unit_offset)


def _norm_gate_up(x, norm_weight, eps, gate_up_weight, gelu_tanh, unit_offset) -> Tensor:
    act = _gemm.ACT_GELU_TANH if gelu_tanh else _gemm.ACT_SILU
    return _gemm.rms_norm_gate_up(
        x, norm_weight, eps, gate_up_weight, act=act, unit_offset=unit_offset
    )


@rms_norm_gate_up_op.register_kernel("cpu")
def _(x, norm_weight, eps, gate_up_weight, gelu_tanh=False, unit_offset=False):
    normed = _rms_norm.rms_norm_reference(x, norm_weight, eps, unit_offset)
    gate_up = torch.nn.functional.linear(normed, gate_up_weight)
    if gelu_tanh:
        return _gelu.gelu_tanh_and_mul_reference(gate_up).contiguous()
    return _silu.silu_and_mul_reference(gate_up).contiguous()


@rms_norm_gate_up_op.register_fake
def _(x, norm_weight, eps, gate_up_weight, gelu_tanh=False, unit_offset=False):
    return x.new_empty((*x.shape[:-1], gate_up_weight.shape[0] // 2))


@_op("add_rms_norm_gate_up")
def add_rms_norm_gate_up_op(
    x: Tensor,
    residual: Tensor,
    norm_weight: Tensor,
    eps: float,
    gate_up_weight: Tensor,
    gelu_tanh: bool = False,
    unit_offset: bool = False,
) -> tuple[Tensor, Tensor]:
    with private_buffers():
        return _add_norm_gate_up_cuda(
            x, residual, norm_weight, eps, gate_up_weight, gelu_tanh, unit_offset
        )


def _add_norm_gate_up_cuda(x, residual, norm_weight, eps, gate_up_weight, gelu_tanh, offset):
    act = _gemm.ACT_GELU_TANH if gelu_tanh else _gemm.ACT_SILU
    return _add_norm_gate_up.add_rms_norm_gate_up(
        x, residual, norm_weight, eps, gate_up_weight, act=act, unit_offset=offset
    )


@add_rms_norm_gate_up_op.register_kernel("cpu")
def _(x, residual, norm_weight, eps, gate_up_weight, gelu_tanh=False, unit_offset=False):
    return _add_norm_gate_up.add_rms_norm_gate_up_reference(
        x, residual, norm_weight, eps, gate_up_weight, gelu_tanh, unit_offset
    )


@add_rms_norm_gate_up_op.register_fake
def _(x, residual, norm_weight, eps, gate_up_weight, gelu_tanh=False, unit_offset=False):
    return x.new_empty((*x.shape[:-1], gate_up_weight.shape[0] // 2)), x.new_empty(x.shape)


@_op("fused_gate_up_silu")
def fused_gate_up_silu_op(x: Tensor, gate_up_weight: Tensor) -> Tensor:
    with private_buffers():
        return _gemm.fused_gate_up_silu(x, gate_up_weight)


@fused_gate_up_silu_op.register_kernel("cpu")
def _(x, gate_up_weight):
    return _silu.silu_and_mul_reference(torch.nn.functional.linear(x, gate_up_weight)).contiguous()


@fused_gate_up_silu_op.register_fake
def _(x, gate_up_weight):
    return x.new_empty((*x.shape[:-1], gate_up_weight.shape[0] // 2))


@_op("fused_gate_up_gelu_tanh")
def fused_gate_up_gelu_tanh_op(x: Tensor, gate_up_weight: Tensor) -> Tensor:
    with private_buffers():
        return _gemm.fused_gate_up_gelu_tanh(x, gate_up_weight)


@fused_gate_up_gelu_tanh_op.register_kernel("cpu")
def _(x, gate_up_weight):
    gate_up = torch.nn.functional.linear(x, gate_up_weight)
    return _gelu.gelu_tanh_and_mul_reference(gate_up).contiguous()


@fused_gate_up_gelu_tanh_op.register_fake
def _(x, gate_up_weight):
    return x.new_empty((*x.shape[:-1], gate_up_weight.shape[0] // 2))


# ---------------------------------------------------------------------------------------------
# Mixture of experts (Qwen3-MoE): the router's top-k and the experts with their combine
# ---------------------------------------------------------------------------------------------


@_op("moe_route")
def moe_route_op(router_logits: Tensor, top_k: int, normalize: bool) -> tuple[Tensor, Tensor]:
    with private_buffers():
        return _moe.moe_route(router_logits, top_k, normalize)


@moe_route_op.register_kernel("cpu")
def _(router_logits, top_k, normalize):
    weights, ids = _moe.moe_route_reference(router_logits, top_k, normalize)
    return weights.contiguous(), ids.contiguous()


@moe_route_op.register_fake
def _(router_logits, top_k, normalize):
    shape = (router_logits.shape[0], top_k)
    return router_logits.new_empty(shape), router_logits.new_empty(shape, dtype=torch.int32)


@_op("moe_experts")
def moe_experts_op(
    hidden: Tensor,
    ids: Tensor,
    weights: Tensor,
    gate_up: Tensor,
    down: Tensor,
    residual: Tensor | None,
) -> Tensor:
    with private_buffers():
        return _moe.moe_experts(hidden, ids, weights, gate_up, down, residual)


@moe_experts_op.register_kernel("cpu")
def _(hidden, ids, weights, gate_up, down, residual):
    out = _moe.moe_experts_reference(hidden, ids, weights, gate_up, down, residual)
    return out.to(hidden.dtype)


@moe_experts_op.register_fake
def _(hidden, ids, weights, gate_up, down, residual):
    return hidden.new_empty(hidden.shape)


# ---------------------------------------------------------------------------------------------
# Linear attention (Qwen3.5): gated delta rule, causal conv1d with its state, gated RMSNorm
# ---------------------------------------------------------------------------------------------


@_op("gated_delta_chunk")
def gated_delta_chunk_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    initial_state: Tensor | None,
) -> tuple[Tensor, Tensor]:
    with private_buffers():
        return _gdn.gated_delta_chunk(q, k, v, a, b, A_log, dt_bias, initial_state)


@gated_delta_chunk_op.register_kernel("cpu")
def _(q, k, v, a, b, A_log, dt_bias, initial_state):
    g, beta = _gdn.gates_reference(a, b, A_log, dt_bias)
    out, state = _gdn.chunk_reference(q, k, v, g, beta, initial_state)
    return out.to(v.dtype).contiguous(), state.contiguous()


@gated_delta_chunk_op.register_fake
def _(q, k, v, a, b, A_log, dt_bias, initial_state):
    bsz, n_tok, hv, dv = v.shape
    state = v.new_empty((bsz, hv, q.shape[-1], dv), dtype=torch.float32)
    return v.new_empty((bsz, n_tok, hv, dv)), state


@_op("gated_delta_recurrent", mutates_args=("state",))
def gated_delta_recurrent_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    a: Tensor,
    b: Tensor,
    A_log: Tensor,
    dt_bias: Tensor,
    state: Tensor,
) -> Tensor:
    with private_buffers():
        return _gdn.gated_delta_recurrent(q, k, v, a, b, A_log, dt_bias, state)


@gated_delta_recurrent_op.register_kernel("cpu")
def _(q, k, v, a, b, A_log, dt_bias, state):
    g, beta = _gdn.gates_reference(a, b, A_log, dt_bias)
    out, new = _gdn.recurrent_reference(q, k, v, g, beta, state)
    state.copy_(new)
    return out.to(v.dtype).contiguous()


@gated_delta_recurrent_op.register_fake
def _(q, k, v, a, b, A_log, dt_bias, state):
    return v.new_empty(v.shape)


@_op("causal_conv1d")
def causal_conv1d_op(
    x: Tensor, weight: Tensor, bias: Tensor | None, state_in: Tensor | None, state_len: int
) -> tuple[Tensor, Tensor]:
    with private_buffers():
        state = x.new_empty((x.shape[0], x.shape[2], state_len))
        return _conv.causal_conv1d(x, weight, bias, state_in, state), state


@causal_conv1d_op.register_kernel("cpu")
def _(x, weight, bias, state_in, state_len):
    hist = state_in
    if hist is None:
        hist = x.new_zeros((x.shape[0], x.shape[2], state_len))
    out, state = _conv.causal_conv1d_reference(x, weight, bias, hist)
    return out.contiguous(), state.contiguous()


@causal_conv1d_op.register_fake
def _(x, weight, bias, state_in, state_len):
    return x.new_empty(x.shape), x.new_empty((x.shape[0], x.shape[2], state_len))


@_op("causal_conv1d_update", mutates_args=("conv_state",))
def causal_conv1d_update_op(
    x: Tensor, conv_state: Tensor, weight: Tensor, bias: Tensor | None
) -> Tensor:
    with private_buffers():
        return _conv.causal_conv1d_update(x, conv_state, weight, bias)


@causal_conv1d_update_op.register_kernel("cpu")
def _(x, conv_state, weight, bias):
    out, state = _conv.causal_conv1d_reference(x, weight, bias, conv_state)
    conv_state.copy_(state)
    return out.contiguous()


@causal_conv1d_update_op.register_fake
def _(x, conv_state, weight, bias):
    return x.new_empty(x.shape)


@_op("rms_norm_gated")
def rms_norm_gated_op(x: Tensor, z: Tensor, weight: Tensor, eps: float) -> Tensor:
    with private_buffers():
        return _rms_norm_gated.rms_norm_gated(x, z, weight, eps)


@rms_norm_gated_op.register_kernel("cpu")
def _(x, z, weight, eps):
    return _rms_norm_gated.rms_norm_gated_reference(x, z, weight, eps).contiguous()


@rms_norm_gated_op.register_fake
def _(x, z, weight, eps):
    return x.new_empty(x.shape)


# ---------------------------------------------------------------------------------------------
# Attention and the KV cache
# ---------------------------------------------------------------------------------------------


@_op("prefill_attention")
def prefill_attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    causal: bool,
    q_start: int,
    window: int | None,
    key_valid: Tensor | None,
) -> Tensor:
    with private_buffers():
        return _attention.prefill_attention(
            q, k, v, scale=scale, causal=causal, q_start=q_start, window=window, key_valid=key_valid
        )


@prefill_attention_op.register_kernel("cpu")
def _(q, k, v, scale, causal, q_start, window, key_valid):
    b, _, sq, _ = q.shape
    mask = _attention.reference_mask(
        b, sq, k.shape[2], causal=causal, q_start=q_start, window=window, key_valid=key_valid
    )
    return _attention.reference_attention(q, k, v, mask, scale).to(q.dtype).contiguous()


@prefill_attention_op.register_fake
def _(q, k, v, scale, causal, q_start, window, key_valid):
    b, hq, sq, d = q.shape
    return q.new_empty((b, sq, hq, d))


@_op("decode_attention")
def decode_attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    kv_end: int,
    position: Tensor | None,
    window: int | None,
    key_valid: Tensor | None,
) -> Tensor:
    with private_buffers():
        if position is not None:
            return _attention.decode_attention(
                q, k, v, scale=scale, position=position, window=window, key_valid=key_valid
            )
        return _attention.decode_attention(
            q, k, v, scale=scale, kv_end=kv_end, window=window, key_valid=key_valid
        )


@decode_attention_op.register_kernel("cpu")
def _(q, k, v, scale, kv_end, position, window, key_valid):
    last = min(int(position[0]), k.shape[2] - 1) if position is not None else kv_end - 1
    mask = _attention.reference_mask(
        q.shape[0], 1, k.shape[2], q_start=last, window=window, key_valid=key_valid
    )
    return _attention.reference_attention(q, k, v, mask, scale).to(q.dtype).contiguous()


@decode_attention_op.register_fake
def _(q, k, v, scale, kv_end, position, window, key_valid):
    b, hq, _, d = q.shape
    return q.new_empty((b, 1, hq, d))


@_op("kv_cache_write_at", mutates_args=("k_cache", "v_cache", "length"))
def kv_cache_write_at_op(
    k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor, position: Tensor, length: Tensor
) -> None:
    _kv_cache.kv_cache_write_at(k_new, v_new, k_cache, v_cache, position, length)


@kv_cache_write_at_op.register_kernel("cpu")
def _(k_new, v_new, k_cache, v_cache, position, length):
    _kv_cache.reference_kv_cache_write_at(k_new, v_new, k_cache, v_cache, position, length)


@kv_cache_write_at_op.register_fake
def _(k_new, v_new, k_cache, v_cache, position, length):
    return None


@_op("kv_cache_ring_write", mutates_args=("k_cache", "v_cache", "length"))
def kv_cache_ring_write_op(
    k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor, position: Tensor, length: Tensor
) -> None:
    _kv_cache.kv_cache_ring_write(k_new, v_new, k_cache, v_cache, position, length)


@kv_cache_ring_write_op.register_kernel("cpu")
def _(k_new, v_new, k_cache, v_cache, position, length):
    _kv_cache.reference_kv_cache_ring_write(k_new, v_new, k_cache, v_cache, position, length)


@kv_cache_ring_write_op.register_fake
def _(k_new, v_new, k_cache, v_cache, position, length):
    return None


# ---------------------------------------------------------------------------------------------
# What the glue calls: the cuTile function in eager CUDA code, the custom op otherwise
# ---------------------------------------------------------------------------------------------


def _use_op(t: Tensor) -> bool:
    return torch.compiler.is_compiling() or not t.is_cuda


def rms_norm(x: Tensor, weight: Tensor, eps: float, unit_offset: bool = False) -> Tensor:
    if _use_op(x):
        return rms_norm_op(x, weight, float(eps), bool(unit_offset))
    return _rms_norm.rms_norm(x, weight, eps, unit_offset=unit_offset)


def add_rms_norm(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, unit_offset: bool = False
) -> tuple[Tensor, Tensor]:
    if _use_op(x):
        return add_rms_norm_op(x, residual, weight, float(eps), bool(unit_offset))
    return _rms_norm.add_rms_norm(x, residual, weight, eps, unit_offset=unit_offset)


def rms_norm_add(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float, unit_offset: bool = False
) -> Tensor:
    """``residual + RMSNorm(x)`` (a norm after a sub-block, added to the residual)."""
    if _use_op(x):
        return rms_norm_add_op(x, residual, weight, float(eps), bool(unit_offset))
    return _rms_norm.rms_norm_add(x, residual, weight, eps, unit_offset=unit_offset)[0]


def add_rms_norm_gate_up(
    x: Tensor,
    residual: Tensor,
    norm_weight: Tensor,
    eps: float,
    gate_up_weight: Tensor,
    gelu_tanh: bool = False,
    unit_offset: bool = False,
) -> tuple[Tensor, Tensor]:
    """``(act(h @ Wg^T) * (h @ Wu^T), h)`` with ``h = residual + RMSNorm(x)`` (SiLU, or
    GELU-tanh): a post-norm layer's attention norm, residual add and MLP gate/up, one launch at
    decode (``add_norm_gate_up``)."""
    args = (x, residual, norm_weight, float(eps), gate_up_weight, bool(gelu_tanh))
    if _use_op(x):
        return add_rms_norm_gate_up_op(*args, bool(unit_offset))
    return _add_norm_gate_up_cuda(*args, unit_offset)


def rms_norm_add_rms_norm(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    next_weight: Tensor,
    eps: float,
    unit_offset: bool = False,
) -> tuple[Tensor, Tensor]:
    """(``residual + RMSNorm(x)``, the RMSNorm of that sum by ``next_weight``)."""
    if _use_op(x):
        return rms_norm_add_rms_norm_op(
            x, residual, weight, next_weight, float(eps), bool(unit_offset)
        )
    return _rms_norm.rms_norm_add(x, residual, weight, eps, next_weight, unit_offset=unit_offset)


def apply_rope(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, decode_heads: int = 0
) -> tuple[Tensor, Tensor]:
    """``decode_heads``: see ``tilegym.ops.rope._pick``."""
    if _use_op(q):
        return apply_rope_op(q, k, cos, sin, int(decode_heads))
    return _rope.apply_rope(q, k, cos, sin, decode_heads=decode_heads)


def qk_norm_rope(
    q, k, q_weight, k_weight, eps, cos, sin, unit_offset: bool = False, decode_heads: int = 0
) -> tuple[Tensor, Tensor]:
    if _use_op(q):
        return qk_norm_rope_op(
            q, k, q_weight, k_weight, float(eps), cos, sin, bool(unit_offset), int(decode_heads)
        )
    return _rope.qk_norm_rope(
        q, k, q_weight, k_weight, eps, cos, sin, unit_offset=unit_offset, decode_heads=decode_heads
    )


def qk_norm_whole_rope(
    q, k, q_weight, k_weight, eps, cos, sin, round_once: bool = True
) -> tuple[Tensor, Tensor]:
    """OLMo's whole-projection q/k RMSNorm + per-head view + transpose + RoPE, one launch."""
    if _use_op(q):
        return qk_norm_whole_rope_op(
            q, k, q_weight, k_weight, float(eps), cos, sin, bool(round_once)
        )
    return _qk_whole.qk_norm_whole_rope(
        q, k, q_weight, k_weight, eps, cos, sin, round_once=round_once
    )


def silu_and_mul(gate: Tensor, up: Tensor | None = None) -> Tensor:
    if _use_op(gate):
        return silu_and_mul_op(gate, up)
    return _silu.silu_and_mul(gate, up)


def gelu_tanh_and_mul(gate: Tensor, up: Tensor | None = None) -> Tensor:
    if _use_op(gate):
        return gelu_tanh_and_mul_op(gate, up)
    return _gelu.gelu_tanh_and_mul(gate, up)


def sigmoid_gate(x: Tensor, gate: Tensor) -> Tensor:
    """``x * sigmoid(gate)``: ``x`` ``[..., H * D]``, ``gate`` ``[..., H, D]`` (strided views
    of the q projection's gate halves; ``ops/sigmoid_gate.py``: Qwen3.5's output gate)."""
    if _use_op(x):
        return sigmoid_gate_op(x, gate)
    return _sigmoid_gate.sigmoid_gate(x, gate)


def sigmoid_gate_add(residual: Tensor, x: Tensor, gate: Tensor) -> Tensor:
    """``residual + x * sigmoid(gate)``, ``gate`` one logit a row (Qwen3-Next's shared expert)."""
    if _use_op(x):
        return sigmoid_gate_add_op(residual, x, gate)
    return _sigmoid_gate.sigmoid_gate_add(residual, x, gate)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    if _use_op(x):
        return linear_op(x, weight, bias)
    return _gemm.linear(x, weight, bias)


def rms_norm_linear(
    x: Tensor,
    norm_weight: Tensor,
    eps: float,
    weight: Tensor,
    bias: Tensor | None = None,
    unit_offset: bool = False,
) -> Tensor:
    """``linear(RMSNorm(x), weight, bias)``; one launch at decode (``gemm.rms_norm_linear``)."""
    if _use_op(x):
        return rms_norm_linear_op(x, norm_weight, float(eps), weight, bias, bool(unit_offset))
    return _gemm.rms_norm_linear(x, norm_weight, eps, weight, bias, unit_offset=unit_offset)


def rms_norm_linear_rope(
    x: Tensor,
    norm_weight: Tensor | None,
    eps: float,
    weight: Tensor,
    bias: Tensor | None,
    cos: Tensor,
    sin: Tensor,
    rotated_heads: int,
    unit_offset: bool = False,
    head_norms=None,
    cache=None,
) -> Tensor:
    """``linear(RMSNorm(x), weight, bias)`` (without ``norm_weight``: ``linear(x, ...)``) with
    RoPE on the first ``rotated_heads`` heads of the packed [q; k; v] output, each RMS-normed
    first with ``head_norms`` (a ``gemm.HeadNorms``, per head or whole-projection), and with
    ``cache`` (a ``gemm.CacheWrite``) the new keys and values written into a static KV cache:
    one launch (``gemm.rms_norm_linear_rope``; for decode)."""
    args = (x, norm_weight, float(eps), weight, bias, cos, sin, int(rotated_heads))
    if not _use_op(x):
        return _gemm.rms_norm_linear_rope(
            *args, unit_offset=unit_offset, head_norms=head_norms, cache=cache
        )
    h = head_norms
    form = () if h is None else (bool(h.unit_offset), bool(h.whole), bool(h.round_once))
    if cache is not None:
        heads = () if h is None else (h.q_weight, h.k_weight, float(h.eps), *form)
        c = cache
        where = (c.keys, c.values, c.position, c.length, int(c.q_heads), bool(unit_offset))
        return rms_norm_linear_rope_cache_op(*args, *where, *heads)
    heads = ()
    if h is not None:
        heads = (h.q_weight, h.k_weight, float(h.eps), int(h.q_heads), *form)
    return rms_norm_linear_rope_op(*args, bool(unit_offset), *heads)


def rms_norm_gate_up(
    x: Tensor,
    norm_weight: Tensor,
    eps: float,
    gate_up_weight: Tensor,
    gelu_tanh: bool = False,
    unit_offset: bool = False,
) -> Tensor:
    """``act(RMSNorm(x) @ Wg^T) * (RMSNorm(x) @ Wu^T)`` (SiLU, or GELU-tanh); one launch at
    decode (``gemm.rms_norm_gate_up``)."""
    if _use_op(x):
        return rms_norm_gate_up_op(
            x, norm_weight, float(eps), gate_up_weight, bool(gelu_tanh), bool(unit_offset)
        )
    return _norm_gate_up(x, norm_weight, eps, gate_up_weight, gelu_tanh, unit_offset)


def linear_residual(x: Tensor, weight: Tensor, residual: Tensor) -> Tensor:
    if _use_op(x):
        return linear_residual_op(x, weight, residual)
    return _gemm.linear_residual(x, weight, residual)


def fused_gate_up_silu(x: Tensor, gate_up_weight: Tensor) -> Tensor:
    if _use_op(x):
        return fused_gate_up_silu_op(x, gate_up_weight)
    return _gemm.fused_gate_up_silu(x, gate_up_weight)


def fused_gate_up_gelu_tanh(x: Tensor, gate_up_weight: Tensor) -> Tensor:
    if _use_op(x):
        return fused_gate_up_gelu_tanh_op(x, gate_up_weight)
    return _gemm.fused_gate_up_gelu_tanh(x, gate_up_weight)


def _scale(q: Tensor, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def prefill_attention(q, k, v, *, scale=None, causal=True, q_start=0, window=None, key_valid=None):
    if _use_op(q):
        return prefill_attention_op(
            q, k, v, _scale(q, scale), bool(causal), int(q_start), window, key_valid
        )
    return _attention.prefill_attention(
        q, k, v, scale=scale, causal=causal, q_start=q_start, window=window, key_valid=key_valid
    )


def decode_attention(
    q, k, v, *, scale=None, kv_end=None, position=None, window=None, key_valid=None
):
    """One new token per sequence; keys ``[0, kv_end)`` or ``[0, position[0]]`` (a device
    tensor: the same call, compiled once, serves every decode step)."""
    if _use_op(q):
        end = k.shape[2] if kv_end is None else int(kv_end)
        return decode_attention_op(q, k, v, _scale(q, scale), end, position, window, key_valid)
    return _attention.decode_attention(
        q,
        k,
        v,
        scale=scale,
        kv_end=kv_end,
        position=position,
        window=window,
        key_valid=key_valid,
    )


def kv_cache_write_at(k_new, v_new, k_cache, v_cache, position, length) -> None:
    if _use_op(k_new):
        kv_cache_write_at_op(k_new, v_new, k_cache, v_cache, position, length)
        return
    _kv_cache.kv_cache_write_at(k_new, v_new, k_cache, v_cache, position, length)


def kv_cache_ring_write(k_new, v_new, k_cache, v_cache, position, length) -> None:
    if _use_op(k_new):
        kv_cache_ring_write_op(k_new, v_new, k_cache, v_cache, position, length)
        return
    _kv_cache.kv_cache_ring_write(k_new, v_new, k_cache, v_cache, position, length)


def moe_route(router_logits: Tensor, top_k: int, normalize: bool) -> tuple[Tensor, Tensor]:
    """(weights [T, top_k] in the logits dtype, int32 expert ids [T, top_k]), best first."""
    if _use_op(router_logits):
        return moe_route_op(router_logits, int(top_k), bool(normalize))
    return _moe.moe_route(router_logits, int(top_k), bool(normalize))


def moe_experts(
    hidden: Tensor,
    ids: Tensor,
    weights: Tensor,
    gate_up: Tensor,
    down: Tensor,
    residual: Tensor | None = None,
) -> Tensor:
    """``(residual +) sum_j weights[:, j] * expert_{ids[:, j]}(hidden)`` for hidden [T, H]."""
    if _use_op(hidden):
        return moe_experts_op(hidden, ids, weights, gate_up, down, residual)
    return _moe.moe_experts(hidden, ids, weights, gate_up, down, residual)


def gated_delta_chunk(q, k, v, a, b, A_log, dt_bias, initial_state=None):
    """Chunked gated delta rule from the raw gate projections: ``(out, final fp32 state)``."""
    if _use_op(v):
        return gated_delta_chunk_op(q, k, v, a, b, A_log, dt_bias, initial_state)
    return _gdn.gated_delta_chunk(q, k, v, a, b, A_log, dt_bias, initial_state)


def gated_delta_recurrent(q, k, v, a, b, A_log, dt_bias, state):
    """Recurrent gated delta rule; ``state`` ``[B, Hv, Dk, Dv]`` is updated in place."""
    if _use_op(v):
        return gated_delta_recurrent_op(q, k, v, a, b, A_log, dt_bias, state)
    return _gdn.gated_delta_recurrent(q, k, v, a, b, A_log, dt_bias, state)


def causal_conv1d(x, weight, bias=None, state_in=None, state_len=4):
    """Causal conv1d + SiLU over ``[B, T, C]``: ``(out, the last state_len inputs [B, C, S])``."""
    if _use_op(x):
        return causal_conv1d_op(x, weight, bias, state_in, int(state_len))
    state = x.new_empty((x.shape[0], x.shape[2], int(state_len)))
    return _conv.causal_conv1d(x, weight, bias, state_in, state), state


def causal_conv1d_update(x, conv_state, weight, bias=None):
    """Decode conv against ``conv_state`` ``[B, C, S]``, shifted in place."""
    if _use_op(x):
        return causal_conv1d_update_op(x, conv_state, weight, bias)
    return _conv.causal_conv1d_update(x, conv_state, weight, bias)


def rms_norm_gated(x: Tensor, z: Tensor, weight: Tensor, eps: float) -> Tensor:
    if _use_op(x):
        return rms_norm_gated_op(x, z, weight, float(eps))
    return _rms_norm_gated.rms_norm_gated(x, z, weight, eps)


# ---------------------------------------------------------------------------------------------
# gpt-oss: attention with sinks, experts with biases and the clamped activation (custom ops and
# what the glue calls, in one block)
# ---------------------------------------------------------------------------------------------


@_op("prefill_attention_sinks")
def prefill_attention_sinks_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    sinks: Tensor,
    scale: float,
    causal: bool,
    q_start: int,
    window: int | None,
    key_valid: Tensor | None,
) -> Tensor:
    with private_buffers():
        return _sinks.prefill_attention_sinks(
            q,
            k,
            v,
            sinks,
            scale=scale,
            causal=causal,
            q_start=q_start,
            window=window,
            key_valid=key_valid,
        )


@prefill_attention_sinks_op.register_kernel("cpu")
def _(q, k, v, sinks, scale, causal, q_start, window, key_valid):
    b, _, sq, _ = q.shape
    mask = _attention.reference_mask(
        b, sq, k.shape[2], causal=causal, q_start=q_start, window=window, key_valid=key_valid
    )
    return _sinks.reference_attention_sinks(q, k, v, mask, sinks, scale).to(q.dtype).contiguous()


@prefill_attention_sinks_op.register_fake
def _(q, k, v, sinks, scale, causal, q_start, window, key_valid):
    b, hq, sq, d = q.shape
    return q.new_empty((b, sq, hq, d))


@_op("decode_attention_sinks")
def decode_attention_sinks_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    sinks: Tensor,
    scale: float,
    kv_end: int,
    position: Tensor | None,
    window: int | None,
    key_valid: Tensor | None,
) -> Tensor:
    with private_buffers():
        span = {"position": position} if position is not None else {"kv_end": kv_end}
        return _sinks.decode_attention_sinks(
            q, k, v, sinks, scale=scale, window=window, key_valid=key_valid, **span
        )


@decode_attention_sinks_op.register_kernel("cpu")
def _(q, k, v, sinks, scale, kv_end, position, window, key_valid):
    last = min(int(position[0]), k.shape[2] - 1) if position is not None else kv_end - 1
    mask = _attention.reference_mask(
        q.shape[0], 1, k.shape[2], q_start=last, window=window, key_valid=key_valid
    )
    return _sinks.reference_attention_sinks(q, k, v, mask, sinks, scale).to(q.dtype).contiguous()


@decode_attention_sinks_op.register_fake
def _(q, k, v, sinks, scale, kv_end, position, window, key_valid):
    b, hq, _, d = q.shape
    return q.new_empty((b, 1, hq, d))


@_op("moe_experts_bias")
def moe_experts_bias_op(
    hidden: Tensor,
    ids: Tensor,
    weights: Tensor,
    gate_up: Tensor,
    gate_up_bias: Tensor,
    down: Tensor,
    down_bias: Tensor,
    residual: Tensor | None,
    alpha: float,
    limit: float,
    act: int,
) -> Tensor:
    with private_buffers():
        return _moe_bias.moe_experts_bias(
            hidden,
            ids,
            weights,
            gate_up,
            gate_up_bias,
            down,
            down_bias,
            residual,
            alpha=alpha,
            limit=limit,
            act=act,
        )


@moe_experts_bias_op.register_kernel("cpu")
def _(hidden, ids, weights, gate_up, gate_up_bias, down, down_bias, residual, alpha, limit, act):
    out = _moe_bias.moe_experts_bias_reference(
        hidden,
        ids,
        weights,
        gate_up,
        gate_up_bias,
        down,
        down_bias,
        residual,
        alpha=alpha,
        limit=limit,
        act=act,
    )
    return out.to(hidden.dtype)


@moe_experts_bias_op.register_fake
def _(hidden, ids, weights, gate_up, gate_up_bias, down, down_bias, residual, alpha, limit, act):
    return hidden.new_empty(hidden.shape)


def prefill_attention_sinks(
    q, k, v, sinks, *, scale=None, causal=True, q_start=0, window=None, key_valid=None
):
    """``prefill_attention`` with per-head sinks ``[Hq]`` in the softmax (gpt-oss)."""
    if _use_op(q):
        return prefill_attention_sinks_op(
            q, k, v, sinks, _scale(q, scale), bool(causal), int(q_start), window, key_valid
        )
    return _sinks.prefill_attention_sinks(
        q,
        k,
        v,
        sinks,
        scale=scale,
        causal=causal,
        q_start=q_start,
        window=window,
        key_valid=key_valid,
    )


def decode_attention_sinks(
    q, k, v, sinks, *, scale=None, kv_end=None, position=None, window=None, key_valid=None
):
    """``decode_attention`` with per-head sinks ``[Hq]`` in the softmax (gpt-oss)."""
    if _use_op(q):
        end = k.shape[2] if kv_end is None else int(kv_end)
        return decode_attention_sinks_op(
            q, k, v, sinks, _scale(q, scale), end, position, window, key_valid
        )
    return _sinks.decode_attention_sinks(
        q,
        k,
        v,
        sinks,
        scale=scale,
        kv_end=kv_end,
        position=position,
        window=window,
        key_valid=key_valid,
    )


def moe_experts_bias(
    hidden,
    ids,
    weights,
    gate_up,
    gate_up_bias,
    down,
    down_bias,
    residual=None,
    *,
    alpha: float,
    limit: float,
    act: int = _moe_bias.ACT_CLAMPED,
) -> Tensor:
    """Biased experts gated by ``act`` (``tilegym.ops.moe_bias``), summed with the residual."""
    if _use_op(hidden):
        return moe_experts_bias_op(
            hidden,
            ids,
            weights,
            gate_up,
            gate_up_bias,
            down,
            down_bias,
            residual,
            float(alpha),
            float(limit),
            int(act),
        )
    return _moe_bias.moe_experts_bias(
        hidden,
        ids,
        weights,
        gate_up,
        gate_up_bias,
        down,
        down_bias,
        residual,
        alpha=alpha,
        limit=limit,
        act=act,
    )


# ---------------------------------------------------------------------------------------------
# DeepSeek V2/V3: multi-head latent attention decode over the latent cache
# ---------------------------------------------------------------------------------------------


@_op("mla_decode")
def mla_decode_op(
    q_latent: Tensor,
    q_pe: Tensor,
    ckv: Tensor,
    kpe: Tensor,
    scale: float,
    kv_end: int,
    position: Tensor | None,
    key_valid: Tensor | None,
) -> Tensor:
    with private_buffers():
        span = {"position": position} if position is not None else {"kv_end": kv_end}
        return _mla.mla_decode(q_latent, q_pe, ckv, kpe, scale=scale, key_valid=key_valid, **span)


@mla_decode_op.register_kernel("cpu")
def _(q_latent, q_pe, ckv, kpe, scale, kv_end, position, key_valid):
    b, t = ckv.shape[0], ckv.shape[2]
    span = {"position": position} if position is not None else {"kv_end": kv_end}
    vis = _mla.visible_keys(b, t, key_valid=key_valid, device=ckv.device, **span)
    ref = _mla.reference_mla_decode(q_latent, q_pe, ckv, kpe, vis, scale)
    return ref.to(q_latent.dtype).contiguous()


@mla_decode_op.register_fake
def _(q_latent, q_pe, ckv, kpe, scale, kv_end, position, key_valid):
    return q_latent.new_empty(q_latent.shape)


def mla_decode(q_latent, q_pe, ckv, kpe, *, scale, kv_end=None, position=None, key_valid=None):
    """Latent context ``[B, H, L]`` of one new token over the latent cache (``ops/mla.py``)."""
    if _use_op(q_latent):
        end = ckv.shape[2] if kv_end is None else int(kv_end)
        return mla_decode_op(q_latent, q_pe, ckv, kpe, float(scale), end, position, key_valid)
    return _mla.mla_decode(
        q_latent, q_pe, ckv, kpe, scale=scale, kv_end=kv_end, position=position, key_valid=key_valid
    )


@_op("mla_prefill")
def mla_prefill_op(
    q_nope: Tensor,
    q_pe: Tensor,
    k_nope: Tensor,
    k_pe: Tensor,
    v: Tensor,
    scale: float,
    q_start: int,
    key_valid: Tensor | None,
) -> Tensor:
    with private_buffers():
        return _mla.mla_prefill(
            q_nope, q_pe, k_nope, k_pe, v, scale=scale, q_start=q_start, key_valid=key_valid
        )


@mla_prefill_op.register_kernel("cpu")
def _(q_nope, q_pe, k_nope, k_pe, v, scale, q_start, key_valid):
    b, _, s, _ = q_nope.shape
    mask = _attention.reference_mask(b, s, k_nope.shape[2], q_start=q_start, key_valid=key_valid)
    ref = _mla.reference_mla_prefill(q_nope, q_pe, k_nope, k_pe, v, mask, scale)
    return ref.to(q_nope.dtype).contiguous()


@mla_prefill_op.register_fake
def _(q_nope, q_pe, k_nope, k_pe, v, scale, q_start, key_valid):
    b, h, s, _ = q_nope.shape
    return q_nope.new_empty((b, s, h, v.shape[3]))


def mla_prefill(q_nope, q_pe, k_nope, k_pe, v, *, scale, q_start=None, key_valid=None):
    """Causal MLA attention of new tokens over expanded keys/values (``ops/mla.py``)."""
    q_start = k_nope.shape[2] - q_nope.shape[2] if q_start is None else int(q_start)
    if _use_op(q_nope):
        return mla_prefill_op(q_nope, q_pe, k_nope, k_pe, v, float(scale), q_start, key_valid)
    return _mla.mla_prefill(
        q_nope, q_pe, k_nope, k_pe, v, scale=scale, q_start=q_start, key_valid=key_valid
    )


# ---------------------------------------------------------------------------------------------
# DeepSeek V2/V3: the absorbed decode's per-head products, the router's fp32 linear (and V2's
# greedy routing fused after it), the two-width latent cache write
# ---------------------------------------------------------------------------------------------


@_op("mla_absorb_query")
def mla_absorb_query_op(q_nope: Tensor, w_uk: Tensor) -> Tensor:
    return _mla_absorb.absorb_query(q_nope, w_uk)


@mla_absorb_query_op.register_kernel("cpu")
def _(q_nope, w_uk):
    return _mla.absorb_query(q_nope, w_uk).contiguous()


@mla_absorb_query_op.register_fake
def _(q_nope, w_uk):
    return q_nope.new_empty((q_nope.shape[0], q_nope.shape[1], w_uk.shape[2]))


def mla_absorb_query(q_nope: Tensor, w_uk: Tensor) -> Tensor:
    """``q_nope`` ``[B, H, N]`` through ``W_UK`` ``[H, N, L]``: ``[B, H, L]``
    (``ops/mla_absorb.py``; on the CPU the ``bmm`` of ``ops/mla.py``)."""
    if _use_op(q_nope):
        return mla_absorb_query_op(q_nope, w_uk)
    return _mla_absorb.absorb_query(q_nope, w_uk)


@_op("mla_latent_to_heads")
def mla_latent_to_heads_op(ctx: Tensor, w_uv: Tensor) -> Tensor:
    return _mla_absorb.latent_to_heads(ctx, w_uv)


@mla_latent_to_heads_op.register_kernel("cpu")
def _(ctx, w_uv):
    return _mla.latent_to_heads(ctx, w_uv).contiguous()


@mla_latent_to_heads_op.register_fake
def _(ctx, w_uv):
    return ctx.new_empty((ctx.shape[0], ctx.shape[1], w_uv.shape[1]))


def mla_latent_to_heads(ctx: Tensor, w_uv: Tensor) -> Tensor:
    """``ctx`` ``[B, H, L]`` through ``W_UV`` ``[H, V, L]``: contiguous ``[B, H, V]``."""
    if _use_op(ctx):
        return mla_latent_to_heads_op(ctx, w_uv)
    return _mla_absorb.latent_to_heads(ctx, w_uv)


@_op("router_logits")
def router_logits_op(x: Tensor, weight: Tensor) -> Tensor:
    with private_buffers():
        return _router.router_logits(x, weight)


@router_logits_op.register_kernel("cpu")
def _(x, weight):
    return _router.reference_router_logits(x, weight).float().contiguous()


@router_logits_op.register_fake
def _(x, weight):
    return x.new_empty((x.shape[0], weight.shape[0]), dtype=torch.float32)


def router_logits(x: Tensor, weight: Tensor) -> Tensor:
    """fp32 router logits ``[T, E]`` of ``x`` ``[T, H]`` and ``weight`` ``[E, H]``, as
    ``F.linear(x.float(), weight.float())`` (``ops/router_linear.py``: bf16/fp16 on CUDA)."""
    if _use_op(x):
        return router_logits_op(x, weight)
    return _router.router_logits(x, weight)


@_op("router_greedy")
def router_greedy_op(
    x: Tensor, weight: Tensor, top_k: int, scaling: float
) -> tuple[Tensor, Tensor]:
    with private_buffers():
        return _router.router_greedy(x, weight, top_k, scaling)


@router_greedy_op.register_kernel("cpu")
def _(x, weight, top_k, scaling):
    weights, ids = _router.reference_router_greedy(x, weight, top_k, scaling)
    return weights.contiguous(), ids.contiguous()


@router_greedy_op.register_fake
def _(x, weight, top_k, scaling):
    shape = (x.shape[0], top_k)
    return x.new_empty(shape, dtype=torch.float32), x.new_empty(shape, dtype=torch.int32)


def router_greedy(x: Tensor, weight: Tensor, top_k: int, scaling: float) -> tuple[Tensor, Tensor]:
    """(fp32 weights ``[T, top_k]``, int32 ids ``[T, top_k]``) of DeepSeek-V2's greedy router:
    its fp32 logits, their softmax's ``top_k`` largest, times ``scaling``."""
    if _use_op(x):
        return router_greedy_op(x, weight, int(top_k), float(scaling))
    return _router.router_greedy(x, weight, int(top_k), float(scaling))


@_op("latent_cache_write_at", mutates_args=("k_cache", "v_cache", "length"))
def latent_cache_write_at_op(
    k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor, position: Tensor, length: Tensor
) -> None:
    _latent_cache.latent_cache_write_at(k_new, v_new, k_cache, v_cache, position, length)


@latent_cache_write_at_op.register_kernel("cpu")
def _(k_new, v_new, k_cache, v_cache, position, length):
    _latent_cache.reference_latent_cache_write_at(k_new, v_new, k_cache, v_cache, position, length)


@latent_cache_write_at_op.register_fake
def _(k_new, v_new, k_cache, v_cache, position, length):
    return None


def latent_cache_write_at(k_new, v_new, k_cache, v_cache, position, length) -> None:
    """The static-cache write at a device position with a key and a value width each
    (``ops/latent_cache.py``: MLA's latent and rope key)."""
    if _use_op(k_new):
        latent_cache_write_at_op(k_new, v_new, k_cache, v_cache, position, length)
        return
    _latent_cache.latent_cache_write_at(k_new, v_new, k_cache, v_cache, position, length)


@_op("rotary_tables")
def rotary_tables_op(
    position_ids: Tensor, inv_freq: Tensor, scaling: float, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    return _rotary.rotary_tables(position_ids, inv_freq, scaling, dtype)


@rotary_tables_op.register_kernel("cpu")
def _(position_ids, inv_freq, scaling, dtype):
    cos, sin = _rotary.reference_rotary_tables(position_ids, inv_freq, scaling, dtype)
    return cos.contiguous(), sin.contiguous()


@rotary_tables_op.register_fake
def _(position_ids, inv_freq, scaling, dtype):
    shape = (*position_ids.shape, 2 * inv_freq.shape[0])
    return position_ids.new_empty(shape, dtype=dtype), position_ids.new_empty(shape, dtype=dtype)


def rotary_tables(
    position_ids: Tensor, inv_freq: Tensor, scaling: float, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """The half-split ``(cos, sin)`` ``[B, S, R]`` of an interleaved (complex) rotary
    embedding's table, in ``dtype`` (``ops/rotary_tables.py``: DeepSeek-V2)."""
    if _use_op(position_ids):
        return rotary_tables_op(position_ids, inv_freq, float(scaling), dtype)
    return _rotary.rotary_tables(position_ids, inv_freq, scaling, dtype)
