"""``--mode eager|static``: the flag, the generate() configuration per mode, compile time kept
in warm-up, a compile inside a timed run flagged, metrics schema versions 1 and 2, and the
bot comparing only runs of one mode. CPU only: the static side really compiles (Inductor on
the CPU, no CUDA graphs there)."""

import copy
import gc
import json
from pathlib import Path

import pytest
import torch
from tilegym_bot.policy import decide, differences
from tilegym_hf_bench.compile_guard import graph_recordings, no_compile, recompile_reason
from tilegym_hf_bench.errors import BenchError
from tilegym_hf_bench.experiment_tree import ExperimentTree, measured_tree
from tilegym_hf_bench.generation import Generator, cache_kwarg, make_input_ids
from tilegym_hf_bench.metrics import assemble, throughput_block
from tilegym_hf_bench.metrics_schema import (
    READABLE_SCHEMA_IDS,
    SCHEMA_ID,
    load_schema,
    validation_errors,
)
from tilegym_hf_bench.model_factory import random_model
from tilegym_hf_bench.modes import (
    DECODE_STEP_COMPILE,
    EAGER,
    STATIC,
    mode_line,
    mode_of,
)
from tilegym_hf_bench.options import UsageError, parse_options
from tilegym_hf_bench.report import detail_lines, summary_lines
from tilegym_hf_bench.throughput import first_run_excess, measure, warm_up_sides
from tilegym_hf_bench.worker_client import cutile_unmeasured_reason
from transformers import CompileConfig, StaticCache

ROOT = Path(__file__).resolve().parents[2]
V1_FILE = ROOT / "docs/results/judge-h200-2026-12-01/metrics/qwen3-neutral-4d054b86-base.json"
ENV = dict.fromkeys(
    ("gpu_name", "gpu_uuid", "compute_capability", "driver", "cuda", "torch", "transformers",
     "cuda_tile", "tileiras", "python")
)  # fmt: skip
PROMPT, NEW = 12, 4


# --- flags -------------------------------------------------------------------------------------


def test_mode_flag_defaults_to_eager_and_lands_in_the_workload():
    o = parse_options(["--model-key", "tiny-qwen3"])
    assert o.workload.mode == EAGER and o.workload.as_metrics()["mode"] == "eager"
    s = parse_options(["--model-key", "qwen3", "--mode", "static"])
    assert s.workload.mode == STATIC and s.workload.as_metrics()["mode"] == "static"
    assert type(s).from_json(json.loads(json.dumps(s.to_json()))) == s  # the worker's request


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "fast"], "invalid choice: 'fast'"),
        (["--mode", "static", "--warmup-runs", "0"], "--mode static needs --warmup-runs >= 1"),
    ],
)
def test_bad_mode_flags_are_usage_errors(args, message):
    with pytest.raises(UsageError, match=message):
        parse_options(["--model-key", "tiny-qwen3", *args])


def test_eager_mode_still_allows_no_warm_up():
    assert parse_options(["--model-key", "qwen3", "--warmup-runs", "0"]).workload.warmup_runs == 0


# --- per-mode configuration (plain data) -------------------------------------------------------


def test_mode_lines_and_the_mode_of_a_file():
    assert mode_line(STATIC) == "mode: static (static KV cache, compiled decode step)"
    assert mode_line(EAGER).startswith("mode: eager (")
    assert mode_of({"mode": "static"}) == STATIC
    assert mode_of({"batch_size": 1}) == EAGER and mode_of(None) == EAGER  # version 1: eager


def test_the_pinned_decode_compile_is_transformers_default():
    """Both supported transformers versions (CI runs 5.17 and the newest) compile a static
    cache's decode step with CompileConfig(); the pinned copy must stay equal to it."""
    assert CompileConfig(**DECODE_STEP_COMPILE) == CompileConfig()


def test_cutile_side_runs_in_both_modes_wherever_the_tree_has_a_package(tmp_path):
    """The worker runs the patched model on any device (on a CPU through the ops' references);
    only --skip-cutile or a tree without a ``tilegym`` package leaves it out."""
    static = parse_options(["--model-key", "qwen3", "--mode", "static"])
    eager = parse_options(["--model-key", "qwen3"])
    skipped = parse_options(["--model-key", "qwen3", "--skip-cutile"])
    tree = ExperimentTree(tmp_path / "src" / "tilegym", tmp_path)
    assert cutile_unmeasured_reason(static, tree) is None
    assert cutile_unmeasured_reason(eager, tree) is None
    assert cutile_unmeasured_reason(skipped, tree) == "--skip-cutile"
    assert "no tilegym package" in cutile_unmeasured_reason(eager, ExperimentTree(None, None))


