"""cuTile forwards for Qwen3 (architecture of Qwen/Qwen3-0.6B).

Qwen3 is the Llama decoder layer plus a per-head RMSNorm on q and k before RoPE; with both the
``rope`` and ``rms_norm`` flags those norms, the head transpose and the rotation run as one
kernel (``tilegym.ops.rope.qk_norm_rope``). Everything else is shared with Llama.
"""

from __future__ import annotations

from tilegym.transformers.llama.modeling_llama import (
    GATE_UP,
    QKV,
    FusedWeights,
    Routes,
    cache_update_takes_kwargs,
    make_attention_forward,
    make_decoder_layer_forward,
    make_mlp_forward,
    make_rms_norm_forward,
)

UPSTREAM_MODULE = "transformers.models.qwen3.modeling_qwen3"
CLASS_PREFIX = "Qwen3"
HAS_QK_NORM = True

__all__ = [
    "GATE_UP",
    "QKV",
    "cache_update_takes_kwargs",
    "CLASS_PREFIX",
    "HAS_QK_NORM",
    "UPSTREAM_MODULE",
    "FusedWeights",
    "Routes",
    "make_attention_forward",
    "make_decoder_layer_forward",
    "make_mlp_forward",
    "make_rms_norm_forward",
]
