"""cuTile forwards for Llama-style decoder layers, shared by every family that has one.

Each ``make_*`` builds a plain function with the upstream module's ``forward`` contract, for
binding to one instance (``types.MethodType``) or setting on a class. It reads the family's
``Family`` description (``family.py``). What a forward routes through cuTile is fixed when it is
built (the ``Routes`` flags), so two models in one process can be patched differently. The
forwards work with the transformers 5.x releases the project supports: the KV cache argument is
``past_key_values`` up to 5.2x and ``cache`` later, and both are accepted and handed to
``Cache.update`` the way the installed release does (``kv_update.py``).

Shared by every family, so no experiment may change this module (``tilegym-hooks scope``); an
experiment wires its own builder through ``Family.forwards`` instead. Being trusted code, it is
not held to the rules on experiment code (it imports ``importlib`` to reach a family's upstream
module).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tilegym.ops.gemm import CacheWrite, HeadNorms, reserve_counters
from tilegym.ops.library import (
    add_rms_norm,
    apply_rope,
    gelu_tanh_and_mul,
    qk_norm_rope,
    qk_norm_whole_rope,
    rms_norm,
    rms_norm_add,
    rms_norm_add_rms_norm,
    sigmoid_gate,
    silu_and_mul,
)
from tilegym.ops.qk_norm_whole_rope import fits as whole_rope_fits
from tilegym.transformers.family import Family, norm_eps
from tilegym.transformers.fused_weights import FusedWeights
from tilegym.transformers.kv_update import static_write_target, update_cache


@dataclass(frozen=True)
class Routes:
    """Which parts of a decoder layer run on cuTile kernels."""

    rms_norm: bool = False
    rope: bool = False
    swiglu: bool = False
    linear: bool = False
    act: str = "silu"  # the gated MLP activation's kernels (a value of GATED_ACTS)
    rope_heads: int = 0  # decode RoPE kernels' heads a block (0: per-token; monkey_patch.TUNING)
    norm_gemv: int = 0  # norms in the next GEMV's K loop: 1 QKV's, 2 and gate/up's (TUNING)
    rope_gemv: int = 0  # 1: a decode row's RoPE in the norm + QKV GEMV's epilogue, 2: and
    # its static-cache write (TUNING)


_ACT_KERNELS = {
    "silu": (silu_and_mul, "fused_gate_up_silu"),
    "gelu_tanh": (gelu_tanh_and_mul, "fused_gate_up_gelu_tanh"),
}


def cache_update_takes_kwargs(attention_cls: type) -> bool:
    """True when the installed release passes ``kwargs=`` to ``cache.update`` (``cache`` arg)."""
    params = inspect.signature(inspect.unwrap(attention_cls.forward)).parameters
    return "cache" in params


def make_rms_norm_forward(family: Family) -> Callable:
    """``XRMSNorm.forward`` on the cuTile RMSNorm kernel (the family's form of the norm)."""
    offset = family.norm_unit_offset

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return rms_norm(hidden_states, self.weight, norm_eps(self), offset)

    return forward


def unbiased(module: torch.nn.Module, names: tuple[str, ...]) -> bool:
    """True when none of the projections ``names`` of ``module`` has a bias."""
    return all(getattr(module, n).bias is None for n in names)


def residual_scale(module: torch.nn.Module, family: Family) -> float | None:
    """What ``module`` (an attention or MLP) scales its output by before the residual add:
    ``config.residual_multiplier`` where the family has one (Granite), else None."""
    return module.config.residual_multiplier if family.residual_multiplier else None


def add_scaled(residual: torch.Tensor, out: torch.Tensor, scale: float | None) -> torch.Tensor:
    """``residual + out``, or ``residual + out * scale`` as the upstream layer writes it."""
    return residual + out if scale is None else residual + out * scale


def make_mlp_forward(routes: Routes, fused: FusedWeights, gemm, family: Family) -> Callable:
    """``XMLP.forward``: gate/up (fused GEMM + activation-and-mul epilogue, or the act-and-mul
    kernel: SiLU, or GELU-tanh by ``routes.act``), down(+residual). A residual multiplier
    (Granite) is folded into the down_proj weight the residual GEMM reads. Given the layer's
    norm (``pre_norm``, ``routes.norm_gemv`` 2), the fused gate/up GEMM applies it. Given
    ``post_add`` ``(residual, norm)`` (a post-norm layer at ``norm_gemv`` 2), the MLP's input is
    ``residual + norm(x)``, which the fused gate/up GEMM forms (``add_rms_norm_gate_up``), and
    the call returns ``(output, that input)``: the layer's next residual."""
    names = family.gate_up
    act_and_mul, gated_gemm = _ACT_KERNELS[routes.act]

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
        pre_norm: torch.nn.Module | None = None,
        post_add: tuple[torch.Tensor, torch.nn.Module] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        fuse = routes.linear and routes.swiglu and unbiased(self, names)
        if post_add is not None:
            before, norm = post_add
            eps, offset = norm_eps(norm), family.norm_unit_offset
            if not fuse or self.down_proj.bias is not None:
                h = rms_norm_add(x, before, norm.weight, eps, offset)
                return forward(self, h), h
            w, _ = fused.get(self, names)
            gelu = routes.act == "gelu_tanh"
            act, h = gemm.add_rms_norm_gate_up(x, before, norm.weight, eps, w, gelu, offset)
            return gemm.linear(act, self.down_proj.weight), h
        if pre_norm is not None and not fuse:  # the norm rides only in the fused gate/up GEMM
            x, pre_norm = pre_norm(x), None
        if routes.linear and unbiased(self, names):
            w, _ = fused.get(self, names)
            if pre_norm is not None:
                eps, gelu = norm_eps(pre_norm), routes.act == "gelu_tanh"
                act = gemm.rms_norm_gate_up(
                    x, pre_norm.weight, eps, w, gelu, family.norm_unit_offset
                )
            elif routes.swiglu:
                act = getattr(gemm, gated_gemm)(x, w)
            else:
                gate, up = gemm.linear(x, w).chunk(2, dim=-1)
                act = getattr(self, family.act)(gate) * up
        else:
            gate, up = _gate_up(self, x, names)
            act = act_and_mul(gate, up) if routes.swiglu else getattr(self, family.act)(gate) * up
        if routes.linear and self.down_proj.bias is None:
            if residual is not None:
                w = fused.scaled(self, "down_proj", residual_scale(self, family))
                return gemm.linear_residual(act, w, residual)
            return gemm.linear(act, self.down_proj.weight)
        out = self.down_proj(act)
        return out if residual is None else add_scaled(residual, out, residual_scale(self, family))

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
    family: Family,
) -> Callable:
    """``XAttention.forward``: fused QKV GEMM, (q/k norm +) RoPE kernel, o_proj(+residual; a
    biased o_proj adds its bias in the plain GEMM and leaves the residual to the layer).
    A layer whose ``family.rope_switch`` attribute is false skips RoPE (SmolLM3's NoPE layers);
    with ``family.clip_qkv`` q, k and v are clamped to +-``config.clip_qkv`` after the q/k norms
    (OLMoE; a PyTorch clamp, skipped while the config leaves it unset);
    a residual multiplier (Granite) is folded into the o_proj weight the residual GEMM reads.
    The softmax scale is the module's ``scaling`` (Granite: ``config.attention_multiplier``).
    With ``family.sinks`` the module's sinks go to the attention function as ``s_aux``; with
    ``family.rope_half_table`` the RoPE kernels get the half-width tables repeated (gpt-oss).
    With ``family.attn_output_gate`` q_proj holds [q; gate] per head and the attention output
    is scaled by ``sigmoid(gate)`` before o_proj (Qwen3.5; with ``swiglu`` on the cuTile
    ``sigmoid_gate`` kernel, which reads the gate halves in place, else PyTorch's sigmoid and
    multiply, as upstream). Tables narrower than the head (partial rotary, Qwen3.5's 0.25) take the
    q/k norms and the RoPE kernel apart: the fused kernels rotate whole heads only. Per-head
    q/k norms (Qwen3) fuse with RoPE in ``qk_norm_rope``; whole-projection ones (OLMo 2/3,
    OLMoE) in ``qk_norm_whole_rope`` (heads whose halves are power-of-two tiles; OLMoE only
    while ``clip_qkv`` is unset, its clamp sits between the norms and RoPE)."""
    names = family.qkv
    q_width = 2 if family.attn_output_gate else 1
    torch_rope = upstream_rope(family)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        cache=None,
        residual: torch.Tensor | None = None,
        pre_norm: torch.nn.Module | None = None,
        **kwargs,
    ):
        cache = cache if cache is not None else past_key_values
        eager_cuda = hidden_states.is_cuda and not torch.compiler.is_compiling()
        if routes.rope_gemv and family.qk_norm and eager_cuda:  # then the compiled step's
            reserve_counters(hidden_states.device)  # head norms zero no fresh counters
        if pre_norm is not None and not routes.linear:  # the norm rides only in a cuTile GEMM
            hidden_states, pre_norm = pre_norm(hidden_states), None
        input_shape = hidden_states.shape[:-1]
        bsz, seq = input_shape
        d = self.head_dim
        hq, hk = self.config.num_attention_heads, self.config.num_key_value_heads
        qkv, gate = None, None
        cos, sin = position_embeddings
        rope = family.rope_switch is None or bool(getattr(self, family.rope_switch))
        rotated, written = False, None
        if routes.linear:
            w, b = fused.get(self, names)
            if rope and rope_in_gemv(routes, family, self, pre_norm, hidden_states, cos):
                offset = family.norm_unit_offset
                nw, eps = (None, 0.0) if pre_norm is None else (pre_norm.weight, norm_eps(pre_norm))
                args = (hidden_states, nw, eps, w, b, cos, sin, hq + hk, offset)
                heads = head_norms(family, self, hq)
                if routes.rope_gemv == 2 and cache is not None:
                    layer_idx, dtype = self.layer_idx, hidden_states.dtype
                    written = static_write_target(cache, layer_idx, attention_mask, dtype)
                write = None
                if written is not None:
                    layer, position = written
                    write = CacheWrite(
                        layer.keys, layer.values, position, layer.cumulative_length, hq
                    )
                qkv = gemm.rms_norm_linear_rope(*args, heads, write)
                rotated = True
            elif pre_norm is None:
                qkv = gemm.linear(hidden_states, w, b)
            else:
                eps, offset = norm_eps(pre_norm), family.norm_unit_offset
                qkv = gemm.rms_norm_linear(hidden_states, pre_norm.weight, eps, w, b, offset)
        elif len(names) == 1:
            qkv = getattr(self, names[0])(hidden_states)
        nq = q_width * hq * d
        if qkv is not None:
            q = qkv[..., :nq].view(bsz, seq, hq, q_width * d)
            k = qkv[..., nq : nq + hk * d].view(bsz, seq, hk, d)
            v = qkv[..., nq + hk * d :].view(bsz, seq, hk, d)
        else:
            q, k, v = (getattr(self, n)(hidden_states) for n in names)
            q = q.view(bsz, seq, hq, q_width * d)
            k, v = k.view(bsz, seq, hk, d), v.view(bsz, seq, hk, d)
        if family.attn_output_gate:  # upstream's chunk of the [q; gate] head
            q, gate = q[..., :d], q[..., d:]  # [B, S, H, D] views of each head's halves
        if family.rope_half_table and routes.rope:  # the kernels take head_dim-wide tables
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        per_head = family.qk_norm and not family.qk_norm_whole
        whole = family.qk_norm and family.qk_norm_whole
        clip = getattr(self.config, "clip_qkv", None) if family.clip_qkv else None
        one_launch = rope and routes.rope and routes.rms_norm and clip is None
        one_launch = one_launch and cos.shape[-1] == d
        if rotated:  # the GEMV's epilogue rotated q and k
            q, k = q.transpose(1, 2), k.transpose(1, 2)
        elif one_launch and whole and whole_rope_fits(d):
            qw, kw, eps = self.q_norm.weight, self.k_norm.weight, norm_eps(self.q_norm)
            q, k = qk_norm_whole_rope(q, k, qw, kw, eps, cos, sin, family.qk_norm_round_once)
        elif one_launch and per_head:
            qw, kw, eps = self.q_norm.weight, self.k_norm.weight, norm_eps(self.q_norm)
            q, k = qk_norm_rope(
                q, k, qw, kw, eps, cos, sin, family.norm_unit_offset, routes.rope_heads
            )
        else:
            if whole:
                q = self.q_norm(q.reshape(bsz, seq, hq * d)).view(bsz, seq, hq, d)
                k = self.k_norm(k.reshape(bsz, seq, hk * d)).view(bsz, seq, hk, d)
            if clip is not None and not per_head:
                q, k, v = (t.clamp(-clip, clip) for t in (q, k, v))
            if per_head:
                q, k = self.q_norm(q), self.k_norm(k)
                if clip is not None:  # after the norms, as for whole-projection norms
                    q, k, v = (t.clamp(-clip, clip) for t in (q, k, v))
            q, k = q.transpose(1, 2), k.transpose(1, 2)
            if rope and routes.rope:
                q, k = apply_rope(q, k, cos, sin, routes.rope_heads)
            elif rope:
                q, k = torch_rope(q, k, cos, sin)
        v = v.transpose(1, 2)
        if written is not None:  # the GEMV wrote them
            k, v = written[0].keys, written[0].values
        elif cache is not None:
            k, v = update_cache(cache, self.layer_idx, k, v, attention_mask, takes_kwargs, kwargs)
        attention_interface = all_attention.get_interface(
            self.config._attn_implementation, eager_fn
        )
        extra = {}
        if family.config_window:
            extra["sliding_window"] = getattr(self.config, "sliding_window", None)
        elif hasattr(self, "sliding_window"):
            extra["sliding_window"] = self.sliding_window
        if family.sinks:  # as upstream passes them (gpt-oss's eager function reads the module's)
            extra["s_aux"] = self.sinks
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
        if gate is not None and routes.swiglu:  # one cuTile launch, the gate read in place
            attn_output = sigmoid_gate(attn_output, gate)
        elif gate is not None:
            attn_output = attn_output * torch.sigmoid(gate.reshape(*input_shape, -1))
        if routes.linear and self.o_proj.bias is None:
            if residual is not None:
                w = fused.scaled(self, "o_proj", residual_scale(self, family))
                return gemm.linear_residual(attn_output, w, residual), attn_weights
            return gemm.linear(attn_output, self.o_proj.weight), attn_weights
        if routes.linear:  # a biased o_proj (gpt-oss): the bias rides in the GEMM's epilogue
            out = gemm.linear(attn_output, self.o_proj.weight, self.o_proj.bias)
        else:
            out = self.o_proj(attn_output)
        if residual is None:
            return out, attn_weights
        return add_scaled(residual, out, residual_scale(self, family)), attn_weights

    return forward