def test_generation_config_per_mode():
    model = random_model("tiny-qwen3", "cpu", seed=0).model
    ids = make_input_ids(512, 1, PROMPT, 0, "cpu")
    eager = Generator(model, ids, "cpu").config(NEW)
    assert eager.cache_implementation is None and eager.compile_config is None
    kept = Generator(model, ids, "cpu", STATIC)
    assert kept.keep_cache and kept.config(NEW).cache_implementation is None  # passed in
    static = Generator(model, ids, "cpu", STATIC, keep_cache=False).config(NEW)
    assert static.cache_implementation == "static"
    assert static.compile_config == CompileConfig(**DECODE_STEP_COMPILE)
    assert static.compile_config._compile_all_devices  # the CPU compiles as a GPU would
    assert (static.max_new_tokens, static.min_new_tokens, static.do_sample) == (NEW, NEW, False)


# --- static generate() on the CPU: compile in warm-up, never in a timed run ---------------------


@pytest.fixture(scope="module")
def warm_static():
    """A tiny model whose static generate() was warmed up (compiled) once for the module."""
    model = random_model("tiny-qwen3", "cpu", seed=0).model
    gen = Generator(model, make_input_ids(512, 1, PROMPT, 0, "cpu"), "cpu", STATIC)
    logged: list[str] = []
    warm = warm_up_sides({"baseline": gen}, NEW, 1, logged.append)
    return gen, warm, logged


@pytest.mark.slow
def test_static_generate_uses_a_static_cache_and_compiles_in_warm_up(warm_static):
    gen, warm, logged = warm_static
    assert warm.runs >= 2
    compile_s = warm.compile_s("baseline")
    assert compile_s is not None and compile_s > 0
    assert any("first warm-up generate() took" in line for line in logged)
    config = copy.deepcopy(gen.config(NEW))
    config.return_dict_in_generate = True
    with torch.inference_mode():
        kept = {cache_kwarg(gen.model): gen.kept_cache(NEW)}
        out = gen.model.generate(input_ids=gen.input_ids, generation_config=config, **kept)
    cache = getattr(out, "cache", None)  # newer transformers; 5.17 calls it past_key_values
    if cache is None:
        cache = out.past_key_values
    assert isinstance(cache, StaticCache) and cache is gen._cache  # the side's one cache
    assert out.sequences.shape == (1, PROMPT + NEW)


@pytest.mark.slow
def test_timed_runs_after_warm_up_do_not_compile(warm_static):
    gen, warm, _ = warm_static
    prompts = [make_input_ids(512, 1, PROMPT, 10 + i, "cpu") for i in range(2)]
    logged: list[str] = []
    samples = measure({"baseline": gen}, 1, NEW, 2, logged.append, prompts.__getitem__)
    seconds = [NEW / tps for tps in samples["baseline"].tokens_per_s]
    assert len(seconds) == 2 and max(seconds) < warm.compile_s("baseline")


@pytest.mark.slow
def test_a_compile_inside_a_timed_run_is_flagged(warm_static):
    """Round 2 changes the batch size, so the compiled decode step needs a new compile: the
    timed run says so and the measurement stops."""
    gen, _, _ = warm_static
    prompts = [make_input_ids(512, batch, PROMPT, 20, "cpu") for batch in (1, 2)]
    logged: list[str] = []
    with pytest.raises(BenchError) as caught:
        measure({"baseline": gen}, 1, NEW, 2, logged.append, prompts.__getitem__)
    message = str(caught.value)
    assert message.startswith("timed run 2/2, baseline: torch.compile needed a new compile")
    assert "run is not ok" in message and "\n" not in message
    assert [line.split(":")[0] for line in logged] == ["timed run 1/2"]


# after the warm_static tests: a compile here would make their first warm-up a warm one
@pytest.mark.slow
def test_a_kept_cache_is_one_cache_at_fixed_addresses_with_the_same_tokens():
    model = random_model("tiny-qwen3", "cpu", seed=3).model
    ids = make_input_ids(512, 1, PROMPT, 4, "cpu")
    fresh = Generator(model, ids, "cpu", STATIC, keep_cache=False)
    kept = Generator(model, ids, "cpu", STATIC, keep_cache=True)
    assert kept.config(NEW).cache_implementation is None  # passed in, not made by generate()
    assert kept.config(NEW).compile_config == fresh.config(NEW).compile_config
    first = kept.generate(NEW)
    cache = kept._cache
    addresses = [layer.keys.data_ptr() for layer in cache.layers]
    kept.generate(1)  # a shorter call reuses it, emptied
    again = kept.generate(NEW)
    assert kept._cache is cache and [layer.keys.data_ptr() for layer in cache.layers] == addresses
    assert torch.equal(first, again) and torch.equal(first, fresh.generate(NEW))
    kept.use_prompt(make_input_ids(512, 2, PROMPT, 5, "cpu"))  # another batch size: a new cache
    assert kept.generate(NEW).shape == (2, PROMPT + NEW) and kept._cache is not cache


