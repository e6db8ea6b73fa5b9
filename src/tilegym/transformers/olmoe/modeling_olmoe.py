"""cuTile forwards for OLMoE (architecture of allenai/OLMoE-1B-7B-0924).

The Llama pre-norm layer with OLMo 2's q/k RMSNorm over the whole projection, an optional clamp
of q, k and v to +-``config.clip_qkv`` after those norms (``clip_qkv``; unset in the published
model), and a sparse MoE block in every layer: a softmax top-k router (64 experts, 8 a token,
the top-k weights not renormalized: ``norm_topk_prob`` false) and packed SwiGLU experts, on the
shared MoE forward (``tilegym.transformers.moe_block``) and Qwen3-MoE's expert kernels.
"""

from tilegym.transformers.family import Family

FAMILY = Family(
    "transformers.models.olmoe.modeling_olmoe",
    "Olmoe",
    qk_norm=True,
    qk_norm_whole=True,
    moe_block="SparseMoeBlock",
    clip_qkv=True,
)
"""OLMoE (allenai/OLMoE-1B-7B-0924 architecture): the family description."""
