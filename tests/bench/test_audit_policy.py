"""The worker confinement's pure rules, table-driven on plain event data."""

from __future__ import annotations

import pytest
from tilegym_hf_bench.isolation.audit_policy import (
    decide,
    event,
    matches_tool,
    read_only_query,
    rules,
)

RULES = rules(
    owned_modules=("tilegym.transformers.qwen3",),
    writable=("/s/scratch", "/s/cache"),
    protected=("/s/scratch/refusals.log",),
    allowed_executables=("gcc", "g++", "ptxas", "tileiras"),
    planted=("/s/scratch", "/s/cache", "/r/src/tilegym"),
    experiment=("/r/src/tilegym",),
)
EXP = "/r/src/tilegym/transformers/qwen3/modeling_qwen3.py:7"
TORCH = "/v/site-packages/torch/_inductor/codecache.py"

CASES = [
    # (id, event, refusal text starts with | None)
    ("system", event("os.system"), "os.system: a shell command"),
    ("fork", event("os.fork"), "os.fork: fork"),
    ("connect", event("socket.connect", site=EXP), f"socket.connect: network connection at {EXP}"),
    ("kill-parent", event("os.kill", pid=10, own_pid=11), "os.kill: signal to process 10"),
    ("kill-self", event("os.kill", pid=11, own_pid=11), None),
    ("killpg", event("os.killpg"), "os.killpg"),
    (
        "gcc",
        event("subprocess.Popen", program="gcc", program_real="/usr/bin/x86_64-linux-gnu-gcc-12"),
        None,
    ),
    (
        "sh",
        event("subprocess.Popen", program="sh", program_real="/usr/bin/dash"),
        "subprocess.Popen: program 'sh' () is not an allowed toolchain",
    ),
    (
        "gcc-link-to-sh",
        event("subprocess.Popen", program="/s/x/gcc", program_real="/usr/bin/dash"),
        "subprocess.Popen: '/s/x/gcc' is /usr/bin/dash, not an allowed toolchain",
    ),
    (
        "planted-gcc",
        event("os.posix_spawn", program="gcc", program_real="/s/scratch/bin/gcc"),
        "os.posix_spawn: /s/scratch/bin/gcc lies in a writable or experiment folder",
    ),
    (
        "nvidia-smi-query",
        event(
            "subprocess.Popen",
            program="nvidia-smi",
            program_real="/usr/bin/nvidia-smi",
            argv=("nvidia-smi", "-i", "0", "--query-gpu=clocks.max.sm", "--format=csv"),
        ),
        None,
    ),
    (
        "nvidia-smi-clock-lock",
        event(
            "subprocess.Popen",
            program="nvidia-smi",
            program_real="/usr/bin/nvidia-smi",
            argv=("nvidia-smi", "-i", "0", "-lgc", "210"),
        ),
        "subprocess.Popen: program 'nvidia-smi' () is not an allowed toolchain",
    ),
    (
        "query-argv-another-program",
        event(
            "subprocess.Popen",
            program="sh",
            program_real="/usr/bin/dash",
            argv=("nvidia-smi", "--query-gpu=name"),
        ),
        "subprocess.Popen: program 'sh' () is not an allowed toolchain",
    ),
    (
        "nvidia-smi-named-link-to-sh",
        event(
            "subprocess.Popen",
            program="/opt/nvidia-smi",
            program_real="/usr/bin/dash",
            argv=("/opt/nvidia-smi", "--query-gpu=name"),
        ),
        "subprocess.Popen: '/opt/nvidia-smi' is /usr/bin/dash, not an allowed toolchain",
    ),
    ("missing", event("os.exec", program="ptxas"), "os.exec: program 'ptxas' not found"),
    ("ctypes-exp", event("ctypes.dlopen", site=EXP, direct=True), "ctypes.dlopen: ctypes from"),
    ("ctypes-torch", event("ctypes.dlopen", site=EXP, direct=False), None),
    ("getframe-exp", event("sys._getframe", site=EXP, direct=True, top_file=EXP), "sys._getframe"),
    ("getframe-torch", event("sys._getframe", site=EXP, top_file=TORCH), None),
    (
        "getframe-logging",
        event("sys._getframe", direct=True, top_file="/py/lib/python3.11/logging/__init__.py"),
        None,
    ),
    ("settrace", event("sys.settrace", direct=True), "sys.settrace: a tracer"),
    ("thread-exp", event("_thread.start_new_thread", direct=True), "_thread.start_new_thread"),
    ("thread-torch", event("_thread.start_new_thread", site=EXP), None),
    ("referrers", event("gc.get_referrers", direct=True), "gc.get_referrers"),
    (
        "tb_frame",
        event("object.__getattr__", direct=True, attribute="tb_frame"),
        "object.__getattr__: tb_frame hands out a frame",
    ),
    ("gi_code", event("object.__getattr__", direct=True, attribute="gi_code"), None),
    ("tb_frame-torch", event("object.__getattr__", attribute="tb_frame"), None),
    (
        "code-rebind",
        event(
            "object.__setattr__",
            site=EXP,
            direct=True,
            attribute="__code__",
            target_module="torch.nn",
        ),
        f"object.__setattr__: rebinding of torch.nn.__code__ at {EXP}",
    ),
    (
        "class-delete",
        event(
            "object.__delattr__", site=EXP, direct=True, attribute="__module__", target_module="x.y"
        ),
        "object.__delattr__: deletion of x.y.__module__",
    ),
    (
        "own-class",
        event(
            "object.__setattr__",
            site=EXP,
            direct=True,
            attribute="__code__",
            target_module="tilegym.transformers.qwen3.kernels.rms",
        ),
        None,
    ),
    (
        "prefix-not-owned",
        event(
            "object.__setattr__",
            site=EXP,
            direct=True,
            attribute="__code__",
            target_module="tilegym.ops.x",
        ),
        "object.__setattr__: rebinding of tilegym.ops.x",
    ),
    ("no-experiment", event("object.__setattr__", attribute="__code__", target_module="t"), None),
    (
        "lazy-import-under-experiment",
        event("object.__setattr__", site=EXP, attribute="__bases__", target_module="torch.fx"),
        None,
    ),
    (
        "namedtuple-module",
        event(
            "object.__setattr__",
            site=EXP,
            direct=True,
            attribute="__module__",
            target_module="collections",
            top_file="/py/lib/python3.11/collections/__init__.py",
        ),
        None,
    ),
    (
        "module-hijack",
        event(
            "object.__setattr__",
            site=EXP,
            direct=True,
            attribute="__module__",
            target_module="torch",
        ),
        "object.__setattr__: rebinding of torch.__module__",
    ),
    (
        "compile-as-torch",
        event("compile", direct=True, filename="/v/site-packages/torch/x.py", top_file=EXP),
        "compile: code named after /v/site-packages/torch/x.py",
    ),
    (
        "code-replace-as-torch",
        event("code.__new__", direct=True, filename="/v/torch/x.py", top_file=EXP),
        "code.__new__: code named after /v/torch/x.py",
    ),
    ("compile-string", event("compile", direct=True, filename="<string>"), None),
    ("compile-own", event("compile", direct=True, filename="/r/src/tilegym/a.py"), None),
    (
        "import-compiles",
        event(
            "compile",
            direct=True,
            filename="/v/torch/x.py",
            top_file="<frozen importlib._bootstrap_external>",
        ),
        None,
    ),
    ("compile-torch", event("compile", filename="/v/torch/x.py"), None),
    ("write-scratch", event("open", paths=("/s/scratch/a", "/s/scratch/a")), None),
    ("write-git", event("open", paths=("/r/.git/config",)), "open: write to /r/.git/config"),
    ("write-log", event("os.truncate", paths=("/s/scratch/refusals.log",)), "os.truncate: write"),
    ("rename-out", event("os.rename", paths=("/s/cache/a", "/r/x")), "os.rename: write to /r/x"),
    ("scratch-prefix", event("os.mkdir", paths=("/s/scratchy",)), "os.mkdir: write to /s/scratchy"),
    ("relative", event("open", relative=True), "open: write to a relative path"),
    ("read", event("open"), None),
    ("unwatched", event("builtins.id"), None),
]


