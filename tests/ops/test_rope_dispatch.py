"""The RoPE kernels' dispatch on plain values (no GPU): which kernel "auto" launches, and with
how many heads a block when a model tunes its decode step (``decode_heads``)."""

import pytest

from tilegym.ops import rope as rp


def test_auto_keeps_the_per_token_kernel_for_small_calls_by_default():
    assert rp._pick(None, "auto", 32, 1, True) == ("token", None)
    assert rp._pick(None, "auto", 32, 32, True) == ("token", None)
    assert rp._pick(None, "auto", 32, 33, True) == ("loop", None)
    assert rp._pick(None, "auto", 32, 1, False) == ("loop", None)  # halves not whole tiles


def test_decode_heads_put_small_calls_on_the_loop_kernel_and_leave_large_ones_alone():
    assert rp._pick(None, "auto", 32, 1, True, decode_heads=1) == ("loop", 1)
    assert rp._pick(None, "auto", 32, 32, False, decode_heads=2) == ("loop", 2)
    assert rp._pick(None, "auto", 32, 33, True, decode_heads=1) == ("loop", None)


def test_a_named_variant_wins_over_decode_heads():
    assert rp._pick("token", "auto", 32, 1, True, decode_heads=4) == ("token", None)
    assert rp._pick("loop", "auto", 32, 1, True, decode_heads=4) == ("loop", None)


def test_bad_variants_and_negative_heads_are_errors():
    with pytest.raises(ValueError, match="unknown variant 'tiled'"):
        rp._pick("tiled", "auto", 32, 1, True)
    with pytest.raises(ValueError, match="decode_heads must be >= 0"):
        rp._pick(None, "auto", 32, 1, True, decode_heads=-1)


def test_the_sweep_and_the_gpu_tests_cover_the_decode_heads_variants():
    for variants in (rp.ROPE_VARIANTS, rp.QK_VARIANTS):
        assert {v.get("decode_heads") for v in variants.values()} >= {1, 2}


@pytest.mark.slow
def test_the_decode_heads_launches_compile_for_sm90():
    """The head-loop kernels at one head and two heads a block, one token a block (what
    ``rope_heads`` 1 and 2 launch at decode), compile on the CPU for qwen3's and llama's heads."""
    import io

    from cuda.tile.compilation import export_kernel

    base = rp.aot_signatures(dtypes=(rp.AOT_DTYPES[0],))
    tuned = rp.aot_signatures(dtypes=(rp.AOT_DTYPES[0],), decode_heads=(1, 2))
    for kernel in (rp.rope_loop_kernel, rp.qk_norm_rope_loop_kernel):
        new = [sig for sig in tuned[kernel] if sig not in base[kernel]]
        assert len(new) >= 4, kernel
        buf = io.BytesIO()
        export_kernel(kernel, new, buf, gpu_code="sm_90", output_format="cubin")
        assert len(buf.getvalue()) > 1000
