"""Attention with sinks (gpt-oss, `tilegym.ops.attention_sinks`) against fp32.

CPU: the fp32 reference equals transformers' own gpt-oss eager attention (causal, sliding
window, left padding, GQA), a sink of -inf gives plain attention, the sink lowers every row's
key weights, and the custom ops' CPU implementations (prefill and decode, a ring buffer's
position included) agree with the reference; the AOT signatures compile for sm_90 (slow).
GPU: prefill and decode against the fp32 reference with odd lengths, windows, left padding,
sinks on and off (very negative), NaN-poisoned outputs, and the device-position decode.
"""

from __future__ import annotations

import io
import math

import pytest
import torch
from transformers.masking_utils import (
    causal_mask_function,
    sdpa_mask,
    sliding_window_causal_mask_function,
)

from tilegym.ops.attention import reference_attention, reference_mask
from tilegym.ops.attention_sinks import reference_attention_sinks
from tilegym.ops.testing import assert_close_rel

GPT_OSS_HEADS = (64, 8, 64)
"""gpt-oss-20b: 64 query heads, 8 kv heads, head_dim 64."""


class _Module(torch.nn.Module):
    """What gpt-oss's eager attention reads off its module."""

    def __init__(self, sinks: torch.Tensor, groups: int):
        super().__init__()
        self.sinks = torch.nn.Parameter(sinks)
        self.num_key_value_groups = groups
        self.training = False


def _additive(mask: torch.Tensor) -> torch.Tensor:
    """A boolean mask as transformers' eager path adds it (0 / dtype minimum)."""
    return torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)


@pytest.mark.parametrize(
    ("sq", "skv", "window", "pads"),
    [(7, 7, None, (0, 3)), (9, 9, 4, (0, 5)), (1, 13, None, (0, 6)), (1, 13, 5, (2, 0))],
)
def test_reference_is_transformers_gpt_oss_eager_attention(sq, skv, window, pads):
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    torch.manual_seed(0)
    hq, hkv, d = 4, 2, 16
    q, k, v = torch.randn(2, hq, sq, d), torch.randn(2, hkv, skv, d), torch.randn(2, hkv, skv, d)
    sinks = torch.randn(hq)
    valid = torch.ones(2, skv, dtype=torch.bool)
    for row, pad in enumerate(pads):
        valid[row, :pad] = False
    fn = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
    dense = sdpa_mask(
        batch_size=2,
        q_length=sq,
        kv_length=skv,
        q_offset=skv - sq,
        mask_function=fn,
        attention_mask=valid,
        allow_is_causal_skip=False,
    )
    mask = reference_mask(2, sq, skv, window=window, key_valid=valid)
    assert torch.equal(mask, dense)
    want, _ = eager_attention_forward(
        _Module(sinks, hq // hkv), q, k, v, _additive(mask), scaling=0.3
    )
    got = reference_attention_sinks(q, k, v, mask, sinks, scale=0.3)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_sink_of_minus_infinity_is_plain_attention_and_a_sink_takes_weight():
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 4, 5, 16), torch.randn(1, 2, 5, 16), torch.randn(1, 2, 5, 16)
    mask = reference_mask(1, 5, 5)
    plain = reference_attention(q, k, v, mask, 0.25)
    off = reference_attention_sinks(q, k, v, mask, torch.full((4,), -math.inf), 0.25)
    torch.testing.assert_close(off, plain)
    on = reference_attention_sinks(q, k, v, mask, torch.full((4,), 3.0), 0.25)
    # the same convex combination of values, scaled by the keys' share (< 1) of the weight
    share = on.norm(dim=-1) / plain.norm(dim=-1)
    assert (share < 1).all() and (share > 0).all()


def test_rows_without_keys_are_zero():
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    mask[..., 0, :] = False
    out = reference_attention_sinks(q, k, v, mask, torch.zeros(2))
    assert torch.all(out[:, 0] == 0) and torch.isfinite(out).all()


