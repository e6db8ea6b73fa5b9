"""Prefill and decode attention kernels against an fp32 SDPA reference with the same mask."""

import math

import pytest
import torch
from transformers.masking_utils import (
    causal_mask_function,
    sdpa_mask,
    sliding_window_causal_mask_function,
)

from tilegym.ops.attention import (
    KERNEL_HEAD_DIMS,
    one_split_tile_n,
    plan_splits,
    reference_attention,
    reference_mask,
)
from tilegym.ops.testing import REL_TOL, assert_close_rel, rel_err

HEADS = {"qwen3": (16, 8, 128), "llama": (32, 8, 64)}
"""(query heads, kv heads, head_dim) run on a GPU, the benchmark's head configurations."""
NEW_HEADS = {"phi3.5": (32, 32, 96), "gemma3": (4, 1, 256)}
"""Phi-3.5-mini (head_dim 96, in 128-wide tiles) and gemma-3-1b (head_dim 256, GQA 4:1)."""
ALL_HEADS = {**HEADS, **NEW_HEADS}
NEW_HEADS_DIMS = sorted({d for _, _, d in NEW_HEADS.values()})


# ------------------------------------------------------------------ CPU: mask semantics, planning


@pytest.mark.parametrize(
    "sq,skv,window", [(5, 5, None), (7, 7, 3), (1, 9, None), (1, 9, 4), (4, 11, None), (4, 11, 5)]
)
def test_reference_mask_matches_transformers_sdpa_mask(sq, skv, window):
    pad = torch.ones(2, skv, dtype=torch.bool)
    pad[1, :3] = False  # left padding of the second sequence
    fn = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
    want = sdpa_mask(
        batch_size=2,
        q_length=sq,
        kv_length=skv,
        q_offset=skv - sq,
        mask_function=fn,
        attention_mask=pad,
        allow_is_causal_skip=False,
    )
    got = reference_mask(2, sq, skv, window=window, key_valid=pad)
    assert torch.equal(got, want)


def test_reference_attention_zeroes_rows_without_keys():
    q, k, v = (torch.randn(1, 2, 3, 8) for _ in range(3))
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    mask[..., 0, :] = False
    out = reference_attention(q, k, v, mask)
    assert out.shape == (1, 3, 2, 8)
    assert torch.all(out[:, 0] == 0) and torch.isfinite(out).all()
    assert out[:, 1:].abs().sum() > 0


@pytest.mark.parametrize(
    "bh,tiles,sms,waves,want",
    [(8, 4, 132, 2, 1), (8, 128, 132, 2, 32), (64, 128, 132, 2, 4), (64, 128, 132, 4, 8)],
)
def test_plan_splits(bh, tiles, sms, waves, want):
    assert plan_splits(bh, tiles, sms, waves=waves) == want


# ------------------------------------------------------------------ GPU: prefill


def _qkv(b, hq, hkv, sq, skv, d, gen, dtype=torch.bfloat16):
    """Inputs in transformers' strided layout: [B, H, S, D] views of [B, S, H, D] tensors."""
    q = torch.randn(b, sq, hq, d, device="cuda", generator=gen).to(dtype).transpose(1, 2)
    k = torch.randn(b, skv, hkv, d, device="cuda", generator=gen).to(dtype).transpose(1, 2)
    v = torch.randn(b, skv, hkv, d, device="cuda", generator=gen).to(dtype).transpose(1, 2)
    return q, k, v


def _left_padding(lengths, total, device="cuda"):
    valid = torch.zeros(len(lengths), total, dtype=torch.bool, device=device)
    for i, n in enumerate(lengths):
        valid[i, total - n :] = True
    return valid


PREFILL_CASES = [
    # b, sq, skv, window, padded lengths (None = no padding)
    (1, 173, 173, None, None),
    (2, 64, 64, None, None),
    (3, 300, 300, None, (300, 129, 7)),
    (2, 257, 257, 37, None),
    (3, 200, 200, 64, (200, 150, 33)),
    (2, 77, 333, None, None),  # chunked prefill: queries at the end of a longer cache
    (1, 1000, 1000, None, None),
]


