#!/usr/bin/env bash
# One GPU run for the RMSNorm / add+RMSNorm, SiLU-and-mul and embedding kernels and the
# qwen3/llama model patches: their GPU tests (every RMSNorm variant against fp32), inventory
# parity, then the benchmark tables (all RMSNorm variants interleaved per shape, against torch).
# RoPE and q/k-norm+RoPE have their own script, gpu_check_rope.sh.
#
# Usage (repo root, on a GPU host with the cuTile toolchain):
#   bash benchmarks/ops/gpu_check_norms.sh                      (< 4 min with a warm cache)
# Env: WARM (benchmark warm-up workers, 5), TEST_TIMEOUT (150 s per test process),
# WARM_TIMEOUT (150 s), RMS_TIMEOUT and SILU_TIMEOUT (90 s per timed table).
# Outputs in $OUT (default ./gpu_check_out): norms_env.txt, norms_summary.txt, norms_tests_*.txt
# (one per pytest shard), norms_warm_*.txt (empty when the warm-up went well), norms_bench.txt,
# and cutile-cache.tar.gz (the kernel cache).
# Cold compiles dominate, so step 1 runs the pytest shards and WARM "--warm I/N" benchmark
# workers in parallel; they fill cuTile's disk cache (build/cutile-cache: carry it to a later run
# to skip the recompiles) for the timed run.
set -o pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT" build/cutile-cache
export CUDA_TILE_CACHE_DIR="$PWD/build/cutile-cache"
export PYTHONPATH="$PWD/src:$PWD/modeling/transformers/src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
WARM="${WARM:-5}"
TT="${TEST_TIMEOUT:-150}"
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv 2>&1 | tee "$OUT/norms_env.txt"
"$PY" -c "import torch, transformers, cuda.tile as ct; print(torch.__version__, transformers.__version__, ct.__version__)" 2>&1 | tee -a "$OUT/norms_env.txt"
git log -1 --format='commit %h %s' 2>/dev/null | tee -a "$OUT/norms_env.txt"
start=$(date +%s)

# 1. tests (sharded), inventory parity and cache-warming benchmark workers, all in parallel
pids=()
shard() {  # name, then pytest arguments
    local name=$1
    shift
    timeout "$TT" "$PY" -m pytest -q -rA -p no:cacheprovider "$@" >"$OUT/norms_tests_$name.txt" 2>&1 &
    pids+=($!)
}
shard rms tests/ops/test_rms_norm.py
shard var_rms tests/ops/test_norm_variants.py
shard silu_embedding tests/ops/test_silu_and_mul.py tests/ops/test_embedding.py
shard patches tests/ops/test_parity_check.py tests/transformers/test_patch_models.py
shard framework tests/transformers/test_patch_framework.py
# inventory runtime parity of this family's Solutions (entry points, sampled shapes)
KS=src/tilegym/transformers
SOL=("$KS"/qwen3/kernel_solutions/qwen3_{rms_norm,add_rms_norm,silu_and_mul}.json
     "$KS"/llama/kernel_solutions/llama_{rms_norm,add_rms_norm,silu_and_mul}.json)
{ timeout "$TT" "$PY" -m tilegym.kernel_inventory.cli parity "${SOL[@]}" \
    && echo "inventory parity: ok"; } >"$OUT/norms_tests_inventory.txt" 2>&1 &
pids+=($!)
for ((i = 0; i < WARM; i++)); do
    timeout "${WARM_TIMEOUT:-150}" "$PY" benchmarks/ops/bench_rms_norm.py --warm "$i/$WARM" \
        >"$OUT/norms_warm_$i.txt" 2>&1 &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
echo "step 1 (tests + warm) took $(($(date +%s) - start)) s, status $status" | tee "$OUT/norms_summary.txt"
for f in "$OUT"/norms_tests_*.txt; do
    echo "== $f: $(tail -n 1 "$f")" | tee -a "$OUT/norms_summary.txt"
    grep -E "^(FAILED|ERROR)" "$f" | head -20 | tee -a "$OUT/norms_summary.txt"
done
for f in "$OUT"/norms_warm_*.txt; do
    [ -s "$f" ] && { echo "== $f (should be empty)"; tail -n 5 "$f"; } | tee -a "$OUT/norms_summary.txt"
done

# 2. timed benchmarks, one at a time (GPU to themselves)
: >"$OUT/norms_bench.txt"
bench() {  # script name, time cap
    echo "== $1" | tee -a "$OUT/norms_bench.txt"
    timeout "$2" "$PY" "benchmarks/ops/$1.py" 2>&1 | tee -a "$OUT/norms_bench.txt" || status=1
}
bench bench_rms_norm "${RMS_TIMEOUT:-90}"
bench bench_silu_and_mul "${SILU_TIMEOUT:-90}"
tar -czf "$OUT/cutile-cache.tar.gz" -C build cutile-cache 2>/dev/null
echo "total $(($(date +%s) - start)) s, status $status" | tee -a "$OUT/norms_summary.txt"
exit $status
