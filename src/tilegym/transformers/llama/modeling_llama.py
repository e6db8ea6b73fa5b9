"""cuTile forwards for Llama-style decoder layers, shared by every family that has one.

A family (Llama, Qwen3, Mistral, Qwen2, Phi-3) is a ``Family``: where its upstream classes
live and how it differs from Llama (q/k norms, packed projections, the activation's name,
where its norms sit and their form: Gemma 3's (1 + weight) norms around each sub-block).
Each family's ``modeling_<key>.py`` holds only its ``FAMILY``; the forwards below read it.

Each ``make_*`` builds a plain function with the upstream module's ``forward`` contract, for
binding to one instance (``types.MethodType``) or setting on a class. What a forward routes
through cuTile is fixed when it is built (the ``Routes`` flags), so two models in one process
can be patched differently. The forwards work with the transformers 5.x releases the project
supports: the KV cache argument is ``past_key_values`` up to 5.2x and ``cache`` later, and both
are accepted and handed to ``Cache.update`` the way the installed release does.
"""

from __future__ import annotations

import importlib
import inspect
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

from tilegym.ops.library import (
    add_rms_norm,
    apply_rope,
    gelu_tanh_and_mul,
    kv_cache_ring_write,
    kv_cache_write_at,
    qk_norm_rope,
    rms_norm,
    rms_norm_add,
    rms_norm_add_rms_norm,
    silu_and_mul,
)
from tilegym.transformers.attention import TileMask, device_position


@dataclass(frozen=True)
class Routes:
    """Which parts of a decoder layer run on cuTile kernels."""

    rms_norm: bool = False
    rope: bool = False
    swiglu: bool = False
    linear: bool = False
    act: str = "silu"  # the gated MLP activation's kernels (a value of GATED_ACTS)


QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")
#: activation names of transformers configs -> the gated-MLP kernels that compute them: the
#: elementwise act-and-mul op and the gate-up GEMM with that epilogue (``tilegym.ops.library``)
GATED_ACTS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
_ACT_KERNELS = {
    "silu": (silu_and_mul, "fused_gate_up_silu"),
    "gelu_tanh": (gelu_tanh_and_mul, "fused_gate_up_gelu_tanh"),
}


def config_activation(config) -> str | None:
    """The MLP activation a config names (``hidden_act``; Gemma's ``hidden_activation``)."""
    return getattr(config, "hidden_act", None) or getattr(config, "hidden_activation", None)


def norm_eps(norm: torch.nn.Module) -> float:
    """An RMSNorm module's epsilon (``variance_epsilon``; Gemma's ``eps``)."""
    eps = getattr(norm, "variance_epsilon", None)
    return norm.eps if eps is None else eps


@dataclass(frozen=True)
class Family:
    """What one Llama-style decoder family has, as the shared forwards need it."""

    upstream_module: str  # e.g. "transformers.models.llama.modeling_llama"
    class_prefix: str  # upstream classes are <prefix>RMSNorm, MLP, Attention, DecoderLayer
    qk_norm: bool = False  # per-head RMSNorm on q and k before RoPE (Qwen3)
    qkv: tuple[str, ...] = QKV  # the q, k, v projections, or one packed [q; k; v] (Phi-3)
    gate_up: tuple[str, ...] = GATE_UP  # the gate and up projections, or one packed [gate; up]
    act: str = "act_fn"  # the MLP's activation attribute (Phi-3: activation_fn)
    config_window: bool = False  # attention gets config.sliding_window (Mistral, Phi-3), not
    # the module's own sliding_window attribute (Qwen2, Qwen3), as the upstream forward does
    qk_norm_whole: bool = False  # the q/k RMSNorm spans the whole projection (OLMo 2)
    post_norm: bool = False  # norms after attention and after the MLP, none before (OLMo 2)
    norm_unit_offset: bool = False  # every RMSNorm scales by (1 + weight) in fp32 and rounds
    # once, to its input's dtype (Gemma 3: Gemma3RMSNorm)
    sandwich_norm: bool = False  # norms before and after attention and the MLP (Gemma 3)
    gated_act: str = "silu"  # the MLP activation's kernels for class-level patches (a value of
    # GATED_ACTS); an instance is patched by its config's activation
    moe_block: str | None = None  # class suffix of the sparse MLP block (Qwen3-MoE:
    # "SparseMoeBlock"), patched by tilegym.transformers.moe_block; None: every MLP is dense
    forwards: Mapping[str, Callable] = field(default_factory=dict, compare=False)
    # the family's own forward builders by upstream class suffix ("RMSNorm", "MLP",
    # "Attention", "DecoderLayer", "MoeBlock"), each with the shared builder's signature: how an
    # experiment wires a new kernel into one family without touching the shared glue


FAMILY = Family("transformers.models.llama.modeling_llama", "Llama")


