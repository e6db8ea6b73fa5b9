#!/usr/bin/env bash
# One GPU run for the norm/RoPE/activation kernels and the qwen3/llama patches: their GPU tests
# and the benchmark tables, logs in $OUT (default ./gpu_check_out).
# Usage (repo root): bash benchmarks/ops/gpu_check_norms.sh
# Time caps per part (seconds): RMS_TIMEOUT, TEST_TIMEOUT, ROPE_TIMEOUT, SILU_TIMEOUT.
# cuTile's on-disk kernel cache lives in build/cutile-cache (carry it to skip recompiles); the
# run leaves a copy in $OUT/cutile-cache.tar.gz.
set -o pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT" build/cutile-cache
export CUDA_TILE_CACHE_DIR="$PWD/build/cutile-cache"
PY="${PYTHON:-python3}"
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv 2>&1 | tee "$OUT/env.txt"
"$PY" -c "import torch, transformers, cuda.tile as ct; print(torch.__version__, transformers.__version__, ct.__version__)" 2>&1 | tee -a "$OUT/env.txt"

bench() {
    echo "== $1" | tee -a "$OUT/bench.txt"
    timeout "$2" "$PY" "benchmarks/ops/$1.py" 2>&1 | tee -a "$OUT/bench.txt" || status=1
}

TESTS=(tests/ops/test_parity_check.py tests/ops/test_rms_norm.py tests/ops/test_rope.py
       tests/ops/test_silu_and_mul.py tests/ops/test_embedding.py)
for t in tests/transformers/test_patch_*.py; do [ -f "$t" ] && TESTS+=("$t"); done

timeout "${TEST_TIMEOUT:-600}" "$PY" -m pytest -q -rA -p no:cacheprovider "${TESTS[@]}" 2>&1 \
    | tee "$OUT/tests.txt" || status=1
bench bench_rms_norm "${RMS_TIMEOUT:-90}"
bench bench_rope "${ROPE_TIMEOUT:-90}"
bench bench_silu_and_mul "${SILU_TIMEOUT:-90}"
tar -czf "$OUT/cutile-cache.tar.gz" -C build cutile-cache 2>/dev/null
exit $status
