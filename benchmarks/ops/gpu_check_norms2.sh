#!/usr/bin/env bash
# GPU check for the RMSNorm / RoPE / qk-norm+RoPE kernel variants (helper/norms): GPU tests of
# every variant + the model patches, then the benchmark tables with all variants interleaved.
# Usage (repo root): OUT=gpu_check_out bash benchmarks/ops/gpu_check_norms2.sh   (< 4 min)
# Outputs in $OUT: env.txt, tests_*.txt (one per pytest shard), warm_*.txt, bench.txt.
# Cold compiles dominate, so step 1 runs the pytest shards and WARM "--warm I/N" benchmark
# workers in parallel (they fill cuTile's disk cache, build/cutile-cache, for the timed run).
set -o pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT" build/cutile-cache
export CUDA_TILE_CACHE_DIR="$PWD/build/cutile-cache"
export PYTHONPATH="$PWD/src:$PWD/modeling/transformers/src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
WARM="${WARM:-5}"
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv 2>&1 | tee "$OUT/env.txt"
"$PY" -c "import torch, transformers, cuda.tile as ct; print(torch.__version__, transformers.__version__, ct.__version__)" 2>&1 | tee -a "$OUT/env.txt"
start=$(date +%s)

# 1. tests (sharded) and cache-warming benchmark workers, all in parallel
pids=()
shard() {  # name, then pytest arguments
    local name=$1
    shift
    timeout "${TEST_TIMEOUT:-150}" "$PY" -m pytest -q -rA -p no:cacheprovider "$@" \
        >"$OUT/tests_$name.txt" 2>&1 &
    pids+=($!)
}
V=tests/ops/test_norm_variants.py
shard rms tests/ops/test_rms_norm.py
shard rope tests/ops/test_rope.py
shard var_rms "$V" -k test_rms_variants
shard var_rope tests/ops/test_rope_variants.py -k test_rope_variants
shard var_qk tests/ops/test_rope_variants.py -k test_qk_norm_rope_variants
shard patches tests/ops/test_parity_check.py tests/transformers/test_patch_models.py
# inventory runtime parity of the Solutions whose kernels changed (entry points, sampled shapes)
KS=src/tilegym/transformers
SOL=($KS/qwen3/kernel_solutions/qwen3_{rms_norm,add_rms_norm,qk_norm_rope}.json
     $KS/llama/kernel_solutions/llama_{rms_norm,add_rms_norm,rope}.json)
{ timeout "${TEST_TIMEOUT:-150}" "$PY" -m tilegym.kernel_inventory.cli parity "${SOL[@]}" \
    && echo "inventory parity: ok"; } >"$OUT/tests_inventory.txt" 2>&1 &
pids+=($!)
for ((i = 0; i < WARM; i++)); do
    for b in bench_rms_norm bench_rope; do
        timeout "${WARM_TIMEOUT:-150}" "$PY" "benchmarks/ops/$b.py" --warm "$i/$WARM" \
            >"$OUT/warm_${b}_$i.txt" 2>&1 &
        pids+=($!)
    done
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
echo "step 1 (tests + warm) took $(($(date +%s) - start)) s, status $status" | tee "$OUT/summary.txt"
for f in "$OUT"/tests_*.txt; do
    echo "== $f: $(tail -n 1 "$f")" | tee -a "$OUT/summary.txt"
    grep -E "^(FAILED|ERROR)" "$f" | head -20 | tee -a "$OUT/summary.txt"
done
for f in "$OUT"/warm_*.txt; do
    [ -s "$f" ] && { echo "== $f (should be empty)"; tail -n 5 "$f"; } | tee -a "$OUT/summary.txt"
done

# 2. timed benchmarks, one at a time (GPU to themselves)
for b in bench_rms_norm bench_rope; do
    echo "== $b" | tee -a "$OUT/bench.txt"
    timeout "${BENCH_TIMEOUT:-60}" "$PY" "benchmarks/ops/$b.py" 2>&1 | tee -a "$OUT/bench.txt" \
        || status=1
done
echo "total $(($(date +%s) - start)) s, status $status" | tee -a "$OUT/summary.txt"
exit $status
