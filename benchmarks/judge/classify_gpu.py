"""The classification attacks on a real GPU profile: which kernels count as cuTile, by the rule
before this change (any name cuTile's demangler accepts, or any name starting with a listed
prefix) and by the one rule now (a ``@ct.kernel`` function of the measured tree; a prefix only
as that function's name or its mangling).

    python benchmarks/judge/classify_gpu.py [--json-out FILE]

Profiles, with torch.profiler: a Triton kernel named ``fused_rmsnorm_Kt2`` (a cuTile-looking
name), a real cuTile kernel of this tree (RMSNorm), and ATen elementwise kernels. Then classifies
every kernel name with the old and the new rule, with the prefix list empty and with the widening
pair "a kernel called ``void`` plus the prefix ``void``". Prints one table; needs a CUDA GPU,
Triton and cuTile.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from cuda.tile.compilation import demangle_kernel_name
from tilegym_hf_bench.profiling.classify import KernelClassifier
from tilegym_hf_bench.profiling.cutile_names import scan_kernel_names

ROOT = Path(__file__).resolve().parents[2]


@triton.jit
def fused_rmsnorm_Kt2(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * 2.0, mask=mask)


def old_rule(prefixes: tuple[str, ...]):
    """The classifier before this change: the demangler alone, or a plain prefix match."""

    def is_cutile(name: str) -> bool:
        try:
            demangle_kernel_name(name)
            return True
        except Exception:
            return name.startswith(prefixes)

    return is_cutile


def profiled_kernels() -> list[str]:
    from tilegym.ops.rms_norm import rms_norm

    x = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    flat, out = x.view(-1), y.view(-1)

    def work():
        fused_rmsnorm_Kt2[(triton.cdiv(flat.numel(), 1024),)](flat, out, flat.numel(), BLOCK=1024)
        rms_norm(x, w, 1e-6)
        (x * 2 + 1).sum()

    work()  # compile outside the profile
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        work()
        torch.cuda.synchronize()
    return sorted(
        {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json-out")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 1
    names = scan_kernel_names(ROOT / "src" / "tilegym")
    kernels = profiled_kernels()
    rules = {
        "old": old_rule(()),
        "new": KernelClassifier(names).is_cutile,
        "old+void": old_rule(("void",)),
        "new+void": KernelClassifier(names | {"void"}, ["void"]).is_cutile,
    }
    rows = [{"kernel": k, **{r: bool(rule(k)) for r, rule in rules.items()}} for k in kernels]
    print(f"{torch.cuda.get_device_name()}; {len(names)} @ct.kernel functions in src/tilegym")
    header = f"| {'kernel (profiled name)':<70} | " + " | ".join(f"{r:>8}" for r in rules) + " |"
    print(header)
    print("|" + "-" * 72 + "|" + "|".join("-" * 10 for _ in rules) + "|")
    for row in rows:
        marks = " | ".join(f"{'cuTile' if row[r] else '-':>8}" for r in rules)
        print(f"| {row['kernel'][:70]:<70} | {marks} |")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"kernels": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
