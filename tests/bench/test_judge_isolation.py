"""The benchmark against experiments that fight it, end to end on the CPU.

Each case is a throwaway experiment tree (a copy of ``src/tilegym`` whose qwen3 family module
carries the attack) measured by the real ``tilegym-hf-bench`` in subprocesses. The attacks are
the ones that moved a verdict when the experiment's code shared the measuring process: a class
rebinding that broke the fp32 reference along with the model, a swapped error function, faked
timers, fast fake answers in the timed runs. Now the PyTorch side, the fp32 reference, the clock
and the scores live in a process that never imports the tree: each attack is refused by the
worker's confinement or fails correctness, and none makes a run look better than it is.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tilegym_hf_bench.metrics_schema import validation_errors

import tilegym

SRC = Path(tilegym.__file__).resolve().parent
pytestmark = pytest.mark.slow  # each case is a whole benchmark run (20-60 s on 2 cores)

FAST = ["--input-length", "16", "--output-length", "4", "--timed-runs", "2", "--warmup-runs", "1"]

#: Appended to the tree's ``monkey_patch`` (the patch entry the worker calls; the benchmark
#: runs whatever the tree holds, scope rules are another layer): every attention output of the
#: patched instance scaled by FACTOR.
SCALE_ATTENTION = """
import tilegym.transformers.monkey_patch as _mp
_orig = _mp.apply_tilegym_kernel
def _evil(model, **flags):
    handle = _orig(model, **flags)
    for layer in model.model.layers:
        fwd = layer.self_attn.forward
        def scaled(*a, _f=fwd, **k):
            out = _f(*a, **k)
            return (out[0] * FACTOR, *out[1:])
        layer.self_attn.forward = scaled
    return handle
_mp.apply_tilegym_kernel = _evil
"""

#: (attack, expected outcome, module of the tree it is appended to)
ATTACKS = {
    # the reference used to run the experiment's classes: now only the worker's model would
    "class_rebind": (
        """
        import transformers.models.qwen3.modeling_qwen3 as _up
        _A = _up.Qwen3Attention
        def _zero(self, hidden_states, *a, **k):
            return hidden_states * 0, None
        _A.forward = _zero
        """,
        "refused",
        "qwen3",
    ),
    "zero_attention_and_fake_error": (
        SCALE_ATTENTION.replace("FACTOR", "0.0")
        + """
import functools, importlib, torch
_mods = functools.reduce(getattr, ("sys", "modules"), torch)
importlib.import_module("tilegym_hf_bench.correctness")
importlib.import_module("tilegym_hf_bench.tolerance")
_mods["tilegym_hf_bench.correctness"].rel_err = lambda *a: 0.0
_mods["tilegym_hf_bench.tolerance"].verdict = lambda *a: None
""",
        "incorrect",
        "monkey_patch",
    ),
    "stopped_clocks": (
        """
        import time, torch
        time.perf_counter = lambda: 1.0
        torch.cuda.synchronize = lambda *a: None
        """,
        "honest",
        "qwen3",
    ),
    "fast_fake_answers": (
        """
        import torch
        import tilegym.transformers.monkey_patch as _mp
        _orig = _mp.apply_tilegym_kernel
        def _evil(model, **flags):
            handle = _orig(model, **flags)
            real = model.generate
            def fast(*a, **k):
                cfg = k.get("generation_config")
                if cfg is not None and not cfg.output_logits:
                    ids = k["input_ids"]
                    junk = torch.randint(0, 500, (ids.shape[0], cfg.max_new_tokens))
                    return torch.cat([ids, junk], dim=1)
                return real(*a, **k)
            model.generate = fast
            return handle
        _mp.apply_tilegym_kernel = _evil
        """,
        "incorrect",
        "monkey_patch",
    ),
    "subprocess": ("import os\nos.system('true')\n", "refused", "qwen3"),
    "frame_walk": ("import sys\nsys._getframe(0).f_back\n", "refused", "qwen3"),
    "write_outside_scratch": (
        "from pathlib import Path\nPath(__file__).with_name('planted.txt').write_text('x')\n",
        "refused",
        "qwen3",
    ),
}
MODULES = {
    "qwen3": ("transformers", "qwen3", "modeling_qwen3.py"),
    "monkey_patch": ("transformers", "monkey_patch.py"),
}


def experiment_tree(tmp_path: Path, attack: str, where: str = "qwen3") -> Path:
    """A copy of ``src/tilegym`` whose module ``where`` (``MODULES``) ends with ``attack``."""
    src = tmp_path / "src"
    shutil.copytree(SRC, src / "tilegym", ignore=shutil.ignore_patterns("__pycache__"))
    module = src.joinpath("tilegym", *MODULES[where])
    module.write_text(module.read_text() + "\n" + textwrap.dedent(attack))
    return src


def bench(src: Path, tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "metrics.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]),
        "CUDA_VISIBLE_DEVICES": "",
        "HF_HUB_OFFLINE": "1",
    }
    r = subprocess.run(
        [sys.executable, "-m", "tilegym_hf_bench._cli", "--model-key", "tiny-qwen3"]
        + ["--device", "cpu", "--metrics-out", str(out), *FAST, *extra],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    return r, json.loads(out.read_text())


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_an_attacking_experiment_moves_no_verdict(name, tmp_path):
    attack, expected, where = ATTACKS[name]
    src = experiment_tree(tmp_path, attack, where)
    r, doc = bench(src, tmp_path)
    assert validation_errors(doc) == []
    log = r.stdout + r.stderr
    if expected == "refused":
        assert doc["status"] == "refused", log
        assert r.returncode == 1 and "refused" in doc["error"], log
        assert doc["baseline"] is None and doc["correctness"] is None
        return
    assert doc["status"] == "ok", log
    correctness = doc["correctness"]
    if expected == "incorrect":
        assert correctness["passed"] is False, log
        assert "correctness: FAIL" in r.stdout
        return
    assert correctness["passed"] is True, log  # the clocks are the measuring process's own
    base = doc["baseline"]["throughput"]["samples"]
    cut = doc["cutile"]["throughput"]["samples"]
    assert all(0 < c < 20 * max(base) for c in cut), (base, cut)
    assert not (src / "tilegym" / "transformers" / "qwen3" / "planted.txt").exists()


def test_the_measuring_process_never_imports_the_tree(tmp_path):
    """An experiment whose package fails at import: the PyTorch side and the reference are
    unaffected (they never import it); the run fails on the cuTile side only."""
    src = experiment_tree(tmp_path, "raise RuntimeError('experiment code ran here')\n")
    r, doc = bench(src, tmp_path)
    assert doc["status"] == "crash"
    assert "experiment code ran here" in doc["error"]
    assert "cuTile side" in doc["error"]
    assert "model built" in r.stdout  # the PyTorch model was built before the worker failed
