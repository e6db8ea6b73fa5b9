#!/usr/bin/env bash
# GPU check of the attention / KV-cache kernels: tests, then the benchmark table, logs in $OUT.
#
#   source .gpu/activate.sh && bash benchmarks/ops/gpu_check_attention.sh [--sweep]
#
# The test files run as parallel pytest processes (one GPU is plenty) so their cuTile JIT
# compiles overlap; a benchmark warm-up compiles its variants meanwhile. Compiled kernels land
# in cuTile's disk cache, so the timed benchmark afterwards compiles nothing.
set -o pipefail
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BENCH_ARGS=("$@")

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import torch, transformers, cuda.tile as ct; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "cuda-tile", ct.__version__)'
} 2>&1 | tee "$OUT/attention_status.txt"

t0=$(date +%s)
run_tests() {  # name, pytest args...
  local name=$1; shift
  timeout "${TEST_TIMEOUT:-170}" $PY -m pytest -q -rfEs -p no:cacheprovider -W ignore::FutureWarning "$@" \
    >"$OUT/attention_tests_$name.txt" 2>&1
  echo "$name exit $?" >>"$OUT/attention_status.txt"
}
run_tests prefill tests/ops/test_attention.py -k "prefill or reference or plan" &
run_tests decode tests/ops/test_attention.py tests/ops/test_kv_cache.py -k "decode or kv_cache or grown or growth or append" &
run_tests model tests/transformers/test_attention_model.py -s &
timeout "${TEST_TIMEOUT:-170}" $PY benchmarks/ops/bench_attention.py --warm-only "${BENCH_ARGS[@]}" \
  >"$OUT/attention_bench_warm.txt" 2>&1 &
(
  timeout "${TEST_TIMEOUT:-170}" $PY -c 'import sys; from tilegym.kernel_inventory.cli import main; sys.exit(main(sys.argv[1:]))' \
    parity --repo-root . src/tilegym/transformers/{qwen3,llama}/kernel_solutions/*_{attention,kv_cache}*.json \
    >"$OUT/attention_parity.txt" 2>&1
  echo "inventory parity exit $?" >>"$OUT/attention_status.txt"
) &
wait
echo "tests + warm-up took $(( $(date +%s) - t0 )) s" | tee -a "$OUT/attention_status.txt"
for f in "$OUT"/attention_tests_*.txt; do
  echo "== $f"; tail -n 25 "$f"
done

timeout "${BENCH_TIMEOUT:-120}" $PY benchmarks/ops/bench_attention.py --json "$OUT/attention_bench.json" \
  "${BENCH_ARGS[@]}" 2>&1 | tee "$OUT/attention_bench.txt"
echo "bench exit $?" | tee -a "$OUT/attention_status.txt"
! grep -qv " exit 0$\|took" "$OUT/attention_status.txt"
