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
FAMILY=norms
TT="${TEST_TIMEOUT:-150}"
# shellcheck source=benchmarks/ops/_gpu_check_lib.sh
source "$(dirname "$0")/_gpu_check_lib.sh"

# 1. tests (sharded), inventory parity and cache-warming benchmark workers, all in parallel
shard rms tests/ops/test_rms_norm.py
shard var_rms tests/ops/test_norm_variants.py
shard silu_embedding tests/ops/test_silu_and_mul.py tests/ops/test_embedding.py
shard patches tests/ops/test_parity_check.py tests/transformers/test_patch_models.py
shard framework tests/transformers/test_patch_framework.py
parity "$KS"/qwen3/kernel_solutions/qwen3_{rms_norm,add_rms_norm,silu_and_mul}.json \
    "$KS"/llama/kernel_solutions/llama_{rms_norm,add_rms_norm,silu_and_mul}.json
warm benchmarks/ops/bench_rms_norm.py "${WARM_TIMEOUT:-150}"
finish_step1

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
