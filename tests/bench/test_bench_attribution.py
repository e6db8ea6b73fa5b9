"""Coverage aggregation and module attribution on synthetic profiler records."""

import cuda.tile as ct
import pytest
from cuda.tile.compilation import (
    ArrayConstraint,
    CallingConvention,
    KernelSignature,
    ScalarConstraint,
    mangle_kernel_name,
)
from tilegym_hf_bench.metrics_schema import load_schema
from tilegym_hf_bench.profiling.attribution import (
    HostEvent,
    KernelEvent,
    ModuleRange,
    aggregate,
    coverage_block,
    enclosing_modules,
    exclusive_ns,
    normalize_module,
    recount,
)
from tilegym_hf_bench.profiling.classify import (
    KernelClassifier,
    PrefixFileError,
    load_prefixes,
    parse_prefixes,
)


def cutile_symbol(function: str) -> str:
    array = ArrayConstraint(
        ct.bfloat16,
        2,
        index_dtype=ct.int32,
        stride_lower_bound_incl=0,
        alias_groups=[],
        may_alias_internally=False,
    )
    sig = KernelSignature(
        [array, ScalarConstraint(ct.float32), 64], CallingConvention.cutile_python_v2()
    )
    return mangle_kernel_name(function, sig)


def test_innermost_enclosing_range_on_the_same_thread():
    ranges = [
        ModuleRange("model", 1, 0, 100),
        ModuleRange("model.layers.0", 1, 10, 50),
        ModuleRange("model.layers.0.mlp", 1, 20, 40),
        ModuleRange("other_thread", 2, 0, 100),
    ]
    hosts = [
        HostEvent(1, 1, 25),  # inside mlp
        HostEvent(2, 1, 45),  # layer, after mlp closed
        HostEvent(3, 1, 99),  # only the root
        HostEvent(4, 1, 150),  # outside everything
        HostEvent(5, 2, 5),  # other thread
        HostEvent(6, 1, 20),  # exactly at the mlp start
        HostEvent(7, 1, 40),  # exactly at the mlp end
    ]
    got = enclosing_modules(hosts, ranges)
    assert got == {
        1: "model.layers.0.mlp",
        2: "model.layers.0",
        3: "model",
        4: None,
        5: "other_thread",
        6: "model.layers.0.mlp",
        7: "model.layers.0.mlp",
    }


def test_ranges_with_equal_start_nest_outer_first():
    ranges = [ModuleRange("inner", 1, 10, 20), ModuleRange("outer", 1, 10, 30)]
    got = enclosing_modules([HostEvent(1, 1, 15), HostEvent(2, 1, 25)], ranges)
    assert got == {1: "inner", 2: "outer"}


def test_normalize_module_folds_layer_indices():
    assert normalize_module("model.layers.17.mlp.down_proj") == "model.layers.*.mlp.down_proj"
    assert normalize_module("model.layers.3") == "model.layers.*"
    assert normalize_module("lm_head") == "lm_head"


def test_aggregate_sums_time_per_kernel_and_module_and_classifies():
    rms = cutile_symbol("rms_norm_kernel")
    ranges = [
        ModuleRange("model.layers.0.mlp", 7, 0, 10),
        ModuleRange("model.layers.1.mlp", 7, 20, 30),
        ModuleRange("model.layers.0.input_layernorm", 7, 40, 50),
    ]
    hosts = [HostEvent(11, 7, 1), HostEvent(12, 7, 21), HostEvent(13, 7, 41), HostEvent(14, 7, 60)]
    kernels = [
        KernelEvent("sm90_xmma_gemm_bf16", 3000, 11),
        KernelEvent("sm90_xmma_gemm_bf16", 1000, 12),
        KernelEvent(rms, 2000, 13),
        KernelEvent("at::native::argmax_kernel", 4000, 14),
        KernelEvent("at::native::copy_kernel", 500, 0),
    ]
    cov = aggregate(kernels, hosts, ranges, KernelClassifier({"rms_norm_kernel"}).is_cutile)
    rows = {(r.name, r.module): (r.calls, r.gpu_ns, r.cutile) for r in cov.rows}
    assert rows == {
        ("sm90_xmma_gemm_bf16", "model.layers.*.mlp"): (2, 4000, False),
        (rms, "model.layers.*.input_layernorm"): (1, 2000, True),
        ("at::native::argmax_kernel", None): (1, 4000, False),
        ("at::native::copy_kernel", None): (1, 500, False),
    }
    assert cov.total_ns == 10500 and cov.cutile_ns == 2000
    assert cov.gpu_time_pct == pytest.approx(100 * 2000 / 10500)
    assert cov.launch_pct == pytest.approx(20.0)
    assert [r.gpu_ns for r in cov.rows] == sorted((r.gpu_ns for r in cov.rows), reverse=True)


