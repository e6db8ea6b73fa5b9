"""The real ``tilegym-hf-bench`` CLI in subprocesses: output contract, metrics, exit codes."""

import json
import os
import re
import subprocess
import sys
import time

import pytest
from tilegym_hf_bench._cli import main
from tilegym_hf_bench.metrics_schema import validation_errors
from tilegym_hf_bench.presets import PRESETS

COMMIT = "0123456789abcdef0123456789abcdef01234567"
THROUGHPUT = re.compile(r"^Average throughput: (\d+\.\d\d) ± (\d+\.\d\d) tokens/sec$")
NOT_MEASURED_T = re.compile(r"^Average throughput: not measured \(.+\)$")
NOT_MEASURED_C = re.compile(r"^>>> cuTile Kernel Coverage \(GPU Time\): not measured \(.+\) <<<$")
EAGER_LINE = "mode: eager (each side's default KV cache, eager generate())"
STATIC_LINE = "mode: static (static KV cache, compiled decode step)"
FAST = ["--input-length", "24", "--output-length", "6", "--timed-runs", "3", "--warmup-runs", "1"]


def bench(*args, timeout=400):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [sys.executable, "-m", "tilegym_hf_bench._cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def grep_lines(stdout):
    return [ln for ln in stdout.splitlines() if ln.startswith(("Average throughput", ">>> cuTile"))]


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(k for k, p in PRESETS.items() if p.cpu_sized))
def test_tiny_preset_end_to_end_on_cpu(tmp_path, key):
    out = tmp_path / "metrics.json"
    r = bench(
        "--model-key", key, "--device", "cpu", "--metrics-out", str(out), "--commit", COMMIT, *FAST
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = grep_lines(r.stdout)
    assert len(lines) == 3, r.stdout
    assert THROUGHPUT.match(lines[0])
    assert THROUGHPUT.match(lines[1])  # the patched model, on the CPU through the ops' references
    assert NOT_MEASURED_C.match(lines[2])
    assert r.stdout.splitlines()[-4:-1] == lines  # the three lines close the report
    assert "weights: random" in r.stdout
    assert EAGER_LINE in r.stdout.splitlines()
    doc = json.loads(out.read_text())
    assert validation_errors(doc) == []
    assert doc["schema"] == "tilegym-bench-metrics/2"
    assert doc["status"] == "ok" and doc["commit"] == COMMIT and doc["model_key"] == key
    assert doc["cutile"] is not None and doc["coverage"] is None
    samples = doc["baseline"]["throughput"]["samples"]
    assert len(samples) == 3 and all(s > 0 for s in samples)
    mean = float(THROUGHPUT.match(lines[0]).group(1))
    assert mean == pytest.approx(doc["baseline"]["throughput"]["mean"], abs=0.006)
    c = doc["correctness"]
    # a sane bf16 baseline: the reported (worst) case's error is a few percent; a tiny random
    # MoE's bf16 routing flips an expert now and then (tiny-mixtral's long case: 0.053)
    assert c["passed"] and 0 < c["baseline_rel_err"] < 0.1 and c["logits_rel_err"] is not None
    assert c["statistic"] == "max_token"
    assert [case["name"] for case in c["cases"]] == ["workload", "padded", "long"]
    assert c["timed_agreement"]["runs"] == 6  # a first-token and a full run per timed run
    for case in c["cases"]:  # an MoE model: each side replayed its routing (the worker's sent)
        if case["routing"] is not None:
            assert None not in case["routing"]["reported"].values()
    assert "model worker: pid" in r.stdout
    assert doc["workload"] == {
        "name": "default",
        "batch_size": 1,
        "input_length": 24,
        "output_length": 6,
        "warmup_runs": 1,
        "timed_runs": 3,
        "seed": 0,
        "mode": "eager",
    }
    compile_s = doc["baseline"]["compile_s"]
    assert compile_s is not None and compile_s >= 0


@pytest.mark.slow
def test_static_mode_end_to_end_on_cpu(tmp_path):
    """Static KV cache with the compiled decode step on both sides (Inductor on the CPU, the
    cuTile side in its worker through the ops' references); the compile is warm-up, reported
    apart."""
    out = tmp_path / "metrics.json"
    r = bench(
        "--model-key", "tiny-qwen3", "--device", "cpu", "--mode", "static",
        "--metrics-out", str(out), "--commit", COMMIT, *FAST,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    lines = grep_lines(r.stdout)
    assert len(lines) == 3 and r.stdout.splitlines()[-4:-1] == lines
    assert THROUGHPUT.match(lines[0])  # first: PyTorch, in static mode
    assert THROUGHPUT.match(lines[1]) and NOT_MEASURED_C.match(lines[2])
    assert r.stdout.splitlines().count(STATIC_LINE) == 2  # in the log and in the report
    doc = json.loads(out.read_text())
    assert validation_errors(doc) == []
    assert doc["schema"] == "tilegym-bench-metrics/2" and doc["workload"]["mode"] == "static"
    base = doc["baseline"]
    assert doc["coverage"] is None and doc["correctness"]["passed"]
    assert doc["cutile"]["compile_s"] is not None
    run_s = [6 / tps for tps in base["throughput"]["samples"]]
    assert base["compile_s"] > max(run_s)  # compiling happened in warm-up, not in a timed run
    assert f"compile/capture {base['compile_s']:.2f} s (warm-up, not timed)" in r.stdout
    log = r.stdout.splitlines()

    def first(prefix):
        return next(i for i, line in enumerate(log) if line.startswith(prefix))

    # the model worker starts before this process imports torch (its first line: the device)
    assert first("model worker: pid") < first("device: cpu")
    # its correctness cases go out during warm-up, not after the timed runs
    assert first("correctness: 3 cases ahead") < first("timed run 1/")
    assert {"startup", "worker_start", "worker_exit", "correctness"} <= set(doc["phases_s"])


@pytest.mark.slow
def test_pretrained_directory_is_loaded_and_reported(tmp_path):
    import torch
    from tilegym_hf_bench.presets import PRESETS, config_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = tmp_path / "tiny-llama-weights"
    config = AutoConfig.for_model(**config_dict(PRESETS["tiny-llama"]))
    torch.manual_seed(3)
    AutoModelForCausalLM.from_config(config).save_pretrained(model_dir)
    out = tmp_path / "m.json"
    r = bench(
        "--model-key",
        "tiny-llama",
        "--model-id",
        str(model_dir),
        "--metrics-out",
        str(out),
        "--commit",
        COMMIT,
        "--skip-correctness",
        "--skip-baseline",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "weights: pretrained" in r.stdout
    doc = json.loads(out.read_text())
    assert validation_errors(doc) == []
    assert (doc["weights"], doc["model_id"], doc["correctness"]) == (
        "pretrained",
        str(model_dir),
        None,
    )
    assert doc["baseline"] is None
    assert grep_lines(r.stdout)[0] == "Average throughput: not measured (--skip-baseline)"


def test_timeout_kills_the_worker_process_group(tmp_path):
    out = tmp_path / "m.json"
    start = time.monotonic()
    r = bench(
        "--model-key",
        "tiny-qwen3",
        "--device",
        "cpu",
        "--timeout",
        "3",
        "--timed-runs",
        "100000",
        "--metrics-out",
        str(out),
        "--commit",
        COMMIT,
    )
    assert time.monotonic() - start < 40
    assert r.returncode == 1
    assert grep_lines(r.stdout) == []
    pgid = int(re.search(r"process group (\d+)", r.stdout).group(1))
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    doc = json.loads(out.read_text())
    assert validation_errors(doc) == []
    assert doc["status"] == "timeout" and "timed out after 3 s" in doc["error"]
    assert doc["baseline"] is None and doc["correctness"] is None


def test_bad_model_dir_is_a_crash_with_metrics(tmp_path):
    out = tmp_path / "m.json"
    missing = tmp_path / "no-such-model"
    r = bench(
        "--model-key",
        "tiny-qwen3",
        "--model-id",
        str(missing),
        "--metrics-out",
        str(out),
        "--commit",
        COMMIT,
    )
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert f"error: benchmark crash: --model-id {missing}: no such directory" in r.stderr
    assert grep_lines(r.stdout) == []
    doc = json.loads(out.read_text())
    assert validation_errors(doc) == []
    assert doc["status"] == "crash" and "no such directory" in doc["error"]
    assert doc["weights"] == "pretrained" and doc["env"]["python"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the following arguments are required: --model-key"),
        (["--model-key", "gpt9"], "unknown --model-key 'gpt9'"),
        (["--model-key", "qwen3", "--workload", "huge"], "invalid choice: 'huge'"),
        (["--model-key", "qwen3", "--batch-size", "0"], "expected a positive integer"),
        (["--model-key", "qwen3", "--timeout", "-1"], "expected seconds > 0"),
        (["--model-key", "qwen3", "--device", "tpu"], "--device must be"),
        (["--model-key", "qwen3", "--commit", "abc"], "--commit must be 40"),
        (["--model-key", "qwen3", "--profiler", "ncu"], "invalid choice: 'ncu'"),
        (["--model-key", "qwen3", "--mode", "graph"], "invalid choice: 'graph'"),
        (["--model-key", "qwen3", "--mode", "static", "--warmup-runs", "0"], "--warmup-runs >= 1"),
    ],
)
def test_usage_errors_exit_2_with_one_error_line(args, message, tmp_path, capsys):
    out = tmp_path / "m.json"
    assert main([*args, "--metrics-out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], captured.err
    assert captured.out == ""
    assert not out.exists()


def test_usage_error_through_the_console_script_exits_2():
    r = bench("--model-key", "qwen3", "--output-length", "x", timeout=60)
    assert r.returncode == 2
    assert (
        r.stderr.strip() == "error: argument --output-length: expected a positive integer, got 'x'"
    )


def test_nsys_profiler_without_nsys_is_a_clear_crash(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no nsys on it
    out = tmp_path / "m.json"
    argv = ["--model-key", "tiny-qwen3", "--profiler", "nsys", "--metrics-out", str(out)]
    assert main([*argv, "--commit", COMMIT]) == 1
    err = capsys.readouterr().err
    assert "error: benchmark crash: --profiler nsys: Nsight Systems (nsys) is not on PATH" in err
    doc = json.loads(out.read_text())
    assert validation_errors(doc) == []
    assert doc["status"] == "crash" and doc["coverage"] is None
