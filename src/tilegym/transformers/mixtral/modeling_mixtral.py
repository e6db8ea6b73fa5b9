"""cuTile forwards for Mixtral (architecture of mistralai/Mixtral-8x7B-v0.1).

Mistral's attention (the config's ``sliding_window`` goes to the attention kernels when set)
with a sparse MoE block in every layer: a softmax top-2 router over 8 experts whose two weights
are always renormalized to sum 1 (the router has no ``norm_topk_prob`` switch), and packed
SwiGLU experts, on the shared MoE forward (``tilegym.transformers.moe_block``) and Qwen3-MoE's
expert kernels. Mixtral has no dense MLP class.
"""

from tilegym.transformers.family import Family

FAMILY = Family(
    "transformers.models.mixtral.modeling_mixtral",
    "Mixtral",
    config_window=True,
    moe_block="SparseMoeBlock",
    moe_renormalize=True,
)
"""Mixtral (mistralai/Mixtral-8x7B-v0.1 architecture): the family description."""
