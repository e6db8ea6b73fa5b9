#!/usr/bin/env bash
# One GPU run for the one-row GEMVs: their GPU tests (the plain and gate/up GEMV kernels, the
# occupancy-hinted tiles, PDL), then each model's decode projections streamed over one weight a
# layer in a CUDA graph (bench_gemv_stream.py: every GEMV tile and the table's choice against
# cuBLAS, the winners beyond the replays' spread written as a whole tile table), then, where
# that table differs from the shipped one, static generate() of each model with the shipped
# table and with the new one (two processes: GPU ms per generated token is the comparison;
# tok/s moves with the host between processes).
# Usage (repo root): bash benchmarks/ops/gpu_check_gemv.sh [MODEL...]   (default: olmo3)
# Logs: $OUT/{env,tests,stream}.txt, $OUT/stream.json, $OUT/tiles.json,
# $OUT/e2e_<model>_{shipped,tuned}.txt (default OUT=./gpu_check_out).
set -o pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT" build/cutile-cache
OUT=$(cd "$OUT" && pwd)  # absolute: TILEGYM_GEMM_TILES below must name the file from anywhere
export CUDA_TILE_CACHE_DIR="$PWD/build/cutile-cache"
export PYTHONPATH="$PWD/src:$PWD/modeling/transformers/src:$PWD/tests/ops${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
models=("${@:-olmo3}")
status=0

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv 2>&1 | tee "$OUT/env.txt"

timeout "${TEST_TIMEOUT:-150}" "$PY" -m pytest -q -rA -p no:cacheprovider tests/ops/test_gemm.py \
    -m gpu -k gemv > "$OUT/tests.txt" 2>&1 || status=1
grep -E "passed|failed" "$OUT/tests.txt" | tail -1 | tee -a "$OUT/env.txt"
grep -E "^(FAILED|ERROR)" "$OUT/tests.txt" | head -20

joined=$(IFS=,; echo "${models[*]}")
timeout "${STREAM_TIMEOUT:-240}" "$PY" benchmarks/ops/bench_gemv_stream.py --models "$joined" \
    --candidates gemv --json-out "$OUT/stream.json" --tuned-out "$OUT/tiles.json" \
    2>&1 | tee "$OUT/stream.txt" || status=1

if [ -s "$OUT/tiles.json" ] && ! cmp -s "$OUT/tiles.json" src/tilegym/ops/gemm_tiles.json; then
    diff src/tilegym/ops/gemm_tiles.json "$OUT/tiles.json" | tee -a "$OUT/env.txt"
    for model in "${models[@]}"; do
        for side in shipped tuned; do
            tiles=()
            [ "$side" = tuned ] && tiles=(env TILEGYM_GEMM_TILES="$OUT/tiles.json")
            timeout "${E2E_TIMEOUT:-150}" "${tiles[@]}" "$PY" benchmarks/e2e/static_generate.py \
                --models "$model" --workloads default --runs "${RUNS:-5}" \
                > "$OUT/e2e_${model}_$side.txt" 2>&1 || status=1
            echo "== $model, $side table"
            grep "^|" "$OUT/e2e_${model}_$side.txt" | tail -2
        done
    done
else
    echo "no tile beat the table's beyond the spread: no end-to-end run" | tee -a "$OUT/env.txt"
fi
echo "total: ${SECONDS}s" | tee -a "$OUT/env.txt"
exit $status
