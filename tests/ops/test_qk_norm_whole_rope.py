"""OLMo's whole-projection q/k RMSNorm + RoPE in one launch (``tilegym.ops.qk_norm_whole_rope``).

CPU: the op's reference against upstream's own modules (``Olmo2RMSNorm``/``Olmo3RMSNorm``/
``OlmoeRMSNorm`` and each family's ``apply_rotary_pos_emb``): equal in fp64 and bit-equal in
bf16 (upstream's rounding order), the custom op's fake and CPU implementations (opcheck), and
every launch shape the default dispatch picks has an AOT signature. GPU (``gpu`` marker): the
cuTile kernel against the fp64 reference at decode and prefill shapes with NaN-poisoned
outputs, every benchmark variant, and replay from a captured CUDA graph.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from tilegym.ops import qk_norm_whole_rope as qw
from tilegym.ops.testing import assert_close_rel

#: model type -> (upstream module, its RMSNorm class, round_once as the family describes it)
FAMILIES = {
    "olmo2": ("transformers.models.olmo2.modeling_olmo2", "Olmo2RMSNorm", True),
    "olmo3": ("transformers.models.olmo3.modeling_olmo3", "Olmo3RMSNorm", True),
    "olmoe": ("transformers.models.olmoe.modeling_olmoe", "OlmoeRMSNorm", False),
}


def _tables(bc, seq, d, gen, device="cpu"):
    """(B or 1, S, D) cos/sin of random positions (fp32), as the rotary modules build them."""
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=device).float() / d))
    pos = torch.randint(0, 4096, (bc, seq), device=device, generator=gen).float()
    emb = torch.cat([pos[..., None] * inv] * 2, dim=-1)
    return emb.cos(), emb.sin()


def _inputs(b, s, hq, hk, d, gen, dtype, device="cpu"):
    """q and k as (B, S, H, D) views of one fused QKV output (as the linear patch hands them
    over) and whole-width norm weights near one."""
    qkv = torch.randn(b, s, (hq + 2 * hk) * d, device=device, generator=gen) * 3
    qkv = qkv.to(dtype)
    q = qkv[..., : hq * d].view(b, s, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].view(b, s, hk, d)
    wq = (1 + 0.3 * torch.randn(hq * d, device=device, generator=gen)).to(dtype)
    wk = (1 + 0.3 * torch.randn(hk * d, device=device, generator=gen)).to(dtype)
    return q, k, wq, wk


def _upstream(family, q, k, wq, wk, eps, cos, sin):
    """The upstream attention's steps with its own modules: q_norm/k_norm on the flat
    projections, view per head, transpose, the family's ``apply_rotary_pos_emb``."""
    module_name, norm_cls, _ = FAMILIES[family]
    module = importlib.import_module(module_name)
    b, s, hq, d = q.shape
    hk = k.shape[2]
    q_norm = getattr(module, norm_cls)(hq * d, eps=eps).to(wq.dtype)
    k_norm = getattr(module, norm_cls)(hk * d, eps=eps).to(wk.dtype)
    with torch.no_grad():
        q_norm.weight.copy_(wq)
        k_norm.weight.copy_(wk)
        qs = q_norm(q.reshape(b, s, hq * d)).view(b, s, hq, d).transpose(1, 2)
        ks = k_norm(k.reshape(b, s, hk * d)).view(b, s, hk, d).transpose(1, 2)
        return module.apply_rotary_pos_emb(qs, ks, cos, sin)


def _cpu_op(q, k, wq, wk, eps, cos, sin, round_once):
    return torch.ops.tilegym.qk_norm_whole_rope(q, k, wq, wk, eps, cos, sin, round_once)


