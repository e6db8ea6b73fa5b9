"""The absorbed MLA decode's per-head products (`tilegym.ops.mla_absorb`, DeepSeek V2/V3).

CPU: the fp32 references equal the ``bmm`` forms of ``tilegym.ops.mla`` (whose absorbed decode
step equals transformers' expanded one, ``test_mla.py``); the custom ops' CPU implementations
and fakes pass opcheck; bad inputs get one clear error; every launch fits a declared AOT
signature; the signatures compile for sm_90 with tensor-core mmas and TMA loads of the weight
(slow).
GPU: both products against the fp32 references on fresh random inputs, odd batch sizes and head
counts, views of a ``kv_b_proj`` weight and a strided ``q_nope``, NaN-poisoned outputs.
"""

from __future__ import annotations

import pytest
import torch

from tilegym.ops import mla, mla_absorb
from tilegym.ops.testing import assert_close_rel, launch_fits, rel_err


def _weights(h, n, v, lat, gen, device="cpu", dtype=torch.float32):
    """(kv_b weight [H * (N + V), L], W_UK view, W_UV view)."""
    w = (torch.randn(h * (n + v), lat, generator=gen, device=device) * 0.05).to(dtype)
    w_uk, w_uv = mla.split_kv_b_weight(w, h, n, v)
    return w, w_uk, w_uv


