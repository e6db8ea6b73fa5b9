"""cuTile forwards for OLMo 2 (architecture of allenai/OLMo-2-0425-1B).

OLMo 2 normalizes after each sub-block instead of before (``residual + norm(attention(x))``,
then the same for the MLP) and its q/k RMSNorm spans the whole projection before RoPE. Both
are fields of the description; the norms run on the cuTile RMSNorm kernel, the adds stay
PyTorch's. Scaffolded by ``tilegym-bot model init olmo2`` from the preset's config.
"""

from tilegym.transformers.family import Family

FAMILY = Family(
    "transformers.models.olmo2.modeling_olmo2",
    "Olmo2",
    qk_norm=True,
    qk_norm_whole=True,
    qk_norm_round_once=True,
    post_norm=True,
)
