"""What a kernel compiles to for the signature its module declares and for that signature's
aligned twin (the form a model's 16-byte aligned tensors get, which the AOT gate adds), on
sm_90: registers, shared memory and spills a thread, as the toolchain's ptxas reports them.

For each module's default ``aot_signatures()``, each kernel's first declared signature that
has a twin. Runs on a CPU (no GPU needed); prints a markdown table.

    python benchmarks/ops/aot_forms.py
    python benchmarks/ops/aot_forms.py --modules attention rms_norm
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/ops"))
from cubin_ptx import ptx_lines, ptxas_usage  # noqa: E402

from tilegym.kernel_inventory.aligned import aligned_twin  # noqa: E402

#: modules whose default ``aot_signatures()`` takes no arguments and declares a twin-less form
MODULES = (
    "attention",
    "attention_sinks",
    "mla",
    "rms_norm",
    "rope",
    "qk_norm_whole_rope",
    "silu_and_mul",
    "sigmoid_gate",
    "causal_conv1d",
    "rotary_tables",
    "kv_cache",
)


def usage_cells(kernel, signature) -> str:
    usage = ptxas_usage(ptx_lines(kernel, signature))
    return (
        f"{usage.registers} | {usage.shared / 1024:.1f} | "
        f"{usage.spill_stores} / {usage.spill_loads}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", nargs="*", default=list(MODULES))
    args = parser.parse_args(argv)
    print(
        "| module | kernel | declared: registers | shared KB | spills st / ld (B) "
        "| twin: registers | shared KB | spills st / ld (B) |"
    )
    print("|---|---|--:|--:|--:|--:|--:|--:|")
    for name in args.modules:
        module = importlib.import_module(f"tilegym.ops.{name}")
        for kernel, signatures in module.aot_signatures().items():
            signature = next((s for s in signatures if aligned_twin(s) is not s), None)
            if signature is None:
                continue
            declared = usage_cells(kernel, signature)
            twin = usage_cells(kernel, aligned_twin(signature))
            print(f"| {name} | `{kernel._pyfunc.__name__}` | {declared} | {twin} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
