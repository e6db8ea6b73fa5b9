"""cuTile forwards for Mistral (architecture of mistralai/Mistral-7B-v0.3).

Mistral's decoder layer is Llama's (a sliding window, when the config sets one, goes to the
attention kernels through the mask); the shared Llama-style glue serves it as it is.
"""

from tilegym.transformers.family import Family

FAMILY = Family("transformers.models.mistral.modeling_mistral", "Mistral", config_window=True)
