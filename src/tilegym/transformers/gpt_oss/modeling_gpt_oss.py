"""cuTile forwards for gpt-oss (architecture of openai/gpt-oss-20b).

Llama's pre-norm layer with four differences the description names. The attention has learned
per-head sinks in its softmax (the sink kernels) and biased q/k/v/o projections (the fused QKV
GEMM and o_proj's GEMM add their biases in the epilogue); the layers alternate a 128-token
sliding window and full attention (``layer_types``; each attention's own ``sliding_window``;
under a static cache the sliding layers are ring buffers, as Gemma 3's and OLMo 3's). The YaRN
rotary tables are half-width and q/k rotate by halves: the RoPE kernels get them repeated. Every
MLP is a sparse block (``GptOssMLP``): a biased router, top-4 of 32 experts with a softmax over
the four logits, and experts whose gate and up are interleaved in one weight, both GEMMs biased,
gated by ``min(g, 7) * sigmoid(1.702 * min(g, 7)) * (clamp(u, -7, 7) + 1)``.
"""

from tilegym.transformers.family import Family

FAMILY = Family(
    "transformers.models.gpt_oss.modeling_gpt_oss",
    "GptOss",
    moe_block="MLP",
    moe_renormalize=True,
    moe_router="router",
    moe_experts="clamped",
    sinks=True,
    rope_half_table=True,
)