def _is_cu(name: str) -> bool:
    return name.startswith("cu")


def test_a_dependent_placed_early_is_charged_from_the_end_of_the_kernel_it_waits_for():
    """Two cuTile kernels, the second a programmatic dependent placed at 2 while the first
    runs to 10: 15 ns of busy time, not 23, and all of it cuTile's."""
    kernels = [KernelEvent("cu_a", 10, 1, 0), KernelEvent("cu_b", 13, 2, 2)]
    assert exclusive_ns(kernels, _is_cu) == [10, 5]
    cov = aggregate(kernels, [], [], _is_cu)
    assert (cov.total_ns, cov.cutile_ns, cov.overlap_ns) == (15, 15, 8)
    assert coverage_block(cov, "torch")["overlap_gpu_ms"] == pytest.approx(8e-6)


def test_a_cutile_kernel_beside_pytorch_kernels_takes_none_of_their_time():
    """A cuTile spinner on another stream from 0 to 100 while PyTorch kernels run at 10-30
    and 50-60: PyTorch keeps its 30 ns, the spinner gets the 70 ns it ran alone. Summed
    durations would have made it 100 of 130; first-started-wins would have made it 100 of
    100."""
    kernels = [
        KernelEvent("cu_spin", 100, 1, 0),
        KernelEvent("gemm", 20, 2, 10),
        KernelEvent("copy", 10, 3, 50),
    ]
    assert exclusive_ns(kernels, _is_cu) == [70, 20, 10]
    cov = aggregate(kernels, [], [], _is_cu)
    assert (cov.total_ns, cov.cutile_ns) == (100, 70)
    # and a PyTorch kernel placed while a cuTile one runs takes the shared instants
    shared = [KernelEvent("cu_a", 10, 1, 0), KernelEvent("gemm", 15, 2, 5)]
    assert exclusive_ns(shared, _is_cu) == [5, 15]


def test_exclusive_shares_without_starts_ties_and_nesting():
    assert exclusive_ns([KernelEvent("gemm", 7, 1), KernelEvent("cu", -3, 2)], _is_cu) == [7, 0]
    # equal starts: the earlier record first; a kernel inside another gets nothing
    tie = [KernelEvent("gemm", 5, 1, 0), KernelEvent("copy", 5, 2, 0)]
    assert exclusive_ns(tie, _is_cu) == [5, 0]
    nested = [KernelEvent("cu_a", 50, 1, 0), KernelEvent("cu_b", 10, 2, 20)]
    assert exclusive_ns(nested, _is_cu) == [50, 0]
    # one kernel without a start keeps its duration beside timed ones
    mixed = [KernelEvent("cu_a", 10, 1, 0), KernelEvent("cu_b", 10, 2, 5), KernelEvent("x", 4, 3)]
    assert exclusive_ns(mixed, _is_cu) == [10, 5, 4]


def test_exclusive_shares_match_counting_every_instant_on_random_records():
    """Against a brute force over unit instants: the shares sum to the union of all intervals,
    PyTorch's to the union of its own, cuTile's to the instants only cuTile kernels cover."""
    import random

    rng = random.Random(7)
    for _ in range(300):
        kernels = [
            KernelEvent(
                rng.choice(["cu_x", "cu_y", "gemm", "copy"]),
                rng.randint(0, 30),
                i,
                rng.randint(0, 60),
            )
            for i in range(rng.randint(1, 12))
        ]
        shares = exclusive_ns(kernels, _is_cu)
        busy, other = set(), set()
        for k in kernels:
            instants = set(range(k.start_ns, k.start_ns + k.duration_ns))
            busy |= instants
            if not _is_cu(k.name):
                other |= instants
        assert all(x >= 0 for x in shares)
        assert sum(shares) == len(busy)
        pairs = list(zip(shares, kernels, strict=True))
        assert sum(x for x, k in pairs if not _is_cu(k.name)) == len(other)
        assert sum(x for x, k in pairs if _is_cu(k.name)) == len(busy - other)