def test_the_cpu_ops_prefill_and_decode_agree_with_the_reference():
    """Decode of the last token (by kv_end and by a device position, also a ring buffer's past
    its last slot) equals the last row of the prefill, on the custom ops' CPU implementations."""
    from tilegym.ops import library

    torch.manual_seed(2)
    hq, hkv, d, s = 4, 2, 64, 9
    q, k, v = torch.randn(2, hq, s, d), torch.randn(2, hkv, s, d), torch.randn(2, hkv, s, d)
    sinks = torch.randn(hq)
    valid = torch.ones(2, s, dtype=torch.bool)
    valid[1, :3] = False
    for window in (None, 4):
        pre = library.prefill_attention_sinks(
            q, k, v, sinks, scale=0.2, q_start=0, window=window, key_valid=valid
        )
        mask = reference_mask(2, s, s, window=window, key_valid=valid)
        torch.testing.assert_close(pre, reference_attention_sinks(q, k, v, mask, sinks, 0.2))
        last = q[:, :, -1:]
        by_end = library.decode_attention_sinks(
            last, k, v, sinks, scale=0.2, kv_end=s, window=window, key_valid=valid
        )
        torch.testing.assert_close(by_end, pre[:, -1:])
        for pos in (s - 1, s + 5):  # past the last slot: a full ring buffer sees every slot
            at = torch.tensor([pos], dtype=torch.int32)
            got = library.decode_attention_sinks(
                last, k, v, sinks, scale=0.2, position=at, window=window, key_valid=valid
            )
            torch.testing.assert_close(got, pre[:, -1:])


@pytest.mark.slow
def test_aot_signatures_compile_for_sm90():
    """Every kernel has signatures; the prefill (window + padding), a partial-output decode,
    a sink-epilogue decode and the sink reduction compile on the CPU."""
    from cuda.tile.compilation import export_kernel

    from tilegym.ops import attention as att
    from tilegym.ops import attention_sinks as sk

    sigs = sk.aot_signatures()
    assert set(sigs) == {
        sk.prefill_attention_sinks_kernel,
        att.decode_attention_kernel,
        sk.decode_sinks_reduce_kernel,
    }
    # a decode variant either takes the sink itself or leaves partials to the sink reduction
    want = {att.EPI_PARTS, att.EPI_SINK} if sk.SINK_EPILOGUE else {att.EPI_PARTS}
    assert {sig.parameters[-1].value for sig in sigs[att.decode_attention_kernel]} == want
    both = sk.decode_sinks_signatures(64, 64, 8, epilogue=(False, True))
    sink_sig = next(
        s for s in both[att.decode_attention_kernel] if s.parameters[-1].value == att.EPI_SINK
    )
    picks = [
        (sk.prefill_attention_sinks_kernel, sigs[sk.prefill_attention_sinks_kernel][-1]),
        (att.decode_attention_kernel, sigs[att.decode_attention_kernel][0]),
        (att.decode_attention_kernel, sink_sig),
        (sk.decode_sinks_reduce_kernel, sigs[sk.decode_sinks_reduce_kernel][0]),
    ]
    for kernel, sig in picks:
        buf = io.BytesIO()
        export_kernel(kernel, [sig], buf, gpu_code="sm_90", output_format="cubin")
        assert len(buf.getvalue()) > 1000


# ------------------------------------------------------------------------------------------ GPU


def _inputs(b, sq, skv, gen, sinks_on=True):
    hq, hkv, d = GPT_OSS_HEADS
    q = torch.randn(b, sq, hq, d, device="cuda", generator=gen).bfloat16().transpose(1, 2)
    k = torch.randn(b, skv, hkv, d, device="cuda", generator=gen).bfloat16().transpose(1, 2)
    v = torch.randn(b, skv, hkv, d, device="cuda", generator=gen).bfloat16().transpose(1, 2)
    sinks = torch.randn(hq, device="cuda", generator=gen) * 2
    if not sinks_on:
        sinks = torch.full_like(sinks, -1.0e4)
    return q, k, v, sinks.bfloat16()


def _left_padded(b, skv, pads):
    valid = torch.ones(b, skv, dtype=torch.bool, device="cuda")
    for row, pad in enumerate(pads[:b]):
        valid[row, :pad] = False
    return valid


@pytest.mark.gpu
@pytest.mark.parametrize("sinks_on", [True, False])
@pytest.mark.parametrize(
    ("b", "sq", "skv", "window", "pads"),
    [
        (1, 1, 1, None, None),
        (2, 37, 37, None, (0, 11)),
        (3, 200, 200, 128, (0, 150, 33)),
        (2, 77, 333, 128, None),  # chunked prefill at the end of a longer cache
        (1, 1000, 1000, None, None),
    ],
)
def test_prefill_matches_fp32_reference(b, sq, skv, window, pads, sinks_on, gen):
    from tilegym.ops.attention_sinks import prefill_attention_sinks

    q, k, v, sinks = _inputs(b, sq, skv, gen, sinks_on)
    valid = None if pads is None else _left_padded(b, skv, pads)
    out = torch.full((b, sq, q.shape[1], q.shape[3]), float("nan"), dtype=q.dtype, device="cuda")
    got = prefill_attention_sinks(
        q, k, v, sinks, scale=0.125, q_start=skv - sq, window=window, key_valid=valid, out=out
    )
    assert got.data_ptr() == out.data_ptr()
    mask = reference_mask(b, sq, skv, window=window, key_valid=valid, device="cuda")
    assert_close_rel(got, reference_attention_sinks(q, k, v, mask, sinks, 0.125))


