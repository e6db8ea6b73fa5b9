"""DeepSeek-V2's RoPE tables in the half-split layout from one kernel (`tilegym.ops.rotary_tables`).

CPU: the reference is transformers' ``DeepseekV2RotaryEmbedding`` table split, repeated and cast
as the patched attention used it (default and YaRN rope); the kernel's angle reduction, replayed
in fp32 PyTorch with the module's constants, stays within 1e-5 rad of the exact one up to the
400 000 positions it claims (and a naive one-constant reduction does not); the custom op's CPU
implementation and fake pass opcheck; bad inputs get one clear error; every launch fits a
declared AOT signature; the signatures compile for sm_90, sm_100 and sm_120 (slow).
GPU: the tables against fp64 ones on fresh positions (decode and prompt sizes, odd batch sizes,
positions up to 163 840), in bf16 and fp32, NaN-poisoned outputs.
"""

from __future__ import annotations

import math

import pytest
import torch

from tilegym.ops import rotary_tables as rt
from tilegym.ops.testing import launch_fits


def _rotary(rope):
    from transformers import DeepseekV2Config
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2RotaryEmbedding

    cfg = DeepseekV2Config(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        qk_rope_head_dim=16,
        max_position_embeddings=163840,
        rope_parameters=rope,
    )
    return DeepseekV2RotaryEmbedding(cfg)


YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
}


