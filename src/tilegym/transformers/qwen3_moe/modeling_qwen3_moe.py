"""cuTile forwards for Qwen3-MoE (architecture of Qwen/Qwen3-30B-A3B).

Qwen3's attention (per-head q/k RMSNorm before RoPE, one kernel with both the ``rope`` and
``rms_norm`` flags) with a sparse MLP block: a softmax top-k router over 128 experts, 8 per token,
renormalized (``norm_topk_prob``), and SwiGLU experts whose weights transformers 5 keeps packed
(``gate_up_proj`` ``[E, 2I, H]``, ``down_proj`` ``[E, H, I]``). The block runs on
``tilegym.transformers.moe_block`` (routing and experts as cuTile ops, the residual summed in);
layers the config makes dense (``mlp_only_layers``, ``decoder_sparse_step``) are ``Qwen3MoeMLP``,
which the shared MLP forward covers. Everything else is the shared Llama-style glue.
"""

from tilegym.transformers.family import Family

FAMILY = Family(
    "transformers.models.qwen3_moe.modeling_qwen3_moe",
    "Qwen3Moe",
    qk_norm=True,
    moe_block="SparseMoeBlock",
)
