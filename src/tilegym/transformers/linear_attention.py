"""The forward of a gated-delta-net linear attention (Qwen3.5, Qwen3-Next) on the cuTile ops.

``make_gated_delta_net_forward()`` builds a plain function with the contract of
``Qwen3_5GatedDeltaNet.forward`` (and ``Qwen3NextGatedDeltaNet.forward``): the projections stay
the module's own ``nn.Linear``; the causal conv + SiLU, the gated delta rule (gates, L2 norms
and the state update fused) and the gated RMSNorm run on ``tilegym.ops.library``'s ops, which
are the cuTile kernels on CUDA and the PyTorch references on the CPU. The cache is kept the way
upstream keeps it: the conv state through ``cache.update_conv_state`` (prefill) or in place
(decode), the recurrent state through ``cache.update_recurrent_state`` (prefill) or in place
(decode). A cache that is recording its past (speculative rollback) falls back to upstream.

Built by a family's patch (``Family.linear_attention``) with the ``linear`` route, the four
input projections (Qwen3-Next's two packed ones, relaid once) run as one cuTile GEMM and
out_proj as the GEMM that adds the layer's residual (the decoder layer hands it over as
``residual``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from tilegym.ops import library as lib


def _padding_masked(hidden_states: torch.Tensor, attention_mask) -> torch.Tensor:
    """upstream ``apply_mask_to_padding_states``: zero the padded tokens (a 2D mask)."""
    if attention_mask is not None:
        dtype = hidden_states.dtype
        return (hidden_states * attention_mask[:, :, None]).to(dtype)
    return hidden_states


def _cached_states(cache, idx: int):
    """(conv state, recurrent state) the layer continues from, or (None, None) before its first
    call: ``get_conv_state`` / ``get_recurrent_state`` (transformers 5.2x) or the layer's
    ``has_previous_state`` and state lists (5.17)."""
    if cache is None:
        return None, None
    if hasattr(cache, "get_conv_state"):
        return cache.get_conv_state(idx), cache.get_recurrent_state(idx)
    if cache.has_previous_state(idx, state_idx=0):
        layer = cache.layers[idx]
        return layer.conv_states[0], layer.recurrent_states[0]
    return None, None


#: Qwen3.5's input projections, in the order their fused GEMM's output holds them
IN_PROJ = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
#: Qwen3-Next's: q, k, v, z and b, a interleaved per key head, relaid once into IN_PROJ's order
PACKED_IN_PROJ = ("in_proj_qkvz", "in_proj_ba")


def _packed(module) -> bool:
    return all(hasattr(module, n) for n in PACKED_IN_PROJ)


def _relaid_in_proj(module) -> tuple[torch.Tensor]:
    """Qwen3-Next's packed projection rows ``[per key head: q, k, v, z]`` and ``[per key head:
    b, a]`` reordered to ``[q; k; v; z; b; a]`` (each over the heads in order), the layout of
    Qwen3.5's four projections, so that one GEMM and the same splits serve both."""
    hk, dk, dv = module.num_k_heads, module.head_k_dim, module.head_v_dim
    r = module.num_v_heads // hk
    qkvz = module.in_proj_qkvz.weight.detach()
    ba = module.in_proj_ba.weight.detach()
    q, k, v, z = qkvz.view(hk, 2 * dk + 2 * r * dv, -1).split([dk, dk, r * dv, r * dv], dim=1)
    b, a = ba.view(hk, 2 * r, -1).split([r, r], dim=1)
    rows = [t.reshape(-1, qkvz.shape[-1]) for t in (q, k, v, z, b, a)]
    return (torch.cat(rows, dim=0).contiguous(),)


def prepare(module, fused) -> None:
    """The input projections' GEMM weight, built at patch time (before anything compiles)."""
    _in_proj_weight(module, fused)


def _in_proj_weight(module, fused) -> torch.Tensor:
    if _packed(module):
        return fused.derived(module, "in_proj_relaid", lambda: _relaid_in_proj(module))[0]
    return fused.get(module, IN_PROJ)[0]


def _projections(module, h):
    """(conv input [B, T, 2 Dk Hk + Dv Hv], z, b, a) from the module's own projections."""
    if not _packed(module):
        return (
            module.in_proj_qkv(h),
            module.in_proj_z(h),
            module.in_proj_b(h),
            module.in_proj_a(h),
        )
    q, k, v, z, b, a = module.fix_query_key_value_ordering(
        module.in_proj_qkvz(h), module.in_proj_ba(h)
    )
    flat = [t.reshape(t.shape[0], t.shape[1], -1) for t in (q, k, v, z)]
    return torch.cat(flat[:3], dim=-1), flat[3], b, a