def rope_in_gemv(routes: Routes, family: Family, attn, pre_norm, hidden, cos) -> bool:
    """Whether this call's RoPE rides in the QKV GEMV's epilogue (``rope_gemv``; with the input
    norm in its K loop where the layer hands it over, ``pre_norm``): one decode row, whole-head
    tables, nothing between the projection and RoPE but q/k norms, per head (Qwen3) or over the
    whole projection (OLMo 2/3) (no output gate, clamp or half tables), and the norm weights in
    the activations' dtype."""
    if not (routes.rope_gemv and routes.rope and routes.rms_norm):
        return False
    if hidden.shape[:-1].numel() != 1 or cos.shape[-1] != attn.head_dim:
        return False
    if family.attn_output_gate or family.rope_half_table:
        return False
    if family.qk_norm_whole and family.norm_unit_offset:  # the kernel has no such form
        return False
    if family.clip_qkv and getattr(attn.config, "clip_qkv", None) is not None:
        return False
    weights = [] if pre_norm is None else [pre_norm.weight]
    if family.qk_norm:
        weights += [attn.q_norm.weight, attn.k_norm.weight]
    return all(w.dtype == hidden.dtype for w in weights)


def head_norms(family: Family, attn, q_heads: int):
    """The q/k norms `rms_norm_linear_rope` applies before RoPE (None without): per head, or
    OLMo's over the whole projection (``qk_norm_whole``, rounded as the family rounds them)."""
    if not family.qk_norm:
        return None
    eps, offset = norm_eps(attn.q_norm), family.norm_unit_offset
    whole, once = family.qk_norm_whole, family.qk_norm_round_once
    return HeadNorms(attn.q_norm.weight, attn.k_norm.weight, eps, q_heads, offset, whole, once)


