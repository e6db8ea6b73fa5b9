"""cuTile forwards for DeepSeek-V3 (architecture of deepseek-ai/DeepSeek-V3).

DeepSeek-V2's layer (``tilegym.transformers.mla``'s attention and sparse-block forwards on the
shared Llama-style glue) with V3's differences: RoPE from ``(cos, sin)`` tables, interleaved
pairs with ``rope_interleave`` (the projection rows permuted as V2's; upstream's rotation already
writes its output split into halves, so the cache holds exactly upstream's rope key) or by
halves without it; the softmax scale with YaRN's mscale; a sigmoid router whose choice adds
``e_score_correction_bias``, keeps the ``topk_group`` groups with the largest sum of their two
best biased scores and renormalizes the unbiased scores of its top-k (``ops.deepseek_route``,
PyTorch), times ``routed_scaling_factor``; shared experts; the first ``first_k_dense_replace``
layers dense.
"""

from tilegym.transformers.family import Family
from tilegym.transformers.mla import make_attention_forward, make_moe_forward

FAMILY = Family(
    "transformers.models.deepseek_v3.modeling_deepseek_v3",
    "DeepseekV3",
    qkv=("kv_a_proj_with_mqa",),  # one projection: nothing concatenated at patch time
    moe_block="MoE",
    forwards={"Attention": make_attention_forward, "MoeBlock": make_moe_forward},
)