def make_gated_delta_net_forward(
    upstream_forward: Callable, routes=None, fused=None, gemm=None, kernels: bool = True
) -> Callable:
    """``XGatedDeltaNet.forward`` on the cuTile ops (``upstream_forward``: the class's own, for
    the cases kept upstream). The cache comes as ``cache`` (5.2x), ``cache_params`` (5.17's
    layer) or ``past_key_values`` (the shared layer forward's kwargs under 5.17). With
    ``routes.linear`` (and ``fused``, ``gemm``: the patch's weights and GEMM ops) the
    projections are cuTile GEMMs; a ``residual`` is added to the output either way. With
    ``kernels`` off (the ``attn`` flag off) the mixer is upstream's, only taking the residual
    the patched decoder layer hands it."""
    on_gemm = kernels and routes is not None and routes.linear and gemm is not None

    def forward(
        self,
        hidden_states,
        cache=None,
        attention_mask=None,
        cache_params=None,
        past_key_values=None,
        residual=None,
        **kwargs,
    ):
        cache = next((c for c in (cache, cache_params, past_key_values) if c is not None), None)
        idx = self.layer_idx
        if not kernels or (cache is not None and getattr(cache.layers[idx], "record_past", False)):
            out = upstream_forward(self, hidden_states, cache, attention_mask, **kwargs)
            return out if residual is None else residual + out
        h = _padding_masked(hidden_states, attention_mask)
        bsz, n_tok, _ = h.shape
        conv_state, rec_state = _cached_states(cache, idx)
        if on_gemm:
            proj = gemm.linear(h, _in_proj_weight(self, fused))
            cuts = [2 * self.key_dim + self.value_dim, self.value_dim]
            mixed, z, b, a = proj.split([*cuts, self.num_v_heads, self.num_v_heads], dim=-1)
        else:
            mixed, z, b, a = _projections(self, h)
        w = self.conv1d.weight.squeeze(1)
        if conv_state is not None and n_tok == 1:
            mixed_conv = lib.causal_conv1d_update(mixed, conv_state, w, self.conv1d.bias)
        else:
            ks = self.conv_kernel_size
            mixed_conv, _ = lib.causal_conv1d(mixed, w, self.conv1d.bias, conv_state, ks)
            if cache is not None:  # upstream's bookkeeping; it stores the same last inputs
                cache.update_conv_state(mixed.transpose(1, 2), idx, conv_kernel_size=ks)
        kd, vd = self.key_dim, self.value_dim
        q = mixed_conv[..., :kd].reshape(bsz, n_tok, -1, self.head_k_dim)
        k = mixed_conv[..., kd : 2 * kd].reshape(bsz, n_tok, -1, self.head_k_dim)
        v = mixed_conv[..., 2 * kd : 2 * kd + vd].reshape(bsz, n_tok, -1, self.head_v_dim)
        if rec_state is not None and n_tok == 1:
            core = lib.gated_delta_recurrent(q, k, v, a, b, self.A_log, self.dt_bias, rec_state)
        else:
            core, final = lib.gated_delta_chunk(q, k, v, a, b, self.A_log, self.dt_bias, rec_state)
            if cache is not None:
                cache.update_recurrent_state(final, idx)
        dv = self.head_v_dim
        normed = lib.rms_norm_gated(
            core.reshape(-1, dv), z.reshape(-1, dv), self.norm.weight, self.norm.variance_epsilon
        ).reshape(bsz, n_tok, -1)
        if on_gemm and self.out_proj.bias is None:
            if residual is not None:
                return gemm.linear_residual(normed, self.out_proj.weight, residual)
            return gemm.linear(normed, self.out_proj.weight)
        out = self.out_proj(normed)
        return out if residual is None else residual + out

    return forward


def make_linear_attention_forward(routes, fused, gemm, family, kernels: bool = True) -> Callable:
    """The builder ``monkey_patch`` calls for ``Family.linear_attention``'s class: the
    gated-delta-net forward above, falling back to that upstream class's own forward."""
    upstream = importlib.import_module(family.upstream_module)
    cls = getattr(upstream, f"{family.class_prefix}{family.linear_attention}")
    return make_gated_delta_net_forward(cls.forward, routes, fused, gemm, kernels)
