#!/usr/bin/env bash
# One GPU run for RoPE in the norm + QKV GEMV's epilogue (`rope_gemv`, `rms_norm_linear_rope`):
# its GPU tests (with the static-cache write and a captured graph's counters) and the two-weight
# norm GEMV's (they share the K loop), llama's inventory parity, the QKV projection streamed
# over one weight a layer with the fused kernel against the norm GEMV then the RoPE kernel it
# replaces (bench_gemv_stream.py's probes), then each model's static generate() in one process:
# PyTorch, cuTile as shipped, with norm_gemv 1, with rope_gemv 1 and with rope_gemv 2 (GPU ms a
# token is the comparison; the variants go over the shipped flags, and llama ships norm_gemv 1
# and rope_gemv 1, so its first three cuTile sides are the same and show the noise).
# Usage (repo root): bash benchmarks/ops/gpu_check_rope_gemv.sh [MODEL...]   (default: llama;
# qwen3 runs its per-head q/k norms in the kernel too; olmo2 and olmo3, post-norm, their
# whole-projection q/k norms without an input norm, and their sides are rope_gemv 2, then
# norm_gemv 2 with it: the post-attention norm and add in the gate/up GEMV, whose GPU tests
# run too)
# Logs: $OUT/{env,tests,stream,e2e}.txt (default OUT=./gpu_check_out). Then, for the keeps:
#   LOOP_ROUNDS="baseline rope-gemv kv-gemv" bash benchmarks/loop/speed_loop.sh OUT qwen3 \
#     --mode static
set -o pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT" build/cutile-cache
OUT=$(cd "$OUT" && pwd)
export CUDA_TILE_CACHE_DIR="$PWD/build/cutile-cache"
export PYTHONPATH="$PWD/src:$PWD/modeling/transformers/src:$PWD/tests/ops${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
models=("${@:-llama}")
status=0
#: the GPU tests: the fused kernel's, the norm gate/up GEMV's (shared K loop), llama's Solution
TESTS="norm_rope or head_norms or bad_shapes or rms_norm_linear_rope or linear_qk_norm_rope or norm_gate_up or cache_write or captured_graph or whole or add_norm or post_norm_add"

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv 2>&1 | tee "$OUT/env.txt"

timeout "${TEST_TIMEOUT:-200}" "$PY" -m pytest -q -rA -p no:cacheprovider \
    tests/ops/test_rms_norm_linear_rope.py tests/ops/test_rms_norm_linear.py \
    tests/ops/test_add_norm_gate_up.py \
    tests/transformers/test_kernel_inventory.py \
    -m gpu -k "$TESTS" > "$OUT/tests.txt" 2>&1 || status=1
grep -E "passed|failed" "$OUT/tests.txt" | tail -1 | tee -a "$OUT/env.txt"
grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | head -20

joined=$(IFS=,; echo "${models[*]}")
timeout "${STREAM_TIMEOUT:-150}" "$PY" benchmarks/ops/bench_gemv_stream.py --models "$joined" \
    --projs qkv --candidates gemv 2>&1 | tee "$OUT/stream.txt" || status=1

for model in "${models[@]}"; do
    sides=(--variant norm_gemv=1 --variant norm_gemv=1,rope_gemv=1 --variant norm_gemv=1,rope_gemv=2)
    case "$model" in
        olmo2 | olmo3) sides=(--variant rope_gemv=2 --variant norm_gemv=2,rope_gemv=2) ;;
    esac
    timeout "${E2E_TIMEOUT:-240}" "$PY" benchmarks/e2e/static_generate.py --models "$model" \
        --workloads default --runs "${RUNS:-3}" "${sides[@]}" \
        > "$OUT/e2e_$model.txt" 2>&1 || status=1
    grep "^|" "$OUT/e2e_$model.txt" | tail -3
done
echo "total: ${SECONDS}s" | tee -a "$OUT/env.txt"
exit $status
