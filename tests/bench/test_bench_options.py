"""Flags to options: workloads per preset, overrides, and what is refused."""

import pytest
from tilegym_hf_bench.options import DEFAULT_TIMEOUT_S, BenchOptions, UsageError, parse_options
from tilegym_hf_bench.presets import PRESETS, config_dict


def test_default_and_decode_workloads_of_the_gpu_presets():
    o = parse_options(["--model-key", "qwen3"])
    w = o.workload
    assert (w.batch_size, w.input_length, w.output_length) == (1, 2048, 128)
    assert (w.warmup_runs, w.timed_runs, w.seed) == (2, 10, 0)
    assert o.timeout_s == DEFAULT_TIMEOUT_S == 900 and o.profiler == "torch" and o.device == "auto"
    d = parse_options(["--model-key", "llama", "--workload", "decode"]).workload
    assert (d.name, d.batch_size, d.input_length, d.output_length) == ("decode", 8, 256, 256)


def test_tiny_presets_get_cpu_sized_workloads_and_flags_override():
    w = parse_options(["--model-key", "tiny-llama"]).workload
    assert (w.batch_size, w.input_length, w.output_length) == (1, 128, 16)
    o = parse_options(
        ["--model-key", "tiny-qwen3", "--batch-size", "3", "--output-length", "7", "--seed", "9",
         "--skip-baseline", "--skip-coverage", "--timeout", "12.5"]
    )  # fmt: skip
    assert (o.workload.batch_size, o.workload.output_length, o.workload.seed) == (3, 7, 9)
    assert o.skip_baseline and o.skip_coverage and not o.skip_cutile and o.timeout_s == 12.5
    assert BenchOptions.from_json(o.to_json()) == o


@pytest.mark.parametrize("key", sorted(k for k, p in PRESETS.items() if p.cpu_sized))
def test_every_tiny_preset_gets_the_cpu_sized_workload(key):
    w = parse_options(["--model-key", key]).workload
    assert (w.batch_size, w.input_length, w.output_length) == (1, 128, 16)


def test_unknown_model_type_needs_model_id():
    with pytest.raises(UsageError, match="unknown --model-key"):
        parse_options(["--model-key", "falcon"])
    o = parse_options(["--model-key", "falcon", "--model-id", "/models/falcon"])
    assert o.model_id == "/models/falcon"


def test_bundled_configs_match_the_published_architectures():
    q = config_dict(PRESETS["qwen3"])
    assert (q["num_hidden_layers"], q["hidden_size"], q["intermediate_size"]) == (28, 1024, 3072)
    assert (q["num_attention_heads"], q["num_key_value_heads"], q["head_dim"]) == (16, 8, 128)
    assert q["vocab_size"] == 151936 and q["tie_word_embeddings"]
    ll = config_dict(PRESETS["llama"])
    assert (ll["num_hidden_layers"], ll["hidden_size"], ll["intermediate_size"]) == (16, 2048, 8192)
    assert ll["rope_scaling"]["rope_type"] == "llama3" and ll["rope_scaling"]["factor"] == 32.0
    assert all(not k.startswith("_") for k in q)


def test_bundled_configs_of_the_baseline_families_match_their_checkpoints():
    names = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
             "num_key_value_heads", "vocab_size")  # fmt: skip

    def dims(key):
        c = config_dict(PRESETS[key])
        return tuple(c[k] for k in names)

    assert dims("mistral") == (32, 4096, 14336, 32, 8, 32768)
    assert dims("qwen2") == (28, 1536, 8960, 12, 2, 151936)
    assert dims("phi3") == (32, 3072, 8192, 32, 32, 32064)
    assert dims("gemma3") == (26, 1152, 6912, 4, 1, 262144)
    assert dims("olmo2") == (16, 2048, 8192, 16, 16, 100352)
    phi3 = config_dict(PRESETS["phi3"])
    longrope = phi3["rope_scaling"]
    assert longrope["type"] == "longrope" and phi3["original_max_position_embeddings"] == 4096
    assert len(longrope["long_factor"]) == len(longrope["short_factor"]) == 48  # head_dim / 2
    assert longrope["long_factor"][-1] == 64.83999633789062
    gemma3 = config_dict(PRESETS["gemma3"])
    assert (gemma3["sliding_window"], gemma3["sliding_window_pattern"]) == (512, 6)
    assert (gemma3["rope_local_base_freq"], gemma3["rope_theta"]) == (10000, 1000000)
    assert PRESETS["gemma3"].model_type == "gemma3_text"
