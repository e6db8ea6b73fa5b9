"""The ``Family`` type: what a Llama-style decoder family is, as the shared forwards read it.

A family (Llama, Qwen3, Mistral, Qwen2, Phi-3, OLMo 2, OLMo 3, Gemma 3, Qwen3-MoE, OLMoE,
Mixtral, Granite, SmolLM3) is a ``Family``: where its upstream classes live and how it differs
from Llama (q/k norms, packed projections, the activation's name, where its norms sit and their
form, scaled residual branches, layers without RoPE, clipped q/k/v, a sparse MoE block and how
its router weighs the experts, attention sinks, biased and clamped experts). Each family's
``<key>/modeling_<key>.py`` holds its ``FAMILY``; ``decoder.py`` reads it. This module is shared
by every family, so no experiment may change it (``tilegym-hooks scope``). Qwen3.5 adds a
gated attention output and linear-attention (gated delta rule) layers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")
#: activation names of transformers configs -> the gated-MLP kernels that compute them: the
#: elementwise act-and-mul op and the gate-up GEMM with that epilogue (``tilegym.ops.library``)
GATED_ACTS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


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
    moe_block: str | None = None  # class suffix of the sparse MLP block (Qwen3-MoE, OLMoE,
    # Mixtral: "SparseMoeBlock"), patched by tilegym.transformers.moe_block; None: every MLP is
    # dense. A family whose every layer is sparse may have no dense <prefix>MLP class (Mixtral)
    # or name it as its sparse block ("MLP": gpt-oss's GptOssMLP), which is then not dense
    moe_renormalize: bool | None = None  # the top-k routing weights are divided by their sum:
    # None reads the router's norm_topk_prob (Qwen3-MoE, OLMoE); True always (Mixtral's router
    # has no switch; gpt-oss's softmax over the top-k logits is the same); False never
    residual_multiplier: bool = False  # each sub-block's output is scaled by the config's
    # residual_multiplier before its residual add, residual + out * m (Granite); pre-norm only
    rope_switch: str | None = None  # the attention's attribute that is false on layers without
    # RoPE (NoPE), which skip the rotation (SmolLM3: "use_rope", from config.no_rope_layers)
    clip_qkv: bool = False  # q, k and v are clamped to +-config.clip_qkv (when set) after the
    # q/k norms, before RoPE (OLMoE)
    moe_router: str = "gate"  # the MoE block's router attribute (gpt-oss: "router"); its linear
    # carries the bias it has (gpt-oss's router has one)
    moe_experts: str = "silu"  # the experts' form: "silu" (unbiased SwiGLU, [gate; up] rows
    # [E, 2I, H]) or "clamped" (gpt-oss: biased GEMMs, gate/up interleaved in a transposed
    # [E, H, 2I] weight, gate <= limit, |up| <= limit, gate * sigmoid(alpha * gate) * (up + 1)
    # with the experts' alpha and limit)
    sinks: bool = False  # the attention's per-head ``sinks`` logits join each softmax row and are
    # dropped (gpt-oss); handed to the attention function as ``s_aux``, as upstream does
    rope_half_table: bool = False  # the rotary tables hold head_dim / 2 columns and q/k rotate
    # by halves (gpt-oss); the RoPE kernels get them repeated to head_dim (the same rotation)
    moe_shared_expert: bool = False  # the sparse block also runs ``shared_expert`` (a dense MLP
    # of the family's class) scaled by sigmoid(``shared_expert_gate``(x)) and adds it (Qwen3-Next)
    attn_output_gate: bool = False  # q_proj yields [q; gate] per head (twice q's rows) and the
    # attention output is scaled by sigmoid(gate) before o_proj (Qwen3.5, Qwen3-Next)
    linear_attention: str | None = None  # class suffix of the linear-attention token mixer of
    # the layers that have one as ``linear_attn`` instead of ``self_attn`` (Qwen3.5:
    # "GatedDeltaNet"), patched by tilegym.transformers.linear_attention; None: none has one
    qk_norm_round_once: bool = False  # the whole-projection q/k norms (qk_norm_whole) multiply
    # the fp32 normalized row by the weight and round once (Olmo2RMSNorm, OLMo 3); else they
    # round before the weight (Llama's form: OLMoE). Read by the fused q/k norm + RoPE kernel
    forwards: Mapping[str, Callable] = field(default_factory=dict, compare=False)
    # the family's own forward builders by upstream class suffix ("RMSNorm", "MLP",
    # "Attention", "DecoderLayer", "MoeBlock"), each with the shared builder's signature: how an
    # experiment wires a new kernel into one family without touching the shared glue; also
    # "RotaryEmbedding" (no shared builder: built as builder(routes, family), patched with rope)