# (batch, seq, q heads, kv heads, head dim, cos batched): odd sizes; GQA and MHA
CPU_CASES = [(3, 5, 3, 1, 10, False), (1, 1, 5, 5, 8, True), (2, 7, 4, 2, 6, True)]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("case", CPU_CASES)
def test_cpu_op_is_upstream_in_fp64(family, case, cpu_gen):
    import tilegym.ops.library  # noqa: F401  (registers torch.ops.tilegym)

    b, s, hq, hk, d, batched = case
    q, k, wq, wk = _inputs(b, s, hq, hk, d, cpu_gen, torch.float64)
    cos, sin = (t.double() for t in _tables(b if batched else 1, s, d, cpu_gen))
    want_q, want_k = _upstream(family, q, k, wq, wk, 1e-6, cos, sin)
    got_q, got_k = _cpu_op(q, k, wq, wk, 1e-6, cos, sin, FAMILIES[family][2])
    assert got_q.shape == (b, hq, s, d) and got_k.shape == (b, hk, s, d)
    torch.testing.assert_close(got_q, want_q, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_k, want_k, rtol=1e-12, atol=1e-12)
    # the rotation matters: without it the check fails
    assert not torch.allclose(got_q, _cpu_op(q, k, wq, wk, 1e-6, 1 + 0 * cos, 0 * sin, True)[0])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cpu_op_rounds_as_upstream_in_bf16(family, cpu_gen):
    """bf16 projections and weights (fp32 tables for OLMo 2/3, whose rotary modules return
    fp32; bf16 for OLMoE's): bit-equal to upstream, and the other rounding order is not."""
    import tilegym.ops.library  # noqa: F401

    round_once = FAMILIES[family][2]
    q, k, wq, wk = _inputs(2, 9, 6, 3, 32, cpu_gen, torch.bfloat16)
    cos, sin = _tables(1, 9, 32, cpu_gen)
    if not round_once:
        cos, sin = cos.bfloat16(), sin.bfloat16()
    want_q, want_k = _upstream(family, q, k, wq, wk, 1e-5, cos, sin)
    got_q, got_k = _cpu_op(q, k, wq, wk, 1e-5, cos, sin, round_once)
    assert got_q.dtype == want_q.dtype == torch.bfloat16
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    other_q, _ = _cpu_op(q, k, wq, wk, 1e-5, cos, sin, not round_once)
    assert not torch.equal(other_q, want_q)


def test_the_families_declare_their_norms_rounding():
    from tilegym.transformers.olmo2.modeling_olmo2 import FAMILY as OLMO2
    from tilegym.transformers.olmo3.modeling_olmo3 import FAMILY as OLMO3
    from tilegym.transformers.olmoe.modeling_olmoe import FAMILY as OLMOE

    families = {"olmo2": OLMO2, "olmo3": OLMO3, "olmoe": OLMOE}
    for key, family in families.items():
        assert family.qk_norm_whole
        assert family.qk_norm_round_once is FAMILIES[key][2], key


def test_fake_and_cpu_implementations_pass_opcheck(cpu_gen):
    from tilegym.ops import library

    q, k, wq, wk = _inputs(2, 3, 4, 2, 16, cpu_gen, torch.bfloat16)
    cos, sin = _tables(1, 3, 16, cpu_gen)
    for round_once in (True, False):
        args = (q, k, wq, wk, 1e-6, cos, sin, round_once)
        torch.library.opcheck(library.qk_norm_whole_rope_op, args)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_only_power_of_two_halves_fit(head_dim):
    assert qw.fits(head_dim)
    assert not any(qw.fits(d) for d in (96, 80, 7, 0))