def test_coverage_block_matches_the_schema_coverage_object():
    import jsonschema

    cov = aggregate(
        [KernelEvent(cutile_symbol("silu_and_mul"), 10, 1), KernelEvent("gemm", 30, 1)],
        [HostEvent(1, 1, 5)],
        [ModuleRange("model.layers.0.mlp", 1, 0, 10)],
        KernelClassifier({"silu_and_mul"}).is_cutile,
    )
    block = coverage_block(cov, "torch")
    assert block["gpu_time_pct"] == 25.0 and block["launch_pct"] == 50.0
    assert recount(block, KernelClassifier({"silu_and_mul"}).is_cutile) == block
    lied = {
        **block,
        "gpu_time_pct": 99.0,
        "kernels": [dict(k, cutile=True) for k in block["kernels"]],
    }
    assert recount(lied, KernelClassifier({"silu_and_mul"}).is_cutile) == block
    assert recount(block, KernelClassifier().is_cutile)["gpu_time_pct"] == 0.0
    schema = load_schema()
    sub = {"$defs": schema["$defs"], **schema["properties"]["coverage"]}
    jsonschema.Draft202012Validator(sub).validate(block)


def test_classifier_demangles_cutile_symbols_of_the_measured_tree_only():
    plain = KernelClassifier({"rope_kernel"})
    assert plain.can_demangle
    assert plain.is_cutile(cutile_symbol("rope_kernel"))
    assert plain.cutile_function(cutile_symbol("rope_kernel")) == "rope_kernel"
    assert not plain.is_cutile("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_tn")
    assert not plain.is_cutile("void at::native::vectorized_elementwise_kernel<4>")
    # a well-formed cuTile symbol of a function the measured tree does not define
    assert not plain.is_cutile(cutile_symbol("elsewhere_kernel"))
    assert plain.cutile_function(cutile_symbol("elsewhere_kernel")) is None


def test_a_foreign_kernel_with_a_cutile_like_name_is_not_cutile():
    """A @triton.jit kernel named like a mangled cuTile symbol (the demangler reads
    ``fused_rmsnorm_Kt2`` as function ``fused_rmsnorm`` with no parameters)."""
    assert not KernelClassifier().is_cutile("fused_rmsnorm_Kt2")
    assert not KernelClassifier({"fused_rmsnorm"}).is_cutile("fused_rmsnorm_Kt2")
    assert not KernelClassifier({"other"}).is_cutile(cutile_symbol("fused_rmsnorm"))


def test_prefixes_match_a_kernel_name_or_its_symbols_only():
    with_prefix = KernelClassifier({"fused_attention"}, ["fused_attention"])
    assert with_prefix.is_cutile("fused_attention")
    assert with_prefix.is_cutile(cutile_symbol("fused_attention"))
    assert not with_prefix.is_cutile("fused_attention_Kt2_shortened")
    assert not with_prefix.is_cutile("fused_attention_v2")
    assert not with_prefix.is_cutile("flash_fwd_kernel")


def test_a_prefix_that_is_no_kernel_of_the_tree_widens_nothing():
    """A kernel called ``void`` with the prefix ``void`` must not claim every ATen kernel."""
    widened = KernelClassifier({"void"}, ["void", "at", "sm90"])
    assert not widened.is_cutile("void at::native::vectorized_elementwise_kernel<4>(int)")
    assert not widened.is_cutile("at::native::copy_kernel")
    assert not widened.is_cutile("sm90_xmma_gemm_bf16")
    assert widened.prefixes == frozenset()  # ``void`` starts like a C++ kernel signature


def test_prefix_file_format():
    assert load_prefixes() == ()
    assert parse_prefixes("prefixes: [a_kernel, b_kernel]\n") == ("a_kernel", "b_kernel")
    for bad in ("prefixes: a_kernel\n", "other: []\n", "prefixes: [1]\n", "- a\n"):
        with pytest.raises(PrefixFileError):
            parse_prefixes(bad)
