"""Repository paths the guards know about (DESIGN.md, "Layout")."""

from __future__ import annotations

TRANSFORMERS_DIR = "src/tilegym/transformers"
MONKEY_PATCH = f"{TRANSFORMERS_DIR}/monkey_patch.py"
HF_BENCH_DIR = "modeling/transformers/src/tilegym_hf_bench"
TILEGYM_PATCH = f"{HF_BENCH_DIR}/tilegym_patch.py"
PREFIXES_YAML = f"{HF_BENCH_DIR}/kernel_filters/tilegym_kernel_prefixes.yaml"
BENCH_SCRIPT = "modeling/transformers/scripts/benchmark_hf_model.sh"
KERNEL_SOURCE_ROOT = "src/tilegym"
SHARED_ENTRY_DIR = "src/tilegym/ops/entry"  # entry points every family's Solutions may name
SANDBOX_DIR = "sandbox"
SANDBOX_KEPT = frozenset({"sandbox/README.md", "sandbox/.gitignore"})

# Files larger than this are not parsed: a guard reports them instead of spending minutes on them.
MAX_PARSED_BYTES = 2 * 1024 * 1024