def test_references_are_the_bmm_forms():
    gen = torch.Generator().manual_seed(0)
    b, h, n, v, lat = 3, 5, 24, 20, 32
    _, w_uk, w_uv = _weights(h, n, v, lat, gen, dtype=torch.float64)
    q = torch.randn(b, h, n, generator=gen, dtype=torch.float64)
    ctx = torch.randn(b, h, lat, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(
        mla_absorb.reference_absorb_query(q, w_uk), mla.absorb_query(q, w_uk), rtol=1e-12, atol=0
    )
    torch.testing.assert_close(
        mla_absorb.reference_latent_to_heads(ctx, w_uv),
        mla.latent_to_heads(ctx, w_uv),
        rtol=1e-12,
        atol=0,
    )


def test_cpu_ops_compute_the_bmm_forms_and_pass_opcheck():
    from tilegym.ops import library

    gen = torch.Generator().manual_seed(1)
    b, h, n, v, lat = 2, 3, 16, 32, 64
    _, w_uk, w_uv = _weights(h, n, v, lat, gen)
    proj = torch.randn(b, h, n + 16, generator=gen)  # q_nope: a strided view, as in the model
    q = proj[..., :n]
    ctx = torch.randn(b, h, lat, generator=gen)
    got_q = library.mla_absorb_query(q, w_uk)
    got_o = library.mla_latent_to_heads(ctx, w_uv)
    assert got_o.is_contiguous() and got_o.shape == (b, h, v)
    torch.testing.assert_close(got_q, mla.absorb_query(q, w_uk))
    torch.testing.assert_close(got_o, mla.latent_to_heads(ctx, w_uv))
    torch.library.opcheck(library.mla_absorb_query_op, (q.bfloat16(), w_uk.bfloat16()))
    torch.library.opcheck(library.mla_latent_to_heads_op, (ctx.bfloat16(), w_uv.bfloat16()))


@pytest.mark.parametrize(
    ("fn", "x", "w", "words"),
    [
        ("absorb_query", (2, 4, 16), (4, 16), "expected"),
        ("absorb_query", (2, 4, 16), (3, 16, 32), "expected"),
        ("absorb_query", (2, 4, 16), (4, 8, 32), "does not fit"),
        ("latent_to_heads", (2, 4, 32), (4, 16, 64), "does not fit"),
    ],
)
def test_bad_shapes_get_one_clear_error(fn, x, w, words):
    args = (torch.zeros(x, dtype=torch.bfloat16), torch.zeros(w, dtype=torch.bfloat16))
    with pytest.raises(mla_absorb.MlaAbsorbInputError, match=words):
        getattr(mla_absorb, fn)(*args)


def test_bad_dtypes_devices_and_strides_get_one_clear_error():
    x, w = torch.zeros(2, 4, 16), torch.zeros(4, 16, 32)
    with pytest.raises(mla_absorb.MlaAbsorbInputError, match="bf16/fp16"):
        mla_absorb.absorb_query(x, w)
    with pytest.raises(mla_absorb.MlaAbsorbInputError, match="bf16/fp16"):
        mla_absorb.absorb_query(x.bfloat16(), w.half())
    with pytest.raises(mla_absorb.MlaAbsorbInputError, match="CUDA"):
        mla_absorb.absorb_query(x.bfloat16(), w.bfloat16())


def test_batch_tiles():
    assert [mla_absorb.batch_tile(b) for b in (1, 8, 9, 64, 65, 1000)] == [8, 8, 64, 64, 64, 64]


@pytest.mark.parametrize("b", [1, 8, 9, 64, 65])
@pytest.mark.parametrize("heads", [16, 128])
def test_every_launch_fits_a_declared_signature(b, heads):
    """What the model launches (DeepSeek-V2-Lite's widths, V3's 128 heads) is what the AOT gate
    compiles: the launch arguments, computed without a GPU, against ``aot_signatures``."""
    sigs = mla_absorb.aot_signatures()[mla_absorb.mla_head_gemm_kernel]
    w, w_uk, w_uv = _weights(heads, 128, 128, 512, torch.Generator(), dtype=torch.bfloat16)
    q = torch.zeros(b, heads, 192, dtype=torch.bfloat16)[..., :128]
    ctx = torch.zeros(b, heads, 512, dtype=torch.bfloat16)
    for x, wv, out, rows_out in (
        (q, w_uk, torch.empty(b, heads, 512, dtype=torch.bfloat16), False),
        (ctx, w_uv, torch.empty(b, heads, 128, dtype=torch.bfloat16), True),
    ):
        grid, args = mla_absorb.launch_args(x, wv, out, rows_out)
        assert any(launch_fits(s, args) for s in sigs), args[3:]
        assert grid[0] == heads * (out.shape[2] // 64)
        assert grid[1] * args[3] >= b > (grid[1] - 1) * args[3]


@pytest.mark.slow
def test_signatures_compile_for_sm90_on_tensor_cores_with_tma_weight_loads():
    from tilegym.kernel_inventory.compile import compile_kernel, toolchain_problem
    from tilegym.kernel_inventory.remarks import kernel_remarks, scalar_mmas

    if toolchain_problem():
        pytest.skip(toolchain_problem())
    kernel = mla_absorb.mla_head_gemm_kernel
    sigs = mla_absorb.aot_signatures()[kernel]
    assert compile_kernel(kernel, sigs, "sm_90") is None
    for sig in sigs:
        mmas = kernel_remarks(kernel, sig, "sm_90")
        assert mmas and not scalar_mmas(mmas), [r.instruction for r in mmas]
        loads = [r for r in kernel_remarks(kernel, sig, "sm_90", "memory") if "Load" in r.message]
        assert any("TMA" in r.instruction for r in loads), [r.instruction for r in loads]


# ------------------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("b", "h", "n", "v", "lat"),
    [
        (1, 16, 128, 128, 512),  # DeepSeek-V2-Lite at batch 1 and 8
        (8, 16, 128, 128, 512),
        (3, 16, 128, 128, 512),
        (9, 16, 128, 128, 512),  # the 64-row batch tile, mostly padding
        (70, 16, 128, 128, 512),  # two batch tiles
        (2, 128, 128, 128, 512),  # DeepSeek-V3's 128 heads
        (5, 5, 64, 96, 256),  # odd heads, a value width no multiple of the column tile
    ],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_products_match_fp32_references(b, h, n, v, lat, dtype, gen, poison_empty):
    _, w_uk, w_uv = _weights(h, n, v, lat, gen, "cuda", dtype)
    # q_nope as the model has it: the first N of each head's N + R projection columns
    proj = torch.randn(b, 1, h, n + 64, generator=gen, device="cuda").to(dtype)
    q = proj.transpose(1, 2)[:, :, 0, :n]
    ctx = torch.randn(b, h, lat, generator=gen, device="cuda").to(dtype)
    got_q = mla_absorb.absorb_query(q, w_uk)
    got_o = mla_absorb.latent_to_heads(ctx, w_uv)
    assert got_q.shape == (b, h, lat) and got_o.shape == (b, h, v) and got_o.is_contiguous()
    ref_q = torch.einsum("bhn,hnl->bhl", q.float(), w_uk.float())
    ref_o = torch.einsum("bhl,hvl->bhv", ctx.float(), w_uv.float())
    assert_close_rel(got_q, ref_q)
    assert_close_rel(got_o, ref_o)
    # one rounding of an fp32 accumulation: as close as the bmm of the same inputs
    assert_close_rel(got_q, ref_q, 2 * rel_err(mla.absorb_query(q, w_uk), ref_q) + 1e-3)


@pytest.mark.gpu
def test_library_ops_run_the_kernels_in_a_compiled_step(gen):
    """The custom ops trace and run inside a compiled function (the decode step's form)."""
    from tilegym.ops import library

    library.register_inductor_fallbacks()
    _, w_uk, w_uv = _weights(16, 128, 128, 512, gen, "cuda", torch.bfloat16)
    q = torch.randn(8, 16, 128, generator=gen, device="cuda").bfloat16()

    @torch.compile(fullgraph=True)
    def step(q):
        return library.mla_latent_to_heads(library.mla_absorb_query(q, w_uk), w_uv)

    q_lat = torch.einsum("bhn,hnl->bhl", q.float(), w_uk.float())
    assert_close_rel(step(q), torch.einsum("bhl,hvl->bhv", q_lat, w_uv.float()))
