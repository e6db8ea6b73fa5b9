"""The cuTile forward of a sparse mixture-of-experts MLP block (Qwen3-MoE's ``SparseMoeBlock``).

A family with such a block names its class suffix in ``Family.moe_block``. The block holds a
router ``gate`` (``weight`` ``[E, H]``, ``top_k``, ``norm_topk_prob``) and ``experts`` with every
expert's weights packed as transformers 5 stores them: ``gate_up_proj`` ``[E, 2I, H]`` (the gate
rows, then the up rows) and ``down_proj`` ``[E, H, I]``. The shared decoder-layer forward calls
``self.mlp(normed, residual=hidden_states)``, so the patched block takes the residual and returns
the layer's output, ``residual + MoE(x)``.

- ``linear``: the router logits are a cuTile GEMM, and the softmax, top-k and renormalization
  run as the cuTile routing op (``moe_route``); without it the upstream router runs.
- ``linear`` and ``swiglu`` (SiLU experts): the experts run as ``moe_experts`` (the gate/up
  GEMM with SiLU, the down GEMM weighted by the routing weights, summed per token with the
  residual); otherwise the upstream experts module runs and the residual is a PyTorch add.

Under ``linear`` the router module itself is not called, so its outputs are not recorded for
``output_router_logits`` (the training-time load-balancing loss); generation never asks for them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tilegym.ops.library import moe_experts, moe_route


def make_moe_block_forward(routes, gemm) -> Callable:
    """``XSparseMoeBlock.forward`` with an optional ``residual`` (``routes``: the layer's
    ``Routes``; ``gemm``: ``tilegym.ops.library`` when ``routes.linear``)."""
    # the experts kernels compute SiLU-gated experts (``Routes.act``)
    fused_experts = routes.linear and routes.swiglu and routes.act == "silu"

    def forward(
        self, hidden_states: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        res = None if residual is None else residual.reshape(-1, shape[-1])
        router, experts = self.gate, self.experts
        if routes.linear:
            logits = gemm.linear(x, router.weight)
            weights, ids = moe_route(logits, router.top_k, bool(router.norm_topk_prob))
        else:
            _, weights, ids = router(x)
        if fused_experts:
            out = moe_experts(x, ids, weights, experts.gate_up_proj, experts.down_proj, res)
        else:
            out = experts(x, ids.to(torch.int64), weights)
            if res is not None:
                out = res + out
        return out.reshape(shape)

    return forward
