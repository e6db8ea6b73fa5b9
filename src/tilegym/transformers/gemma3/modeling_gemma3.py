"""cuTile forwards for Gemma 3 (architecture of google/gemma-3-1b-it).

The text model (``config.model_type`` ``gemma3_text``; the multimodal ``gemma3`` is not
patched) differs from Llama in three ways the description names. Every RMSNorm is Gemma's
(fp32, scaled by ``1 + weight``, rounded once), the q/k norms included. Each sub-block has a
norm before and after it (sandwich norms): the output norm, the residual add and the next
input norm run as one kernel. The MLP is GeGLU with the tanh GELU (``gelu_pytorch_tanh``), in
the gate-up GEMM's epilogue or the GELU-tanh-and-mul kernel.

What stays upstream: the scaled embedding (``Gemma3TextScaledWordEmbedding``: the lookup times
sqrt(hidden), left to PyTorch), the rotary tables (one per layer type: local base 1e4 for
sliding-window layers, global 1e6 for full-attention layers, computed by the model and handed
to each layer as its type's table; the layer forwards pass them on), the masks of both layer
types and the final logit soft-capping after ``lm_head``. ``query_pre_attn_scalar`` reaches the
attention as the module's ``scaling`` and each layer's window as its ``sliding_window``.
"""

from tilegym.transformers.family import Family

MODEL_TYPE = "gemma3_text"

FAMILY = Family(
    "transformers.models.gemma3.modeling_gemma3",
    "Gemma3",
    qk_norm=True,
    norm_unit_offset=True,
    sandwich_norm=True,
    gated_act="gelu_tanh",
)
