"""Qwen3-MoE routing and experts (`tilegym.ops.moe`) against fp32 references.

CPU: the references agree with transformers' own `Qwen3MoeTopKRouter` / `Qwen3MoeExperts`
(every experts implementation it has), the dispatch bookkeeping (`dispatch_reference`) and a
PyTorch replay of the kernels' data flow over it, the custom ops on the CPU and under
`torch.compile(fullgraph=True)`, the tile policy, and the AOT signatures (every launch the host
code makes has one; they compile for sm_90).
GPU: parity against fp32 at decode and prefill token counts, odd shapes, idle and overloaded
experts, the dispatch's outputs, NaN-poisoned outputs and workspaces, and CUDA-graph replay.
"""

from __future__ import annotations

import dataclasses
import math

import cuda.tile as ct
import pytest
import torch
from cuda.tile.compilation import ArrayConstraint, ScalarConstraint

from tilegym.ops import moe
from tilegym.ops._common import aligned_array_sig, signature
from tilegym.ops.moe import MoeConfig
from tilegym.ops.testing import assert_close_rel, rel_err

#: the tile buckets of `choose_config`, each also run with another dispatch
CONFIGS = [
    MoeConfig(8, 64, 64, 128, swap=True, dispatch="per_slot", occupancy=2),
    MoeConfig(8, 64, 64, 128, swap=True, dispatch="direct", occupancy=2),
    MoeConfig(8, 64, 64, 128, swap=True, occupancy=2),
    MoeConfig(16, 64, 64, 128, swap=True, dispatch="per_slot", occupancy=2),
    MoeConfig(16, 64, 64, 128, swap=True),
    MoeConfig(32, 64, 128, 64, swap=True),
    MoeConfig(64, 128, 128, 64),
    MoeConfig(64, 128, 128, 64, dispatch="per_slot"),
    MoeConfig(64, 128, 128, 64, dispatch="direct"),
    MoeConfig(64, 64, 128, 64, occupancy=1),
]


def _cfg_id(c: MoeConfig) -> str:
    tail = ("s" if c.swap else "") + f"o{c.occupancy}-{c.dispatch}"
    return f"{c.bm}x{c.bn_up}x{c.bn_down}k{c.tk}{tail}"


def _qwen3_moe_config(experts=8, top_k=2, hidden=64, inter=32, normalize=True):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        hidden_size=hidden,
        moe_intermediate_size=inter,
        num_experts=experts,
        num_experts_per_tok=top_k,
        norm_topk_prob=normalize,
        hidden_act="silu",
    )


def _routing(t, e, k, gen, device="cpu", busy=0):
    """Distinct expert ids per token (as top-k gives) and positive weights; the first ``busy``
    tokens all pick expert 0 first."""
    scores = torch.rand((t, e), generator=gen, device=device)
    scores[:busy, 0] = 2.0
    ids = scores.topk(k, dim=-1).indices.to(torch.int32)
    weights = torch.rand((t, k), generator=gen, device=device) + 0.05
    return ids, weights


def _weights(e, h, i, gen, dtype, device="cpu"):
    gate_up = torch.randn((e, 2 * i, h), generator=gen, device=device) / math.sqrt(h)
    down = torch.randn((e, h, i), generator=gen, device=device) / math.sqrt(i)
    return gate_up.to(dtype), down.to(dtype)


# ---------------------------------------------------------------------------------------------
# CPU: references against transformers
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_route_reference_matches_transformers_router(normalize, dtype, cpu_gen):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    cfg = _qwen3_moe_config(experts=16, top_k=4, normalize=normalize)
    router = Qwen3MoeTopKRouter(cfg).to(dtype)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=cpu_gen))
    x = torch.randn((37, cfg.hidden_size), generator=cpu_gen).to(dtype)
    with torch.no_grad():
        logits, scores, indices = router(x)
    weights, ids = moe.moe_route_reference(logits, cfg.num_experts_per_tok, normalize)
    assert ids.dtype == torch.int32 and weights.dtype == logits.dtype
    assert torch.equal(ids, indices.to(torch.int32))
    assert torch.equal(weights, scores)


