"""cuTile forwards for Llama (architecture of meta-llama/Llama-3.2-1B).

Llama's decoder layer is the one the shared Llama-style glue (``tilegym.transformers.decoder``)
is written for: the description below names only where its upstream classes live.
"""

from tilegym.transformers.family import Family

FAMILY = Family("transformers.models.llama.modeling_llama", "Llama")
