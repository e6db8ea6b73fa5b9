"""cuTile forwards for Phi-3 (architecture of microsoft/Phi-3.5-mini-instruct).

Phi-3 stores its projections packed: ``qkv_proj`` is ``[q; k; v]`` and ``gate_up_proj`` is
``[gate; up]``, the layouts the fused GEMMs take, so its weights are used as they are (no
repacking). Its head dim (96) runs in the attention kernels' 128-wide tiles. Its 262144-token
sliding window never binds below that length, but makes every layer of a static cache a
``StaticSlidingWindowLayer``, whose decode masks carry a device position
(``tilegym.transformers.attention.compileable_decode_mask``).
"""

from tilegym.transformers.family import Family

FAMILY = Family(
    "transformers.models.phi3.modeling_phi3",
    "Phi3",
    qkv=("qkv_proj",),
    gate_up=("gate_up_proj",),
    act="activation_fn",
    config_window=True,
)
