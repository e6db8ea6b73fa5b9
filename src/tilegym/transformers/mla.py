"""The forwards of DeepSeek V2/V3's multi-head latent attention and shared-expert MoE block,
shared by the ``deepseek_v2`` and ``deepseek_v3`` families (each names them in
``Family.forwards``; the rest of their layers is the shared Llama-style glue):

**Multi-head latent attention** (``DeepseekV2Attention``). q comes from ``q_proj`` (V2-Lite) or
the low-rank ``q_a_proj`` -> ``q_a_layernorm`` -> ``q_b_proj``; ``kv_a_proj_with_mqa`` gives the
512-wide latent (normed by ``kv_a_layernorm``) and a 64-wide rope key shared by the heads. With
``linear`` the first projections are one GEMM (``[q_proj; kv_a_proj_with_mqa]``). RoPE is the
interleaved form (V2: a complex table; V3 with ``rope_interleave``: cos/sin on even/odd slices,
its output already split into halves); with ``rope`` and ``linear`` the rope rows of the projection
weights are permuted once at patch time (each head's pairs ``(x0, x1), (x2, x3), ...`` become
``x0, x2, ..., x1, x3, ...``; with ``rope`` alone, on upstream's projections, the rope columns
are gathered so per call), which turns the rotation into the half-split one the shared RoPE
kernel computes (V2's tables: the complex table's real and imaginary parts, repeated; V3's:
its own cos/sin). q and k are permuted alike, so every score is unchanged; V2's cache then holds
the rope key in that permuted order, which only the patched model reads (V3's upstream rotation
already writes it so). V3 without ``rope_interleave`` rotates by halves: nothing is permuted.

With ``rope`` V2's rotary module returns those half-split tables itself, from one kernel per
step (``make_rotary_forward``: ``tilegym.ops.rotary_tables``), so no layer splits the complex
table again.

With ``attn`` (transformers' attention switched to "tilegym": its compact masks) attention runs
on ``tilegym.ops.mla``: the prompt on the prefill kernel over keys and values expanded through
``kv_b_proj`` (as upstream; k = nope 128 + the shared rope 64, v 128), each decode step on the
latent kernel in the absorbed form: ``q_nope`` through ``W_UK`` into the latent space, scores
against the cached latent plus the rope key, the latent context through ``W_UV`` (both per-head
products on ``tilegym.ops.mla_absorb``); the expanded ``T x H x 320`` keys and values are never
built. Without ``attn`` the model's own attention function runs on the expanded keys, as
upstream.

**Cache layout**: the one upstream keeps (transformers 5.17 and 5.24 alike): per layer the
normed latent ``[B, 1, T, 512]`` as the cache's keys and the rotated rope key ``[B, 1, T, 64]``
as its values, 576 values per token and layer (the expanded form: ``H x 320`` = 5120 for
V2-Lite's 16 heads). ``DynamicCache`` and the static cache hold two tensors of different widths
per layer as they are. A static layer under a "tilegym" mask with a device position (the
compiled decode step) is written by one cuTile launch with a width each
(``tilegym.ops.latent_cache``, which also sets the layer's device length); any other cache by
its own ``update``. The decode kernel reads the whole static buffer with its key range from the
mask's device position. The ``TileKVCache`` (one width for keys and values) is not used for MLA
(``attention.use_tile_cache`` leaves such a model on ``DynamicCache``).

**Sparse block** (``DeepseekV2Moe``, ``DeepseekV3MoE``): the router's fp32 logits come from
the bf16/fp16 activations and weight by an fp32-accumulating cuTile GEMM
(``tilegym.ops.router_linear``: the same products as upstream's ``F.linear`` on upcast copies,
no copy per call; an fp32 router weight keeps upstream's linear); V2's greedy top-k of the
softmax times ``routed_scaling_factor`` is fused after that GEMM (``router_greedy``); V2's
group-limited routing and V3's sigmoid router (``e_score_correction_bias``, groups scored by
their top two, renormalized) run on the logits as ``tilegym.ops.deepseek_route`` (PyTorch). The
routed experts are the shared grouped expert kernels (``moe_experts``, packed ``[E, 2I, H]`` /
``[E, H, I]`` as Qwen3-MoE's) with the layer's residual summed in, and the shared experts (a
dense ``DeepseekV2MLP``, patched as every MLP) add that sum in their down GEMM's epilogue:
``residual + routed + shared`` in two launches' epilogues. The first ``first_k_dense_replace``
layers are dense MLPs. In bf16 the sum is rounded in another order than upstream's ``residual +
(routed + shared)`` (equal in fp32).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from transformers.cache_utils import StaticLayer

from tilegym.ops import library
from tilegym.ops.deepseek_route import deepseek_v2_route, deepseek_v3_route
from tilegym.ops.mla import split_kv_b_weight
from tilegym.transformers import routing_tap
from tilegym.transformers.attention import NAME, TileMask, device_position
from tilegym.transformers.fused_weights import FusedWeights
from tilegym.transformers.kv_update import update_cache
from tilegym.transformers.rope_tables import DYNAMIC_ROPE


def rope_permutation(rope_dim: int) -> torch.Tensor:
    """Row order taking interleaved rope pairs to the half-split layout: evens, then odds."""
    return torch.cat([torch.arange(0, rope_dim, 2), torch.arange(1, rope_dim, 2)])


def permuted_rows(weight: torch.Tensor, period: int, start: int, rope_dim: int) -> torch.Tensor:
    """``weight`` with rows ``[start, start + rope_dim)`` of every ``period`` rows permuted by
    ``rope_permutation`` (a head's rope rows of q, or the rope rows of the latent projection)."""
    w = weight.detach().view(-1, period, weight.shape[-1]).clone()
    idx = start + rope_permutation(rope_dim).to(weight.device)
    w[:, start : start + rope_dim] = w[:, idx]
    return w.view_as(weight)


def _q_name(attn) -> str:
    return "q_proj" if attn.q_lora_rank is None else "q_a_proj"


def _first_projection(attn, fused: FusedWeights, permute: bool) -> tuple[torch.Tensor, ...]:
    """(weight, bias) of ``[q_proj or q_a_proj; kv_a_proj_with_mqa]`` as one GEMM, the rope rows
    permuted when the RoPE kernel rotates them; built once per module."""
    names = (_q_name(attn), "kv_a_proj_with_mqa")
    if not permute:
        return fused.get(attn, names)

    def build():
        q, kv = getattr(attn, names[0]), attn.kv_a_proj_with_mqa
        r, lat = attn.qk_rope_head_dim, attn.kv_lora_rank
        qw = q.weight.detach()
        if attn.q_lora_rank is None:
            qw = permuted_rows(qw, attn.qk_head_dim, attn.qk_nope_head_dim, r)
        kvw = permuted_rows(kv.weight, lat + r, lat, r)
        out = [torch.cat([qw, kvw])]
        if q.bias is not None or kv.bias is not None:
            qb = q.bias if q.bias is not None else qw.new_zeros(qw.shape[0])
            kvb = kv.bias.detach() if kv.bias is not None else kvw.new_zeros(kvw.shape[0])
            if attn.q_lora_rank is None:
                qb = permuted_rows(qb[:, None], attn.qk_head_dim, attn.qk_nope_head_dim, r)[:, 0]
            kvb = permuted_rows(kvb[:, None], lat + r, lat, r)[:, 0]
            out.append(torch.cat([qb.detach(), kvb]))
        return out

    got = fused.derived(attn, "mla_first_projection", build)
    return got[0], (got[1] if len(got) > 1 else None)


def _q_b_weight(attn, fused: FusedWeights, permute: bool) -> torch.Tensor:
    """``q_b_proj``'s weight, its heads' rope rows permuted when the RoPE kernel rotates them."""
    if not permute:
        return attn.q_b_proj.weight
    build = lambda: [  # noqa: E731
        permuted_rows(
            attn.q_b_proj.weight, attn.qk_head_dim, attn.qk_nope_head_dim, attn.qk_rope_head_dim
        )
    ]
    return fused.derived(attn, "mla_q_b_weight", build)[0]


def rope_tables(position_embeddings) -> tuple[torch.Tensor, torch.Tensor]:
    """The half-split kernel's ``cos``/``sin`` ``[B, S, R]``: V2's complex table ``[B, S, R/2]``
    (its real and imaginary parts, repeated), V3's ``(cos, sin)`` as they are (``cat(freqs,
    freqs)``, the layout its interleaved rotation reads the first half of)."""
    if isinstance(position_embeddings, torch.Tensor):
        cos, sin = position_embeddings.real, position_embeddings.imag
        return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    return position_embeddings


def make_rotary_forward(routes, family) -> Callable:
    """``DeepseekV2RotaryEmbedding.forward`` returning the half-split ``(cos, sin)`` tables in
    the activation dtype, once per step from the positions (``library.rotary_tables``), in place
    of the complex table that ``rope_tables`` split, repeated and cast in every layer. Built
    only with ``rope`` on: the attention then rotates on the RoPE kernel, which takes these
    tables as they are; a dynamic rope type keeps upstream's forward."""
    upstream = importlib.import_module(family.upstream_module)
    original = getattr(upstream, f"{family.class_prefix}RotaryEmbedding").forward

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        if getattr(self, "rope_type", "default") in DYNAMIC_ROPE:
            return original(self, x, position_ids)
        inv_freq = self.inv_freq.to(x.device)
        return library.rotary_tables(position_ids, inv_freq, float(self.attention_scaling), x.dtype)

    return forward


def interleaved(attn) -> bool:
    """Whether the module rotates interleaved pairs (V2 always; V3 with ``rope_interleave``)."""
    return bool(getattr(attn.config, "rope_interleave", True))


def _upstream_rope(upstream, attn, q_pe, k_pe, position_embeddings):
    """The family's own rotation, as upstream calls it."""
    if isinstance(position_embeddings, torch.Tensor):  # V2: the complex table
        return upstream.apply_rotary_emb(q_pe, k_pe, position_embeddings.to(q_pe.device))
    cos, sin = position_embeddings
    if interleaved(attn):
        return upstream.apply_rotary_pos_emb_interleave(q_pe, k_pe, cos, sin)
    return upstream.apply_rotary_pos_emb(q_pe, k_pe, cos, sin)


def _describe(mask, s: int, t: int, past: int | None) -> TileMask:
    """The attention's compact mask (a TileMask from the tilegym mask builder, or none: causal,
    the new tokens at the end of the keys)."""
    if isinstance(mask, TileMask):
        return mask
    if mask is not None:
        raise TypeError(f"MLA attention under 'tilegym' got a {type(mask).__name__} mask")
    return TileMask(s, t, t - s if past is None else past)


def make_attention_forward(
    routes, fused, gemm, eager_fn, all_attention, takes_kwargs, family
) -> Callable:
    """``DeepseekV2Attention.forward`` / ``DeepseekV3Attention.forward`` with an optional
    ``residual`` (returned added to the
    output): fused first projection, the RoPE kernel on permuted rows, MLA prefill and latent
    decode kernels under the "tilegym" attention, the o_proj GEMM adding the residual."""
    upstream = importlib.import_module(family.upstream_module)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask=None,
        past_key_values=None,
        cache=None,
        position_embeddings: torch.Tensor | None = None,
        residual: torch.Tensor | None = None,
        **kwargs,
    ):
        cache = cache if cache is not None else past_key_values
        b, s = hidden_states.shape[:-1]
        h, n, r = self.config.num_attention_heads, self.qk_nope_head_dim, self.qk_rope_head_dim
        lat, dv = self.kv_lora_rank, self.v_head_dim
        kernel_rope = routes.rope
        permute = kernel_rope and routes.linear and interleaved(self)  # rows, once
        gather = kernel_rope and not routes.linear and interleaved(self)  # per call
        if routes.linear:
            w, bias = _first_projection(self, fused, permute)
            both = gemm.linear(hidden_states, w, bias)
            q, ckv = both[..., : -(lat + r)], both[..., -(lat + r) :]
            if self.q_lora_rank is not None:
                q = gemm.linear(self.q_a_layernorm(q), _q_b_weight(self, fused, permute), None)
        else:
            if self.q_lora_rank is None:
                q = self.q_proj(hidden_states)
            else:
                q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
            ckv = self.kv_a_proj_with_mqa(hidden_states)
        q = q.view(b, s, h, n + r).transpose(1, 2)
        q_nope, q_pe = q[..., :n], q[..., n:]
        k_lat = self.kv_a_layernorm(ckv[..., :lat]).view(b, 1, s, lat)
        k_pe = ckv[..., lat:].view(b, 1, s, r)
        if gather:  # upstream's projections: the pairs split here (two small copies)
            perm = rope_permutation(r).to(q_pe.device)
            q_pe, k_pe = q_pe[..., perm], k_pe[..., perm]
        if kernel_rope:
            cos, sin = rope_tables(position_embeddings)
            q_pe, k_pe = library.apply_rope(q_pe, k_pe, cos.to(q.dtype), sin.to(q.dtype))
        else:
            q_pe, k_pe = _upstream_rope(upstream, self, q_pe, k_pe, position_embeddings)
        tile = self.config._attn_implementation == NAME
        past = None
        if cache is not None:
            if tile and s > 1 and not isinstance(attention_mask, TileMask):
                past = int(cache.get_seq_length(self.layer_idx))  # the prompt's start
            k_lat, k_pe = _write_cache(
                cache, self.layer_idx, k_lat, k_pe, attention_mask, takes_kwargs, kwargs
            )
        if tile:
            out = _mla(self, q_nope, q_pe, k_lat, k_pe, attention_mask, past, s, gemm, routes)
        else:
            out = _upstream_attention(
                self, q_nope, q_pe, k_lat, k_pe, attention_mask, all_attention, eager_fn, kwargs
            )
        out = out.reshape(b, s, h * dv)
        if routes.linear and self.o_proj.bias is None:
            if residual is not None:
                return gemm.linear_residual(out, self.o_proj.weight, residual), None
            return gemm.linear(out, self.o_proj.weight), None
        out = self.o_proj(out)
        return (out if residual is None else residual + out), None

    return forward


