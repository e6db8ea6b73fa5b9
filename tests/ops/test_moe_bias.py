"""gpt-oss's router and experts (`tilegym.ops.moe_bias`, `tilegym.ops.moe.moe_route`) against
fp32.

CPU: the experts reference on the row layout (``expert_rows``) equals transformers'
``GptOssExperts.forward`` on its interleaved layout; the clamp binds in those inputs; the
renormalized top-k route equals ``GptOssTopKRouter`` (softmax over the top-k logits); the CPU
custom op; the AOT signatures (one per biased GEMM compiles for sm_90, slow).
GPU: parity against fp32 at decode and prefill token counts under every tile config, odd
shapes, NaN-poisoned outputs and workspaces, the SiLU form, ids outside the experts.
"""

from __future__ import annotations

import io

import pytest
import torch

from tilegym.ops import moe
from tilegym.ops import moe_bias as mb
from tilegym.ops.testing import assert_close_rel


def _gpt_oss_experts(e, h, inter, seed=0):
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    torch.manual_seed(seed)
    cfg = GptOssConfig(hidden_size=h, intermediate_size=inter, num_local_experts=e)
    experts = GptOssExperts(cfg)
    with torch.no_grad():
        for p in experts.parameters():
            p.copy_(torch.randn(p.shape) * 0.5)
    return experts


def _routing(t, e, k, generator=None, device="cpu"):
    logits = torch.randn(t, e, generator=generator, device=device)
    weights, ids = torch.topk(logits.softmax(-1), k, dim=-1)
    return ids.to(torch.int32), weights


