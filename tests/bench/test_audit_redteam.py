"""Red team for the worker confinement: each case is an experiment run in a real subprocess.

The driver imports torch and transformers (as the worker does), installs the hook, imports a
throwaway package laid out like an experiment and calls its ``run()``. A refused case must end
with REFUSED_EXIT and the expected ``refused:`` line; an honest one must finish untouched.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tilegym_hf_bench.isolation.audit_hook import REFUSED_EXIT, read_refusals

pytest.importorskip("transformers")

HARNESS = Path(__file__).resolve().parents[2] / "modeling/transformers/src/tilegym_hf_bench"
MODULE = "src/tilegym/transformers/qwen3/modeling_qwen3.py"

DRIVER = """
import sys
from pathlib import Path
root = Path(sys.argv[1])
import torch, transformers.models.qwen3.modeling_qwen3  # the worker imports these first
from tilegym_hf_bench.isolation.audit_hook import Confinement, install
if sys.argv[3:] == ["warm"]:
    # Inductor probes the CPU's vector ISAs with `python -c <dlopen>`, which no confinement may
    # allow; the worker runs that probe (cached per process) before confining itself.
    from torch._inductor import cpu_vec_isa
    cpu_vec_isa.valid_vec_isa_list()
install(
    Confinement(
        experiment_roots=(root / "src/tilegym",),
        owned_modules=("tilegym.transformers.qwen3",),
        writable=(root / "scratch",),
        allowed_executables=("gcc", "g++", "cc", "c++", "ptxas", "tileiras", "ldconfig"),
        record_only=sys.argv[2] == "record",
    ),
    refusal_log=root / "scratch/refusals.log",
)
sys.path.insert(0, str(root / "src"))
from tilegym.transformers.qwen3 import modeling_qwen3 as exp
if hasattr(exp, "run"):
    exp.run(root)