@pytest.mark.parametrize("impl", ["eager", "batched_mm", "grouped_mm"])
def test_experts_reference_matches_transformers_experts(impl, cpu_gen):
    """fp32 on the CPU: the reference is the module's forward, whichever implementation runs."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = _qwen3_moe_config(experts=8, top_k=2)
    cfg._experts_implementation = impl
    experts = Qwen3MoeExperts(cfg)
    gate_up, down = _weights(8, cfg.hidden_size, cfg.moe_intermediate_size, cpu_gen, torch.float32)
    with torch.no_grad():
        experts.gate_up_proj.copy_(gate_up)
        experts.down_proj.copy_(down)
    x = torch.randn((23, cfg.hidden_size), generator=cpu_gen)
    ids, weights = _routing(23, 8, 2, cpu_gen, busy=12)
    with torch.no_grad():
        expected = experts(x, ids.long(), weights)
    got = moe.moe_experts_reference(x, ids, weights, gate_up, down)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    residual = torch.randn(x.shape, generator=cpu_gen)
    with_res = moe.moe_experts_reference(x, ids, weights, gate_up, down, residual)
    torch.testing.assert_close(with_res, expected + residual, rtol=1e-5, atol=1e-5)


def test_experts_reference_skips_ids_outside_the_experts(cpu_gen):
    gate_up, down = _weights(4, 32, 16, cpu_gen, torch.float32)
    x = torch.randn((3, 32), generator=cpu_gen)
    ids = torch.tensor([[0, 4], [-1, 2], [4, 4]], dtype=torch.int32)
    w = torch.ones((3, 2))
    got = moe.moe_experts_reference(x, ids, w, gate_up, down)
    kept = torch.tensor([[0], [2], [1]])
    only = moe.moe_experts_reference(x, kept, torch.ones(3, 1), gate_up, down)
    torch.testing.assert_close(got[:2], only[:2])
    assert torch.equal(got[2], torch.zeros(32))


# ---------------------------------------------------------------------------------------------
# CPU: dispatch bookkeeping and the kernels' data flow
# ---------------------------------------------------------------------------------------------


def _check_dispatch(sorted_, pos, bexp, ids, n_experts, bm, stable):
    """The invariants `moe_dispatch` promises (``stable``: slots in order inside an expert)."""
    flat = ids.reshape(-1).long().cpu()
    sorted_, pos, bexp = sorted_.long().cpu(), pos.long().cpu(), bexp.long().cpu()
    n = flat.numel()
    mb = moe.max_blocks(n, n_experts, bm)
    assert sorted_.numel() == mb * bm and pos.numel() == n and bexp.numel() == mb
    valid = (flat >= 0) & (flat < n_experts)
    counts = torch.bincount(flat[valid], minlength=n_experts)
    used = int(((counts + bm - 1) // bm).sum())
    assert used <= mb
    expected_bexp = torch.repeat_interleave(torch.arange(n_experts), (counts + bm - 1) // bm)
    assert torch.equal(bexp[:used], expected_bexp)
    assert bool((bexp[used:] == n_experts).all())
    assert bool((pos[~valid] == mb * bm).all())
    rows = pos[valid]
    assert torch.equal(sorted_[rows], torch.arange(n)[valid])  # pos and sorted are inverse
    assert rows.unique().numel() == rows.numel()
    assert torch.equal(bexp[rows // bm], flat[valid])  # each slot sits in a block of its expert
    filler = torch.ones(mb * bm, dtype=torch.bool)
    filler[rows] = False
    assert bool((sorted_[filler] == n).all())  # the rest is the sentinel
    if stable:
        for e in range(n_experts):
            r = rows[flat[valid] == e]
            assert bool((r[1:] > r[:-1]).all())


@pytest.mark.parametrize("bm", [8, 16, 64])
def test_dispatch_reference_bookkeeping(bm, cpu_gen):
    cases = [
        _routing(37, 8, 2, cpu_gen)[0],
        _routing(1, 128, 8, cpu_gen)[0],
        _routing(300, 128, 8, cpu_gen)[0],
        torch.full((50, 2), 3, dtype=torch.int32),  # one expert takes every slot
        torch.tensor([[0, 9], [-1, 2], [2, 2]], dtype=torch.int32),  # ids outside [0, 8)
    ]
    for ids in cases:
        e = 128 if ids.max() >= 9 else 8
        sorted_, pos, bexp = moe.dispatch_reference(ids, e, bm)
        _check_dispatch(sorted_, pos, bexp, ids, e, bm, stable=True)


def test_per_slot_dispatch_reference_layout(cpu_gen):
    """Every valid slot alone in its own block's first row, blocks in slot order."""
    ids = _routing(5, 8, 2, cpu_gen)[0]
    ids[1, 1] = 8  # outside the experts
    sorted_, pos, bexp = moe.dispatch_reference(ids, 8, 4, "per_slot")
    flat = ids.reshape(-1)
    assert sorted_.numel() == 10 * 4 and moe.n_blocks(10, 8, 4, "per_slot") == 10
    assert bexp.tolist() == [e if e < 8 else 8 for e in flat.tolist()]
    assert pos.tolist() == [4 * s if s != 3 else 40 for s in range(10)]
    rows = sorted_.view(10, 4)
    assert rows[:, 0].tolist() == [s if s != 3 else 10 for s in range(10)]
    assert bool((rows[:, 1:] == 10).all())


