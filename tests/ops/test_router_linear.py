"""A MoE router's fp32 linear of bf16/fp16 operands and DeepSeek-V2's greedy routing fused after
it (`tilegym.ops.router_linear`).

CPU: the references equal transformers' ``DeepseekV2TopkRouter`` (its logits; its greedy
weights and experts, as the experts see them); the custom ops' CPU implementations and fakes
pass opcheck; bad inputs get one clear error; the split plan covers every K tile once; every
launch fits a declared AOT signature; the GEMM compiles for sm_90 on tensor cores (slow).
GPU: logits and routing against fp32 references on fresh random inputs, odd token counts,
expert counts that are no power of two, a hidden size no multiple of the K step, NaN-poisoned
outputs, and a routing whose softmax is saturated (scores that underflow).
"""

from __future__ import annotations

import pytest
import torch

from tilegym.ops import router_linear as rl
from tilegym.ops.deepseek_route import dense_weights
from tilegym.ops.testing import assert_close_rel, launch_fits


def _router(e, k, hidden, scaling, gen):
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    cfg = DeepseekV2Config(
        hidden_size=hidden,
        n_routed_experts=e,
        num_experts_per_tok=k,
        routed_scaling_factor=scaling,
        topk_method="greedy",
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    router = DeepseekV2TopkRouter(cfg)
    with torch.no_grad():
        router.weight.normal_(0, 0.3, generator=gen)
    return router


@pytest.mark.parametrize(("e", "k", "scaling"), [(64, 6, 1.0), (12, 3, 2.5)])
def test_references_are_the_upstream_router(e, k, scaling):
    gen = torch.Generator().manual_seed(e)
    router = _router(e, k, 48, scaling, gen)
    x = torch.randn(37, 48, generator=gen)
    with torch.no_grad():
        logits, weights, ids = router(x)
    w = router.weight.detach()
    torch.testing.assert_close(rl.reference_router_logits(x, w), logits, rtol=0, atol=0)
    got_w, got_ids = rl.reference_router_greedy(x, w, k, scaling)
    assert got_w.dtype == torch.float32 and got_ids.dtype == torch.int32
    torch.testing.assert_close(dense_weights(got_w, got_ids, e), dense_weights(weights, ids, e))
    # best first, as the experts kernels and the fused kernel give them
    assert (got_w[:, :-1] >= got_w[:, 1:]).all()


def test_cpu_ops_pass_opcheck_and_equal_the_references():
    from tilegym.ops import library

    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(9, 64, generator=gen), torch.randn(16, 64, generator=gen)
    torch.testing.assert_close(library.router_logits(x, w), rl.reference_router_logits(x, w))
    got = library.router_greedy(x, w, 4, 1.5)
    want = rl.reference_router_greedy(x, w, 4, 1.5)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    xb, wb = x.bfloat16(), w.bfloat16()
    torch.library.opcheck(library.router_logits_op, (xb, wb))
    torch.library.opcheck(library.router_greedy_op, (xb, wb, 4, 1.5))


@pytest.mark.parametrize(
    ("x", "w", "dtypes", "words"),
    [
        ((4, 64), (16, 32), (torch.bfloat16, torch.bfloat16), "expected"),
        ((4, 2, 64), (16, 64), (torch.bfloat16, torch.bfloat16), "expected"),
        ((4, 64), (16, 64), (torch.bfloat16, torch.float32), "bf16/fp16"),
        ((4, 64), (16, 64), (torch.float32, torch.float32), "bf16/fp16"),
        ((4, 64), (16, 64), (torch.bfloat16, torch.bfloat16), "CUDA"),
    ],
)
def test_bad_inputs_get_one_clear_error(x, w, dtypes, words):
    args = (torch.zeros(x, dtype=dtypes[0]), torch.zeros(w, dtype=dtypes[1]))
    with pytest.raises(rl.RouterInputError, match=words):
        rl.router_logits(*args)


@pytest.mark.parametrize("m_blocks", [1, 2, 32, 47, 200])
@pytest.mark.parametrize("k_tiles", [1, 5, 16, 100])
def test_split_plan_covers_every_k_tile_once(m_blocks, k_tiles):
    splits, per = rl.plan_splits(m_blocks, k_tiles, 132)
    assert 1 <= splits <= rl.MAX_SPLITS
    assert splits * per >= k_tiles > (splits - 1) * per  # no empty split, no tile left out
    if m_blocks == 1 and k_tiles == 16:
        assert splits == 16  # decode: the router weight spread over 16 blocks


@pytest.mark.parametrize("t", [1, 8, 9, 2048, 3001])
@pytest.mark.parametrize("route", [None, (6, 1.0)])
def test_every_launch_fits_a_declared_signature(t, route):
    """DeepSeek-V2-Lite's router (64 experts, hidden 2048) at decode and prefill token counts:
    the launch arguments, computed without a GPU, against ``aot_signatures``."""
    sigs = rl.aot_signatures(64, 6)
    x, w = torch.zeros(t, 2048, dtype=torch.bfloat16), torch.zeros(64, 2048, dtype=torch.bfloat16)
    result, todo = rl.launches(x, w, route, 132)
    kernels = [kernel for kernel, *_ in todo]
    assert kernels == [rl.router_logits_partial_kernel, rl.router_logits_route_kernel]
    for kernel, _, args, _ in todo:
        assert any(launch_fits(s, args) for s in sigs[kernel]), args[3:]
    (_, grid, _, dependent), (_, rgrid, rargs, rdependent) = todo
    assert not dependent and rdependent  # the reduction waits on the GEMM's partials
    assert grid[0] * rl.token_tile(t) >= t and rgrid[0] * rargs[7] >= t
    shapes = [tuple(r.shape) for r in (result if route else (result,))]
    assert shapes == ([(t, 6), (t, 6)] if route else [(t, 64)])


@pytest.mark.slow
def test_signatures_compile_for_sm90_and_the_gemm_runs_on_tensor_cores():
    from tilegym.kernel_inventory.compile import compile_kernel, toolchain_problem
    from tilegym.kernel_inventory.remarks import kernel_remarks, scalar_mmas

    if toolchain_problem():
        pytest.skip(toolchain_problem())
    sigs = rl.aot_signatures()
    for kernel, ss in sigs.items():
        assert compile_kernel(kernel, ss, "sm_90") is None
    for sig in sigs[rl.router_logits_partial_kernel]:
        mmas = kernel_remarks(rl.router_logits_partial_kernel, sig, "sm_90")
        assert mmas and not scalar_mmas(mmas), [r.instruction for r in mmas]


# ------------------------------------------------------------------------------------------ GPU


def _inputs(t, e, hidden, gen, dtype, w_std=0.02):
    x = torch.randn(t, hidden, generator=gen, device="cuda").to(dtype)
    w = (torch.randn(e, hidden, generator=gen, device="cuda") * w_std).to(dtype)
    return x, w


CASES = [
    (1, 64, 2048),  # DeepSeek-V2-Lite decode, batch 1 and 8
    (8, 64, 2048),
    (3, 64, 2048),
    (2048, 64, 2048),  # its prefill
    (77, 60, 2048),  # experts no power of two
    (9, 256, 7168),  # DeepSeek-V3's 256 experts (two expert tiles), hidden 7168
    (8, 32, 7168),  # its preset's 32: a 64-row expert tile, half of it zero rows
    (5, 16, 1000),  # hidden no multiple of the K step
]


@pytest.mark.gpu
@pytest.mark.parametrize(("t", "e", "hidden"), CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_logits_match_the_fp32_linear(t, e, hidden, dtype, gen, poison_empty):
    x, w = _inputs(t, e, hidden, gen, dtype)
    got = rl.router_logits(x, w)
    assert got.dtype == torch.float32 and got.shape == (t, e)
    # the same products as upstream's fp32 linear, summed in another order
    assert_close_rel(got, torch.nn.functional.linear(x.float(), w.float()), 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize(("t", "e", "hidden"), CASES)
@pytest.mark.parametrize(("k", "scaling", "w_std"), [(6, 1.0, 0.02), (8, 2.5, 0.02), (6, 1.0, 1.0)])
def test_greedy_routing_matches_the_reference(t, e, hidden, k, scaling, w_std, gen, poison_empty):
    """Weights at their experts within fp32 rounding, best first, distinct ids; ``w_std`` 1
    saturates the softmax (most scores underflow to 0; the experts still come by logit)."""
    k = min(k, e)
    x, w = _inputs(t, e, hidden, gen, torch.bfloat16, w_std)
    weights, ids = rl.router_greedy(x, w, k, scaling)
    assert weights.shape == ids.shape == (t, k) and ids.dtype == torch.int32
    want_w, want_ids = rl.reference_router_greedy(x, w, k, scaling)
    got_dense, want_dense = dense_weights(weights, ids, e), dense_weights(want_w, want_ids, e)
    assert_close_rel(got_dense, want_dense, 1e-5)
    assert ((ids >= 0) & (ids < e)).all()
    assert (ids.sort(dim=-1).values.diff(dim=-1) > 0).all()  # k distinct experts per token
    logits = torch.nn.functional.linear(x.float(), w.float())
    chosen = logits.gather(1, ids.long())
    assert (chosen[:, :-1] >= chosen[:, 1:] - 1e-3).all()  # best first
    # every expert left out scores at most the k-th chosen one (up to the fp32 sums' order)
    picked = torch.zeros_like(logits, dtype=torch.bool).scatter(1, ids.long(), True)
    left = logits.masked_fill(picked, float("-inf")).max(dim=-1).values
    kth = chosen.min(dim=-1).values
    assert (left <= kth + 1e-3 * kth.abs().clamp(min=1)).all()


@pytest.mark.gpu
def test_library_ops_run_in_a_compiled_step(gen):
    from tilegym.ops import library

    library.register_inductor_fallbacks()
    x, w = _inputs(8, 64, 2048, gen, torch.bfloat16)

    @torch.compile(fullgraph=True)
    def step(x):
        return library.router_greedy(x, w, 6, 1.0), library.router_logits(x, w)

    (weights, ids), logits = step(x)
    want = rl.reference_router_greedy(x, w, 6, 1.0)
    assert_close_rel(dense_weights(weights, ids, 64), dense_weights(*want, 64), 1e-5)
    assert_close_rel(logits, torch.nn.functional.linear(x.float(), w.float()), 1e-5)