@pytest.mark.gpu
@pytest.mark.parametrize("model", sorted(ALL_HEADS))
@pytest.mark.parametrize("b,sq,skv,window,lengths", PREFILL_CASES)
def test_prefill_matches_fp32_reference(model, b, sq, skv, window, lengths, gen):
    from tilegym.ops.attention import prefill_attention

    hq, hkv, d = ALL_HEADS[model]
    q, k, v = _qkv(b, hq, hkv, sq, skv, d, gen)
    key_valid = None if lengths is None else _left_padding(lengths, skv)
    out = torch.full((b, sq, hq, d), float("nan"), dtype=q.dtype, device="cuda")
    scale = 0.7 / math.sqrt(d)
    got = prefill_attention(
        q, k, v, scale=scale, window=window, key_valid=key_valid, out=out, q_start=skv - sq
    )
    assert got.data_ptr() == out.data_ptr()
    mask = reference_mask(b, sq, skv, window=window, key_valid=key_valid, device="cuda")
    ref = reference_attention(q, k, v, mask, scale=scale)
    err = assert_close_rel(got, ref)
    # no worse than twice torch's own bf16 SDPA on the same inputs and mask
    has_key = mask.any(-1, keepdim=True)
    group = hq // hkv
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q,
        k.repeat_interleave(group, 1),
        v.repeat_interleave(group, 1),
        attn_mask=mask | ~has_key,
        scale=scale,
    ).masked_fill(~has_key, 0.0)
    assert err <= max(2.0 * rel_err(sdpa.transpose(1, 2), ref), 4e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["qwen3", *sorted(NEW_HEADS)])
def test_prefill_padded_rows_are_zero_and_zero_output_fails(model, gen):
    from tilegym.ops.attention import prefill_attention

    hq, hkv, d = ALL_HEADS[model]
    q, k, v = _qkv(2, hq, hkv, 50, 50, d, gen)
    valid = _left_padding((50, 20), 50)
    got = prefill_attention(q, k, v, key_valid=valid)
    assert torch.all(got[1, :30] == 0)
    ref = reference_attention(q, k, v, reference_mask(2, 50, 50, key_valid=valid, device="cuda"))
    assert_close_rel(got, ref)
    with pytest.raises(AssertionError):
        assert_close_rel(torch.zeros_like(got), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["llama", *sorted(NEW_HEADS)])
def test_prefill_non_causal(model, gen):
    from tilegym.ops.attention import prefill_attention

    hq, hkv, d = ALL_HEADS[model]
    q, k, v = _qkv(2, hq, hkv, 70, 130, d, gen)
    got = prefill_attention(q, k, v, causal=False)
    ref = reference_attention(q, k, v, reference_mask(2, 70, 130, causal=False, device="cuda"))
    assert_close_rel(got, ref)


@pytest.mark.gpu
def test_prefill_rejects_unsupported_head_dim(gen):
    from tilegym.ops.attention import AttentionInputError, prefill_attention

    q, k, v = _qkv(1, 4, 2, 8, 8, 80, gen)
    with pytest.raises(AttentionInputError, match="head_dim 80"):
        prefill_attention(q, k, v)


# ------------------------------------------------------------------ GPU: decode

DECODE_LENGTHS = [1, 7, 64, 65, 255, 1000, 4097, 8192]


