"""The cuTile forward of a sparse mixture-of-experts MLP block (the ``SparseMoeBlock`` of
Qwen3-MoE, OLMoE and Mixtral).

A family with such a block names its class suffix in ``Family.moe_block``. The block holds a
router ``gate`` (``weight`` ``[E, H]``, ``top_k``; whether the top-k weights are renormalized
is ``Family.moe_renormalize``, or the router's ``norm_topk_prob`` where that is None: Mixtral
always renormalizes, OLMoE-1B-7B does not) and ``experts`` with every
expert's weights packed as transformers 5 stores them: ``gate_up_proj`` ``[E, 2I, H]`` (the gate
rows, then the up rows) and ``down_proj`` ``[E, H, I]``. The shared decoder-layer forward calls
``self.mlp(normed, residual=hidden_states)``, so the patched block takes the residual and returns
the layer's output, ``residual + MoE(x)``.

- ``linear``: the router logits are a cuTile GEMM, and the softmax, top-k and renormalization
  run as the cuTile routing op (``moe_route``); without it the upstream router runs.
- ``linear`` and ``swiglu`` (SiLU experts): the experts run as ``moe_experts`` (the gate/up
  GEMM with SiLU, the down GEMM weighted by the routing weights, summed per token with the
  residual); otherwise the upstream experts module runs and the residual is a PyTorch add.

The routing weights come out in the logits' dtype, as Qwen3-MoE's and OLMoE's routers cast
them; Mixtral's router keeps them in fp32, so in bf16 the cuTile route rounds them once more
than upstream does (the same values in fp32). Mixtral's training-time router jitter is not
applied (``router_jitter_noise`` acts only in training mode; generation never trains).

Under ``linear`` the router module itself is not called, so its outputs are not recorded for
``output_router_logits`` (the training-time load-balancing loss); generation never asks for them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tilegym.ops.library import moe_experts, moe_route


def make_moe_block_forward(routes, gemm, family) -> Callable:
    """``XSparseMoeBlock.forward`` with an optional ``residual`` (``routes``: the layer's
    ``Routes``; ``gemm``: ``tilegym.ops.library`` when ``routes.linear``; ``family``: its
    ``Family``, whose ``moe_renormalize`` says whether the top-k weights are renormalized)."""
    # the experts kernels compute SiLU-gated experts (``Routes.act``)
    fused_experts = routes.linear and routes.swiglu and routes.act == "silu"
    renormalize = family.moe_renormalize

    def forward(
        self, hidden_states: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        res = None if residual is None else residual.reshape(-1, shape[-1])
        router, experts = self.gate, self.experts
        if routes.linear:
            logits = gemm.linear(x, router.weight)
            norm = router.norm_topk_prob if renormalize is None else renormalize
            weights, ids = moe_route(logits, router.top_k, bool(norm))
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