class FusedWeights:
    """Concatenated projection weights (QKV, gate+up) built once per module, freed on undo.

    Kept on the module as a plain attribute (``_tilegym_fused_<names>``), which ``torch.compile``
    reads like any module attribute, and marked as a static address so that a CUDA graph uses
    the weight in place instead of copying it in before every replay."""

    def __init__(self) -> None:
        self._owners: list[tuple[weakref.ref, str]] = []

    def get(self, module: torch.nn.Module, names: tuple[str, ...]) -> tuple[torch.Tensor, ...]:
        """(weight, bias) of the projections ``names`` as one; a packed projection's own."""
        if len(names) == 1:
            proj = getattr(module, names[0])
            return proj.weight, proj.bias
        attr = "_tilegym_fused_" + "_".join(names)
        cached = getattr(module, attr, None)
        if cached is None:
            projs = [getattr(module, n) for n in names]
            weight = torch.cat([p.weight.detach() for p in projs], dim=0)
            biases = [p.bias for p in projs]
            bias = None
            if any(b is not None for b in biases):
                bias = torch.cat(
                    [
                        b.detach() if b is not None else weight.new_zeros(p.out_features)
                        for b, p in zip(biases, projs, strict=True)
                    ]
                )
            for t in (weight, bias):
                if t is not None:
                    torch._dynamo.mark_static_address(t)
            cached = (weight, bias)
            setattr(module, attr, cached)
            self._owners.append((weakref.ref(module), attr))
        return cached

    def build(self, module: torch.nn.Module, names: tuple[str, ...]) -> None:
        self.get(module, names)

    def __len__(self) -> int:
        """How many repacked weights this holds (each on its module)."""
        return len(self._owners)

    def clear(self) -> None:
        for ref, attr in self._owners:
            module = ref()
            if module is not None:
                module.__dict__.pop(attr, None)
        self._owners = []


def cache_update_takes_kwargs(attention_cls: type) -> bool:
    """True when the installed release passes ``kwargs=`` to ``cache.update`` (``cache`` arg)."""
    params = inspect.signature(inspect.unwrap(attention_cls.forward)).parameters
    return "cache" in params


def make_rms_norm_forward(family: Family = FAMILY) -> Callable:
    """``XRMSNorm.forward`` on the cuTile RMSNorm kernel (the family's form of the norm)."""
    offset = family.norm_unit_offset

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, norm_eps(self), offset)

    return forward


def unbiased(module: torch.nn.Module, names: tuple[str, ...]) -> bool:
    """True when none of the projections ``names`` of ``module`` has a bias."""
    return all(getattr(module, n).bias is None for n in names)


def make_mlp_forward(
    routes: Routes, fused: FusedWeights, gemm, family: Family = FAMILY
) -> Callable:
    """``XMLP.forward``: gate/up (fused GEMM + activation-and-mul epilogue, or the act-and-mul
    kernel: SiLU, or GELU-tanh by ``routes.act``), down(+residual)."""
    names = family.gate_up
    act_and_mul, gated_gemm = _ACT_KERNELS[routes.act]

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if routes.linear and unbiased(self, names):
            w, _ = fused.get(self, names)
            if routes.swiglu:
                act = getattr(gemm, gated_gemm)(x, w)
            else:
                gate, up = gemm.linear(x, w).chunk(2, dim=-1)
                act = getattr(self, family.act)(gate) * up
        else:
            gate, up = _gate_up(self, x, names)
            act = act_and_mul(gate, up) if routes.swiglu else getattr(self, family.act)(gate) * up
        if routes.linear and self.down_proj.bias is None:
            if residual is not None:
                return gemm.linear_residual(act, self.down_proj.weight, residual)
            return gemm.linear(act, self.down_proj.weight)
        out = self.down_proj(act)
        return out if residual is None else residual + out

    return forward


def _gate_up(mlp, x, names):
    if len(names) == 1:
        return getattr(mlp, names[0])(x).chunk(2, dim=-1)
    return getattr(mlp, names[0])(x), getattr(mlp, names[1])(x)