def _write_cache(cache, layer_idx, k_lat, k_pe, mask, takes_kwargs, kwargs):
    """Write the latent and the rope key into the cache; return the layer's whole entries.

    A static layer under a "tilegym" mask with a device position is written by one cuTile
    launch at that position (two widths: ``library.latent_cache_write_at``), which also sets
    the layer's device length, as ``StaticLayer.update`` does; any other cache by its own
    ``update`` (the shared one-width ``kv_cache_write_at`` does not take the two widths)."""
    position = device_position(mask)
    layers = getattr(cache, "layers", None)
    layer = layers[layer_idx] if layers is not None else None
    if position is not None and type(layer) is StaticLayer:
        if not layer.is_initialized:
            layer.lazy_initialization(k_lat, k_pe)
        library.latent_cache_write_at(
            k_lat, k_pe, layer.keys, layer.values, position, layer.cumulative_length
        )
        return layer.keys, layer.values
    return update_cache(cache, layer_idx, k_lat, k_pe, None, takes_kwargs, kwargs)


def _kv_b(attn, x: torch.Tensor, gemm, routes) -> torch.Tensor:
    if routes.linear:
        return gemm.linear(x, attn.kv_b_proj.weight)
    return attn.kv_b_proj(x)


def _mla(attn, q_nope, q_pe, k_lat, k_pe, mask, past, s, gemm, routes) -> torch.Tensor:
    """Attention output ``[B, S, H, V]`` on the MLA kernels under a compact mask."""
    b, h, n, dv = q_nope.shape[0], q_nope.shape[1], attn.qk_nope_head_dim, attn.v_head_dim
    t = k_lat.shape[2]
    m = _describe(mask, s, t, past)
    position = device_position(m)
    if s == 1:  # the absorbed form over the latent cache
        w_uk, w_uv = split_kv_b_weight(attn.kv_b_proj.weight, h, n, dv)
        q_lat = library.mla_absorb_query(q_nope[:, :, 0], w_uk)
        span = {"position": position} if position is not None else {"kv_end": min(t, m.q_start + 1)}
        ctx = library.mla_decode(
            q_lat, q_pe[:, :, 0], k_lat, k_pe, scale=attn.scaling, key_valid=m.key_valid, **span
        )
        return library.mla_latent_to_heads(ctx, w_uv)[:, None]
    q_start = int(position[0]) if position is not None else m.q_start
    t = min(t, q_start + s)  # a static buffer's later slots are never visible: not expanded
    kv = _kv_b(attn, k_lat[:, 0, :t], gemm, routes).view(b, t, h, n + dv)
    k_nope, v = kv[..., :n].transpose(1, 2), kv[..., n:].transpose(1, 2)
    valid = None if m.key_valid is None else m.key_valid[:, :t]
    return library.mla_prefill(
        q_nope,
        q_pe,
        k_nope,
        k_pe[:, :, :t],
        v,
        scale=attn.scaling,
        q_start=q_start,
        key_valid=valid,
    )


