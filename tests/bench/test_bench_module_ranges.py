"""Forward-hook module ranges through the real torch.profiler (CPU activity on this machine):
every host op of a forward is attributed to the innermost module that ran it."""

import torch
from tilegym_hf_bench.presets import PRESETS, config_dict
from tilegym_hf_bench.profiling.attribution import enclosing_modules, normalize_module
from tilegym_hf_bench.profiling.module_ranges import module_ranges
from tilegym_hf_bench.profiling.torch_trace import split_events
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
