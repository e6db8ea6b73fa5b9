"""Which profiled kernel names count as cuTile: exactly the symbols cuTile's compiler gives a
``@ct.kernel`` of the measured tree, never an Inductor or vendor kernel shaped to look alike.

The attack: a custom op named ``zzrope_Kt2_A9f32_1t`` makes Inductor call the Triton kernel it
fuses around it ``triton_poi_fused__to_copy_zzrope_Kt2_A9f32_1t_3``, which cuTile's demangler
reads as the function ``triton_poi_fused__to_copy_zzrope``; a never-launched ``@ct.kernel`` of
that name made it count (``decide`` kept it, +0.65 pp at identical GPU time)."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import cuda.tile as ct
import pytest
from cuda.tile.compilation import (
    ArrayConstraint,
    CallingConvention,
    ConstantConstraint,
    KernelSignature,
    mangle_kernel_name,
)
from tilegym_hf_bench.profiling.classify import KernelClassifier

from tilegym.kernel_inventory.compile import toolchain_problem

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
ATTACK = "triton_poi_fused__to_copy_zzrope_Kt2_A9f32_1t_3"
DECOY = "triton_poi_fused__to_copy_zzrope"
# Real symbols of the H200 profiles (docs/results/*/...json), both calling conventions.
RMS_T1 = (
    "rms_norm_kernel_Kt1_A2bf16_1v8l0_2t1_3i16_p16_A1bf16_1i16t1_p16_A2bf16_1v8l0_2t1_3i16_p16"
    "_Sf32_I2_I4096_B0"
)
GEMV_T2 = (
    "tilegym_gemv_kernel_Kt2_A2bf16_1s1v8l0_2i16t1_p16_A2bf16_1v8l0_2t1_3i16_p16_A1bf16_1i16t1"
    "_p16_A2bf16_1v8l0_2t1_3i16_p16_A2bf16_1s1v8l0_2i16t1_p16_I1_I4_I1024_I10_B0_B0"
)
KV_RING = (
    "kv_cache_ring_write_kernel_Kt2_A4bf16_5s1_7v8l0_8t1_ai16_p16_A4bf16_5s1_7v8l0_8t1_ai16_p16"
    "_A4bf16_1s1_7v8l0_8t1_ei16_p16_A4bf16_1s1_7v8l0_8t1_ei16_p16_A1i32_1s1t1_p16_A1i64_1s1t1"
    "_p16_I128"
)
INDUCTOR_REAL = "triton_poi_fused__to_copy_bmm_cat_cos_mul_qk_norm_rope_sin_slice_transpose_view_3"
TREE = frozenset({"rms_norm_kernel", "tilegym_gemv_kernel", "kv_cache_ring_write_kernel"})

# (id, profiled kernel name, extra @ct.kernel names in the tree, counts as cuTile)
CASES = [
    ("real_rms_norm_t1", RMS_T1, (), True),
    ("real_gemv_t2", GEMV_T2, (), True),
    ("real_kv_ring_write", KV_RING, (), True),
    ("real_inductor_kernel", INDUCTOR_REAL, ("qk_norm_rope_kernel",), False),
    ("attack", ATTACK, (DECOY,), False),
    (
        "attack_upper_case",
        ATTACK.upper().replace("_KT2_A9F32_1T_3", "_Kt2_A9f32_1t_3"),
        (DECOY.upper(),),
        False,
    ),
    ("attack_title_case", "T" + ATTACK[1:], ("T" + DECOY[1:],), False),
    (
        "attack_reduction",
        "triton_per_fused_zzrope_Kt2_A9f32_1t_2",
        ("triton_per_fused_zzrope",),
        False,
    ),
    ("attack_inductor_cpp", "cpp_fused_zzrope_Kt2_A9f32_1t_1", ("cpp_fused_zzrope",), False),
    (
        "attack_constant_tail",
        "triton_poi_fused_zz_Kt2_A1f32_1l0_I_3",
        ("triton_poi_fused_zz",),
        False,
    ),
    ("vendor_gemm_look_alike", "sm90_xmma_gemm_Kt2_A1f32_1l0", ("sm90_xmma_gemm",), False),
    ("nvjet_look_alike", "nvjet_sm90_tst_Kt2_A1f32_1l0", ("nvjet_sm90_tst",), False),
    ("suffix_index", RMS_T1 + "_3", (), False),
    ("suffix_word", GEMV_T2 + "x", (), False),
    ("prefix_word", "x" + RMS_T1, (), False),
    ("non_canonical_int", "rms_norm_kernel_Kt2_A1f32_1l0_I03", (), False),
    ("non_canonical_masks", "rms_norm_kernel_Kt2_A2f32_2t1_1t1", (), False),
    ("negative_zero", "rms_norm_kernel_Kt2_A1f32_1l0_I_0", (), False),
    ("no_parameters", "rms_norm_kernel_Kt2", (), False),
    ("case_of_the_mark", "rms_norm_kernel_kt2_A1f32_1l0", (), False),
]


@pytest.mark.parametrize(
    ("name", "extra", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_only_exact_cutile_symbols_of_the_tree_count(name, extra, expected):
    classifier = KernelClassifier(TREE | set(extra))
    assert classifier.is_cutile(name) is expected
    assert (classifier.cutile_function(name) is not None) is expected


# (id, kernel names, listed prefixes, profiled name, counts)
PREFIX_CASES = [
    ("bare_name", {"fused_attention"}, ["fused_attention"], "fused_attention", True),
    (
        "shortened_mangling",
        {"fused_attention"},
        ["fused_attention"],
        "fused_attention_Kt2_x",
        False,
    ),
    (
        "decoy_prefix",
        {"triton_poi_fused_add_3"},
        ["triton_poi_fused_add_3"],
        "triton_poi_fused_add_3",
        False,
    ),
    ("decoy_vendor_prefix", {"nvjet_sm90_tst"}, ["nvjet_sm90_tst"], "nvjet_sm90_tst", False),
]


@pytest.mark.parametrize(
    ("names", "prefixes", "name", "expected"),
    [c[1:] for c in PREFIX_CASES],
    ids=[c[0] for c in PREFIX_CASES],
)
def test_a_prefix_adds_only_a_bare_kernel_name_of_no_generated_look(
    names, prefixes, name, expected
):
    assert KernelClassifier(names, prefixes).is_cutile(name) is expected


def _profiled_kernels() -> list[tuple[str, bool]]:
    found: set[tuple[str, bool]] = set()

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("name"), str) and isinstance(node.get("cutile"), bool):
                found.add((node["name"], node["cutile"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in sorted(RESULTS.rglob("*.json")):
        walk(json.loads(path.read_text()))
    return sorted(found)


def test_committed_profiles_keep_their_class_and_their_attacked_inductor_kernels_do_not_count():
    """Every kernel of the committed H200 profiles keeps the class it was measured with (the
    tree: every function the demangler reads there), and every Inductor kernel among them,
    renamed as the attack renames it, does not count even with its decoy in the tree."""
    kernels = _profiled_kernels()
    assert sum(cutile for _, cutile in kernels) > 100 and sum(not c for _, c in kernels) > 100
    tree = {name.rsplit("_K", 1)[0] for name, cutile in kernels if cutile}
    classifier = KernelClassifier(tree)
    assert [n for n, cutile in kernels if classifier.is_cutile(n) != cutile] == []
    inductor = sorted({n for n, _ in kernels if re.fullmatch(r"triton_\w+_\d+", n)})
    assert len(inductor) > 20
    attacked = [re.sub(r"_(\d+)$", r"_zzrope_Kt2_A9f32_1t_\1", n) for n in inductor]
    decoys = {n.rsplit("_K", 1)[0] for n in attacked}
    fooled = KernelClassifier(tree | decoys)
    assert [n for n in attacked if fooled.is_cutile(n)] == []


def _cubin_functions(data: bytes) -> list[str]:
    """The FUNC symbols of an ELF64 little-endian cubin (its ``.symtab``)."""
    shoff, shentsize, shnum = (
        struct.unpack_from("<Q", data, 0x28)[0],
        *struct.unpack_from("<HH", data, 0x3A),
    )
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    names = []
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 2:  # SHT_SYMTAB
            continue
        strtab = sections[link][4]
        for at in range(offset, offset + size, entsize):
            st_name, st_info = struct.unpack_from("<IB", data, at)
            if st_info & 0xF == 2:  # STT_FUNC
                end = data.index(b"\0", strtab + st_name)
                names.append(data[strtab + st_name : end].decode())
    return sorted(names)


@ct.kernel
def triton_poi_fused__to_copy_zz(x, n: ct.Constant[int]):
    pass


@ct.kernel
def copy_kernel(x, y, tile: ct.Constant[int]):
    t = ct.load(x, index=(ct.bid(0),), shape=(tile,))
    ct.store(y, index=(ct.bid(0),), tile=t)


def _array():
    return ArrayConstraint(
        ct.float32,
        1,
        index_dtype=ct.int32,
        stride_lower_bound_incl=0,
        alias_groups=[],
        may_alias_internally=False,
    )


def _export(kernel, signatures, tmp_path) -> list[str]:
    from cuda.tile.compilation import export_kernel

    problem = toolchain_problem()
    if problem is not None:
        pytest.skip(problem)
    out = tmp_path / "k.cubin"
    export_kernel(kernel, signatures, str(out), gpu_code="sm_90", output_format="cubin")
    return _cubin_functions(out.read_bytes())


def test_the_compiler_names_a_decoy_exactly_like_the_inductor_kernel(tmp_path):
    """cuTile compiles the decoy to ``triton_poi_fused__to_copy_zz_Kt2_A1f32_1l0_I_3``: the very
    name Inductor gives kernel 3 fused around a custom op ``zz_Kt2_A1f32_1l0_I``. Round-tripping
    cannot tell them apart; the function's generated-looking name does."""
    v2 = CallingConvention.cutile_python_v2()
    symbols = _export(
        triton_poi_fused__to_copy_zz,
        [KernelSignature([_array(), ConstantConstraint(-3)], v2)],
        tmp_path,
    )
    assert symbols == ["triton_poi_fused__to_copy_zz_Kt2_A1f32_1l0_I_3"]
    assert not KernelClassifier({"triton_poi_fused__to_copy_zz"}).is_cutile(symbols[0])


def test_compiled_symbols_of_a_tree_kernel_count_and_their_look_alikes_do_not(tmp_path):
    signatures = [
        KernelSignature([_array(), _array(), ConstantConstraint(128)], conv)
        for conv in (CallingConvention.cutile_python_v1(), CallingConvention.cutile_python_v2())
    ]
    symbols = _export(copy_kernel, signatures, tmp_path)
    assert symbols == sorted(mangle_kernel_name("copy_kernel", s) for s in signatures)
    tree = KernelClassifier({"copy_kernel"})
    for symbol in symbols:
        assert tree.is_cutile(symbol)
        assert not KernelClassifier({"other_kernel"}).is_cutile(symbol)
        for look_alike in (symbol + "_3", symbol + "0_3", "x" + symbol, symbol.upper()):
            assert not tree.is_cutile(look_alike)