def _upstream_attention(attn, q_nope, q_pe, k_lat, k_pe, mask, all_attention, eager_fn, kwargs):
    """The model's own attention function over the expanded keys and values, as upstream."""
    query = torch.cat((q_nope, q_pe), dim=-1)
    key, value = attn.expand_kv(k_lat, k_pe)
    fn = all_attention.get_interface(attn.config._attn_implementation, eager_fn)
    out, _ = fn(attn, query, key, value, mask, dropout=0.0, scaling=attn.scaling, **kwargs)
    return out


def _router_kernels(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the router runs on ``library.router_*``: on the GPU the cuTile GEMM takes bf16 or
    fp16 activations and a weight of that dtype (an fp32 weight stays upstream's linear); on
    the CPU the ops' references are upstream's fp32 linear."""
    if x.dtype != weight.dtype:
        return False
    return not x.is_cuda or x.dtype in (torch.bfloat16, torch.float16)


def _routed(gate, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, ids) of a DeepSeek router: V2's greedy one as one op (fp32 logits, the top-k
    of their softmax times the scaling: ``library.router_greedy``); the others after the fp32
    logits (``library.router_logits``) in ``_route``."""
    weight = gate.weight
    if not _router_kernels(x, weight):
        return _route(gate, torch.nn.functional.linear(x.float(), weight.float()))
    greedy = getattr(gate, "e_score_correction_bias", None) is None and gate.topk_method == "greedy"
    if greedy:
        return library.router_greedy(x, weight, gate.top_k, gate.routed_scaling_factor)
    return _route(gate, library.router_logits(x, weight))


def _route(gate, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, ids) of a DeepSeek router after its fp32 linear: V3's (it has
    ``e_score_correction_bias``) and V2's group-limited one in PyTorch, V2's greedy one on the
    shared routing kernel (the top-k of the softmax, not renormalized) times its scaling."""
    bias = getattr(gate, "e_score_correction_bias", None)
    if bias is not None:
        return deepseek_v3_route(
            logits,
            bias,
            top_k=gate.top_k,
            n_group=gate.num_group,
            topk_group=gate.topk_group,
            renormalize=bool(gate.norm_topk_prob),
            scaling=gate.routed_scaling_factor,
        )
    if gate.topk_method != "greedy":
        return deepseek_v2_route(
            logits,
            top_k=gate.top_k,
            method=gate.topk_method,
            n_group=gate.num_group,
            topk_group=gate.topk_group,
            scaling=gate.routed_scaling_factor,
        )
    weights, ids = library.moe_route(logits, gate.top_k, False)
    if gate.routed_scaling_factor != 1.0:
        weights = weights * gate.routed_scaling_factor
    return weights, ids


def make_moe_forward(routes, gemm, family, fused=None) -> Callable:
    """``DeepseekV2Moe.forward`` / ``DeepseekV3MoE.forward`` with an optional ``residual``: the
    router's fp32 logits, routed (``_route``), the routed experts on
    the grouped expert kernels with the residual summed in, the shared experts' down GEMM adding
    that sum."""
    fused_experts = routes.linear and routes.swiglu and routes.act == "silu"

    def forward(
        self, hidden_states: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        res = None if residual is None else residual.reshape(-1, shape[-1])
        gate = self.gate
        if routes.linear:
            weights, ids = _routed(gate, x)
            routing_tap.chose(gate, ids)
        else:
            _, weights, ids = gate(x)
        if fused_experts:
            out = library.moe_experts(
                x, ids, weights, self.experts.gate_up_proj, self.experts.down_proj, res
            )
        else:
            out = self.experts(x, ids.to(torch.int64), weights)
            if res is not None:
                out = res + out
        return self.shared_experts(x, residual=out).reshape(shape)

    return forward
