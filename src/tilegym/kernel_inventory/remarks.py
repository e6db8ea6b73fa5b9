"""Compiler remarks of a kernel's build: which ``ct.mma`` became tensor-core instructions.

An ``mma`` the compiler cannot map to tensor cores still compiles, into scalar FMAs: the MoE
gate-up GEMM ran that way at 7% of the copy bandwidth until its SASS was read on a GPU host.
tileiras reports the lowering of each operation (``--remarks``); ``kernel_remarks`` exports a
kernel's TileIR bytecode for one signature, runs tileiras on it for an architecture and parses
the remarks, so a test catches a scalar ``mma`` on a machine without a GPU.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TIMEOUT_S = 600.0
"""One tileiras run (the slowest kernels here take about 150 s on a quiet 2-core machine)."""

_CATEGORY = re.compile(r"^\s*category:\s*(?P<category>.+?)\s*$")
_REMARK = re.compile(r"^\s*remark\[(?P<status>\w+)\]:\s*(?P<message>.*?)\s*$")
_LOCATION = re.compile(r"^\s*-->\s*(?P<location>.+?)\s*$")
_FIELD = re.compile(r"^\s*=\s*(?:note:\s*)?(?P<key>[\w ]+?)\s*[=:]\s*(?P<value>.+?)\s*$")


@dataclass(frozen=True)
class Remark:
    """One tileiras remark: ``status`` is ``passed``, ``failed``, ``missed`` or ``analysis``."""

    category: str
    status: str
    message: str
    location: str = ""
    name: str = ""
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def instruction(self) -> str:
        return self.notes.get("Instruction", "")


def parse_remarks(text: str) -> list[Remark]:
    """The remarks in tileiras' command-line remark output, in order."""
    remarks: list[Remark] = []
    category = ""
    current: dict[str, Any] | None = None

    def flush() -> None:
        if current is not None:
            remarks.append(Remark(**current))

    for line in text.splitlines():
        if m := _CATEGORY.match(line):
            flush()
            current, category = None, m["category"]
        elif m := _REMARK.match(line):
            flush()
            current = dict(category=category, status=m["status"], message=m["message"], notes={})
        elif current is None:
            continue
        elif m := _LOCATION.match(line):
            current["location"] = m["location"]
        elif m := _FIELD.match(line):
            if m["key"] == "name":
                current["name"] = m["value"]
            else:
                current["notes"][m["key"]] = m["value"]
    flush()
    return remarks


def scalar_mmas(remarks: list[Remark]) -> list[Remark]:
    """The ``mma`` operations that did not become tensor-core instructions."""
    return [r for r in remarks if r.category == "Tensor-core" and r.status != "passed"]


def tileiras_path() -> str:
    from cuda.tile._compile import _find_compiler_bin

    return _find_compiler_bin().path


def kernel_remarks(
    kernel: Any, signature: Any, gpu_code: str = "sm_90", category: str = "tensorcore"
) -> list[Remark]:
    """Build ``kernel`` for one ``KernelSignature`` and ``gpu_code`` and return tileiras'
    ``category`` remarks. Raises ``RuntimeError`` with tileiras' message if the build fails."""
    from cuda.tile.compilation import export_kernel

    with tempfile.TemporaryDirectory(prefix="tilegym-remarks-") as tmp:
        bytecode = Path(tmp) / "kernel.tileir"
        export_kernel(kernel, [signature], bytecode, output_format="tileir_bytecode")
        run = subprocess.run(
            [
                tileiras_path(),
                f"--gpu-name={gpu_code}",
                f"--remarks={category}",
                "-o",
                str(Path(tmp) / "kernel.cubin"),
                str(bytecode),
            ],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    if run.returncode:
        message = (run.stderr or run.stdout).strip().splitlines()
        raise RuntimeError(f"tileiras exited {run.returncode}: {message[0] if message else ''}")
    return parse_remarks(run.stdout + run.stderr)
