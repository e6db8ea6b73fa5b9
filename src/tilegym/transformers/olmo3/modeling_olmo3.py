"""cuTile forwards for OLMo 3 (architecture of allenai/Olmo-3-1025-7B).

OLMo 2's layer (norms after attention and after the MLP, q/k RMSNorm over the whole
projection) with sliding-window attention on three of every four layers (``layer_types``).
The window is the attention's own ``sliding_window`` attribute (None on full-attention layers),
which the attention kernels read per layer; under a static cache the sliding layers are ring
buffers (``kv_update``), as Gemma 3's. The rotary tables (one per layer type: YaRN on the
full-attention layers of the published model) are the upstream model's, handed to each layer.
"""

from tilegym.transformers.family import Family

FAMILY = Family(
    "transformers.models.olmo3.modeling_olmo3",
    "Olmo3",
    qk_norm=True,
    qk_norm_whole=True,
    qk_norm_round_once=True,
    post_norm=True,
)
"""OLMo 3 (allenai/Olmo-3-1025-7B architecture): the family description."""