def test_only_a_static_mode_can_keep_a_cache():
    model = random_model("tiny-qwen3", "cpu", seed=0).model
    with pytest.raises(BenchError, match="no static cache to keep"):
        Generator(model, make_input_ids(512, 1, PROMPT, 0, "cpu"), "cpu", EAGER, keep_cache=True)


# --- the guard on its own -------------------------------------------------------------------


class _GcProbe:
    """A side whose generate() records whether the cyclic collector was on while it ran."""

    def __init__(self):
        self.gc_on: list[bool] = []

    def timed(self, new_tokens, ids=None, label=None):
        self.gc_on.append(gc.isenabled())
        return 0.01 * new_tokens, None


@pytest.mark.slow
def test_timed_runs_pause_the_garbage_collector_and_restore_it():
    sides = {"baseline": _GcProbe(), "cutile": _GcProbe()}
    assert gc.isenabled()
    measure(sides, 1, 4, 3, lambda line: None)
    assert gc.isenabled()
    assert [s.gc_on for s in sides.values()] == [[False] * 6, [False] * 6]


def test_a_failing_timed_run_still_restores_the_garbage_collector():
    class Broken(_GcProbe):
        def timed(self, new_tokens, ids=None, label=None):
            raise BenchError("boom")

    with pytest.raises(BenchError):
        measure({"baseline": Broken()}, 1, 4, 1, lambda line: None)
    assert gc.isenabled()


def test_guard_lets_compiled_code_run_and_flags_a_shape_change():
    double = torch.compile(lambda x: x * 2, backend="eager")
    double(torch.ones(3))
    with no_compile("timed run 1/2, cutile"):
        assert double(torch.full((3,), 2.0)).tolist() == [4.0, 4.0, 4.0]
    flagged = pytest.raises(BenchError, match=r"^timed run 2/2, cutile: .*size mismatch")
    with flagged, no_compile("timed run 2/2, cutile"):
        double(torch.ones(4))
    double(torch.ones(4))  # outside a timed run compiling is allowed again


def test_guard_flags_a_first_compile_and_passes_other_errors_through():
    fresh = torch.compile(lambda x: x + 1, backend="eager")
    flagged = pytest.raises(BenchError, match="needed a new compile")
    with flagged, no_compile("timed run 1/1, baseline"):
        fresh(torch.ones(2))
    with pytest.raises(RuntimeError, match="^boom$"), no_compile("timed run 1/1, baseline"):
        raise RuntimeError("boom")


def test_guard_flags_a_cuda_graph_recording_and_ignores_other_callbacks():
    """cudagraph trees announce a recording through Dynamo's callback handler, the way this
    test does; a CPU cannot record a CUDA graph itself."""
    from torch._dynamo.callback import CallbackTrigger, callback_handler

    flagged = pytest.raises(BenchError, match=r"^timed run 4/5, baseline: 1 CUDA graph\(s\) rec")
    recording = callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "7/0")
    with flagged, no_compile("timed run 4/5, baseline"), recording:
        pass
    other = callback_handler.install_callbacks(CallbackTrigger.LAZY_BACKWARD, "7/1")
    with no_compile("timed run 5/5, baseline"), other:
        pass
    with graph_recordings() as heard:  # the listener left with the guard
        pass
    assert heard == [] and all(cb.__name__ != "heard" for cb in callback_handler.start_callbacks)


def test_recompile_reason_is_one_short_line():
    text = "Detected recompile when torch.compile stance is 'fail_on_recompile'. file: 'x.py'\n"
    text += "    triggered by:\n    - 0/0: tensor 'x' size mismatch" + " pad" * 200
    reason = recompile_reason(text)
    assert reason.startswith("file: 'x.py' triggered by: - 0/0: tensor 'x' size mismatch")
    assert "\n" not in reason and len(reason) <= 400 and reason.endswith("...")


def test_first_run_excess():
    assert first_run_excess([]) is None and first_run_excess([3.0]) is None
    assert first_run_excess([30.0, 1.0, 1.5]) == 28.5
    assert first_run_excess([1.0, 1.2]) == 0.0  # never negative


# --- metrics schema: version 2 written, version 1 still valid ----------------------------------