@pytest.mark.parametrize("ev, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(ev, expected):
    got = decide(ev, RULES)
    if expected is None:
        assert got is None
    else:
        assert got is not None and got.startswith(expected), got


@pytest.mark.parametrize(
    "name, ok",
    [
        ("gcc", True),
        ("gcc-12", True),
        ("x86_64-linux-gnu-gcc-12", True),
        ("gcc-ar", False),
        ("xgcc", False),
        ("sh", False),
        ("python3", False),
        ("ptxas", True),
    ],
)
def test_matches_tool(name, ok):
    assert matches_tool(name, ("gcc", "ptxas")) is ok


def test_event_rejects_unknown_fact():
    with pytest.raises(TypeError, match="unknown event facts"):
        event("open", path="/x")


@pytest.mark.parametrize(
    ("argv", "ok"),
    [
        (("nvidia-smi", "-i", "0", "--query-gpu=clocks.max.sm", "--format=csv,noheader"), True),
        (("/usr/bin/nvidia-smi", "--id=1", "--query-gpu=name"), True),
        (("nvidia-smi",), False),  # the default report is harmless but nothing here needs it
        (("nvidia-smi", "-i"), False),
        (("nvidia-smi", "-i", "0;x"), False),
        (("nvidia-smi", "--query-gpu="), False),
        (("nvidia-smi", "--query-gpu=name", "-pm", "1"), False),
        (("nvidia-smi", "-r"), False),
        (("nvidia-smi", "--lock-gpu-clocks=210"), False),
        (("gcc", "--format=x"), False),
        ((), False),
    ],
)
def test_read_only_query(argv, ok):
    assert read_only_query(argv) is ok