LAYOUTS = [(32, 32, 128), (16, 16, 128)]
SHAPES = [(1, 1), (3, 1), (8, 1), (32, 1), (64, 1), (1, 5), (2, 7), (1, 33), (1, 2048)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_default_launch_shape_has_an_aot_signature(dtype):
    """The AOT gate compiles what the model launches: the constants ``qk_norm_whole_rope``
    passes for decode and prefill shapes are among the declared signatures'."""
    sigs = qw.aot_signatures(heads=LAYOUTS, dtypes=(dtype,))[qw.qk_norm_whole_rope_kernel]
    declared = {tuple(p.value for p in s.parameters[-7:]) for s in sigs}
    for hq, hk, d in LAYOUTS:
        for b, s in SHAPES:
            th, ts, tc = qw.launch_shape(hq, hk, d, b, s)
            assert (th, ts, d // 2, tc, qw.LATENCY, True, True) in declared, (hq, b, s)


def test_decode_spreads_one_token_over_head_groups():
    """olmo3 decode: 8 q + 8 kv head groups, one token each, the whole row in one tile."""
    th, ts, tc = qw.launch_shape(32, 32, 128, 1, 1)
    assert (th, ts, tc) == (4, 1, 32)
    assert qw._loop_grid(th, ts, 32, 32, 1, 1) == (16, 1, 1)


# --------------------------------------------------------------------------------------------
# GPU: the cuTile kernel
# --------------------------------------------------------------------------------------------

# (batch, seq, q heads, kv heads, head dim, cos batched): decode (batch 1 and 3), prefill
# lengths incl. odd ones, odd head counts, olmo3's 32 x 128 and OLMoE-like 16 x 128
GPU_CASES = [
    (1, 1, 32, 32, 128, False),
    (3, 1, 32, 32, 128, True),
    (3, 1, 5, 3, 64, False),
    (1, 7, 32, 32, 128, False),
    (2, 37, 16, 16, 128, True),
    (1, 33, 7, 7, 64, False),
    (1, 2048, 32, 32, 128, False),
    (2, 19, 6, 2, 128, True),
]


def _gpu_case(case, dtype, cos_dtype, gen):
    b, s, hq, hk, d, batched = case
    q, k, wq, wk = _inputs(b, s, hq, hk, d, gen, dtype, device="cuda")
    cos, sin = _tables(b if batched else 1, s, d, gen, device="cuda")
    return q, k, wq, wk, cos.to(cos_dtype), sin.to(cos_dtype)


def _fp64_reference(q, k, wq, wk, eps, cos, sin):
    return qw.qk_norm_whole_rope_reference(
        q.double(), k.double(), wq.double(), wk.double(), eps, cos.double(), sin.double()
    )


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dtype", "round_once"),
    [(torch.bfloat16, True), (torch.bfloat16, False), (torch.float16, True)],
)
@pytest.mark.parametrize("case", GPU_CASES)
def test_kernel_matches_fp64_reference(case, dtype, round_once, gen, poison_empty):
    cos_dtype = torch.float32 if round_once else dtype  # as OLMo 2/3 and OLMoE hand them over
    q, k, wq, wk, cos, sin = _gpu_case(case, dtype, cos_dtype, gen)
    got_q, got_k = qw.qk_norm_whole_rope(q, k, wq, wk, 1e-6, cos, sin, round_once=round_once)
    want_q, want_k = _fp64_reference(q, k, wq, wk, 1e-6, cos, sin)
    b, s, hq, hk, d, _ = case
    assert got_q.shape == (b, hq, s, d) and got_k.shape == (b, hk, s, d)
    assert got_q.dtype == got_k.dtype == dtype and got_q.is_contiguous()
    assert_close_rel(got_q, want_q)
    assert_close_rel(got_k, want_k)


@pytest.mark.gpu
@pytest.mark.parametrize("round_once", [True, False])
@pytest.mark.parametrize("case", [GPU_CASES[0], GPU_CASES[1], GPU_CASES[4]])
def test_kernel_rounds_as_upstream(case, round_once, gen, poison_empty):
    """Against the same-dtype reference (upstream's roundings) the kernel differs only where its
    fp32 sums land next to a rounding boundary: far below one extra bf16 rounding (~1e-3), so
    the rounding order is upstream's."""
    cos_dtype = torch.float32 if round_once else torch.bfloat16
    q, k, wq, wk, cos, sin = _gpu_case(case, torch.bfloat16, cos_dtype, gen)
    got_q, got_k = qw.qk_norm_whole_rope(q, k, wq, wk, 1e-6, cos, sin, round_once=round_once)
    cos32, sin32 = cos.float(), sin.float()  # the kernel rotates in fp32, rounding once
    want_q, want_k = qw.qk_norm_whole_rope_reference(q, k, wq, wk, 1e-6, cos32, sin32, round_once)
    assert_close_rel(got_q, want_q.to(got_q.dtype).float(), 5e-4)
    assert_close_rel(got_k, want_k.to(got_k.dtype).float(), 5e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", sorted(qw.VARIANTS))
@pytest.mark.parametrize("case", [GPU_CASES[1], GPU_CASES[4]])
def test_every_variant_matches(case, variant, gen, poison_empty):
    q, k, wq, wk, cos, sin = _gpu_case(case, torch.bfloat16, torch.float32, gen)
    got_q, got_k = qw.qk_norm_whole_rope(q, k, wq, wk, 1e-6, cos, sin, **qw.VARIANTS[variant])
    want_q, want_k = _fp64_reference(q, k, wq, wk, 1e-6, cos, sin)
    assert_close_rel(got_q, want_q)
    assert_close_rel(got_k, want_k)


@pytest.mark.gpu
def test_decode_replays_from_a_cuda_graph(gen):
    """Captured once, replayed on new projections and positions copied into the same buffers:
    no host read of a device value, outputs at the captured addresses."""
    q, k, wq, wk, cos, sin = _gpu_case(GPU_CASES[1], torch.bfloat16, torch.float32, gen)
    qw.qk_norm_whole_rope(q, k, wq, wk, 1e-6, cos, sin)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_q, out_k = qw.qk_norm_whole_rope(q, k, wq, wk, 1e-6, cos, sin)
    new = _gpu_case(GPU_CASES[1], torch.bfloat16, torch.float32, gen)
    for dst, src in zip((q, k, wq, wk, cos, sin), new, strict=True):
        dst.copy_(src)
    graph.replay()
    want_q, want_k = _fp64_reference(*new[:4], 1e-6, *new[4:])
    assert_close_rel(out_q, want_q)
    assert_close_rel(out_k, want_k)


@pytest.mark.gpu
def test_zero_output_fails_against_the_reference(gen):
    q, k, wq, wk, cos, sin = _gpu_case(GPU_CASES[0], torch.bfloat16, torch.float32, gen)
    want_q, _ = _fp64_reference(q, k, wq, wk, 1e-6, cos, sin)
    with pytest.raises(AssertionError):
        assert_close_rel(torch.zeros_like(want_q).bfloat16(), want_q)