print("driver: done", flush=True)
"""

PRELUDE = """
import os, sys, functools, socket, subprocess
import torch
import transformers
from transformers.models.qwen3 import modeling_qwen3 as _up
"""

REFUSED = [
    (
        "ctypes-via-builtins",
        'getattr(torch, "__builtins__")["__import__"]("ctypes").CDLL(None)',
        "ctypes.dlopen: ctypes from experiment code",
    ),
    (
        "tamper-with-the-hook-module",
        "import builtins\n"
        "from tilegym_hf_bench.isolation import audit_hook, audit_policy\n"
        "audit_policy.decide = lambda *a: None\n"
        "audit_policy.ALWAYS_REFUSED.clear()\n"
        "audit_hook.REFUSED_EXIT = 0\n"
        "builtins.getattr = lambda *a: None\n"
        "os._exit = lambda code: None\n"
        'os.system("true")',
        "os.system: a shell command",
    ),
    (
        "ctypes-disguised-as-torch",
        'code = compile("import ctypes; ctypes.CDLL(None)", torch.__file__, "exec")\nexec(code)',
        "compile: code named after",
    ),
    (
        "module-written-to-scratch",
        '(root / "scratch/helper.py").write_text("import sys\\nsys._getframe(0)\\n")\n'
        'sys.path.insert(0, str(root / "scratch"))\n'
        "import helper",
        "sys._getframe: frame access",
    ),
    (
        "subprocess-shell",
        'subprocess.run(["sh", "-c", "true"])',
        "subprocess.Popen: program 'sh' (sh -c true) is not an allowed toolchain",
    ),
    ("os-system", 'os.system("true")', "os.system: a shell command"),
    (
        "nvidia-smi-setter",
        'subprocess.run(["nvidia-smi", "-i", "0", "-lgc", "210"])',
        "subprocess.Popen: program 'nvidia-smi' (nvidia-smi -i 0 -lgc) is not an allowed",
    ),
    (
        "planted-gcc-on-path",
        'p = root / "scratch/gcc"; p.write_text("#!/bin/sh\\n"); p.chmod(0o755)\n'
        'os.environ.update(PATH=str(root / "scratch"))\nsubprocess.run(["gcc"])',
        "subprocess.Popen: {root}/scratch/gcc lies in a writable or experiment folder",
    ),
    (
        "write-git",
        'open(root / ".git/config", "a").write("x")',
        "open: write to {root}/.git/config, outside the writable folders",
    ),
    (
        "write-harness",
        f'open("{HARNESS}/planted.py", "w")',
        f"open: write to {HARNESS}/planted.py, outside",
    ),
    (
        "symlink-out-of-scratch",
        'os.symlink(root / ".git", root / "scratch/g")\nopen(root / "scratch/g/HEAD", "w")',
        "open: write to {root}/.git/HEAD",
    ),
    ("getframe", "sys._getframe(1)", "sys._getframe: frame access"),
    (
        "tb-frame",
        "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    e.__traceback__.tb_frame",
        "object.__getattr__: tb_frame hands out a frame",
    ),
    (
        "gi-frame",
        'g = (i for i in ())\ngetattr(g, "gi_frame")',
        "object.__getattr__: gi_frame hands out a frame",
    ),
    ("gc-referrers", "import gc\ngc.get_referrers(torch)", "gc.get_referrers"),
    ("settrace", "sys.settrace(lambda *a: None)", "sys.settrace: a tracer"),
    (
        "socket",
        'socket.create_connection(("127.0.0.1", 9), timeout=1)',
        "socket.connect: network connection",
    ),
    ("kill-parent", "os.kill(os.getppid(), 9)", "os.kill: signal to process"),
    (
        "code-rebind",
        "torch.nn.functional.silu.__code__ = (lambda *a, **k: 0).__code__",
        "object.__setattr__: rebinding of torch.nn.functional.__code__",
    ),
    (
        "reduce-getattr-code",
        'fn = functools.reduce(getattr, ("nn", "functional", "silu"), torch)\n'
        'setattr(fn, "__code__", (lambda *a: 0).__code__)',
        "object.__setattr__: rebinding of torch.nn.functional.__code__",
    ),
]

# Plain class attribute assignment raises no audit event in CPython 3.10-3.13 (checked), so the
# hook cannot see these; strict xfail keeps the gap visible until something closes it.
UNAUDITED = [
    ("alias-then-assign", "A = _up.Qwen3Attention\nA.forward = lambda *a, **k: None"),
    ("computed-setattr", 'setattr(_up.Qwen3MLP, "for" + "ward", lambda *a: None)'),
    ("type-setattr", 'type.__setattr__(_up.Qwen3MLP, "forward", lambda *a: None)'),
    (
        "mock-patch-object",
        "import unittest.mock\n"
        'unittest.mock.patch.object(_up.Qwen3MLP, "forward", lambda *a: None).start()',
    ),
]


def _experiment(tmp_path: Path, body: str, at_import: bool) -> Path:
    root = tmp_path / "exp"
    module = root / MODULE
    module.parent.mkdir(parents=True)
    for pkg in ("src/tilegym", "src/tilegym/transformers", "src/tilegym/transformers/qwen3"):
        (root / pkg / "__init__.py").write_text("")
    (root / ".git").mkdir()
    (root / "scratch").mkdir()
    code = PRELUDE + (
        "root = __import__('pathlib').Path(__file__).parents[4]\n" + body
        if at_import
        else "def run(root):\n" + textwrap.indent(body, "    ")
    )
    module.write_text(code + "\n")
    return root


def _run(root: Path, mode: str = "enforce", timeout: int = 240, env_extra=None, warm=False):
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **(env_extra or {})}
    driver = root / "driver.py"
    driver.write_text(DRIVER)
    # through a shell, so that a kill of the parent would hit the shell and show as -9
    cmd = f'"{sys.executable}" "{driver}" "{root}" {mode} {"warm" if warm else ""}; exit $?'
    return subprocess.run(
        ["sh", "-c", cmd], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


AT_IMPORT = ("ctypes-via-builtins", "os-system", "getframe")  # also spelled at import time
REFUSED_PARAMS = [
    pytest.param(body, line, False, id=f"{name}-in-run") for name, body, line in REFUSED
] + [
    pytest.param(body, line, True, id=f"{name}-at-import")
    for name, body, line in REFUSED
    if name in AT_IMPORT
]


@pytest.mark.parametrize("body, line, at_import", REFUSED_PARAMS)
def test_refused(tmp_path, body, line, at_import):
    root = _experiment(tmp_path, body, at_import)
    proc = _run(root)
    refusals = read_refusals(root / "scratch/refusals.log")
    assert proc.returncode == REFUSED_EXIT, (proc.returncode, proc.stderr[-2000:], refusals)
    assert "driver: done" not in proc.stdout
    assert len(refusals) == 1, refusals
    assert refusals[0].startswith("refused: " + line.format(root=root)), refusals
    assert f" at {root}/" in refusals[0], refusals


@pytest.mark.xfail(strict=True, reason="class attribute assignment raises no audit event")
@pytest.mark.parametrize("body", [c[1] for c in UNAUDITED], ids=[c[0] for c in UNAUDITED])
def test_unaudited_class_rebinding(tmp_path, body):
    root = _experiment(tmp_path, body, at_import=False)
    proc = _run(root)
    assert proc.returncode == REFUSED_EXIT, proc.stderr[-2000:]


HONEST = """
import torch.nn as nn

