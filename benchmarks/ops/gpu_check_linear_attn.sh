#!/usr/bin/env bash
# One GPU run for Qwen3.5's linear-attention kernels (gated delta rule prefill/decode, causal
# conv1d with its state, gated RMSNorm) and their model glue: the GPU tests in parallel shards
# (cold compiles dominate: one shard per kernel family), then the benchmark table against
# flash-linear-attention (if importable) and transformers' torch code.
#
# Usage (repo root, on a GPU host with the cuTile toolchain; fla optional, e.g.
#   pip install --no-deps --target /tmp/fla-site fla_core-0.6.0-py3-none-any.whl
#   export PYTHONPATH=/tmp/fla-site   # needs triton and einops, present with torch):
#   bash benchmarks/ops/gpu_check_linear_attn.sh
# Env: TEST_TIMEOUT (600 s per test process), BENCH_TIMEOUT (400 s), BENCH_ARGS.
# Outputs in $OUT (default ./gpu_check_out): linear_attn_env.txt, linear_attn_summary.txt,
# linear_attn_tests_*.txt, linear_attn_bench.txt, cutile-cache.tar.gz.
FAMILY=linear_attn
TT="${TEST_TIMEOUT:-600}"
# shellcheck source=benchmarks/ops/_gpu_check_lib.sh
source "$(dirname "$0")/_gpu_check_lib.sh"

shard chunk tests/ops/test_gated_delta.py -m gpu -k "chunk_kernel"
shard decode tests/ops/test_gated_delta.py -m gpu -k "not chunk_kernel"
shard conv_norm tests/ops/test_linear_attn_ops.py -m gpu
shard glue tests/transformers/test_qwen3_5_linear_attention_on_cpu.py
finish_step1

# shellcheck disable=SC2086  # BENCH_ARGS is a word list
timeout "${BENCH_TIMEOUT:-400}" "$PY" benchmarks/ops/bench_gated_delta.py ${BENCH_ARGS:-} 2>&1 \
    | tee "$OUT/linear_attn_bench.txt" || status=1
tar -czf "$OUT/cutile-cache.tar.gz" -C build cutile-cache 2>/dev/null
echo "total $(($(date +%s) - start)) s, status $status" | tee -a "$OUT/linear_attn_summary.txt"
exit $status
