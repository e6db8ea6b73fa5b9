#!/usr/bin/env bash
# One GPU run for DeepSeek-V2 (the absorbed decode's per-head products, the router's fp32 linear
# with the greedy routing fused after it, the two-width latent cache write): the GPU tests of
# those kernels and of the MLA decode/prefill, deepseek_v2's inventory parity and the CPU tests
# of both DeepSeek families, in parallel shards; then the end-to-end benchmark of the
# deepseek_v2 preset in static mode, default workload (1 x 2048 -> 128) and decode workload
# (8 x 256 -> 256), 5 timed runs each (coverage before: 80.30% and 86.25%).
#
# Usage (repo root, on a GPU host with the cuTile toolchain; the host has no .git, so name the
# commit of this tree):
#   COMMIT=<40-hex> OUT=/some/dir bash benchmarks/ops/gpu_check_deepseek.sh
# Env: COMMIT (required unless git can tell), STEPS ("checks e2e" by default), TEST_TIMEOUT
# (240 s per test process: the first launches compile), E2E_TIMEOUT (240 s per end-to-end run).
# A step that runs out of time leaves its partial output (run again with STEPS=e2e).
# Outputs in $OUT (default ./gpu_check_out): deepseek_env.txt, deepseek_summary.txt,
# deepseek_tests_*.txt, deepseek_e2e_{default,decode}.{txt,json}, cutile-cache.tar.gz.
FAMILY=deepseek
TT="${TEST_TIMEOUT:-240}"
# shellcheck source=benchmarks/ops/_gpu_check_steps.sh
source "$(dirname "$0")/_gpu_check_steps.sh"
# shellcheck source=benchmarks/ops/_gpu_check_lib.sh
source "$(dirname "$0")/_gpu_check_lib.sh"
echo "steps: $STEPS; commit: ${COMMIT:-not needed}" | tee -a "$OUT/${FAMILY}_env.txt"

if [[ " $STEPS " == *" checks "* ]]; then
    shard absorb tests/ops/test_mla_absorb.py -m gpu
    shard router tests/ops/test_router_linear.py -m gpu
    shard cache tests/ops/test_latent_cache.py -m gpu
    shard rotary tests/ops/test_rotary_tables.py -m gpu
    shard mla tests/ops/test_mla.py -m gpu
    shard cpu tests/transformers/test_deepseek_on_cpu.py tests/transformers/test_deepseek_v2_inventory.py
    parity "$KS"/deepseek_v2/kernel_solutions/*.json --repo-root . --shapes 4
    finish_step1
fi

if [[ " $STEPS " == *" e2e "* ]]; then
    e2e_runs deepseek_v2 "${E2E_TIMEOUT:-240}"
fi
tar -czf "$OUT/cutile-cache.tar.gz" -C build cutile-cache 2>/dev/null
echo "total $(($(date +%s) - start)) s, status $status" | tee -a "$OUT/${FAMILY}_summary.txt"
exit $status