@pytest.mark.gpu
@pytest.mark.parametrize("tile_n", [64, 128])
@pytest.mark.parametrize("model", sorted(ALL_HEADS))
@pytest.mark.parametrize("skv", DECODE_LENGTHS)
def test_decode_matches_fp32_reference(model, skv, tile_n, gen, poison_empty):
    from tilegym.ops.attention import decode_attention

    hq, hkv, d = ALL_HEADS[model]
    b = 3
    q, k, v = _qkv(b, hq, hkv, 1, skv, d, gen)
    got = decode_attention(q, k, v, scale=0.09, tile_n=tile_n, split_waves=4)
    ref = reference_attention(q, k, v, reference_mask(b, 1, skv, device="cuda"), scale=0.09)
    assert got.shape == (b, 1, hq, d)
    assert_close_rel(got, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("tile_n", [64, 128])
@pytest.mark.parametrize("model", sorted(ALL_HEADS))
@pytest.mark.parametrize("splits", [1, 3, None])
def test_decode_padding_window_and_splits(model, splits, tile_n, gen, poison_empty):
    from tilegym.ops.attention import decode_attention

    hq, hkv, d = ALL_HEADS[model]
    b, skv = 4, 1500
    q, k, v = _qkv(b, hq, hkv, 1, skv, d, gen)
    valid = _left_padding((1500, 900, 65, 1), skv)
    kw = dict(num_splits=splits, tile_n=tile_n)
    got = decode_attention(q, k, v, key_valid=valid, **kw)
    ref = reference_attention(q, k, v, reference_mask(b, 1, skv, key_valid=valid, device="cuda"))
    assert_close_rel(got, ref)
    got = decode_attention(q, k, v, key_valid=valid, window=300, **kw)
    mask = reference_mask(b, 1, skv, key_valid=valid, window=300, device="cuda")
    assert_close_rel(got, reference_attention(q, k, v, mask))


@pytest.mark.gpu
@pytest.mark.parametrize("tile_n", [64, 128])
@pytest.mark.parametrize("model", sorted(ALL_HEADS))
def test_decode_per_sequence_lengths_ignore_stale_cache(model, tile_n, gen, poison_empty):
    from tilegym.ops.attention import decode_attention

    hq, hkv, d = ALL_HEADS[model]
    b, skv = 3, 2000
    q, k, v = _qkv(b, hq, hkv, 1, skv, d, gen)
    lens = torch.tensor([2000, 1234, 3], device="cuda", dtype=torch.int32)
    k = k.clone()
    v = v.clone()
    for i, n in enumerate(lens.tolist()):  # stale entries past each length must not leak in
        k[i, :, n:] = float("nan")
        v[i, :, n:] = float("nan")
    got = decode_attention(q, k, v, kv_lens=lens, tile_n=tile_n)
    mask = reference_mask(b, 1, skv, kv_lens=lens, device="cuda")
    assert_close_rel(got, reference_attention(q, k.nan_to_num(), v.nan_to_num(), mask))


@pytest.mark.gpu
def test_decode_kv_end_limits_keys(gen):
    from tilegym.ops.attention import decode_attention

    hq, hkv, d = HEADS["qwen3"]
    q, k, v = _qkv(2, hq, hkv, 1, 700, d, gen)
    got = decode_attention(q, k, v, kv_end=333)
    ref = reference_attention(
        q, k[:, :, :333], v[:, :, :333], reference_mask(2, 1, 333, device="cuda")
    )
    assert_close_rel(got, ref)
    assert (
        rel_err(got, reference_attention(q, k, v, reference_mask(2, 1, 700, device="cuda")))
        > REL_TOL[got.dtype]
    )


# ------------------------------------------------------------------ CPU: benchmark table shapes


def _bench_module():
    from bench_scripts import load_bench

    return load_bench("bench_attention")


def test_bench_rows_fit_their_headers():
    bench = _bench_module()
    from _timing import format_table, summarize

    st = {
        "sdpa": summarize([10.0, 11.0]),
        "tile": summarize([8.0, 9.0]),
        "n128 w4": summarize([7.0]),
    }
    row, rec = bench.decode_table_row("qwen3", 8, 4096, 1 << 20, st, ceiling_tbps=4.3)
    assert len(row) == len(bench.DECODE_HEADER) and rec["sweep_us"] == {"n128 w4": 7.0}
    assert "n128 w4:7.0" in format_table(bench.DECODE_HEADER, [row])
    assert row[bench.DECODE_HEADER.index("best")] == "n128 w4"
    assert row[bench.DECODE_HEADER.index("best speedup")] == f"{10.5 / 7.0:.2f}x"
    rows, recs = bench.prefill_table_rows("llama", 1, 8192, 32, 64, st)
    assert all(len(r) == len(bench.PREFILL_HEADER) for r in rows) and len(recs) == 3
    assert rows[0][-1] == 100.0
    c = {"torch.cat": summarize([20.0]), "tile write": summarize([5.0])}
    row, _ = bench.cache_table_row(1, 256, 1, c)
    assert len(row) == len(bench.CACHE_HEADER) and row[-1] == 4.0


# ------------------------------------------------------------------ decode launch schemes


def test_plan_splits_caps_and_short_caches():
    assert plan_splits(8, 128, 132, min_tiles=1, waves=8) == 64  # capped at DECODE_MAX_SPLITS
    assert plan_splits(8, 128, 132, min_tiles=1, waves=8, max_splits=16) == 16
    assert plan_splits(64, 2, 132, min_tiles=4) == 1  # too short to split
    assert plan_splits(8, 0, 132) == 1


def test_plan_decode_auto_one_split_for_short_caches():
    from tilegym.ops.attention import (
        DECODE_AUTO_OCCUPANCY,
        DECODE_AUTO_ONE_SPLIT_BLOCKS,
        DECODE_AUTO_ONE_SPLIT_KEYS,
        DECODE_AUTO_SCHEME,
        plan_decode,
    )

    short = DECODE_AUTO_ONE_SPLIT_KEYS
    for d, base, large in ((128, 64, 256), (64, 128, 256), (96, 64, 256), (256, 64, 128)):
        p = plan_decode(8, short, d, 132, mode="auto")
        assert (p.scheme, p.splits) == ("one", 1)
        assert p.tile_n * p.tiles_per_split >= short and p.tiles_per_split <= -(-short // large)
        p = plan_decode(8, 37, d, 132, mode="auto")  # fits one default tile
        assert (p.scheme, p.tile_n, p.tiles_per_split) == ("one", base, 1)
        p = plan_decode(8, 8192, d, 132, mode="auto")  # few blocks, long cache: split
        assert p.scheme == DECODE_AUTO_SCHEME and p.splits > 1 and p.tile_n == base
        assert p.occupancy == DECODE_AUTO_OCCUPANCY
        # enough (batch, kv head) blocks: one split with the large tile at any length
        p = plan_decode(DECODE_AUTO_ONE_SPLIT_BLOCKS, 8192, d, 132, mode="auto")
        assert (p.scheme, p.splits) == ("one", 1) and p.tile_n == large
        # a short sliding window over a long cache is short too
        p = plan_decode(8, 8192, d, 132, mode="auto", window=100)
        assert p.scheme == "one" and p.tile_n * p.tiles_per_split >= 100 + p.tile_n - 1


@pytest.mark.parametrize("mode", ["auto", "pdl", "split"])
@pytest.mark.parametrize("span", [0, 1, 37, 256, 257, 1000, 4097, 8192, 100000])
@pytest.mark.parametrize("bh", [1, 8, 40, 64, 200])
def test_plan_decode_covers_every_key(mode, span, bh):
    from tilegym.ops.attention import DECODE_MAX_SPLITS, plan_decode

    for d in KERNEL_HEAD_DIMS:
        for kw in ({}, {"num_splits": 37}, {"min_split_keys": 1, "split_waves": 8}):
            p = plan_decode(bh, span, d, 132, mode=mode, **kw)
            assert p.splits * p.tiles_per_split * p.tile_n >= span
            assert (p.splits - 1) * p.tiles_per_split * p.tile_n < max(span, 1)  # none empty
            assert 1 <= p.splits <= DECODE_MAX_SPLITS
            assert (p.scheme == "one") == (p.splits == 1)


def test_plan_decode_explicit_arguments_win():
    from tilegym.ops.attention import AttentionInputError, plan_decode

    p = plan_decode(8, 256, 128, 132, mode="auto", num_splits=4, tile_n=32, form="rows")
    assert (p.splits, p.tile_n, p.form, p.scheme) == (4, 32, "rows", "pdl")
    p = plan_decode(8, 8192, 128, 132, mode="pdl", occupancy=2)
    assert p.scheme == "pdl" and p.occupancy == 2
    with pytest.raises(AttentionInputError, match="form"):
        plan_decode(8, 256, 128, 132, form="diagonal")
    with pytest.raises(AttentionInputError, match="mode"):
        plan_decode(8, 256, 128, 132, mode="bogus")


def test_decode_aot_signatures_cover_benchmark_and_test_variants():
    """Every kernel configuration the benchmark sweep and the mode tests launch (unmasked) is in
    ``decode_kernel_configs``, i.e. compiled by the AOT gate, at every tested head config."""
    from tilegym.ops.attention import (
        decode_kernel_config,
        decode_kernel_configs,
        decode_signatures,
        plan_decode,
    )

    bench = _bench_module()
    for model, (hq, hkv, d) in ALL_HEADS.items():
        group = hq // hkv
        configs = set(decode_kernel_configs(d, group))
        assert len(decode_signatures(d, group)[next(iter(decode_signatures(d, group)))]) == len(
            configs
        )
        launched = [{}]
        if model in bench.HEADS:  # the sweep (default plans) runs the benchmark's heads only
            launched += bench.decode_variants(d).values()
        launched += [{**kw, **p} for kw in VARIANTS.values() for p in plans(d).values()]  # tests
        for kw in launched:
            kw = {k: v for k, v in kw.items() if k != "occupancy"}
            for bh in (8, 40, 64):
                for span in (1, 37, 256, 257, 1000, 4097, 8192):
                    cfg = decode_kernel_config(plan_decode(bh, span, d, 132, **kw), group)
                    assert cfg in configs, (kw, bh, span, cfg)


def test_decode_rejects_unknown_mode():
    from tilegym.ops.attention import AttentionInputError, decode_attention

    q = torch.zeros(1, 2, 1, 64)
    with pytest.raises(AttentionInputError, match="mode"):
        decode_attention(q, q, q, mode="bogus")


def _poisoned_out(b, hq, d, dtype=torch.bfloat16):
    return torch.full((b, 1, hq, d), float("nan"), dtype=dtype, device="cuda")


def _check_decode(got, ref, out):
    assert got.data_ptr() == out.data_ptr()
    assert_close_rel(got, ref)
    with pytest.raises(AssertionError):  # the check itself must reject an all-zeros output
        assert_close_rel(torch.zeros_like(got), ref)


MODE_LENGTHS = [1, 37, 256, 257, 1000, 4097, 8192]


def plans(d: int) -> dict[str, dict]:
    """Plan overrides: default, one split (small and large key tiles), many splits, short
    splits. The large tile is the one-split tile of ``plan_decode`` (256 keys up to head_dim
    128, 128 keys at 256, where 256 keys would not fit the shared memory)."""
    return {
        "default": {},
        "one": {"num_splits": 1},
        "one-large": {"num_splits": 1, "tile_n": one_split_tile_n(d)},
        "many": {"num_splits": 37},
        "short": {"min_split_keys": 1, "split_waves": 8},
    }


PLANS = sorted(plans(128))
# launch scheme x MMA orientation (x occupancy hint) variants; every one is checked
VARIANTS = {
    "pdl": {"mode": "pdl"},
    "split": {"mode": "split"},
    "auto": {"mode": "auto"},
    "rows-pdl": {"mode": "pdl", "form": "rows"},
    "rows-auto": {"mode": "auto", "form": "rows"},
    "pdl-o2": {"mode": "pdl", "occupancy": 2, "split_waves": 2},
    "pdl-o3": {"mode": "pdl", "occupancy": 3, "split_waves": 3},
    "pdl-o4": {"mode": "pdl", "occupancy": 4, "split_waves": 4},
}
# the plans that give a variant kernels no other variant runs
_PLANS_OF = {v: ["default", "many", "short"] for v in ("pdl-o2", "pdl-o3", "pdl-o4")}


@pytest.mark.gpu
@pytest.mark.parametrize(
    "variant,plan",
    [(m, p) for m in VARIANTS for p in _PLANS_OF.get(m, PLANS)],
)
@pytest.mark.parametrize("model", sorted(ALL_HEADS))
@pytest.mark.parametrize("skv", MODE_LENGTHS)
def test_decode_modes_match_fp32_reference(model, variant, plan, skv, gen, poison_empty):
    from tilegym.ops.attention import decode_attention

    hq, hkv, d = ALL_HEADS[model]
    for b in (1, 5):
        q, k, v = _qkv(b, hq, hkv, 1, skv, d, gen)
        ref = reference_attention(q, k, v, reference_mask(b, 1, skv, device="cuda"), scale=0.11)
        for _ in range(2):  # twice: a second call into the same buffers
            out = _poisoned_out(b, hq, d)
            kw = {**VARIANTS[variant], **plans(d)[plan]}
            got = decode_attention(q, k, v, scale=0.11, out=out, **kw)
            _check_decode(got, ref, out)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["pdl", "rows-pdl", "auto"])
def test_decode_back_to_back_calls_on_fresh_data(variant, gen):
    """Many launches in a row, each on new data into a reused output buffer, with no sync
    between them: a stale partial would show up as a mismatch."""
    from tilegym.ops.attention import decode_attention

    hq, hkv, d = HEADS["qwen3"]
    b, skv = 8, 3000
    outs, refs = [], []
    out = _poisoned_out(b, hq, d)
    for i in range(6):
        n = skv - 397 * i
        q, k, v = _qkv(b, hq, hkv, 1, n, d, gen)
        outs.append(decode_attention(q, k, v, out=out, **VARIANTS[variant]).clone())
        refs.append(reference_attention(q, k, v, reference_mask(b, 1, n, device="cuda")))
    for got, ref in zip(outs, refs, strict=True):
        assert_close_rel(got, ref)


MASK_VARIANTS = ["pdl", "split", "auto", "rows-pdl", "rows-auto"]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MASK_VARIANTS)
@pytest.mark.parametrize("model", sorted(ALL_HEADS))
def test_decode_modes_cache_views_per_sequence_lengths(model, mode, gen, poison_empty):
    """Reads ``[:, :, :length]`` views of ``[B, Hkv, capacity, D]`` cache buffers (strided over
    capacity) with per-sequence lengths; stale NaNs past each length must not leak in."""
    from tilegym.ops.attention import decode_attention

    hq, hkv, d = ALL_HEADS[model]
    lens_list = [1, 37, 1000, 4097, 256]
    b, length, capacity = len(lens_list), max(lens_list), 4608
    kbuf = torch.full((b, hkv, capacity, d), float("nan"), dtype=torch.bfloat16, device="cuda")
    vbuf = torch.full_like(kbuf, float("nan"))
    q, k_new, v_new = _qkv(b, hq, hkv, 1, length, d, gen)
    for i, n in enumerate(lens_list):
        kbuf[i, :, :n] = k_new[i, :, :n]
        vbuf[i, :, :n] = v_new[i, :, :n]
    k, v = kbuf[:, :, :length], vbuf[:, :, :length]
    lens = torch.tensor(lens_list, device="cuda", dtype=torch.int32)
    mask = reference_mask(b, 1, length, kv_lens=lens, device="cuda")
    ref = reference_attention(q, k.nan_to_num(), v.nan_to_num(), mask)
    for plan in plans(d).values():
        out = _poisoned_out(b, hq, d)
        got = decode_attention(q, k, v, kv_lens=lens, out=out, **VARIANTS[mode], **plan)
        _check_decode(got, ref, out)
    # kv_end over the same strided view (all sequences at one length): the first 37 keys of
    # every sequence must hold data for that (sequence 0 had only 1 valid key above)
    kbuf[:, :, :37] = k_new[:, :, :37]
    vbuf[:, :, :37] = v_new[:, :, :37]
    out = _poisoned_out(b, hq, d)
    got = decode_attention(q, kbuf[:, :, :37], vbuf[:, :, :37], out=out, **VARIANTS[mode])
    ref = reference_attention(
        q, k_new[:, :, :37], v_new[:, :, :37], reference_mask(b, 1, 37, device="cuda")
    )
    _check_decode(got, ref, out)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", MASK_VARIANTS)