def make_attention_forward(
    routes: Routes,
    fused: FusedWeights,
    gemm,
    eager_fn: Callable,
    all_attention,
    takes_kwargs,
    family: Family = FAMILY,
) -> Callable:
    """``XAttention.forward``: fused QKV GEMM, (q/k norm +) RoPE kernel, o_proj(+residual)."""
    names = family.qkv
    torch_rope = upstream_rope(family)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        cache=None,
        residual: torch.Tensor | None = None,
        **kwargs,
    ):
        cache = cache if cache is not None else past_key_values
        input_shape = hidden_states.shape[:-1]
        bsz, seq = input_shape
        d = self.head_dim
        hq, hk = self.config.num_attention_heads, self.config.num_key_value_heads
        qkv = None
        if routes.linear:
            w, b = fused.get(self, names)
            qkv = gemm.linear(hidden_states, w, b)
        elif len(names) == 1:
            qkv = getattr(self, names[0])(hidden_states)
        if qkv is not None:
            q = qkv[..., : hq * d].view(bsz, seq, hq, d)
            k = qkv[..., hq * d : (hq + hk) * d].view(bsz, seq, hk, d)
            v = qkv[..., (hq + hk) * d :].view(bsz, seq, hk, d)
        else:
            q, k, v = (getattr(self, n)(hidden_states) for n in names)
            q, k, v = q.view(bsz, seq, hq, d), k.view(bsz, seq, hk, d), v.view(bsz, seq, hk, d)
        cos, sin = position_embeddings
        per_head = family.qk_norm and not family.qk_norm_whole
        if family.qk_norm and family.qk_norm_whole:
            q = self.q_norm(q.reshape(bsz, seq, hq * d)).view(bsz, seq, hq, d)
            k = self.k_norm(k.reshape(bsz, seq, hk * d)).view(bsz, seq, hk, d)
        if per_head and routes.rope and routes.rms_norm:
            qw, kw, eps = self.q_norm.weight, self.k_norm.weight, norm_eps(self.q_norm)
            q, k = qk_norm_rope(q, k, qw, kw, eps, cos, sin, family.norm_unit_offset)
        else:
            if per_head:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            if routes.rope:
                q, k = apply_rope(q, k, cos, sin)
            else:
                q, k = torch_rope(q, k, cos, sin)
        v = v.transpose(1, 2)
        if cache is not None:
            k, v = _update_cache(cache, self.layer_idx, k, v, attention_mask, takes_kwargs, kwargs)
        attention_interface = all_attention.get_interface(
            self.config._attn_implementation, eager_fn
        )
        extra = {}
        if family.config_window:
            extra["sliding_window"] = getattr(self.config, "sliding_window", None)
        elif hasattr(self, "sliding_window"):
            extra["sliding_window"] = self.sliding_window
        attn_output, attn_weights = attention_interface(
            self,
            q,
            k,
            v,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **extra,
            **kwargs,
        )
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        if routes.linear and self.o_proj.bias is None:
            if residual is not None:
                return gemm.linear_residual(attn_output, self.o_proj.weight, residual), attn_weights
            return gemm.linear(attn_output, self.o_proj.weight), attn_weights
        out = self.o_proj(attn_output)
        return (out if residual is None else residual + out), attn_weights

    return forward


def _update_cache(cache, layer_idx, k, v, mask, takes_kwargs, kwargs):
    """Write the new keys/values into the cache and return what attention reads.

    A transformers ``StaticLayer`` under a tilegym mask with a device position (a static cache)
    is written by one cuTile launch at that position, which also advances the layer's length:
    no host value changes from one decode step to the next, so one compiled CUDA graph serves
    them all. A ``StaticSlidingWindowLayer`` under a tilegym mask is a ring buffer
    (``_update_sliding``). Any other cache goes through its own ``update``."""
    position = device_position(mask)
    layers = getattr(cache, "layers", None)
    layer = layers[layer_idx] if layers is not None else None
    if position is not None and type(layer) is StaticLayer:
        if not layer.is_initialized:
            layer.lazy_initialization(k, v)
        kv_cache_write_at(k, v, layer.keys, layer.values, position, layer.cumulative_length)
        return layer.keys, layer.values
    if isinstance(mask, TileMask) and type(layer) is StaticSlidingWindowLayer:
        return _update_sliding(
            layer, position, k, v, lambda: _update(cache, layer_idx, k, v, takes_kwargs, kwargs)
        )
    return _update(cache, layer_idx, k, v, takes_kwargs, kwargs)


def _update(cache, layer_idx, k, v, takes_kwargs=False, kwargs=None):
    if takes_kwargs:
        return cache.update(k, v, layer_idx, kwargs=kwargs)
    return cache.update(k, v, layer_idx)


def _update_sliding(layer, position, k, v, update: Callable):
    """A static cache's sliding-window layer kept as a ring buffer: slot ``t % window`` holds
    token ``t``.

    transformers' layer, once full, rolls its whole window left by one token per decode step
    (three passes over it, about 8% of gemma-3-1b's GPU time in static mode); here a decode step
    writes one slot (``kv_cache_ring_write`` at the mask's absolute device position, which also
    advances the layer's device length) and counts the token on the host as transformers does.
    Decode attention reads all slots, order-free. Several new tokens (a prefill, a continuation)
    go through transformers' ``update``, which needs the window in order: a full window is
    rotated into order before it and back into ring order after it (eager steps, not the
    compiled decode step)."""
    window = layer.max_cache_len
    if position is not None and k.shape[2] == 1:
        if not layer.is_initialized:
            layer.lazy_initialization(k, v)
        kv_cache_ring_write(k, v, layer.keys, layer.values, position, layer.cumulative_length)
        layer.cumulative_length_int += 1
        return layer.keys, layer.values
    if layer.is_initialized and layer.cumulative_length_int >= window:
        _rotate(layer, -(layer.cumulative_length_int % window))
    out = update()
    if layer.cumulative_length_int >= window:
        _rotate(layer, layer.cumulative_length_int % window)
    return out


