#!/usr/bin/env bash
# One GPU run for the cuTile GEMMs: GPU tests, the benchmark table vs cuBLAS, then the GEMMs
# timed call by call inside both patched models' generate() (bench_gemm_in_model.py).
# Compiles are slow (seconds per tile config), so the tests run as parallel pytest shards and
# the benchmark's launches are pre-compiled by parallel warm-up shards, all sharing the cuTile
# disk cache; the timed benchmark then runs alone on the GPU.
# Usage (repo root): bash benchmarks/ops/gpu_check_gemm.sh [--sweep]
# Logs: $OUT/{env,tests,bench,in_model}.txt, $OUT/bench_gemm.json and $OUT/in_model.json
# (default OUT=./gpu_check_out).
set -o pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute: TILEGYM_GEMM_TILES below must name the file from anywhere
PY="${PYTHON:-python3}"
SHARDS="${SHARDS:-6}"
WARM_SHARDS="${WARM_SHARDS:-12}"
SWEEP=()
[ "${1:-}" = "--sweep" ] && SWEEP=(--sweep --iters "${SWEEP_ITERS:-20}")
export CUDA_TILE_CACHE_DIR="${CUDA_TILE_CACHE_DIR:-/tmp/tilegym-cutile-cache}"
tmp=$(mktemp -d)
status=0

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv 2>&1 | tee "$OUT/env.txt"
"$PY" -c "import torch, cuda.tile as ct; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cuda-tile', ct.__version__)" 2>&1 | tee -a "$OUT/env.txt"

"$PY" -m pytest --collect-only -q -p no:cacheprovider tests/ops/test_gemm.py 2>/dev/null \
    | grep '::' > "$tmp/ids" || { echo "error: test collection failed"; exit 1; }
split -n "r/$SHARDS" "$tmp/ids" "$tmp/shard_"
pids=()
for f in "$tmp"/shard_*; do
    # shellcheck disable=SC2046  # one test id per word
    timeout "${TEST_TIMEOUT:-200}" "$PY" -m pytest -q -rs -p no:cacheprovider $(cat "$f") \
        > "$f.log" 2>&1 &
    pids+=($!)
done
for i in $(seq 0 $((WARM_SHARDS - 1))); do
    timeout "${WARMUP_TIMEOUT:-200}" "$PY" benchmarks/ops/bench_gemm.py "${SWEEP[@]}" \
        --warmup-shard "$i/$WARM_SHARDS" > "$tmp/warm_$i.log" 2>&1 &
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
wait
for f in "$tmp"/shard_*.log; do echo "== $(basename "$f")"; cat "$f"; done > "$OUT/tests.txt"
cat "$tmp"/warm_*.log >> "$OUT/tests.txt"
echo "tests + compile warm-up: ${SECONDS}s" | tee -a "$OUT/env.txt"
grep -hE "passed|failed|error" "$tmp"/shard_*.log | tee -a "$OUT/env.txt"
grep -hE "^(FAILED|ERROR)" "$tmp"/shard_*.log | head -40

timeout "${BENCH_TIMEOUT:-150}" "$PY" benchmarks/ops/bench_gemm.py "${SWEEP[@]}" \
    --json-out "$OUT/bench_gemm.json" --tuned-out "$OUT/tuned.json" 2>&1 \
    | tee "$OUT/bench.txt" || status=1

if [ ${#SWEEP[@]} -gt 0 ] && [ -s "$OUT/tuned.json" ]; then
    # Verify the sweep's table: the model-shape tests and the table benchmark with it loaded.
    export TILEGYM_GEMM_TILES="$OUT/tuned.json"
    echo "== with the swept tile table: tests" | tee -a "$OUT/tests.txt"
    grep "test_model_projection" "$tmp/ids" > "$tmp/ids2"
    split -n "r/$SHARDS" "$tmp/ids2" "$tmp/t2_"
    pids=()
    for f in "$tmp"/t2_*; do
        # shellcheck disable=SC2046  # one test id per word
        timeout "${TEST2_TIMEOUT:-60}" "$PY" -m pytest -q -p no:cacheprovider $(cat "$f") \
            > "$f.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || status=1; done
    cat "$tmp"/t2_*.log >> "$OUT/tests.txt"
    grep -hE "passed|failed|error" "$tmp"/t2_*.log | tee -a "$OUT/env.txt"
    grep -hE "^(FAILED|ERROR)" "$tmp"/t2_*.log | head -20
    echo "== with the swept tile table: benchmark" | tee -a "$OUT/bench.txt"
    timeout "${BENCH2_TIMEOUT:-60}" "$PY" benchmarks/ops/bench_gemm.py \
        --json-out "$OUT/bench_gemm_table.json" 2>&1 | tee -a "$OUT/bench.txt" || status=1
fi
timeout "${IN_MODEL_TIMEOUT:-300}" "$PY" benchmarks/ops/bench_gemm_in_model.py \
    --json-out "$OUT/in_model.json" 2>&1 | tee "$OUT/in_model.txt" || status=1
echo "total: ${SECONDS}s" | tee -a "$OUT/env.txt"
rm -rf "$tmp"
exit $status
