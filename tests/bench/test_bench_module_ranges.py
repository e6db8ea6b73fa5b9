"""Forward-hook module ranges through the real torch.profiler (CPU activity on this machine):
every host op of a forward is attributed to the innermost module that ran it; and kernels are
linked to their launching op or, without one, to their launch call."""

import functools
from types import SimpleNamespace

import pytest
import torch
from tilegym_hf_bench.presets import PRESETS, config_dict
from tilegym_hf_bench.profiling.attribution import (
    MODULE_RANGE_PREFIX,
    aggregate,
    enclosing_modules,
    normalize_module,
)
from tilegym_hf_bench.profiling.module_ranges import module_ranges
from tilegym_hf_bench.profiling.torch_trace import split_events
from torch.autograd import DeviceType
from transformers import AutoConfig, AutoModelForCausalLM


def tiny_model():
    config = AutoConfig.for_model(**config_dict(PRESETS["tiny-qwen3"]))
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def test_host_ops_are_attributed_to_the_module_that_ran_them():
    model = tiny_model()
    ids = torch.randint(0, 512, (1, 9))
    with (
        module_ranges(model),
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof,
        torch.no_grad(),
    ):
        model(input_ids=ids)
    events = prof.profiler.kineto_results.events()
    kernels, hosts, ranges = split_events(events)
    assert kernels == []  # no GPU here
    names = {r.module for r in ranges}
    assert {"Qwen3ForCausalLM", "model.layers.1.mlp.down_proj", "lm_head"} <= names
    assert all(r.start_ns <= r.end_ns for r in ranges)

    module_of = enclosing_modules(hosts, ranges)
    op_name = {e.correlation_id(): e.name() for e in events if e.correlation_id() > 0}
    linear_modules = {
        normalize_module(module_of[h.id]) for h in hosts if op_name[h.id] == "aten::linear"
    }
    assert linear_modules == {
        "model.layers.*.self_attn.q_proj",
        "model.layers.*.self_attn.k_proj",
        "model.layers.*.self_attn.v_proj",
        "model.layers.*.self_attn.o_proj",
        "model.layers.*.mlp.gate_proj",
        "model.layers.*.mlp.up_proj",
        "model.layers.*.mlp.down_proj",
        "lm_head",
    }


def test_hooks_are_removed_and_output_unchanged():
    model = tiny_model()
    ids = torch.randint(0, 512, (2, 7))
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with module_ranges(model):
            hooked = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
    assert torch.equal(plain, hooked) and torch.equal(plain, after)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def _kineto(activity, name, corr, linked=0, thread=1, start=0, end=0, dur=0, typed=True):
    """One kineto event as torch.profiler reports it on a GPU host (the accessors split_events
    calls); this machine has no GPU, so the CUDA-side records are written out here.
    typed=False: without the ``activity_type`` accessor, as torch 2.11 on the H200 reports them."""
    gpu_side = ("kernel", "gpu_memcpy", "gpu_user_annotation")
    device = DeviceType.CUDA if activity in gpu_side else DeviceType.CPU
    values = dict(
        device_type=device,
        name=name,
        correlation_id=corr,
        linked_correlation_id=linked,
        start_thread_id=thread,
        start_ns=start,
        end_ns=end,
        duration_ns=dur,
    )
    if typed:
        values["activity_type"] = activity
    return SimpleNamespace(**{key: (lambda v=v: v) for key, v in values.items()})


@pytest.mark.parametrize("typed", [True, False], ids=["activity-types", "names-only"])
def test_kernels_without_a_linked_op_are_attributed_through_their_launch_call(typed):
    """A cuTile kernel has no linked op (kineto links kernels to ops, not to annotations): its
    module comes from the driver call that launched it, matched by CUPTI correlation id, even
    when an op elsewhere has the same (separately counted) id. Records shaped as device call 5
    of session 15 dumped them from a patched tiny-qwen3 forward (names-only: no activity type,
    one thread id, GPU-side copies of the annotations, API calls whose ids collide with ops')."""
    mlp = MODULE_RANGE_PREFIX + "model.layers.0.mlp"
    attn = MODULE_RANGE_PREFIX + "model.layers.0.self_attn"
    k = functools.partial(_kineto, typed=typed)
    events = [
        k("user_annotation", mlp, 1, start=10, end=50),
        k("gpu_user_annotation", mlp, 1, start=10, end=50),
        k("cpu_op", "aten::linear", 7, start=20, end=25),
        k("cuda_runtime", "cudaLaunchKernel", 100, linked=7, start=21),
        k("kernel", "sm90_xmma_gemm_bf16", 100, linked=7, dur=3000),
        k("cuda_driver", "cuLaunchKernelEx", 101, start=30),
        k("kernel", "rms_norm_kernel", 101, dur=2000),
        k("user_annotation", attn, 2, start=60, end=90),
        k("cpu_op", "aten::add", 101, start=70, end=71),  # op id == the driver call's id
        k("cuda_runtime", "cudaStreamIsCapturing", 7, start=72),  # id == aten::linear's
        k("gpu_memcpy", "Memcpy DtoD", 102, dur=50),
        k("kernel", "orphan_kernel", 103, dur=10),  # no launch call recorded
    ]
    kernels, hosts, ranges = split_events(events)
    assert [k.name for k in kernels] == ["sm90_xmma_gemm_bf16", "rms_norm_kernel", "orphan_kernel"]
    cov = aggregate(kernels, hosts, ranges, lambda name: name == "rms_norm_kernel")
    modules = {r.name: r.module for r in cov.rows}
    assert modules == {
        "sm90_xmma_gemm_bf16": "model.layers.*.mlp",
        "rms_norm_kernel": "model.layers.*.mlp",
        "orphan_kernel": None,
    }
