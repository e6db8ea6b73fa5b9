#!/usr/bin/env bash
# One GPU run for the RoPE and q/k-norm+RoPE kernels (every variant) and their "auto" dispatch:
# GPU tests of every variant + the AOT signatures + the model patches, inventory parity, then
# the benchmark tables (all variants interleaved per shape, with torch and a dst.copy_(src)
# ceiling row).
#
# Usage (repo root, on a GPU host with the cuTile toolchain):
#   bash benchmarks/ops/gpu_check_rope.sh                       (< 4 min)
# Env: WARM (benchmark warm-up workers, 5), SHARDS (variant test shards, 5), TEST_TIMEOUT,
# BENCH_TIMEOUT, QK_WHOLE_TIMEOUT (bench_qk_norm_rope.py, cold compiles included: 300),
# WRITE_FLUSH=0 (skip the write-flush table).
# Outputs in $OUT (default ./gpu_check_out): rope_env.txt, rope_summary.txt, rope_tests_*.txt
# (one per pytest shard), rope_warm_*.txt (empty when the warm-up went well), rope_bench.txt
# (write flush), rope_bench_qk_whole.txt (OLMo's whole-projection q/k norm + RoPE, write flush)
# and rope_bench_read.txt (read flush).
# Cold compiles dominate, so step 1 runs the pytest shards and WARM "--warm I/N" benchmark
# workers in parallel (they fill cuTile's disk cache, build/cutile-cache, for the timed run).
FAMILY=rope
TT="${TEST_TIMEOUT:-140}"
# shellcheck source=benchmarks/ops/_gpu_check_lib.sh
source "$(dirname "$0")/_gpu_check_lib.sh"

# 1. tests (sharded) and cache-warming benchmark workers, all in parallel
shard rope tests/ops/test_rope.py tests/ops/test_rope_aot.py
TT=420 shard qk_whole tests/ops/test_qk_norm_whole_rope.py  # ~60 cold compiles
shard patches tests/transformers/test_patch_models.py
SHARDS="${SHARDS:-5}"
for ((i = 0; i < SHARDS; i++)); do  # every RoPE / qk variant, disjoint shards (_shard in the test file)
    ROPE_VARIANT_SHARD="$i/$SHARDS" timeout "$TT" "$PY" -m pytest -q -rA -p no:cacheprovider \
        tests/ops/test_rope_variants.py >"$OUT/rope_tests_variants_$i.txt" 2>&1 &
    pids+=($!)
done
parity "$KS/qwen3/kernel_solutions/qwen3_qk_norm_rope.json" "$KS/llama/kernel_solutions/llama_rope.json" \
    "$KS"/olmo*/kernel_solutions/olmo*_qk_norm_whole_rope.json
warm benchmarks/ops/bench_rope.py "$TT"
finish_step1

# 2. timed benchmarks, one at a time (GPU to themselves); rows print as they finish. First with
# the default write flush (comparable with the earlier tables), then the prefill shapes again
# with TILEGYM_BENCH_FLUSH=read (clean L2: no write-back of the flush's dirty lines inside the
# timed call, see benchmarks/ops/bench_flush.py)
if [ "${WRITE_FLUSH:-1}" = 1 ]; then
    timeout "${BENCH_TIMEOUT:-60}" "$PY" benchmarks/ops/bench_rope.py 2>&1 | tee "$OUT/rope_bench.txt" \
        || status=1
fi
timeout "${QK_WHOLE_TIMEOUT:-300}" "$PY" benchmarks/ops/bench_qk_norm_rope.py 2>&1 \
    | tee "$OUT/rope_bench_qk_whole.txt" || status=1
export TILEGYM_BENCH_FLUSH=read
echo "== TILEGYM_BENCH_FLUSH=read" | tee "$OUT/rope_bench_read.txt"
timeout "${BENCH_TIMEOUT:-60}" "$PY" benchmarks/ops/bench_rope.py --shapes 1x2048,4x4096,8x4096 \
    2>&1 | tee -a "$OUT/rope_bench_read.txt" || status=1
echo "total $(($(date +%s) - start)) s, status $status" | tee -a "$OUT/rope_summary.txt"
exit $status