@pytest.mark.parametrize("model", sorted(ALL_HEADS))
def test_decode_modes_padding_and_window(model, mode, gen, poison_empty):
    from tilegym.ops.attention import decode_attention

    hq, hkv, d = ALL_HEADS[model]
    b, skv = 4, 3001
    q, k, v = _qkv(b, hq, hkv, 1, skv, d, gen)
    valid = _left_padding((3001, 900, 65, 1), skv)
    for window in (None, 300, 200, 37):
        mask = reference_mask(b, 1, skv, key_valid=valid, window=window, device="cuda")
        ref = reference_attention(q, k, v, mask)
        for plan in plans(d).values():
            out = _poisoned_out(b, hq, d)
            got = decode_attention(
                q, k, v, key_valid=valid, window=window, out=out, **VARIANTS[mode], **plan
            )
            _check_decode(got, ref, out)


def test_bench_decode_summary_counts_rows_and_wins():
    bench = _bench_module()
    recs = [
        dict(model="qwen3", batch=1, cache=256, sdpa_us=10.0, tile_us=8.0, sweep_us={"a": 12.0}),
        dict(model="qwen3", batch=8, cache=256, sdpa_us=10.0, tile_us=11.0, sweep_us={"a": 5.0}),
    ]
    text = bench.decode_summary(recs)
    cells = {line.split()[0]: line.split() for line in text.splitlines()[2:]}
    tile, a = cells["tile"], cells["a"]
    assert tile[1] == "1/2" and tile[4:] == ["qwen3", "b8", "c256", "1"]
    assert a[1] == "1/2" and a[2] == f"{math.sqrt(10 / 12 * 2):.3f}" and a[-1] == "1"


