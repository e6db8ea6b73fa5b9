"""Gated delta rule: the fp32 references against transformers' own functions (CPU), the AOT
signatures against the launches (CPU), and the cuTile kernels against the references (GPU)."""

from __future__ import annotations

import cuda.tile as ct
import pytest
import torch

from tilegym.ops import gated_delta as gd
from tilegym.ops.testing import REL_TOL, assert_close_rel, launch_fits, rel_err

qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")


def _inputs(bsz, n_tok, hk, hv, dk, dv, gen, device="cpu", dtype=torch.float32, pad=0):
    """Raw projections as ``Qwen3_5GatedDeltaNet`` feeds them (q/k/v views of one conv output);
    the first ``pad`` tokens of batch row 0 are left padding (zero, as the masked projections
    make them), and the gate parameters are drawn like the module initialises them."""
    conv = torch.randn(bsz, n_tok, 2 * hk * dk + hv * dv, generator=gen, device=device)
    a = torch.randn(bsz, n_tok, hv, generator=gen, device=device) * 2
    b = torch.randn(bsz, n_tok, hv, generator=gen, device=device) * 2
    if pad:
        conv[0, :pad] = 0
        a[0, :pad], b[0, :pad] = 0, 0
    conv, a, b = (x.to(dtype) for x in (conv, a, b))
    q = conv[..., : hk * dk].view(bsz, n_tok, hk, dk)
    k = conv[..., hk * dk : 2 * hk * dk].view(bsz, n_tok, hk, dk)
    v = conv[..., 2 * hk * dk :].view(bsz, n_tok, hv, dv)
    A_log = torch.empty(hv, device=device).uniform_(0.01, 16, generator=gen).log().to(dtype)
    dt_bias = (torch.rand(hv, generator=gen, device=device) * 2 - 1).to(dtype)
    return q, k, v, a, b, A_log, dt_bias


def _state(bsz, hv, dk, dv, gen, device="cpu"):
    return torch.randn(bsz, hv, dk, dv, generator=gen, device=device) * 0.1


# ---------------------------------------------------------------------------------------------
# CPU: references vs transformers
# ---------------------------------------------------------------------------------------------