def _rotate(layer, shift: int) -> None:
    """Roll a layer's key/value slots by ``shift`` in place (``StaticLayer``'s tensors keep
    their addresses: a compiled step holds them)."""
    if shift:
        layer.keys.copy_(torch.roll(layer.keys, shift, dims=2))
        layer.values.copy_(torch.roll(layer.values, shift, dims=2))


def upstream_rope(family: Family) -> Callable:
    """The family's own ``apply_rotary_pos_emb``, for RoPE left to PyTorch: it runs exactly as
    upstream. OLMo 2's rotary module returns fp32 cos/sin and its function casts the result
    back to q's dtype; a shared rotation without that cast handed the static cache fp32 keys
    (H200 loop, drop-rope round: ``index_copy_(): ... Float and ... BFloat16``)."""
    return importlib.import_module(family.upstream_module).apply_rotary_pos_emb


def make_decoder_layer_forward(routes: Routes, family: Family = FAMILY) -> Callable:
    """``XDecoderLayer.forward``: the attention residual add is folded into the o_proj GEMM
    (``linear``) or into the fused add+RMSNorm kernel (``rms_norm``); the MLP residual add into
    the down_proj GEMM (``linear``), else it stays a PyTorch add: a standalone cuTile add never
    beat PyTorch's on the H200, so the library has none. Post-norm (OLMo 2) and sandwich-norm
    (Gemma 3) families have their own layer forwards below."""
    offset = family.norm_unit_offset

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs,
    ) -> torch.Tensor:
        residual = hidden_states
        normed = self.input_layernorm(hidden_states)
        fold = routes.linear and self.self_attn.o_proj.bias is None
        attn_out, _ = self.self_attn(
            hidden_states=normed,
            attention_mask=attention_mask,
            position_ids=position_ids,
            position_embeddings=position_embeddings,
            residual=residual if fold else None,
            **kwargs,
        )
        norm = self.post_attention_layernorm
        if fold:
            hidden_states = attn_out
            normed = norm(hidden_states)
        elif routes.rms_norm:
            hidden_states, normed = add_rms_norm(
                attn_out, residual, norm.weight, norm_eps(norm), offset
            )
        else:
            hidden_states = residual + attn_out
            normed = norm(hidden_states)
        return self.mlp(normed, residual=hidden_states)

    def post_norm_forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """A post-norm family's layer (OLMo 2): each sub-block's output is normalized, then
        added to the residual (the norms are the patched RMSNorm forwards; the adds stay
        PyTorch's: nothing to fold them into)."""
        attn_out, _ = self.self_attn(
            hidden_states=hidden_states,
            attention_mask=attention_mask,
            position_ids=position_ids,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        hidden_states = hidden_states + self.post_attention_layernorm(attn_out)
        return hidden_states + self.post_feedforward_layernorm(self.mlp(hidden_states))

    def sandwich_forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """A sandwich-norm family's layer (Gemma 3): each sub-block's input and output are
        normalized and the normed output is added to the residual. With ``rms_norm`` the
        attention's output norm, the residual add and the MLP's input norm are one kernel
        (``rms_norm_add_rms_norm``), the MLP's output norm and add another (``rms_norm_add``);
        the add (and a norm of a sum) is rounded like PyTorch's. The position embeddings are
        the ones the upstream model hands this layer (its layer type's RoPE table)."""
        attn_out, _ = self.self_attn(
            hidden_states=self.input_layernorm(hidden_states),
            attention_mask=attention_mask,
            position_ids=position_ids,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        post, pre = self.post_attention_layernorm, self.pre_feedforward_layernorm
        if routes.rms_norm and norm_eps(post) == norm_eps(pre):
            hidden_states, normed = rms_norm_add_rms_norm(
                attn_out, hidden_states, post.weight, pre.weight, norm_eps(post), offset
            )
        else:
            hidden_states = hidden_states + post(attn_out)
            normed = pre(hidden_states)
        mlp_out = self.mlp(normed)
        post = self.post_feedforward_layernorm
        if routes.rms_norm:
            return rms_norm_add(mlp_out, hidden_states, post.weight, norm_eps(post), offset)
        return hidden_states + post(mlp_out)

    if family.sandwich_norm:
        return sandwich_forward
    return post_norm_forward if family.post_norm else forward