def test_bench_decode_variants_are_valid_arguments():
    import inspect

    from tilegym.ops.attention import DECODE_MODES, decode_attention

    bench = _bench_module()
    params = inspect.signature(decode_attention).parameters
    for d in (64, 128):
        variants = bench.decode_variants(d)
        assert any(kw.get("tile_n") for kw in variants.values())
        assert any(kw.get("form") == "rows" for kw in variants.values())
        assert "pdl" in {kw.get("mode") for kw in variants.values()}
        # every timed (scheme, form, occupancy) is among the GPU-tested variants
        tested = {(kw["mode"], kw.get("form"), kw.get("occupancy")) for kw in VARIANTS.values()}
        for kw in variants.values():
            key = (kw.get("mode", "auto"), kw.get("form"), kw.get("occupancy"))
            assert key in tested or kw.get("num_splits") == 1, kw
        for kw in variants.values():
            assert set(kw) <= set(params) and kw.get("mode", "pdl") in DECODE_MODES


@pytest.mark.gpu
@pytest.mark.parametrize("model", sorted(ALL_HEADS))
@pytest.mark.parametrize("b", [1, 8])
@pytest.mark.parametrize("pos", [0, 63, 1000, 8191])
def test_decode_device_position_sees_keys_up_to_it(model, b, pos, gen, poison_empty):
    """A static cache's decode: keys ``[0, position]`` read from a device tensor; the slots
    after it (stale or never written) must not leak in, with or without padding."""
    from tilegym.ops.attention import decode_attention

    hq, hkv, d = ALL_HEADS[model]
    skv = 8192 + 64
    q, k, v = _qkv(b, hq, hkv, 1, skv, d, gen)
    k, v = k.clone(), v.clone()
    k[:, :, pos + 1 :] = float("nan")
    v[:, :, pos + 1 :] = float("nan")
    position = torch.tensor([pos], device="cuda", dtype=torch.int32)
    got = decode_attention(q, k, v, scale=0.07, position=position)
    ref = reference_attention(
        q,
        k.nan_to_num(),
        v.nan_to_num(),
        reference_mask(b, 1, skv, q_start=pos, device="cuda"),
        0.07,
    )
    assert_close_rel(got, ref)
    valid = torch.ones((b, skv), dtype=torch.bool, device="cuda")
    valid[0, : pos // 2] = False  # the first sequence left-padded
    got = decode_attention(q, k, v, scale=0.07, position=position, key_valid=valid)
    mask = reference_mask(b, 1, skv, q_start=pos, key_valid=valid, device="cuda")
    assert_close_rel(got, reference_attention(q, k.nan_to_num(), v.nan_to_num(), mask, 0.07))


@pytest.mark.gpu
@pytest.mark.parametrize("model", sorted(ALL_HEADS))
@pytest.mark.parametrize("skv,pos", [(512, 512), (512, 9999), (4, 77), (4100, 4100)])
def test_decode_position_past_the_last_key_sees_them_all(model, skv, pos, gen):
    """A full ring-buffer window: the token's absolute position lies past the cache's last
    slot, and every slot is seen (not keys past the array, which would be zero-padded)."""
    from tilegym.ops.attention import decode_attention

    hq, hkv, d = ALL_HEADS[model]
    q, k, v = _qkv(2, hq, hkv, 1, skv, d, gen)
    position = torch.tensor([pos], device="cuda", dtype=torch.int32)
    got = decode_attention(q, k, v, scale=0.07, position=position)
    ref = reference_attention(
        q, k, v, reference_mask(2, 1, skv, q_start=skv - 1, device="cuda"), 0.07
    )
    assert_close_rel(got, ref)


@pytest.mark.gpu
def test_decode_position_rejects_a_bad_tensor_and_kv_lens_together(gen):
    from tilegym.ops.attention import AttentionInputError, decode_attention

    hq, hkv, d = HEADS["qwen3"]
    q, k, v = _qkv(2, hq, hkv, 1, 64, d, gen)
    with pytest.raises(AttentionInputError, match="int32 tensor of shape"):
        decode_attention(q, k, v, position=torch.tensor([3], device="cuda"))
    pos = torch.tensor([3], device="cuda", dtype=torch.int32)
    with pytest.raises(AttentionInputError, match="not both"):
        decode_attention(q, k, v, position=pos, kv_lens=pos.expand(2))


# ------------------------------------------------------------------ head dims 96 and 256


def test_tiles_per_head_dim():
    """64 and 128 keep their H200-measured tiles; 96 runs exactly as 128 (128-wide tiles); 256
    has its own, smaller query/key tiles."""
    from tilegym.ops.attention import (
        PrefillConfig,
        default_decode_tile_n,
        default_prefill_config,
        head_tile,
    )

    assert KERNEL_HEAD_DIMS == (64, 96, 128, 256)
    assert [head_tile(d) for d in KERNEL_HEAD_DIMS] == [64, 128, 128, 256]
    assert default_prefill_config(64) == PrefillConfig(128, 128, 2)
    assert default_prefill_config(96) == default_prefill_config(128) == PrefillConfig(64, 64, 2)
    assert default_prefill_config(256) == PrefillConfig(64, 32, 1)
    assert [default_decode_tile_n(d) for d in KERNEL_HEAD_DIMS] == [128, 64, 64, 64]
    assert [one_split_tile_n(d) for d in KERNEL_HEAD_DIMS] == [256, 256, 256, 128]


@pytest.mark.parametrize("d", [32, 80, 100, 192, 512])
def test_head_dims_outside_the_envelope_are_refused(d):
    from tilegym.ops.attention import (
        AttentionInputError,
        aot_signatures,
        decode_attention,
        prefill_attention,
    )

    q = torch.zeros(1, 2, 1, d, dtype=torch.bfloat16)
    with pytest.raises(AttentionInputError, match=f"head_dim {d} "):
        prefill_attention(q, q, q)
    with pytest.raises(AttentionInputError, match=f"head_dim {d} "):
        decode_attention(q, q, q)
    with pytest.raises(AttentionInputError, match=f"head_dim {d} "):
        aot_signatures(d, 2, 1)


def test_model_patch_serves_every_kernel_head_dim_and_refuses_others():
    from types import SimpleNamespace

    from tilegym.ops.attention import KERNEL_HEAD_DIMS, SUPPORTED_HEAD_DIMS
    from tilegym.transformers.attention import unsupported_reason

    assert set(SUPPORTED_HEAD_DIMS) == set(KERNEL_HEAD_DIMS) == {64, 96, 128, 256}
    for d in SUPPORTED_HEAD_DIMS:
        assert unsupported_reason(SimpleNamespace(head_dim=d)) is None
    for d in (80, 160, 512):
        assert f"head_dim {d} is not supported" in unsupported_reason(SimpleNamespace(head_dim=d))


def test_aot_signatures_cover_the_new_head_dims():
    """The kernels' ``D`` is the tile width (128 for 96); prefill, every decode variant and the
    reduction are declared at both new head configurations."""
    from tilegym.ops.attention import (
        aot_signatures,
        decode_attention_kernel,
        decode_kernel_configs,
        decode_reduce_kernel,
        prefill_attention_kernel,
    )

    for hq, hkv, d in NEW_HEADS.values():
        sigs = aot_signatures(d, hq, hkv)
        assert set(sigs) == {
            prefill_attention_kernel,
            decode_attention_kernel,
            decode_reduce_kernel,
        }
        assert len(sigs[decode_attention_kernel]) == len(decode_kernel_configs(d, hq // hkv))
        width = 128 if d == 96 else d
        for kernel, index in (
            (prefill_attention_kernel, 8),
            (decode_attention_kernel, 13),
            (decode_reduce_kernel, 3),
        ):
            for sig in sigs[kernel]:
                assert sig.parameters[index].value == width, (kernel, d)


@pytest.mark.slow
@pytest.mark.parametrize("kernel_name", ["prefill", "decode_attention", "decode_reduce"])
@pytest.mark.parametrize("model", sorted(NEW_HEADS))
def test_aot_signatures_compile_for_sm90_at_new_head_dims(model, kernel_name):
    """The declared signatures at head_dim 96 and 256 compile on the CPU for Hopper: all of the
    prefill and reduction kernels, and the first decode variant (each takes 10-15 s; all of
    them ran on an H200 in tests/ops/test_attention.py's GPU tests)."""
    from tilegym.kernel_inventory.compile import compile_kernel, toolchain_problem
    from tilegym.ops.attention import aot_signatures

    if toolchain_problem():
        pytest.skip(toolchain_problem())
    hq, hkv, d = NEW_HEADS[model]
    (kernel, sigs) = next(
        (k, s)
        for k, s in aot_signatures(d, hq, hkv).items()
        if k._pyfunc.__name__.startswith(kernel_name)
    )
    if kernel_name == "decode_attention":
        sigs = sigs[:1]
    assert compile_kernel(kernel, sigs, "sm_90") is None, kernel._pyfunc.__name__


def _in_wider(t: torch.Tensor, width: int, fill: float) -> torch.Tensor:
    """``t`` (a ``[B, H, S, D]`` view of ``[B, S, H, D]``) copied into the first ``D`` columns of
    a ``[B, S, H, width]`` buffer whose other columns hold ``fill``; the ``[B, H, S, D]`` view."""
    b, h, s, d = t.shape
    buf = torch.full((b, s, h, width), fill, dtype=t.dtype, device=t.device)
    buf[..., :d] = t.transpose(1, 2)
    return buf.transpose(1, 2)[..., :d]


@pytest.mark.gpu
@pytest.mark.parametrize("model", sorted(NEW_HEADS))
def test_new_head_dims_read_and_write_only_their_columns(model, gen):
    """Every head's row is followed by 32 NaN columns in q, k and v and by 32 sentinel columns
    in the output: loads must stop at the head dim (96 runs in 128-wide tiles, whose last 32
    columns must be zeros, not memory) and stores must leave the sentinels alone."""
    from tilegym.ops.attention import decode_attention, prefill_attention

    hq, hkv, d = NEW_HEADS[model]
    b, s, width, nan, sentinel = 3, 300, d + 32, float("nan"), 7.0
    q, k, v = (_in_wider(t, width, nan) for t in _qkv(b, hq, hkv, s, s, d, gen))
    valid = _left_padding((300, 129, 7), s)
    out_buf = torch.full((b, s, hq, width), sentinel, dtype=q.dtype, device="cuda")
    out_buf[..., :d] = nan
    for window in (None, 37):
        got = prefill_attention(q, k, v, window=window, key_valid=valid, out=out_buf[..., :d])
        mask = reference_mask(b, s, s, window=window, key_valid=valid, device="cuda")
        assert_close_rel(got, reference_attention(q, k, v, mask))
        assert torch.all(out_buf[..., d:] == sentinel)
    q1 = _in_wider(q[:, :, -1:].contiguous(), width, nan)
    position = torch.tensor([s - 1], device="cuda", dtype=torch.int32)
    ref = reference_attention(q1, k, v, reference_mask(b, 1, s, key_valid=valid, device="cuda"))
    for variant in VARIANTS.values():
        for kw in ({}, {"position": position}, {"num_splits": 3}):
            dec_buf = torch.full((b, 1, hq, width), sentinel, dtype=q.dtype, device="cuda")
            dec_buf[..., :d] = nan
            got = decode_attention(q1, k, v, key_valid=valid, out=dec_buf[..., :d], **variant, **kw)
            _check_decode(got, ref, dec_buf[..., :d])
            assert torch.all(dec_buf[..., d:] == sentinel), (variant, kw)