SHAPES = [  # (B, T, Hk, Hv, Dk, Dv)
    (1, 1, 2, 2, 16, 16),
    (2, 5, 2, 4, 16, 8),
    (1, 63, 2, 2, 32, 16),
    (2, 64, 1, 2, 16, 32),
    (1, 65, 2, 2, 16, 16),
    (2, 130, 2, 4, 32, 16),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_state", [False, True])
def test_references_match_transformers(shape, with_state, cpu_gen):
    bsz, n_tok, hk, hv, dk, dv = shape
    q, k, v, a, b, A_log, dt_bias = _inputs(*shape, cpu_gen, pad=min(3, n_tok - 1))
    g, beta = gd.gates_reference(a, b, A_log, dt_bias)
    s0 = _state(bsz, hv, dk, dv, cpu_gen) if with_state else None
    kw = dict(initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    # q/k repeated to the value heads as the module does before these functions up to 5.17
    qr, kr = (x.repeat_interleave(hv // hk, dim=2) for x in (q, k))
    hf_rec = qwen3_5.torch_recurrent_gated_delta_rule(qr, kr, v, g=g, beta=beta, **kw)
    hf_chunk = qwen3_5.torch_chunk_gated_delta_rule(qr, kr, v, g=g, beta=beta, **kw)
    rec = gd.recurrent_reference(q, k, v, g, beta, s0)
    chunk = gd.chunk_reference(q, k, v, g, beta, s0)
    split = gd.chunk_reference(q, k, v, g, beta, s0, split=True)
    # fp32, the chunked and recurrent orders of summation: 1.4e-5 apart at T = 64 for one seed
    # (outputs ~1e-2); a wrong gate or beta is off by ~1e-1
    for mine in (rec, chunk, split):
        for got, want in zip(mine, hf_rec, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=5e-5)
    for got, want in zip(chunk, hf_chunk, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=5e-5)


def test_gates_reference_is_the_module_math(cpu_gen):
    """The gate formula is the module's, in bf16 as the model runs it (beta rounded to bf16)."""
    q, k, v, a, b, A_log, dt_bias = _inputs(2, 7, 2, 4, 16, 16, cpu_gen, dtype=torch.bfloat16)
    g, beta = gd.gates_reference(a, b, A_log, dt_bias)
    assert g.dtype == torch.float32 and beta.dtype == torch.bfloat16
    sp = torch.log1p(torch.exp(a.float() + dt_bias.float()))
    torch.testing.assert_close(g, -A_log.float().exp() * sp)
    assert (g <= 0).all()


def test_ut_inverse_is_the_inverse_for_near_singular_chunks(cpu_gen):
    """Identical keys and beta near 1 (the hardest case for a product-of-powers inverse):
    the doubling inverse is still the exact inverse in fp32."""
    n = 64
    am = torch.ones(n, n).tril(-1) * 0.999
    t = gd.ut_inverse_reference(am)
    torch.testing.assert_close(t @ (torch.eye(n) + am), torch.eye(n), rtol=0, atol=1e-4)
    # UT systems as the kernels build them: beta_i k_i.k_j exp(gcum_i - gcum_j), unit keys,
    # against the fp64 inverse
    k = torch.nn.functional.normalize(torch.randn(3, n, 32, generator=cpu_gen), dim=-1)
    beta = torch.rand(3, n, 1, generator=cpu_gen)
    gc = (-torch.rand(3, n, generator=cpu_gen) * 0.2).cumsum(-1)
    am = (beta * k @ k.transpose(-1, -2) * (gc[..., :, None] - gc[..., None, :]).exp()).tril(-1)
    t = gd.ut_inverse_reference(am)
    want = torch.linalg.inv(torch.eye(n, dtype=torch.float64) + am.double())
    assert rel_err(t, want) < 1e-5
    for block in (2, 8, 16, 32):  # the diagonal blocks first (ut_block): the same inverse
        assert rel_err(gd.ut_inverse_reference(am, block), want) < 1e-5


def test_blocked_ut_inverse_is_the_inverse_in_fp64(cpu_gen):
    """The doubling started from the diagonal blocks' inverses is exact arithmetic, not an
    approximation: in fp64 it is the inverse to rounding, at every block size."""
    n = 64
    am = torch.randn(2, n, n, generator=cpu_gen, dtype=torch.float64).tril(-1) * 0.3
    eye = torch.eye(n, dtype=torch.float64).expand(2, -1, -1)
    for block in (0, 2, 4, 8, 16, 32):
        t = gd.ut_inverse_reference(am, block)
        torch.testing.assert_close(t @ (eye + am), eye, rtol=0, atol=1e-9)


def test_reference_catches_a_wrong_decay(cpu_gen):
    """The equality check can fail: a decay off by 1% is detected."""
    q, k, v, a, b, A_log, dt_bias = _inputs(1, 70, 2, 2, 16, 16, cpu_gen)
    g, beta = gd.gates_reference(a, b, A_log, dt_bias)
    out, _ = gd.chunk_reference(q, k, v, g, beta)
    bad, _ = gd.chunk_reference(q, k, v, g * 1.01, beta)
    assert rel_err(bad, out) > 1e-4
    bad, _ = gd.chunk_reference(q, k, v, g * 1.01, beta, split=True)
    assert rel_err(bad, out) > 1e-4


# ---------------------------------------------------------------------------------------------
# CPU: AOT signatures cover the launches
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def launches(monkeypatch):
    """Record (kernel, grid, args) of every ct.launch instead of launching (CPU tensors)."""
    seen = []

    def record(stream, grid, kernel, args):
        seen.append((kernel, grid, args))

    monkeypatch.setattr(ct, "launch", record)
    monkeypatch.setattr(gd, "stream", lambda *a: None)
    monkeypatch.setattr(gd, "check_activation", lambda *a: None)
    return seen


@pytest.mark.parametrize("heads", [(16, 16, 128, 128), (16, 32, 128, 128)])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize(
    ("two_pass", "apply_tf32", "ut_tf32"),
    [(False, False, False), (True, False, False), (True, True, False), (True, True, True)],
)
def test_aot_signatures_cover_the_launches(
    launches, heads, split, two_pass, apply_tf32, ut_tf32, cpu_gen
):
    hk, hv, dk, dv = heads
    sigs = gd.aot_signatures(
        heads=(heads,),
        dtypes=(torch.bfloat16,),
        split=(split,),
        two_pass=(two_pass,),
        apply_tf32=(apply_tf32,),
        ut_tf32=(ut_tf32,),
    )
    q, k, v, a, b, A_log, dt_bias = _inputs(2, 3, hk, hv, dk, dv, cpu_gen, dtype=torch.bfloat16)
    state = torch.zeros(2, hv, dk, dv)
    kw = dict(split=split, prep_two_pass=two_pass, apply_tf32=apply_tf32, ut_tf32=ut_tf32)
    gd.gated_delta_recurrent(q, k, v, a, b, A_log, dt_bias, state)
    gd.gated_delta_chunk(q, k, v, a, b, A_log, dt_bias, **kw)
    gd.gated_delta_chunk(q, k, v, a, b, A_log, dt_bias, state, **kw)
    names = []
    for kernel, _, args in launches:
        names.append(kernel._pyfunc.__name__)
        assert any(launch_fits(s, args) for s in sigs[kernel]), (kernel._pyfunc.__name__, args)
    assert set(names) == {k._pyfunc.__name__ for k in sigs}


_BOTH = (False, True)
_EVERY_FORM = dict(split=_BOTH, two_pass=_BOTH, apply_tf32=_BOTH, ut_tf32=_BOTH)
_AOT_CASES = [
    (kernel._pyfunc.__name__, i)
    for kernel, sigs in gd.aot_signatures(**_EVERY_FORM).items()
    for i in range(len(sigs))
]


@pytest.mark.slow
@pytest.mark.parametrize("name, index", _AOT_CASES)
def test_aot_signatures_compile_for_sm90(name, index):
    """One signature a test: all of them, compiled in one test, take over ten minutes on a
    two-core machine (the prep and UT kernels several minutes each)."""
    from tilegym.kernel_inventory.compile import compile_kernel, toolchain_problem

    if toolchain_problem():
        pytest.skip(toolchain_problem())
    [(kernel, sigs)] = [
        (k, ss) for k, ss in gd.aot_signatures(**_EVERY_FORM).items() if k._pyfunc.__name__ == name
    ]
    assert compile_kernel(kernel, [sigs[index]], "sm_90") is None, (name, sigs[index])


@pytest.mark.slow
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("tf32", [False, True])
def test_two_pass_prep_runs_on_tensor_cores_without_spills(split, tf32):
    """Why the two-pass prep exists: each half compiles to wgmma with no register spills
    (the one-kernel prep compiles to mma.sync and spills 7 KB a thread), at one chunk a block
    and the compiler's occupancy (the two-chunk, two-CTA blocks the module ships spill the UT
    kernel's split-tf32 form)."""
    from cubin_ptx import instructions, ptx_lines, ptxas_usage

    from tilegym.kernel_inventory.compile import toolchain_problem
    from tilegym.ops._common import with_hints

    if toolchain_problem():
        pytest.skip(toolchain_problem())
    sigs = gd.aot_signatures(
        heads=((16, 32, 128, 128),),
        dtypes=(torch.bfloat16,),
        split=(split,),
        two_pass=(True,),
        apply_tf32=(tf32,),
        ut_tf32=(tf32,),
        chunks_per_block=1,
    )
    for kernel in (gd.gdn_chunk_ut_kernel, gd.gdn_chunk_apply_kernel):
        lines = ptx_lines(with_hints(kernel, occupancy=None), sigs[kernel][0])
        usage = ptxas_usage(lines)
        name = kernel._pyfunc.__name__
        assert usage.spill_loads == 0 and usage.spill_stores == 0, (name, usage)
        assert instructions(lines, "wgmma.mma_async"), name


# ---------------------------------------------------------------------------------------------
# GPU: kernels vs the fp32 references
# ---------------------------------------------------------------------------------------------

GPU_SHAPES = [  # (B, T, Hk, Hv, Dk, Dv)
    (1, 1, 16, 16, 128, 128),
    (2, 7, 16, 32, 128, 128),
    (1, 63, 16, 16, 128, 128),
    (2, 64, 16, 16, 128, 128),
    (1, 65, 16, 32, 128, 128),
    (3, 130, 4, 8, 128, 128),
    (1, 333, 2, 4, 64, 128),
    (1, 1000, 16, 16, 128, 128),
]


#: the prep's products at fp32 accuracy (split tf32), for the tests that compare two forms of
#: the same products: the tf32 forms would add their own rounding to the difference
FP32_PREP = dict(ut_tf32=False, apply_tf32=False)

#: shapes of the variant tests: one chunk and a token, three chunks with padding, Dk 64
VARIANT_SHAPES = [(1, 65, 16, 16, 128, 128), (3, 130, 4, 8, 128, 128), (1, 333, 2, 4, 64, 128)]


def _cuda_inputs(shape, gen, dtype, pad):
    return _inputs(*shape, gen, device="cuda", dtype=dtype, pad=pad)


def _check_chunk(
    shape, dtype, gen, with_state=True, variant=None, shipped=None, state_tol=1e-4, final_tol=2e-3
):
    """The chunked kernels with ``variant`` keyword arguments against the fp32 recurrent
    reference (final states to ``final_tol``); with ``shipped`` also against that form (the
    same products on the same values: outputs to 1e-2, final states to ``state_tol``)."""
    bsz, n_tok, hk, hv, dk, dv = shape
    x = _cuda_inputs(shape, gen, dtype, pad=min(5, n_tok - 1))
    s0 = _state(bsz, hv, dk, dv, gen, "cuda") if with_state else None
    out, final = gd.gated_delta_chunk(*x, s0, **{**(shipped or {}), **(variant or {})})
    g, beta = gd.gates_reference(*x[3:])
    want_out, want_state = gd.recurrent_reference(*x[:3], g, beta, s0)
    assert out.dtype == dtype and final.dtype == torch.float32
    assert_close_rel(out, want_out)
    assert_close_rel(final, want_state, final_tol)
    if shipped is not None:
        one_out, one_final = gd.gated_delta_chunk(*x, s0, **shipped)
        assert_close_rel(out, one_out.float(), 1e-2)
        assert_close_rel(final, one_final, state_tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("with_state", [False, True])
def test_chunk_kernel_matches_reference(shape, dtype, with_state, gen, poison_empty):
    _check_chunk(shape, dtype, gen, with_state)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("with_state", [False, True])
def test_split_scan_matches_reference_and_the_one_kernel_scan(
    shape, dtype, with_state, gen, poison_empty
):
    """The state pass + parallel output kernel: the recurrent reference's answer, and the
    one-kernel scan's to the two-form bound (1e-4). Both run the same tf32 products, but their
    final states differ by up to 2.3e-5 on some inputs, the same on every run of those inputs
    (``diag_split_scan.py``, H100): a 1e-5 bound failed one case in 32 now and then."""
    variant, shipped = dict(split=True), dict(split=False)
    _check_chunk(shape, dtype, gen, with_state, variant, shipped)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "shape", [(1, 1, 16, 16, 128, 128), (2, 64, 16, 16, 128, 128), (3, 130, 4, 8, 128, 128)]
)
@pytest.mark.parametrize("split", [False, True])
def test_two_pass_prep_matches_reference_and_the_one_kernel_prep(
    shape, dtype, split, gen, poison_empty
):
    """The prep as the UT-inverse kernel then the apply kernel: the recurrent reference's
    answer, and the one-kernel prep's (the same products on the same values: both at fp32
    accuracy, the tf32 forms off)."""
    variant = dict(prep_two_pass=True)
    shipped = dict(split=split, prep_two_pass=False, **FP32_PREP)
    _check_chunk(shape, dtype, gen, True, variant, shipped)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", VARIANT_SHAPES)
@pytest.mark.parametrize("split", [False, True])
def test_apply_tf32_matches_reference_and_the_split_tf32_apply(
    shape, dtype, split, gen, poison_empty
):
    """u and w as one tf32 product each: the recurrent reference's answer, and the fp32-accurate
    apply's up to tf32 rounding (the final state to the reference's own tolerance)."""
    variant = dict(apply_tf32=True)
    shipped = dict(split=split, prep_two_pass=True, **FP32_PREP)
    _check_chunk(shape, dtype, gen, True, variant, shipped, state_tol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", VARIANT_SHAPES)
@pytest.mark.parametrize("apply_tf32", [False, True])
def test_ut_tf32_matches_reference_and_the_split_tf32_inverse(
    shape, dtype, apply_tf32, gen, poison_empty
):
    """The UT system and doubling levels as one tf32 product each (alone and with the tf32
    apply): the recurrent reference's answer, and the fp32-accurate inverse's up to tf32
    rounding."""
    variant = dict(ut_tf32=True, apply_tf32=apply_tf32)
    shipped = dict(prep_two_pass=True, **FP32_PREP)
    _check_chunk(shape, dtype, gen, True, variant, shipped, state_tol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("ut_block", [8, 16])
@pytest.mark.parametrize("two_pass", [False, True])
@pytest.mark.parametrize("shape", [(1, 65, 16, 16, 128, 128), (3, 130, 4, 8, 128, 128)])
def test_blocked_ut_inverse_matches_reference_and_the_full_doubling(
    shape, two_pass, ut_block, gen, poison_empty
):
    """The UT inverse's first levels on the diagonal blocks (fp32, batched) give the recurrent
    reference's answer and the full-width doubling's, in both prep forms."""
    variant, shipped = (
        dict(ut_block=ut_block),
        dict(prep_two_pass=two_pass, ut_block=0, **FP32_PREP),
    )
    _check_chunk(shape, torch.bfloat16, gen, True, variant, shipped)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", VARIANT_SHAPES)
@pytest.mark.parametrize(
    ("split", "bv", "out_bv"),
    [
        (False, 16, 64),
        (False, 64, 64),
        (True, 16, 32),
        (True, 16, 64),
        (True, 64, 64),
        (True, 32, 128),
    ],
)
def test_scan_widths_match_reference(shape, dtype, split, bv, out_bv, gen, poison_empty):
    """The scan forms at the value-block widths ``bench_gated_delta_scan.py`` times give the
    recurrent reference's answer."""
    _check_chunk(shape, dtype, gen, True, dict(split=split, bv=bv, out_bv=out_bv))


def test_scan_at_16_value_columns_runs_on_tensor_cores_without_spills(monkeypatch):
    """Why the narrower scan is worth timing: at the shipped 32 value columns ptxas spills the
    one-kernel scan (1.1 KB a thread on cuda-tile 1.7); at 16 nothing spills and a head has
    twice the programs."""
    from cubin_ptx import instructions, ptx_lines, ptxas_usage

    from tilegym.kernel_inventory.compile import toolchain_problem

    if toolchain_problem():
        pytest.skip(toolchain_problem())
    monkeypatch.setattr(gd, "SCAN_BV", 16)  # the width aot_signatures declares the scan at
    sigs = gd.aot_signatures(heads=((16, 16, 128, 128),), dtypes=(torch.bfloat16,), split=(False,))
    lines = ptx_lines(gd.gdn_chunk_scan_kernel, sigs[gd.gdn_chunk_scan_kernel][0])
    usage = ptxas_usage(lines)
    assert usage.spill_loads == 0 and usage.spill_stores == 0, usage
    assert instructions(lines, "wgmma.mma_async")


@pytest.mark.slow
@pytest.mark.parametrize("low", [False, True], ids=["tf32", "low"])
def test_state_pass_as_it_runs_moves_tiles_by_tma_onto_wgmma_without_spills(low):
    """The state pass compiled for the aligned arrays it runs on (the last signature it
    declares): TMA copies, wgmma products, no spills, also in its 16-bit form. For unaligned
    arrays the same source becomes 4-byte ``cp.async`` copies; the AOT gate compiles both."""
    from cubin_ptx import instructions, ptx_lines, ptxas_usage

    from tilegym.kernel_inventory.compile import toolchain_problem

    if toolchain_problem():
        pytest.skip(toolchain_problem())
    one = dict(heads=((16, 16, 128, 128),), dtypes=(torch.bfloat16,), split=(True,))
    sigs = gd.aot_signatures(**one, state_low=low)
    state_sigs = sigs[gd.gdn_chunk_state_kernel]
    assert len(state_sigs) == 4  # without and with a starting state, any strides and aligned
    lines = ptx_lines(gd.gdn_chunk_state_kernel, state_sigs[-1])
    usage = ptxas_usage(lines)
    assert usage.spill_loads == 0 and usage.spill_stores == 0, usage
    assert instructions(lines, "cp.async.bulk") and instructions(lines, "wgmma.mma_async")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [*VARIANT_SHAPES, (1, 1000, 16, 16, 128, 128)])
@pytest.mark.parametrize(
    "variant",
    [
        dict(occupancy=2),
        dict(state_occupancy=2),
        dict(chunks_per_block=2),
        dict(chunks_per_block=3, occupancy=2),
        dict(chunks_per_block=2, occupancy=2, state_occupancy=2),
    ],
    ids=["occ2", "state-occ2", "cpb2", "cpb3-occ2", "cpb2-both2"],
)
def test_block_shapes_match_reference_and_the_shipped_blocks(
    shape, dtype, variant, gen, poison_empty
):
    """The parallel kernels at two CTAs an SM or walking several chunks a block (the last
    block short), and the state pass at two CTAs an SM: the recurrent reference's answer, and
    that of one chunk a block at the compiler's occupancy (the same products on the same
    values)."""
    one_chunk = dict(chunks_per_block=1, occupancy=None, state_occupancy=None)
    _check_chunk(shape, dtype, gen, True, variant, shipped=one_chunk)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [*VARIANT_SHAPES, (1, 1000, 16, 16, 128, 128)])
def test_low_state_pass_matches_reference(shape, dtype, gen, poison_empty):
    """The state pass on 16-bit w and keys, its products on the state and v' rounded to the
    inputs' dtype (fla's precision): outputs within the dtype's tolerance of the fp32
    recurrence, final states within 1e-2."""
    _check_chunk(shape, dtype, gen, True, dict(state_low=True), final_tol=1e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [*VARIANT_SHAPES, (1, 1000, 16, 16, 128, 128)])
def test_low_state_pass_algorithm_fits_its_gpu_test_bounds(shape, dtype, cpu_gen):
    """Why the 16-bit state pass's GPU test bounds hold: its algorithm in fp32 PyTorch with
    the state pass's operands rounded to the dtype is, against the fp32 recurrence, well
    inside them: outputs in the dtype at most a quarter of theirs, final states at most half
    (bf16 reaches about 2.9e-3 of 1e-2 over 60 seeds)."""
    bsz, n_tok, hk, hv, dk, dv = shape
    x = _inputs(*shape, cpu_gen, dtype=dtype, pad=min(5, n_tok - 1))
    s0 = _state(bsz, hv, dk, dv, cpu_gen, "cpu")
    g, beta = gd.gates_reference(*x[3:])
    want_out, want_state = gd.recurrent_reference(*x[:3], g, beta, s0)
    out, final = gd.chunk_reference(*x[:3], g, beta, s0, split=True, low=dtype)
    assert_close_rel(out.to(dtype), want_out, REL_TOL[dtype] / 4)
    assert_close_rel(final, want_state, 1e-2 / 2)
    exact_out, _ = gd.chunk_reference(*x[:3], g, beta, s0, split=True)
    assert rel_err(out, want_out) > rel_err(exact_out, want_out)  # the rounding is applied


def test_low_state_pass_needs_the_split_scan_after_the_two_pass_prep(cpu_gen):
    x = _inputs(1, 3, 2, 2, 16, 16, cpu_gen)
    for other in (dict(split=False), dict(prep_two_pass=False)):
        with pytest.raises(ValueError, match="state_low needs the split"):
            gd.gated_delta_chunk(*x, state_low=True, **other)
    with pytest.raises(ValueError, match="state_low needs bf16 or fp16 inputs"):
        gd.gated_delta_chunk(*x, state_low=True)  # fp32 inputs


def test_aot_signatures_cover_the_low_state_pass(launches, cpu_gen):
    """The 16-bit state pass and the apply kernel writing its w and keys in 16 bits."""
    sigs = gd.aot_signatures(heads=((2, 4, 64, 128),), dtypes=(torch.bfloat16,), state_low=True)
    x = _inputs(2, 70, 2, 4, 64, 128, cpu_gen, dtype=torch.bfloat16)
    gd.gated_delta_chunk(*x, state_low=True)
    kernels = {kernel for kernel, _, _ in launches}
    assert {gd.gdn_chunk_state_kernel, gd.gdn_chunk_apply_kernel} <= kernels
    for kernel, _, args in launches:
        assert any(launch_fits(s, args) for s in sigs[kernel]), (kernel._pyfunc.__name__, args)


def test_chunks_per_block_must_be_positive(cpu_gen):
    x = _inputs(1, 3, 2, 2, 16, 16, cpu_gen)
    with pytest.raises(ValueError, match="chunks_per_block 0"):
        gd.gated_delta_chunk(*x, chunks_per_block=0)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kernel",
    [
        gd.gdn_chunk_ut_kernel,
        gd.gdn_chunk_apply_kernel,
        gd.gdn_chunk_output_kernel,
        gd.gdn_chunk_state_kernel,
    ],
    ids=lambda k: k._pyfunc.__name__,
)
def test_prefill_kernels_fit_two_ctas_an_sm_without_spills(kernel):
    """Why the occupancy forms are worth timing: left to the compiler, each prefill kernel takes
    over half an SM's 228 KB of shared memory (one CTA an SM); hinted at 2 each fits two, on
    wgmma, with no spills (at one chunk a block)."""
    from cubin_ptx import instructions, ptx_lines, ptxas_usage

    from tilegym.kernel_inventory.compile import toolchain_problem
    from tilegym.ops._common import with_hints

    if toolchain_problem():
        pytest.skip(toolchain_problem())
    one_chunk = dict(split=(True,), chunks_per_block=1)
    sigs = gd.aot_signatures(heads=((16, 16, 128, 128),), dtypes=(torch.bfloat16,), **one_chunk)
    sig = sigs[kernel][-1]  # aligned arrays, as the model's are
    assert ptxas_usage(ptx_lines(with_hints(kernel, occupancy=None), sig)).shared > 114 * 1024
    lines = ptx_lines(with_hints(kernel, occupancy=2), sig)
    usage = ptxas_usage(lines)
    assert usage.spill_loads == 0 and usage.spill_stores == 0, usage
    assert usage.shared <= 114 * 1024 and usage.registers <= 128, usage
    assert instructions(lines, "wgmma.mma_async")


def test_ut_block_must_be_a_power_of_two_below_the_chunk():
    for bad in (1, 3, 12, gd.CHUNK, 128):
        with pytest.raises(ValueError, match="ut_block"):
            gd._log_block(bad)
    assert [gd._log_block(n) for n in (0, 2, 16, 32)] == [0, 1, 4, 5]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 65, 16, 16, 128, 128), (2, 130, 4, 8, 128, 128)])
