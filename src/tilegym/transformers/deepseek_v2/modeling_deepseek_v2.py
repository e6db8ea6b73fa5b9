"""cuTile forwards for DeepSeek-V2 (architecture of deepseek-ai/DeepSeek-V2-Lite).

Llama's pre-norm layer (the shared RMSNorm, dense MLP and layer forwards) with DeepSeek's
multi-head latent attention and shared-expert sparse block, whose forwards are
``tilegym.transformers.mla``'s (named in ``forwards``): the fused first projection, the
interleaved RoPE on the shared kernel through permuted projection rows (its tables from one
kernel per step: the rotary module's forward), the MLA prefill and latent-cache decode kernels
(``tilegym.ops.mla``) over upstream's latent cache with the absorbed decode's per-head products
and the static cache's write on cuTile, the router's fp32 linear with the greedy top-k fused
after it (group-limited routing: PyTorch after the linear), the routed experts on the grouped
expert kernels and the shared experts adding the sum in their down GEMM. The first
``first_k_dense_replace`` layers are dense MLPs. The cache layout and what stays PyTorch:
``tilegym.transformers.mla`` and docs/DESIGN.md.
"""

from tilegym.transformers.family import Family
from tilegym.transformers.mla import (
    make_attention_forward,
    make_moe_forward,
    make_rotary_forward,
)

FAMILY = Family(
    "transformers.models.deepseek_v2.modeling_deepseek_v2",
    "DeepseekV2",
    qkv=("kv_a_proj_with_mqa",),  # one projection: nothing concatenated at patch time
    moe_block="Moe",
    forwards={
        "Attention": make_attention_forward,
        "MoeBlock": make_moe_forward,
        "RotaryEmbedding": make_rotary_forward,
    },
)
