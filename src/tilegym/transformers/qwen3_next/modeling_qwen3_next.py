"""cuTile forwards for Qwen3-Next (architecture of Qwen/Qwen3-Next-80B-A3B-Instruct).

Qwen3.5's hybrid layers (three gated delta nets per gated full-attention layer, zero-centred
norms, per-head q/k norms, partial rotary; ``tilegym.transformers.qwen3_5``) with two
differences. Its gated delta nets pack q, k, v, z per key head into ``in_proj_qkvz`` and b, a
into ``in_proj_ba``: the glue relays those rows once into Qwen3.5's order, so one GEMM and the
same splits serve both. Its MLPs are sparse MoE blocks (softmax top-k router with
``norm_topk_prob``, packed SwiGLU experts) on the shared MoE ops, plus a shared expert (the
family's dense MLP) scaled by ``sigmoid(shared_expert_gate(x))`` and added with the residual.
"""

from tilegym.transformers.family import Family

FAMILY = Family(
    "transformers.models.qwen3_next.modeling_qwen3_next",
    "Qwen3Next",
    qk_norm=True,
    norm_unit_offset=True,
    moe_block="SparseMoeBlock",
    moe_shared_expert=True,
    attn_output_gate=True,
    linear_attention="GatedDeltaNet",
)