def _doc(mode=STATIC, compile_s=2.5):
    parts = {
        "baseline": throughput_block([10.0, 11.0], [5.0, 5.2], [12.0, 13.0], False, compile_s),
        "cutile": None,
        "coverage": None,
        "correctness": None,
    }
    workload = {"name": "default", "batch_size": 1, "input_length": 24, "output_length": 6,
                "warmup_runs": 1, "timed_runs": 2, "seed": 0, "mode": mode}  # fmt: skip
    return assemble(
        status="ok", error=None, model_key="tiny-qwen3", model_id=None, weights="random",
        commit="c" * 40, started_at="2026-12-01T00:00:00Z", wall_s=5.0, env=dict(ENV),
        workload=workload, parts=parts,
    )  # fmt: skip


def test_version_2_documents_carry_mode_and_compile_time():
    doc = _doc()
    assert doc["schema"] == SCHEMA_ID == "tilegym-bench-metrics/2"
    assert load_schema()["properties"]["schema"]["enum"] == list(READABLE_SCHEMA_IDS)
    assert validation_errors(doc) == []
    assert doc["baseline"]["compile_s"] == 2.5 and doc["workload"]["mode"] == "static"
    assert validation_errors(_doc(compile_s=None)) == []
    bad = _doc(mode="turbo")
    assert any("workload" in e for e in validation_errors(bad))
    negative = _doc()
    negative["baseline"]["compile_s"] = -1.0
    assert validation_errors(negative)


def test_version_2_without_a_mode_is_valid_and_means_eager():
    """The bot's runner writes a document for a run that produced none, without a mode."""
    doc = _doc()
    del doc["workload"]["mode"]
    assert validation_errors(doc) == [] and mode_of(doc["workload"]) == EAGER


def test_version_1_files_stay_valid_and_may_not_carry_version_2_fields():
    v1 = json.loads(V1_FILE.read_text())
    assert v1["schema"] == "tilegym-bench-metrics/1" and "mode" not in v1["workload"]
    assert validation_errors(v1) == []
    with_mode = copy.deepcopy(v1)
    with_mode["workload"]["mode"] = "static"
    assert validation_errors(with_mode)
    with_compile = copy.deepcopy(v1)
    with_compile["baseline"]["compile_s"] = 1.0
    assert validation_errors(with_compile)
    downgraded = _doc()
    downgraded["schema"] = "tilegym-bench-metrics/1"
    assert validation_errors(downgraded)


# --- the output says the mode; the grep lines keep their meaning -------------------------------


def test_report_says_the_mode_of_version_1_and_2_documents():
    static = _doc()
    lines = detail_lines(static, {"cutile": "--skip-cutile"})
    assert "mode: static (static KV cache, compiled decode step)" in lines
    assert any("compile/capture 2.50 s (warm-up, not timed)" in line for line in lines)
    static["baseline"]["ttft_ms"] = {"samples": [30.0, 90.0, 31.0], "mean": 50.3}
    assert any("TTFT median 31.0 ms" in line for line in detail_lines(static, {}))
    assert summary_lines(static, {"cutile": "--skip-cutile"}) == [
        "Average throughput: 10.50 ± 0.71 tokens/sec",
        "Average throughput: not measured (--skip-cutile)",
        ">>> cuTile Kernel Coverage (GPU Time): not measured (skipped) <<<",
    ]
    v1 = json.loads(V1_FILE.read_text())
    assert mode_line(EAGER) in detail_lines(v1, {})


# --- the bot compares runs of one mode only ----------------------------------------------------


def test_differences_treat_a_missing_mode_as_eager():
    v1 = json.loads(V1_FILE.read_text())
    eager, static = copy.deepcopy(v1), copy.deepcopy(v1)
    eager["workload"]["mode"] = "eager"
    static["workload"]["mode"] = "static"
    assert differences(v1, eager) == [] and differences(eager, v1) == []
    assert differences(v1, static) == ["mode differs (base 'eager', head 'static')"]
    assert differences(static, eager) == ["mode differs (base 'static', head 'eager')"]
    assert differences(static, static) == []


def test_decision_refuses_to_compare_two_modes():
    base = json.loads(V1_FILE.read_text())
    head = copy.deepcopy(base)
    head["schema"] = SCHEMA_ID
    head["workload"]["mode"] = "static"
    d = decide(base, head)
    assert d.status == "inconclusive"
    assert "not comparable: mode differs (base 'eager', head 'static')" in d.reasons


# --- item 4's CPU half: Inductor's generated kernels are not cuTile ----------------------------


@pytest.mark.parametrize(
    "name",
    [
        "triton_poi_fused_add_mul_0",
        "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1",
        "triton_per_fused_add_embedding_mean_pow_rsqrt_2",
        "triton_tem_fused_mm_3",
    ],
)
def test_inductor_kernels_count_as_non_cutile(name):
    assert not measured_tree().classifier().is_cutile(name)