def upstream_rope(family: Family) -> Callable:
    """The family's own ``apply_rotary_pos_emb``, for RoPE left to PyTorch: it runs exactly as
    upstream. OLMo 2's rotary module returns fp32 cos/sin and its function casts the result
    back to q's dtype; a shared rotation without that cast handed the static cache fp32 keys
    (H200 loop, drop-rope round: ``index_copy_(): ... Float and ... BFloat16``)."""
    return importlib.import_module(family.upstream_module).apply_rotary_pos_emb


def make_decoder_layer_forward(routes: Routes, family: Family) -> Callable:
    """``XDecoderLayer.forward``: the attention residual add is folded into the o_proj GEMM
    (``linear``) or into the fused add+RMSNorm kernel (``rms_norm``); the MLP residual add into
    the down_proj GEMM (``linear``), else it stays a PyTorch add: a standalone cuTile add never
    beat PyTorch's on the H200, so the library has none. A residual multiplier (Granite's
    ``residual + out * m``) rides in the o_proj/down_proj weights the residual GEMMs read; the
    add+RMSNorm kernel has no scale, so there (``linear`` off) the scaling is PyTorch's multiply.
    Post-norm (OLMo 2) and sandwich-norm (Gemma 3) families have their own layer forwards below.
    A layer with a linear-attention mixer (``family.linear_attention``: Qwen3.5's
    ``linear_attn``) calls it where the others call ``self_attn``, with the residual to fold
    into its out_proj GEMM and the cache under both names the releases use. With
    ``routes.norm_gemv`` the input norm is handed to the attention (``pre_norm``), whose QKV
    GEMM applies it (``rms_norm_linear``: one launch at decode); at 2 the post-attention norm
    also goes to a dense MLP whose o_proj took the residual (``rms_norm_gate_up``)."""
    offset = family.norm_unit_offset
    mlp_norm = routes.norm_gemv >= 2 and not family.moe_block and "MLP" not in family.forwards

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs,
    ) -> torch.Tensor:
        residual = hidden_states
        mixer = getattr(self, "linear_attn", None) if family.linear_attention else None
        if routes.norm_gemv and mixer is None:  # the attention's QKV GEMM applies the norm
            normed, pre = hidden_states, {"pre_norm": self.input_layernorm}
        else:
            normed, pre = self.input_layernorm(hidden_states), {}
        if mixer is not None:
            fold = routes.linear and mixer.out_proj.bias is None
            attn_out = mixer(
                hidden_states=normed,
                attention_mask=attention_mask,
                residual=residual if fold else None,
                **kwargs,
            )
        else:
            fold = routes.linear and self.self_attn.o_proj.bias is None
            attn_out, _ = self.self_attn(
                hidden_states=normed,
                attention_mask=attention_mask,
                position_ids=position_ids,
                position_embeddings=position_embeddings,
                residual=residual if fold else None,
                **pre,
                **kwargs,
            )
        norm = self.post_attention_layernorm
        if fold and mlp_norm:  # the MLP's gate/up GEMM applies the norm
            return self.mlp(attn_out, residual=attn_out, pre_norm=norm)
        if fold:
            hidden_states = attn_out
            normed = norm(hidden_states)
        elif routes.rms_norm:
            scale = residual_scale(mixer or self.self_attn, family)
            branch = attn_out if scale is None else attn_out * scale
            hidden_states, normed = add_rms_norm(
                branch, residual, norm.weight, norm_eps(norm), offset
            )
        else:
            scale = residual_scale(mixer or self.self_attn, family)
            hidden_states = add_scaled(residual, attn_out, scale)
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
        """A post-norm family's layer (OLMo 2, OLMo 3): each sub-block's output is normalized,
        then added to the residual. With ``rms_norm`` each norm and its add are one kernel
        (``rms_norm_add``: the norm rounded as the patched RMSNorm rounds it, then the add as
        PyTorch's), else the norms' own forwards and PyTorch's adds. At ``norm_gemv`` 2 the
        attention's norm and add ride in the MLP's gate/up GEMM (``add_rms_norm_gate_up``)."""
        attn_out, _ = self.self_attn(
            hidden_states=hidden_states,
            attention_mask=attention_mask,
            position_ids=position_ids,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        post_attn, post_mlp = self.post_attention_layernorm, self.post_feedforward_layernorm
        if not routes.rms_norm:
            hidden_states = hidden_states + post_attn(attn_out)
            return hidden_states + post_mlp(self.mlp(hidden_states))
        if mlp_norm:  # the MLP's gate/up GEMM forms the residual + norm it reads
            mlp_out, hidden_states = self.mlp(attn_out, post_add=(hidden_states, post_attn))
        else:
            w, eps = post_attn.weight, norm_eps(post_attn)
            hidden_states = rms_norm_add(attn_out, hidden_states, w, eps, offset)
            mlp_out = self.mlp(hidden_states)
        w, eps = post_mlp.weight, norm_eps(post_mlp)
        return rms_norm_add(mlp_out, hidden_states, w, eps, offset)

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
