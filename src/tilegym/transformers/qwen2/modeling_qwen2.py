"""cuTile forwards for Qwen2 (architecture of Qwen/Qwen2.5-1.5B).

Qwen2 is the Llama decoder layer with biases on the q, k and v projections: the packed QKV
weight carries the concatenated bias, which the GEMM adds in its epilogue.
"""

from tilegym.transformers.family import Family

FAMILY = Family("transformers.models.qwen2.modeling_qwen2", "Qwen2")