def test_dispatch_check_catches_a_wrong_layout(cpu_gen):
    ids = _routing(37, 8, 2, cpu_gen)[0]
    sorted_, pos, bexp = moe.dispatch_reference(ids, 8, 8)
    swapped = sorted_.clone()
    first, second = int(pos[0]), int(pos[1])
    swapped[first], swapped[second] = swapped[second], swapped[first]
    with pytest.raises(AssertionError):
        _check_dispatch(swapped, pos, bexp, ids, 8, 8, stable=True)


def _blocked_experts(hidden, ids, weights, gate_up, down, residual, bm, dispatch):
    """The kernels' data flow in PyTorch: gather rows by the dispatch, one expert per block,
    outputs by padded row, combine through ``pos``. Unused rows stay NaN, so a row read that
    the dispatch did not fill shows."""
    t, h = hidden.shape
    k = ids.shape[1]
    e, i2, _ = gate_up.shape
    inter = i2 // 2
    sorted_, pos, bexp = moe.dispatch_reference(ids, e, bm, dispatch)
    rows = sorted_.numel()
    x = torch.cat([hidden.float(), torch.zeros(1, h)])  # the sentinel's token is a zero row
    xg = x[(sorted_.long() // k).clamp(max=t)]
    y = torch.full((rows + 1, h), float("nan"))
    y[rows] = 0  # the combine's missing rows read zeros
    for b, expert in enumerate(bexp.tolist()):
        if expert >= e:
            continue
        r = slice(b * bm, (b + 1) * bm)
        gu = xg[r] @ gate_up[expert].float().T
        act = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        y[r] = act @ down[expert].float().T
    out = (y[pos.long().view(t, k)] * weights.float().unsqueeze(-1)).sum(1)
    return out if residual is None else out + residual.float()


@pytest.mark.parametrize("dispatch", moe.DISPATCHES)
@pytest.mark.parametrize("bm", [8, 32, 64])
def test_blocked_data_flow_matches_reference(bm, dispatch, cpu_gen):
    gate_up, down = _weights(6, 64, 48, cpu_gen, torch.float32)
    for t, k in ((1, 2), (37, 2), (130, 3)):
        x = torch.randn((t, 64), generator=cpu_gen)
        ids, w = _routing(t, 6, k, cpu_gen)
        ids[: t // 2, 0] = -1 if t > 1 else ids[0, 0]  # some slots outside the experts
        res = torch.randn((t, 64), generator=cpu_gen)
        got = _blocked_experts(x, ids, w, gate_up, down, res, bm, dispatch)
        ref = moe.moe_experts_reference(x, ids, w, gate_up, down, res)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# CPU: custom ops, compile, policy, AOT
# ---------------------------------------------------------------------------------------------


def test_custom_ops_on_cpu_match_references(cpu_gen):
    from tilegym.ops import library

    logits = torch.randn((9, 16), generator=cpu_gen).to(torch.bfloat16)
    w, ids = library.moe_route(logits, 4, True)
    rw, rids = moe.moe_route_reference(logits, 4, True)
    assert torch.equal(w, rw) and torch.equal(ids, rids) and ids.dtype == torch.int32
    gate_up, down = _weights(16, 64, 32, cpu_gen, torch.bfloat16)
    x = torch.randn((9, 64), generator=cpu_gen).to(torch.bfloat16)
    res = torch.randn((9, 64), generator=cpu_gen).to(torch.bfloat16)
    out = library.moe_experts(x, ids, w, gate_up, down, res)
    ref = moe.moe_experts_reference(x, ids, w, gate_up, down, res)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert torch.equal(out, ref.to(torch.bfloat16))
    args = (x, ids, w, gate_up, down, None)
    torch.library.opcheck(torch.ops.tilegym.moe_experts.default, args)
    torch.library.opcheck(torch.ops.tilegym.moe_route.default, (logits, 4, False))


@pytest.mark.slow
def test_custom_ops_compile_fullgraph_on_cpu(cpu_gen):
    from tilegym.ops import library

    gate_up, down = _weights(8, 64, 32, cpu_gen, torch.bfloat16)

    def block(x, logits, residual):
        weights, ids = library.moe_route(logits, 2, True)
        return library.moe_experts(x, ids, weights, gate_up, down, residual + 1)

    compiled = torch.compile(block, fullgraph=True)
    for t in (5, 11):
        x = torch.randn((t, 64), generator=cpu_gen).to(torch.bfloat16)
        logits = torch.randn((t, 8), generator=cpu_gen).to(torch.bfloat16)
        res = torch.randn((t, 64), generator=cpu_gen).to(torch.bfloat16)
        assert torch.equal(compiled(x, logits, res), block(x, logits, res))


def test_choose_config_buckets():
    decode = moe.choose_config(1 * 8, 128)
    assert (decode.bm, decode.swap, decode.dispatch) == (8, True, "direct")
    assert decode.bn_up == decode.bn_down == 64  # the warpgroup mma's M
    assert moe.choose_config(8 * 8, 128).dispatch == "direct"
    assert moe.choose_config(9 * 8, 128).dispatch == "sorted"
    assert moe.choose_config(128 * 8, 128).bm == 8
    assert moe.choose_config(256 * 8, 128).bm == 16
    assert moe.choose_config(512 * 8, 128).bm == 32
    prefill = moe.choose_config(2048 * 8, 128)
    assert (prefill.bm, prefill.swap, prefill.dispatch) == (64, False, "sorted")
    with pytest.raises(ValueError, match="power of two"):
        MoeConfig(24, 64, 64, 64)
    with pytest.raises(ValueError, match="occupancy"):
        MoeConfig(8, 64, 64, 64, occupancy=-1)
    with pytest.raises(ValueError, match="dispatch"):
        MoeConfig(8, 64, 64, 64, dispatch="small")
    with pytest.raises(ValueError, match="no dispatch kernel"):
        moe.moe_dispatch(torch.zeros(8, dtype=torch.int32), 128, 8, "direct")


def test_max_blocks_bounds_the_used_blocks(cpu_gen):
    for t, e, k, bm in ((1, 128, 8, 8), (8, 128, 8, 8), (37, 6, 2, 32), (2048, 128, 8, 64)):
        ids = _routing(t, e, k, cpu_gen)[0]
        counts = torch.bincount(ids.reshape(-1).long(), minlength=e)
        assert int(((counts + bm - 1) // bm).sum()) <= moe.max_blocks(t * k, e, bm)
    assert moe.max_blocks(8, 128, 8) == 8  # T = 1: one block per routed expert


def _matches(sig, kernel, args) -> bool:
    """Whether a launch's arguments fit a signature: arrays by dtype and rank, runtime ints as
    int32 scalars, constants by value."""
    params = sig.parameters
    if len(params) != len(args):
        return False
    dtypes = {**moe._CT, torch.int32: ct.int32}
    for p, a in zip(params, args, strict=True):
        if isinstance(p, ArrayConstraint):
            if not isinstance(a, torch.Tensor) or a.dim() != p.ndim:
                return False
            if dtypes.get(a.dtype) != p.dtype:
                return False
        elif isinstance(p, ScalarConstraint):
            if isinstance(a, bool) or not isinstance(a, int):
                return False
        elif type(p.value) is not type(a) or p.value != a:
            return False
    return True


@pytest.fixture
def launches(monkeypatch):
    """Record (kernel, grid, args) of every ct.launch instead of launching (CPU tensors)."""
    seen = []

    def record(stream, grid, kernel, args):
        seen.append((kernel, grid, args))

    monkeypatch.setattr(ct, "launch", record)
    monkeypatch.setattr(moe, "stream", lambda *a: None)
    monkeypatch.setattr(moe, "_check_experts", lambda *a: None)
    monkeypatch.setattr(moe, "_check_route", lambda *a: None)
    return seen


def test_aot_signatures_cover_the_launches(launches, cpu_gen):
    """Every launch of routing and experts at the AOT token counts (routing weights in bf16 and
    in fp32) has a declared signature (so the compile gate compiles what runs), and the grids
    are fixed by T, k, E, the tiles."""
    e, k, h, i = 128, 8, 256, 128
    tokens = (1, 8, 128, 256, 512, 2048)
    sigs = moe.aot_signatures(experts=e, top_k=k, hidden=h, tokens=tokens)
    gate_up, down = _weights(e, h, i, cpu_gen, torch.bfloat16)
    for t in tokens:
        x = torch.zeros((t, h), dtype=torch.bfloat16)
        for dt in (torch.bfloat16, torch.float32):
            moe.moe_route(torch.zeros((t, e), dtype=dt), k, t % 2 == 0)
        ids, w = _routing(t, e, k, cpu_gen)
        moe.moe_experts(x, ids, w.to(torch.bfloat16), gate_up, down, x if t > 8 else None)
        moe.moe_experts(x, ids, w.float(), gate_up, down, x)  # DeepSeek's fp32 routing weights
        cfg = moe.choose_config(t * k, e)
        grids = {kern: grid for kern, grid, _ in launches}
        mb = moe.n_blocks(t * k, e, cfg.bm, cfg.dispatch)
        assert grids[moe._hinted(moe.tilegym_moe_gate_up_kernel, cfg)] == (mb, i // cfg.bn_up, 1)
        assert grids[moe._hinted(moe.tilegym_moe_down_kernel, cfg)] == (mb, h // cfg.bn_down, 1)
        if cfg.dispatch == "direct":  # no dispatch kernel; its per_slot variant, declared too
            assert [kern._pyfunc.__name__ for kern, _, _ in launches[-3:]] == [
                "tilegym_moe_gate_up_kernel",
                "tilegym_moe_down_kernel",
                "tilegym_moe_combine_kernel",
            ]
            assert grids[launches[-3][0]] == (t * k, i // cfg.bn_up, 1)
            per_slot = dataclasses.replace(cfg, dispatch="per_slot")
            moe.moe_experts(x, ids, w.to(torch.bfloat16), gate_up, down, config=per_slot)
    for kernel, _, args in launches:
        assert any(_matches(s, kernel, args) for s in sigs.get(kernel, [])), (kernel, args)
    assert {k._pyfunc.__name__ for k, _, _ in launches} == _kernel_names()


def _kernel_names() -> set[str]:
    return {n for n in dir(moe) if n.startswith("tilegym_moe_") and n.endswith("_kernel")}


def test_aot_signature_match_rejects_other_launches():
    sig = moe.aot_signatures()[moe.tilegym_moe_scan_kernel][0]
    i32 = torch.zeros(4, dtype=torch.int32)
    assert _matches(sig, None, (i32, i32, i32, 8, 128, 32))
    assert not _matches(sig, None, (i32, i32, i32, 16, 128, 32))
    assert not _matches(sig, None, (i32, i32, i32.float(), 8, 128, 32))
    assert not _matches(sig, None, (i32, i32, i32.view(2, 2), 8, 128, 32))


@pytest.mark.parametrize("rows", [0, 3, 6])
def test_route_rows_must_be_a_power_of_two(rows):
    with pytest.raises(ValueError, match="power of two"):
        moe.moe_route(torch.zeros((4, 4)), 2, True, tile_rows=rows)


def test_route_takes_one_token_a_program_at_decode():
    tm = moe.route_tiles(128, 8)[0]
    assert tm == 16
    assert [moe.route_rows(t, tm) for t in (1, 8, 128, 129, 2048)] == [1, 1, 1, 16, 16]


def test_route_signatures_have_both_row_counts_with_the_shipped_keys():
    """`route_rows` launches one row a program at decode and TM at prefill: the AOT list has
    both, each with ``ROUTE_PACKED``."""
    sigs = moe.aot_signatures()[moe.tilegym_moe_route_kernel]
    consts = {tuple(p.value for p in sig.parameters[3:]) for sig in sigs}
    rows = {c[0] for c in consts}
    assert 1 in rows and len(rows) >= 2
    assert {c[-1] for c in consts} == {moe.ROUTE_PACKED}


@pytest.mark.slow
@pytest.mark.parametrize("e,k", [(512, 10), (128, 8), (32, 4)])
def test_packed_route_compiles_for_sm90(e, k):
    """The packed-key router (int64 keys, bitcasts) compiles for Hopper at the families' router
    widths, with the shipped rows a program and with one."""
    from tilegym.kernel_inventory.compile import compile_kernel, toolchain_problem

    if toolchain_problem():
        pytest.skip(toolchain_problem())
    tm, ep, kp = moe.route_tiles(e, k)
    arrays = (aligned_array_sig(ct.bfloat16, 2),) * 2 + (aligned_array_sig(ct.int32, 2),)
    sigs = [signature(*arrays, rows, ep, k, kp, True, True) for rows in {tm, 1}]
    assert compile_kernel(moe.tilegym_moe_route_kernel, sigs, "sm_90") is None


@pytest.mark.slow
def test_aot_signatures_compile_for_sm90():
    """Every kernel of the module compiles on the CPU for Hopper with its declared signatures."""
    from tilegym.kernel_inventory.compile import compile_kernel, toolchain_problem

    if toolchain_problem():
        pytest.skip(toolchain_problem())
    sigs = moe.aot_signatures()
    assert {k._pyfunc.__name__ for k in sigs} == _kernel_names()
    for kernel, ss in sigs.items():
        assert compile_kernel(kernel, ss, "sm_90") is None, kernel._pyfunc.__name__


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------


def _torch_bf16_experts(hidden, ids, weights, gate_up, down, residual):
    """transformers' eager experts in the activation dtype (every op rounds), + residual."""
    inter = down.shape[-1]
    out = torch.zeros_like(hidden)
    for e in range(gate_up.shape[0]):
        tok, slot = torch.where(ids.long() == e)
        if tok.numel() == 0:
            continue
        gu = torch.nn.functional.linear(hidden[tok], gate_up[e])
        act = torch.nn.functional.silu(gu[:, :inter]) * gu[:, inter:]
        y = torch.nn.functional.linear(act, down[e]) * weights[tok, slot, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out if residual is None else residual + out


def _experts_case(
    t, h, i, e, k, gen, *, ids=None, residual=True, config=None, dtype=torch.bfloat16
):
    x = torch.randn((t, h), generator=gen, device="cuda").to(dtype)
    gate_up, down = _weights(e, h, i, gen, dtype, "cuda")
    if ids is None:
        ids, w = _routing(t, e, k, gen, "cuda")
    else:
        w = torch.rand(ids.shape, generator=gen, device="cuda") + 0.05
    w = w.to(dtype)
    res = torch.randn((t, h), generator=gen, device="cuda").to(dtype) if residual else None
    out = torch.full((t, h), float("nan"), device="cuda", dtype=dtype)
    got = moe.moe_experts(x, ids, w, gate_up, down, res, out=out, config=config)
    assert got.data_ptr() == out.data_ptr()
    ref = moe.moe_experts_reference(x, ids, w, gate_up, down, res)
    torch_err = rel_err(_torch_bf16_experts(x, ids, w, gate_up, down, res), ref)
    assert_close_rel(out, ref, tol=max(1.5 * torch_err, 8e-3))
    return x, ids, w, gate_up, down, res


QWEN3_30B = dict(h=2048, i=768, e=128, k=8)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 3, 8, 37, 2048])
def test_experts_qwen3_30b_shapes(t, gen, poison_empty):
    """Qwen3-30B-A3B's expert shapes; workspaces NaN-poisoned (unused rows must not leak)."""
    _experts_case(t, **QWEN3_30B, gen=gen, residual=t % 2 == 1)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", CONFIGS, ids=_cfg_id)
@pytest.mark.parametrize("t", [1, 3, 37, 300])
def test_experts_odd_shapes_every_config(cfg, t, gen, poison_empty):
    """H = 5 x 64 and I = 3 x 64 (partial column tiles at every tile width), 6 experts, k = 2
    and 3, T off every block size."""
    for k in (2, 3):
        _experts_case(t, 320, 192, 6, k, gen, config=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", CONFIGS, ids=_cfg_id)
def test_experts_idle_and_overloaded_experts(cfg, gen, poison_empty):
    """Most of 64 experts idle; every slot on one expert (twice per token); ids outside the
    experts (they contribute nothing, as in transformers)."""
    _experts_case(5, 256, 128, 64, 2, gen, config=cfg)
    for t in (1, 37, 2048):
        one = torch.full((t, 2), 3, dtype=torch.int32, device="cuda")
        _experts_case(t, 256, 128, 8, 2, gen, ids=one, config=cfg)
    ids = torch.tensor([[0, 8], [-1, 2], [8, 8], [7, 1]], dtype=torch.int32, device="cuda")
    _experts_case(4, 256, 128, 8, 2, gen, ids=ids, config=cfg)


@pytest.mark.gpu
def test_experts_fp16_and_int64_ids(gen):
    ids, _ = _routing(37, 16, 4, gen, "cuda")
    _experts_case(37, 256, 128, 16, 4, gen, ids=ids.long(), dtype=torch.float16)


@pytest.mark.gpu
@pytest.mark.parametrize("dispatch", ["sorted", "per_slot"])
@pytest.mark.parametrize(
    "t,e,k,bm", [(1, 128, 8, 8), (8, 128, 8, 8), (37, 6, 2, 16), (2048, 128, 8, 64)]
)
def test_dispatch_outputs(t, e, k, bm, dispatch, gen):
    ids, _ = _routing(t, e, k, gen, "cuda")
    ids[0, 0] = e  # one slot outside the experts
    sorted_, pos, bexp = moe.moe_dispatch(ids.reshape(-1).contiguous(), e, bm, dispatch)
    if dispatch == "sorted":
        _check_dispatch(sorted_, pos, bexp, ids, e, bm, stable=False)
    else:  # deterministic: exactly the reference's layout
        expected = moe.dispatch_reference(ids, e, bm, dispatch)
        for got, want in zip((sorted_, pos, bexp), expected, strict=True):
            assert torch.equal(got.cpu(), want)


def _route_check(logits, top_k, normalize, weights, ids):
    """ids: a valid top-k, best first (their probabilities are the k largest, ties in any
    order), distinct; weights: the reference's for those ids, within one rounding."""
    probs = torch.softmax(logits.float(), dim=-1)
    top = probs.topk(top_k, dim=-1).values
    chosen = probs.gather(1, ids.long())
    torch.testing.assert_close(chosen, top, rtol=1e-5, atol=1e-7)
    assert bool((ids.sort(1).values.diff(dim=1) > 0).all())
    expected = chosen / chosen.sum(1, keepdim=True) if normalize else chosen
    tol = {torch.bfloat16: 8e-3, torch.float16: 1e-3, torch.float32: 1e-5}[logits.dtype]
    torch.testing.assert_close(weights.float(), expected, rtol=tol, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("t", [1, 3, 8, 37, 2048])
@pytest.mark.parametrize("e,k", [(128, 8), (6, 2), (60, 1), (8, 8)])
def test_route_matches_reference(t, e, k, dtype, gen, poison_empty):
    logits = (torch.randn((t, e), generator=gen, device="cuda") * 3).to(dtype)
    for normalize in (True, False):
        weights, ids = moe.moe_route(logits, k, normalize)
        assert weights.dtype == dtype and ids.dtype == torch.int32
        _route_check(logits, k, normalize, weights, ids)
        _, rids = moe.moe_route_reference(logits, k, normalize)
        # rows that pick other experts than torch.topk (or another order) hold a near-tie
        differ = ~(ids == rids).all(1)
        probs = torch.softmax(logits[differ].float(), dim=-1)
        near = probs.topk(min(k + 1, e), dim=-1).values
        gaps = (near[:, :-1] - near[:, 1:]) / near[:, :-1]
        assert bool((gaps.min(1).values < 1e-5).all())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("t", [1, 3, 37])
@pytest.mark.parametrize("e,k", [(512, 10), (128, 8), (60, 1), (8, 8)])
@pytest.mark.parametrize("packed,tile_rows", [(True, None), (False, 1), (True, 1), (True, 4)])
def test_route_variants_match_the_shipped_route(t, e, k, dtype, packed, tile_rows, gen):
    """The packed-key rounds and other rows a program choose what the shipped kernel chooses
    (the same first index on ties), with the same weights; ties made on purpose in row 0."""
    logits = (torch.randn((t, e), generator=gen, device="cuda") * 3).to(dtype)
    logits[0, : min(e, 4)] = logits[0].max()  # a tie at the top: the first column wins
    for normalize in (True, False):
        want_w, want_ids = moe.moe_route(logits, k, normalize, packed=False)
        weights, ids = moe.moe_route(logits, k, normalize, tile_rows=tile_rows, packed=packed)
        _route_check(logits, k, normalize, weights, ids)
        assert torch.equal(ids, want_ids)
        tol = {torch.bfloat16: 8e-3, torch.float32: 1e-6}[dtype]  # row sums in another order
        torch.testing.assert_close(weights, want_w, rtol=tol, atol=1e-7)


@pytest.mark.gpu
def test_route_check_catches_a_wrong_choice(gen):
    logits = torch.randn((16, 32), generator=gen, device="cuda")
    weights, ids = moe.moe_route_reference(logits, 4, True)
    with pytest.raises(AssertionError):
        _route_check(logits, 4, True, weights, (ids + 1) % 32)


@pytest.mark.gpu
def test_inputs_the_kernels_do_not_take_raise(gen):
    x = torch.randn((4, 64), device="cuda", dtype=torch.bfloat16)
    gate_up, down = _weights(4, 64, 32, gen, torch.bfloat16, "cuda")
    ids, w = _routing(4, 4, 2, gen, "cuda")
    w = w.to(torch.bfloat16)
    with pytest.raises(ValueError, match="CUDA"):
        moe.moe_experts(x.cpu(), ids, w, gate_up, down)
    with pytest.raises(ValueError, match="dtype"):
        moe.moe_experts(x.float(), ids, w, gate_up.float(), down.float())
    with pytest.raises(ValueError, match="down"):
        moe.moe_experts(x, ids, w, gate_up, down[:, :, :16])
    with pytest.raises(ValueError, match="residual"):
        moe.moe_experts(x, ids, w, gate_up, down, x[:2])
    with pytest.raises(ValueError, match="top_k"):
        moe.moe_route(torch.randn((4, 4), device="cuda"), 5, True)
    with pytest.raises(ValueError, match="CUDA"):
        moe.moe_route(torch.randn((4, 4)), 2, True)


@pytest.mark.gpu
def test_experts_deterministic(gen):
    """The atomic dispatch orders an expert's rows differently from call to call; the output
    must not change."""
    x, ids, w, gate_up, down, res = _experts_case(2048, 512, 256, 16, 4, gen)
    first = moe.moe_experts(x, ids, w, gate_up, down, res)
    for _ in range(3):
        assert torch.equal(moe.moe_experts(x, ids, w, gate_up, down, res), first)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 8, 37])
def test_cuda_graph_replay_with_new_inputs(t, gen):
    """Routing + experts captured once, replayed on new hidden states and router logits:
    equal to eager on the same inputs (no host synchronization, fixed grids)."""
    h, i, e, k = 512, 256, 32, 4
    gate_up, down = _weights(e, h, i, gen, torch.bfloat16, "cuda")
    x = torch.randn((t, h), generator=gen, device="cuda").to(torch.bfloat16)
    logits = torch.randn((t, e), generator=gen, device="cuda").to(torch.bfloat16)

    def step():
        weights, ids = moe.moe_route(logits, k, True)
        return weights, ids, moe.moe_experts(x, ids, weights, gate_up, down, x)

    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    for _ in range(3):
        x.copy_(torch.randn((t, h), generator=gen, device="cuda"))
        logits.copy_(torch.randn((t, e), generator=gen, device="cuda") * 2)
        graph.replay()
        eager = step()
        for got, want in zip(static, eager, strict=True):
            assert torch.equal(got, want)
        weights, ids, out = eager
        ref = moe.moe_experts_reference(x, ids, weights, gate_up, down, x)
        assert_close_rel(out, ref, tol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 3, 37])
def test_qwen3_moe_entry_points_at_decode_and_prefill(t, gen):
    """The two shared experts entry points (their own Definitions) at Qwen3-30B-A3B's shapes:
    at T <= 8 the op's direct dispatch has no dispatch kernel, so they take the per-slot layout."""
    from tilegym.ops.entry import moe as entry

    x, ids, w, gate_up, down, res = _experts_case(t, **QWEN3_30B, gen=gen)
    act = entry.experts_gate_up_silu(x, ids, gate_up)
    assert act.shape == (t, QWEN3_30B["k"], QWEN3_30B["i"])
    out = entry.experts_down_combine(act, ids, w, down, res)
    ref = moe.moe_experts_reference(x, ids, w, gate_up, down, res)
    assert_close_rel(out, ref, tol=2e-2)
