"""The cuTile forward of a sparse mixture-of-experts MLP block (the ``SparseMoeBlock`` of
Qwen3-MoE, OLMoE and Mixtral, gpt-oss's ``GptOssMLP``).

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

gpt-oss (``Family.moe_router`` "router", ``Family.moe_experts`` "clamped"): the router's linear
has a bias, and its softmax over the top-k logits is the renormalized top-k of the softmax
(``moe_route`` with renormalization). Its experts have biased GEMMs and the clamped activation
(``moe_experts_bias``) on their weights relaid once into the row layout (``prepare``, kept by
the patch's ``FusedWeights``: one more copy of the expert weights while patched).

Qwen3-Next (``Family.moe_shared_expert``): the block also holds ``shared_expert`` (the family's
dense MLP, patched as such) and ``shared_expert_gate`` (a ``[1, H]`` linear); their
``sigmoid(gate(x)) * shared_expert(x)`` joins the residual the experts op adds (upstream adds it
to the experts' sum; the same terms, summed in another order); with ``swiglu`` the gate, its
product and that sum are one cuTile launch (``sigmoid_gate_add``).

Under ``linear`` the router module itself is not called, so its outputs are not recorded for
``output_router_logits`` (the training-time load-balancing loss); generation never asks for them.
The block tells ``routing_tap`` its choice instead, where the benchmark's routing report listens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tilegym.ops.library import moe_experts, moe_experts_bias, moe_route, sigmoid_gate_add
from tilegym.ops.moe_bias import ACT_CLAMPED, expert_rows
from tilegym.transformers import routing_tap
from tilegym.transformers.fused_weights import FusedWeights

EXPERT_FORMS = ("silu", "clamped")


def _rows(experts: torch.nn.Module, fused) -> tuple[torch.Tensor, ...]:
    """gpt-oss's experts in the kernels' row layout, built once per module."""

    def build():
        return expert_rows(
            experts.gate_up_proj,
            experts.gate_up_proj_bias,
            experts.down_proj,
            experts.down_proj_bias,
        )

    return fused.derived(experts, "expert_rows", build)


def _fused_experts(routes, family) -> bool:
    """True when the experts run as one cuTile op (``linear`` and ``swiglu``)."""
    if family.moe_experts not in EXPERT_FORMS:
        raise ValueError(f"Family.moe_experts {family.moe_experts!r} not one of {EXPERT_FORMS}")
    if family.moe_experts == "clamped":
        return routes.linear and routes.swiglu
    return routes.linear and routes.swiglu and routes.act == "silu"


def prepare(block: torch.nn.Module, routes, fused, family) -> None:
    """What the block's forward reads, built at patch time (before anything is compiled)."""
    if family.moe_experts == "clamped" and _fused_experts(routes, family):
        _rows(block.experts, fused)


def make_moe_block_forward(routes, gemm, family, fused=None) -> Callable:
    """``XSparseMoeBlock.forward`` with an optional ``residual`` (``routes``: the layer's
    ``Routes``; ``gemm``: ``tilegym.ops.library`` when ``routes.linear``; ``family``: its
    ``Family``, whose ``moe_renormalize`` says whether the top-k weights are renormalized,
    ``moe_router`` where the router is and ``moe_experts`` the experts' form; ``fused``: the
    patch's ``FusedWeights``, which keeps relaid expert weights)."""
    fused = FusedWeights() if fused is None else fused
    fused_experts = _fused_experts(routes, family)
    clamped = family.moe_experts == "clamped"
    renormalize = family.moe_renormalize

    def forward(
        self, hidden_states: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        res = None if residual is None else residual.reshape(-1, shape[-1])
        router, experts = getattr(self, family.moe_router), self.experts
        if family.moe_shared_expert:
            gate = self.shared_expert_gate
            g = gemm.linear(x, gate.weight, gate.bias) if routes.linear else gate(x)
            shared = self.shared_expert(x)
            if res is not None and routes.swiglu:  # the gate and the sum in one launch
                res = sigmoid_gate_add(res, shared, g)
            else:
                shared = torch.sigmoid(g) * shared
                res = shared if res is None else res + shared
        if routes.linear:
            logits = gemm.linear(x, router.weight, getattr(router, "bias", None))
            norm = router.norm_topk_prob if renormalize is None else renormalize
            weights, ids = moe_route(logits, router.top_k, bool(norm))
            routing_tap.chose(router, ids)
        else:
            _, weights, ids = router(x)
        if fused_experts and clamped:
            gu, gub, down, db = _rows(experts, fused)
            alpha, limit = experts.alpha, experts.limit
            out = moe_experts_bias(
                x, ids, weights, gu, gub, down, db, res, alpha=alpha, limit=limit, act=ACT_CLAMPED
            )
        elif fused_experts:
            out = moe_experts(x, ids, weights, experts.gate_up_proj, experts.down_proj, res)
        else:
            out = experts(x, ids.to(torch.int64), weights)
            if res is not None:
                out = res + out
        return out.reshape(shape)

    return forward