@pytest.mark.parametrize("rope", [{"rope_type": "default", "rope_theta": 10000.0}, YARN])
def test_reference_is_the_upstream_table_as_the_attention_used_it(rope):
    from tilegym.transformers.mla import rope_tables

    rotary = _rotary(rope)
    pos = torch.tensor([[0, 1, 2, 3000], [7, 9, 4095, 163000]])
    x = torch.zeros(2, 4, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        table = rotary(x, pos)
    want = [t.to(torch.bfloat16) for t in rope_tables(table)]
    got = rt.reference_rotary_tables(pos, rotary.inv_freq, rotary.attention_scaling, x.dtype)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def _reduce(f: torch.Tensor, hi: float, lo: float) -> torch.Tensor:
    """The kernel's reduction of fp32 angles, in fp32 PyTorch."""
    k = torch.floor(f * torch.tensor(rt.INV_TWO_PI, dtype=torch.float32) + 0.5)
    return (f - k * torch.tensor(hi, dtype=torch.float32)) - k * torch.tensor(
        lo, dtype=torch.float32
    )


def test_the_angle_reduction_is_exact_enough_up_to_400k_positions():
    pos = torch.cat([torch.arange(0, 4096), torch.randint(4096, 400_000, (20_000,))])
    inv = 1.0 / (10000.0 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
    f = pos[:, None].float() * inv  # upstream's fp32 angles
    exact = torch.remainder(f.double() + math.pi, 2 * math.pi) - math.pi
    got = _reduce(f, rt.TWO_PI_HI, rt.TWO_PI_LO).double()
    # the same angle modulo 2 pi, within 1e-5 rad
    err = (torch.remainder(got - exact + math.pi, 2 * math.pi) - math.pi).abs().max().item()
    assert err < 1e-5, err
    # k rounds f / 2 pi in fp32: off by one within its rounding of a half, so just past pi
    assert got.abs().max() <= math.pi + 0.05
    # the split matters: 2 pi as one fp32 constant is off by its rounding times k
    naive = _reduce(f, float(torch.tensor(2 * math.pi, dtype=torch.float32)), 0.0).double()
    assert (torch.remainder(naive - exact + math.pi, 2 * math.pi) - math.pi).abs().max() > 1e-3


def test_cpu_op_is_the_reference_and_passes_opcheck():
    from tilegym.ops import library

    pos = torch.tensor([[3, 4, 5]])
    inv = torch.rand(8) * 0.5
    got = library.rotary_tables(pos, inv, 1.25, torch.float32)
    want = rt.reference_rotary_tables(pos, inv, 1.25, torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert got[0].shape == (1, 3, 16)
    torch.library.opcheck(library.rotary_tables_op, (pos, inv, 1.25, torch.bfloat16))


@pytest.mark.parametrize(
    ("pos", "inv", "dtype", "words"),
    [
        (torch.zeros(4, dtype=torch.int64), torch.zeros(16), torch.bfloat16, "position_ids"),
        (torch.zeros(1, 4, dtype=torch.float32), torch.zeros(16), torch.bfloat16, "position_ids"),
        (torch.zeros(1, 4, dtype=torch.int64), torch.zeros(12), torch.bfloat16, "power of two"),
        (torch.zeros(1, 4, dtype=torch.int64), torch.zeros(16), torch.int8, "table dtype"),
        (torch.zeros(1, 4, dtype=torch.int64), torch.zeros(16), torch.bfloat16, "CUDA"),
    ],
)
def test_bad_inputs_get_one_clear_error(pos, inv, dtype, words):
    with pytest.raises(rt.RotaryTablesInputError, match=words):
        rt.rotary_tables(pos, inv, 1.0, dtype)


@pytest.mark.parametrize("n", [1, 8, 9, 2048, 2049])
def test_every_launch_fits_a_declared_signature(n):
    sigs = rt.aot_signatures()[rt.rotary_tables_kernel]
    pos, inv = torch.zeros(n, dtype=torch.int64), torch.zeros(32)
    table = torch.empty(n, 64, dtype=torch.bfloat16)
    grid, args = rt.launch_args(pos, inv, table, table, 1.0)
    assert any(launch_fits(s, args) for s in sigs), args[4:]
    assert grid[0] * args[5] >= n > (grid[0] - 1) * args[5]


@pytest.mark.slow
def test_signatures_compile_for_every_target():
    from tilegym.kernel_inventory.compile import compile_kernel, toolchain_problem

    if toolchain_problem():
        pytest.skip(toolchain_problem())
    sigs = rt.aot_signatures()[rt.rotary_tables_kernel]
    for gpu in ("sm_90", "sm_100", "sm_120"):
        assert compile_kernel(rt.rotary_tables_kernel, sigs, gpu) is None, gpu


# ------------------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("b", "s", "high"), [(1, 1, 2176), (8, 1, 4096), (3, 37, 163840), (1, 2048, 2048)]
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tables_match_fp64(b, s, high, dtype, gen, poison_empty):
    pos = torch.randint(0, high, (b, s), generator=gen, device="cuda")
    rotary = _rotary(YARN).cuda()
    inv, scale = rotary.inv_freq, rotary.attention_scaling
    cos, sin = rt.rotary_tables(pos, inv, scale, dtype)
    f = (pos[..., None].float() * inv.float()).double()  # upstream's fp32 angles, exactly
    for got, want in ((cos, torch.cos(f) * scale), (sin, torch.sin(f) * scale)):
        want = torch.cat((want, want), dim=-1)
        assert got.dtype == dtype and got.shape == (b, s, 2 * inv.shape[0])
        bar = 2e-5 if dtype == torch.float32 else 4e-3  # the reduction; bf16's half step at 1
        assert (got.double() - want).abs().max().item() <= bar


@pytest.mark.gpu
@pytest.mark.parametrize("rh", [8, 16, 32, 64, 128])
@pytest.mark.parametrize(("b", "s"), [(1, 1), (3, 37), (8, 1)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_llama_form_tables_at_every_family_width_match_fp64(rh, b, s, dtype, gen, poison_empty):
    """The widths the families' rotary modules use (``tilegym.transformers.rope_tables``):
    gpt-oss and Llama-3.2 32, Qwen3 64, Gemma 3 128 frequencies; OLMo's fp32 tables."""
    pos = torch.randint(0, 131072, (b, s), generator=gen, device="cuda")
    inv = 1.0 / (1e6 ** (torch.arange(0, 2 * rh, 2, dtype=torch.float32, device="cuda") / (2 * rh)))
    cos, sin = rt.rotary_tables(pos, inv, 1.0, dtype)
    f = (pos[..., None].float() * inv).double()
    for got, want in ((cos, torch.cos(f)), (sin, torch.sin(f))):
        want = torch.cat((want, want), dim=-1)
        assert got.dtype == dtype and got.shape == (b, s, 2 * rh)
        bar = 2e-5 if dtype == torch.float32 else 4e-3
        assert (got.double() - want).abs().max().item() <= bar
