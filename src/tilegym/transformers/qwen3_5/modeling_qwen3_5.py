"""cuTile forwards for Qwen3.5 (the text architecture of Qwen/Qwen3.5-0.8B).

The text model (``config.model_type`` ``qwen3_5_text``, ``Qwen3_5ForCausalLM``; the multimodal
``qwen3_5`` is not patched) is hybrid: ``layer_types`` gives three linear-attention layers per
full-attention layer. A linear-attention layer's mixer (``linear_attn``, a gated delta net) runs
on the gated-delta-rule, causal-conv1d and gated-RMSNorm ops
(``tilegym.transformers.linear_attention``), its four input projections as one GEMM and
out_proj as the GEMM that adds the residual; its conv and recurrent states stay in the cache
upstream made (a static cache's, updated in place). The full-attention layers are the shared
glue with the gated output (q_proj holds [q; gate] per head, the output is scaled by
sigmoid(gate) before o_proj) and per-head q/k norms. Every RMSNorm but the gated one is
zero-centred (fp32, ``1 + weight``, rounded once), as Gemma's.

Rotary: partial (0.25 of the 256-wide head). The M-RoPE tables stay upstream
(``Qwen3_5TextRotaryEmbedding`` takes the T/H/W position rows and picks the frequencies of
each section from its row); the layers get those tables and rotate the first 64 dims in the
half-split layout (``apply_rotary_pos_emb``) on the RoPE kernel, so whatever the rows hold
(equal for text) the rotation is upstream's. Partial tables keep the q/k norms and the
rotation as separate kernels (the fused one rotates whole heads).
"""

from tilegym.transformers.family import Family

MODEL_TYPE = "qwen3_5_text"

FAMILY = Family(
    "transformers.models.qwen3_5.modeling_qwen3_5",
    "Qwen3_5",
    qk_norm=True,
    norm_unit_offset=True,
    attn_output_gate=True,
    linear_attention="GatedDeltaNet",
)