class Local(nn.Module):
    def forward(self, x):
        return x

Local.forward = lambda self, x: x + 0  # a class of its own module

def run(root):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval()
    layer = model.model.layers[0]
    original = layer.forward
    layer.forward = lambda *a, **k: original(*a, **k)  # an instance, not the class
    with torch.no_grad():
        logits = model(torch.arange(6).unsqueeze(0)).logits
    (root / "scratch/out.txt").write_text(str(tuple(logits.shape)))
    f = torch.compile(lambda x: torch.sin(x) * 2 + 1)
    assert torch.allclose(f(torch.ones(8)), torch.sin(torch.ones(8)) * 2 + 1)
    print("honest: ok", flush=True)
"""


def _honest_env(root: Path) -> dict:
    scratch = root / "scratch"
    return {
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
        "TRITON_CACHE_DIR": str(scratch / "triton"),
        "TMPDIR": str(scratch),
        # Inductor hashes its precompiled headers with `openssl sha512`
        "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0",
    }


@pytest.mark.parametrize("mode", ["record", "enforce"])
def test_honest_experiment_is_not_refused(tmp_path, mode):
    root = _experiment(tmp_path, "", at_import=True)
    (root / MODULE).write_text(PRELUDE + HONEST)
    proc = _run(root, mode=mode, timeout=540, env_extra=_honest_env(root), warm=True)
    refusals = read_refusals(root / "scratch/refusals.log")
    assert refusals == [], refusals
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "honest: ok" in proc.stdout and "driver: done" in proc.stdout
    assert (root / "scratch/out.txt").read_text() == "(1, 6, 64)"


GPU_QUERY = """
def run(root):
    out = subprocess.check_output(
        ["nvidia-smi", "-i", "0", "--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits"]
    )
    print("clock:", out.decode().strip(), flush=True)
"""


def test_a_read_only_gpu_query_runs(tmp_path):
    """Triton's ``nvsmi`` (Inductor sizes its GEMM padding with it when the compiled step keeps
    PyTorch's GEMMs): nvidia-smi with only query options runs; a real program on PATH outside
    the writable and experiment folders stands in for the driver's."""
    root = _experiment(tmp_path, "", at_import=True)
    (root / MODULE).write_text(PRELUDE + GPU_QUERY)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\n[ "$3" = "--query-gpu=clocks.max.sm" ] && echo 1980\n')
    smi.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = _run(root, env_extra=env)
    refusals = read_refusals(root / "scratch/refusals.log")
    assert refusals == [], refusals
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "clock: 1980" in proc.stdout and "driver: done" in proc.stdout


def test_record_only_lists_without_refusing(tmp_path):
    body = 'sys.settrace(None)\nos.system("true")\nprint("after", flush=True)'
    root = _experiment(tmp_path, body, at_import=False)
    proc = _run(root, mode="record")
    refusals = read_refusals(root / "scratch/refusals.log")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "after" in proc.stdout
    assert [r.split(":")[1].strip() for r in refusals] == ["sys.settrace", "os.system"], refusals
    assert all(r.startswith("would refuse: ") for r in refusals)