def test_chunk_kernel_with_fp32_fma_prep_matches_reference(shape, gen, poison_empty):
    """The UT transform's other form (fp32 FMAs instead of split tf32) is exact too."""
    bsz, n_tok, hk, hv, dk, dv = shape
    q, k, v, a, b, A_log, dt_bias = _cuda_inputs(shape, gen, torch.bfloat16, pad=3)
    s0 = _state(bsz, hv, dk, dv, gen, "cuda")
    x = (q, k, v, a, b, A_log, dt_bias, s0)
    out, final = gd.gated_delta_chunk(*x, prep_split=False, **FP32_PREP)
    g, beta = gd.gates_reference(a, b, A_log, dt_bias)
    want_out, want_state = gd.recurrent_reference(q, k, v, g, beta, s0)
    assert_close_rel(out, want_out)
    assert_close_rel(final, want_state, 2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "shape", [(1, 1, 16, 16, 128, 128), (4, 1, 16, 32, 128, 128), (2, 3, 2, 4, 64, 64)]
)
def test_recurrent_kernel_matches_reference(shape, dtype, gen, poison_empty):
    bsz, n_tok, hk, hv, dk, dv = shape
    q, k, v, a, b, A_log, dt_bias = _cuda_inputs(shape, gen, dtype, pad=0)
    s0 = _state(bsz, hv, dk, dv, gen, "cuda")
    state = s0.clone()
    out = gd.gated_delta_recurrent(q, k, v, a, b, A_log, dt_bias, state)
    g, beta = gd.gates_reference(a, b, A_log, dt_bias)
    want_out, want_state = gd.recurrent_reference(q, k, v, g, beta, s0)
    assert_close_rel(out, want_out)
    assert_close_rel(state, want_state, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("n_prefill", [1, 63, 64, 65, 130])
def test_prefill_then_decode_carries_the_state(n_prefill, gen, poison_empty):
    """Prefill (chunked kernel) then 6 decode steps (recurrent kernel, state in place) equal the
    recurrent reference over the whole sequence, left padding included."""
    shape = (2, n_prefill + 6, 16, 32, 128, 128)
    q, k, v, a, b, A_log, dt_bias = _cuda_inputs(shape, gen, torch.bfloat16, pad=min(4, n_prefill))
    p = slice(0, n_prefill)
    out_p, state = gd.gated_delta_chunk(q[:, p], k[:, p], v[:, p], a[:, p], b[:, p], A_log, dt_bias)
    outs = [out_p]
    for t in range(n_prefill, n_prefill + 6):
        d = slice(t, t + 1)
        step = (x[:, d] for x in (q, k, v, a, b))
        outs.append(gd.gated_delta_recurrent(*step, A_log, dt_bias, state))
    g, beta = gd.gates_reference(a, b, A_log, dt_bias)
    want_out, want_state = gd.recurrent_reference(q, k, v, g, beta)
    assert_close_rel(torch.cat(outs, dim=1), want_out)
    assert_close_rel(state, want_state, 2e-3)


@pytest.mark.gpu
def test_recurrent_kernel_in_a_cuda_graph(gen):
    """The decode kernel replays from a captured graph with the state updated in place."""
    shape = (2, 1, 16, 16, 128, 128)
    q, k, v, a, b, A_log, dt_bias = _cuda_inputs(shape, gen, torch.bfloat16, pad=0)
    state = _state(2, 16, 128, 128, gen, "cuda")
    s0 = state.clone()
    gd.gated_delta_recurrent(q, k, v, a, b, A_log, dt_bias, state.clone())  # compile outside
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gd.gated_delta_recurrent(q, k, v, a, b, A_log, dt_bias, state)
    state.copy_(s0)
    graph.replay()
    graph.replay()
    g, beta = gd.gates_reference(a, b, A_log, dt_bias)
    twice = (torch.cat([x, x], dim=1) for x in (q, k, v, g, beta))
    want_out, want_state = gd.recurrent_reference(*twice, s0)
    assert_close_rel(out, want_out[:, 1:])
    assert_close_rel(state, want_state, 1e-5)


@pytest.mark.gpu
def test_zero_output_fails_against_real_reference(gen):
    q, k, v, a, b, A_log, dt_bias = _cuda_inputs((1, 70, 2, 2, 128, 128), gen, torch.bfloat16, 0)
    g, beta = gd.gates_reference(a, b, A_log, dt_bias)
    want, _ = gd.recurrent_reference(q, k, v, g, beta)
    with pytest.raises(AssertionError):
        assert_close_rel(torch.zeros_like(want).bfloat16(), want)
