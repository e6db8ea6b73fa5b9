"""A branch-free frequency update for longrope rotary embeddings (Phi-3.5), so a static-cache
decode step compiles into one graph.

transformers 5.17's ``dynamic_rope_update`` picks longrope's short or long frequencies with
``if max(position_ids) + 1 > original_max_position_embeddings``: a tensor read on the host.
Under ``torch.compile`` that is a graph break, and the rest of the model's forward runs as
several graphs with eager code and a device sync between them every decode step (phi-3.5 on
the H200: about 4 syncs a step, 548 ``cudaStreamSynchronize`` calls in 128 tokens). Later
transformers select with ``torch.where`` and copy into the buffer in place; this is that
selection, for the versions that still branch. Same frequencies, same outputs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch


def branch_free_forward(rotary: torch.nn.Module) -> Callable | None:
    """An instance ``forward`` for ``rotary`` if it is a longrope embedding whose upstream
    forward is wrapped by ``dynamic_rope_update``, else None (nothing to replace)."""
    if getattr(rotary, "rope_type", None) != "longrope":
        return None
    inner = inspect.unwrap(type(rotary).forward)  # under no_grad and dynamic_rope_update
    if inner is type(rotary).forward or not hasattr(rotary, "original_inv_freq"):
        return None
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    original_max = rotary.config.rope_parameters["original_max_position_embeddings"]
    long_inv_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](
        rotary.config, rotary.inv_freq.device, seq_len=original_max + 1
    )
    per_device: dict[torch.device, torch.Tensor] = {}

    @torch.no_grad()
    def forward(self, x, position_ids):
        long = per_device.get(x.device)
        if long is None:
            long = per_device[x.device] = long_inv_freq.to(x.device)
        longer = position_ids.max() + 1 > original_max
        self.inv_freq.copy_(torch.where(longer, long, self.original_inv_freq.to(x.device)))
        return inner(self, x, position_ids)

    return forward