def test_reference_is_transformers_gpt_oss_experts():
    experts = _gpt_oss_experts(6, 32, 24)
    x = torch.randn(9, 32) * 2
    ids, weights = _routing(9, 6, 3)
    with torch.no_grad():
        want = experts(x, ids.long(), weights)
        rows = mb.expert_rows(
            experts.gate_up_proj,
            experts.gate_up_proj_bias,
            experts.down_proj,
            experts.down_proj_bias,
        )
        gu = x @ experts.gate_up_proj[0] + experts.gate_up_proj_bias[0]
    assert (gu[..., ::2] > 7).any() and (gu[..., 1::2].abs() > 7).any()  # the clamps bind
    got = mb.moe_experts_bias_reference(x, ids, weights, *rows, alpha=1.702, limit=7.0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    res = torch.randn(9, 32)
    got = mb.moe_experts_bias_reference(x, ids, weights, *rows, res, alpha=1.702, limit=7.0)
    torch.testing.assert_close(got, want + res, rtol=1e-5, atol=1e-4)


def test_expert_rows_layout():
    """Gate rows first, then up rows, each row an output feature over the hidden size."""
    experts = _gpt_oss_experts(2, 8, 4)
    gu, gub, down, db = mb.expert_rows(
        experts.gate_up_proj, experts.gate_up_proj_bias, experts.down_proj, experts.down_proj_bias
    )
    assert gu.shape == (2, 8, 8) and gub.shape == (2, 8) and down.shape == (2, 8, 4)
    assert torch.equal(gu[1, 0], experts.gate_up_proj[1, :, 0])  # gate 0
    assert torch.equal(gu[1, 4], experts.gate_up_proj[1, :, 1])  # up 0
    assert torch.equal(gu[1, 5], experts.gate_up_proj[1, :, 3])  # up 1
    assert torch.equal(gub[0, 4:], experts.gate_up_proj_bias[0, 1::2])
    assert torch.equal(down[0].T, experts.down_proj[0]) and torch.equal(db, experts.down_proj_bias)


def test_renormalized_route_is_gpt_oss_router():
    """Softmax over all experts, top-k, renormalized = softmax over the top-k logits."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter

    torch.manual_seed(3)
    router = GptOssTopKRouter(GptOssConfig(hidden_size=16, num_local_experts=32))
    with torch.no_grad():
        router.weight.normal_()
        router.bias.normal_()
        x = torch.randn(21, 16)
        logits, want_w, want_ids = router(x)
    got_w, got_ids = moe.moe_route_reference(logits, router.top_k, True)
    assert torch.equal(got_ids.long(), want_ids)
    torch.testing.assert_close(got_w, want_w, rtol=1e-6, atol=1e-7)


def test_the_cpu_op_is_the_reference():
    from tilegym.ops import library

    experts = _gpt_oss_experts(4, 16, 8, seed=2)
    x, res = torch.randn(5, 16), torch.randn(5, 16)
    ids, weights = _routing(5, 4, 2)
    rows = mb.expert_rows(
        experts.gate_up_proj, experts.gate_up_proj_bias, experts.down_proj, experts.down_proj_bias
    )
    got = library.moe_experts_bias(x, ids, weights, *rows, res, alpha=1.5, limit=3.0)
    want = mb.moe_experts_bias_reference(x, ids, weights, *rows, res, alpha=1.5, limit=3.0)
    torch.testing.assert_close(got, want)


@pytest.mark.slow
def test_aot_signatures_compile_for_sm90():
    from cuda.tile.compilation import export_kernel

    sigs = mb.aot_signatures()
    biased = [
        k for k in sigs if k not in moe.aot_signatures(32, 4, 2880) and len(sigs[k]) > 0
    ]  # the hinted variants of the two new kernels
    assert len(biased) >= 2
    for kernel in biased[:2]:
        buf = io.BytesIO()
        export_kernel(kernel, [sigs[kernel][0]], buf, gpu_code="sm_90", output_format="cubin")
        assert len(buf.getvalue()) > 1000


# ------------------------------------------------------------------------------------------ GPU


CONFIGS = [
    moe.MoeConfig(8, 64, 64, 128, swap=True, dispatch="direct", occupancy=2),
    moe.MoeConfig(8, 64, 64, 128, swap=True, dispatch="per_slot", occupancy=2),
    moe.MoeConfig(16, 64, 64, 128, swap=True),
    moe.MoeConfig(32, 64, 128, 64, swap=True),
    moe.MoeConfig(64, 128, 128, 64),
]


def _case(t, e, k, h, inter, gen, cfg=None, act=mb.ACT_CLAMPED, residual=True):
    dev = "cuda"
    x = (torch.randn(t, h, device=dev, generator=gen) * 2).bfloat16()
    gu = (torch.randn(e, 2 * inter, h, device=dev, generator=gen) / h**0.5).bfloat16()
    gub = torch.randn(e, 2 * inter, device=dev, generator=gen).bfloat16()
    down = (torch.randn(e, h, inter, device=dev, generator=gen) / inter**0.5).bfloat16()
    db = torch.randn(e, h, device=dev, generator=gen).bfloat16()
    ids, weights = _routing(t, e, k, gen, dev)
    weights = weights.bfloat16()
    res = torch.randn(t, h, device=dev, generator=gen).bfloat16() if residual else None
    got = mb.moe_experts_bias(
        x, ids, weights, gu, gub, down, db, res, alpha=1.702, limit=7.0, act=act, config=cfg
    )
    want = mb.moe_experts_bias_reference(
        x, ids, weights, gu, gub, down, db, res, alpha=1.702, limit=7.0, act=act
    )
    assert_close_rel(got, want)
    return got


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 3, 8, 37, 2048])
def test_gpt_oss_20b_shapes(t, gen, poison_empty):
    """gpt-oss-20b's experts (32 x 2880 x 2880, top-4); outputs and workspaces NaN-poisoned."""
    _case(t, 32, 4, 2880, 2880, gen)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", CONFIGS, ids=repr)
@pytest.mark.parametrize("t", [1, 5, 300])
def test_odd_shapes_every_config(cfg, t, gen, poison_empty):
    _case(t, 6, 2, 200, 72, gen, cfg=cfg)


@pytest.mark.gpu
def test_silu_form_and_no_residual(gen, poison_empty):
    _case(37, 8, 2, 256, 128, gen, act=mb.ACT_SILU, residual=False)


@pytest.mark.gpu
def test_biases_change_the_output(gen):
    """A kernel dropping either bias fails: zeroing them changes the result."""
    t, e, k, h, inter = 8, 4, 2, 128, 64
    x = torch.randn(t, h, device="cuda", generator=gen).bfloat16()
    gu = (torch.randn(e, 2 * inter, h, device="cuda", generator=gen) / h**0.5).bfloat16()
    down = (torch.randn(e, h, inter, device="cuda", generator=gen) / inter**0.5).bfloat16()
    gub = torch.randn(e, 2 * inter, device="cuda", generator=gen).bfloat16()
    db = torch.randn(e, h, device="cuda", generator=gen).bfloat16()
    ids, weights = _routing(t, e, k, gen, "cuda")
    weights = weights.bfloat16()
    a = mb.moe_experts_bias(x, ids, weights, gu, gub, down, db, alpha=1.702, limit=7.0)
    for zg, zd in ((True, False), (False, True)):
        b = mb.moe_experts_bias(
            x,
            ids,
            weights,
            gu,
            torch.zeros_like(gub) if zg else gub,
            down,
            torch.zeros_like(db) if zd else db,
            alpha=1.702,
            limit=7.0,
        )
        assert (a.float() - b.float()).abs().max() > 1e-2
