"""cuTile forwards for SmolLM3 (architecture of HuggingFaceTB/SmolLM3-3B).

SmolLM3 is the Llama decoder layer with NoPE layers: where ``config.no_rope_layers`` is 0
(every fourth layer of the published model) the attention's ``use_rope`` is 0 and the layer
skips RoPE, which the description names (``rope_switch``). The optional sliding window
(``use_sliding_window``, ``sliding_window``, ``layer_types``) is the attention's own
``sliding_window`` attribute, which the attention kernels read per layer; the published model
has it off.
"""

from tilegym.transformers.family import Family

FAMILY = Family("transformers.models.smollm3.modeling_smollm3", "SmolLM3", rope_switch="use_rope")