DECODE_CASES = [  # (b, skv, window, pads, by_position)
    (1, 1, None, None, False),
    (3, 37, None, (0, 11, 36), False),
    (2, 130, 128, (0, 5), True),  # a ring buffer of 128 slots, position past the last
    (4, 777, None, None, False),
    (1, 4097, None, None, True),  # long cache: the split plan, combined with the sink
    (8, 3000, 128, (0, 7, 100), False),
]


def test_sink_decode_takes_the_sink_in_one_split_and_reduces_split_plans():
    """A one-split plan's output epilogue takes the sink (one launch); a split plan keeps its
    partials for the sink reduction; the GPU cases below run both (at 132 SMs, the H100 SXM's
    and the H200's, and at the H100 PCIe's 114)."""
    from tilegym.ops import attention as att
    from tilegym.ops.attention_sinks import sinks_config

    hq, hkv, d = GPT_OSS_HEADS
    for cfg in att.decode_kernel_configs(d, hq // hkv):
        want = att.EPI_SINK if cfg[6] == att.EPI_OUT else att.EPI_PARTS
        assert sinks_config(cfg, epilogue=True) == (*cfg[:6], want)
        assert sinks_config(cfg, epilogue=False) == (*cfg[:6], att.EPI_PARTS)
    for sms in (114, 132):
        one = {
            att.plan_decode(b * hkv, skv, d, sms, window=window).splits == 1
            for b, skv, window, _, _ in DECODE_CASES
        }
        assert one == {True, False}, sms


@pytest.mark.gpu
@pytest.mark.parametrize("sink_epilogue", [False, True])
@pytest.mark.parametrize("sinks_on", [True, False])
@pytest.mark.parametrize(("b", "skv", "window", "pads", "by_position"), DECODE_CASES)
def test_decode_matches_fp32_reference(
    b, skv, window, pads, by_position, sinks_on, sink_epilogue, gen
):
    from tilegym.ops.attention_sinks import decode_attention_sinks

    q, k, v, sinks = _inputs(b, 1, skv, gen, sinks_on)
    valid = None if pads is None else _left_padded(b, skv, pads)
    out = torch.full((b, 1, q.shape[1], q.shape[3]), float("nan"), dtype=q.dtype, device="cuda")
    kw = dict(key_valid=valid, out=out, sink_epilogue=sink_epilogue)
    if by_position:
        pos = torch.tensor([skv + 3], dtype=torch.int32, device="cuda")
        got = decode_attention_sinks(q, k, v, sinks, scale=0.125, position=pos, window=None, **kw)
        mask = reference_mask(b, 1, skv, q_start=skv - 1, key_valid=valid, device="cuda")
    else:
        got = decode_attention_sinks(q, k, v, sinks, scale=0.125, window=window, **kw)
        mask = reference_mask(b, 1, skv, window=window, key_valid=valid, device="cuda")
    assert torch.isfinite(got).all()
    assert_close_rel(got, reference_attention_sinks(q, k, v, mask, sinks, 0.125))


@pytest.mark.gpu
def test_sinks_change_the_output(gen):
    """The kernels' sink matters (a kernel ignoring it fails): on and off differ."""
    from tilegym.ops.attention_sinks import decode_attention_sinks, prefill_attention_sinks

    q, k, v, sinks = _inputs(2, 40, 40, gen)
    off = torch.full_like(sinks, -1.0e4)
    a = prefill_attention_sinks(q, k, v, sinks, scale=0.125)
    b = prefill_attention_sinks(q, k, v, off, scale=0.125)
    assert (a.float() - b.float()).abs().max() > 1e-2
    for epilogue in (False, True):
        a = decode_attention_sinks(q[:, :, -1:], k, v, sinks, scale=0.125, sink_epilogue=epilogue)
        b = decode_attention_sinks(q[:, :, -1:], k, v, off, scale=0.125, sink_epilogue=epilogue)
        assert (a.float() - b.float()).abs().max() > 1e-2
