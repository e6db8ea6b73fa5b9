"""cuTile forwards for Qwen3 (architecture of Qwen/Qwen3-0.6B).

Qwen3 is the Llama decoder layer plus a per-head RMSNorm on q and k before RoPE; with both the
``rope`` and ``rms_norm`` flags those norms, the head transpose and the rotation run as one
kernel (``tilegym.ops.rope.qk_norm_rope``). Everything else is the shared Llama-style glue.
"""

from tilegym.transformers.family import Family

FAMILY = Family("transformers.models.qwen3.modeling_qwen3", "Qwen3", qk_norm=True)
