#!/usr/bin/env bash
# One GPU run for gpt-oss (issue 46): the GPU tests of attention with sinks and of the biased,
# clamped experts, gpt-oss's inventory parity and its CPU tests, in parallel shards beside two
# workers that compile every kernel the tables launch; then the two kernel tables (decode
# attention with sinks vs SDPA and transformers' eager attention; the experts at T = 1 and 8 vs
# their weight-read floor and transformers' default experts); then the end-to-end benchmark of
# the gpt_oss preset in static mode, default workload and decode workload, 5 timed runs each.
#
# Usage (repo root, on a GPU host with the cuTile toolchain; the host has no .git, so name the
# commit of this tree):
#   COMMIT=<40-hex> OUT=/some/dir bash benchmarks/ops/gpu_check_gpt_oss.sh
# Env: COMMIT (required unless git can tell), STEPS ("checks e2e" by default: checks = tests,
# parity and tables; e2e = the two end-to-end runs), TEST_TIMEOUT (120 s per test process),
# BENCH_TIMEOUT (40 s per table), E2E_TIMEOUT (180 s per end-to-end run; granite's static run
# took 136 s on the H200). The limits add up to 9.7 minutes, a typical run about 7; a step that
# runs out of time leaves its partial output (an end-to-end run then writes a metrics file with
# status timeout: run again with STEPS=e2e E2E_TIMEOUT=280). On the H200 (12-06) the default
# workload's run took 150 s and the decode workload's 206 s (110 s of it its correctness
# referee), so a full check does not fit one 600 s device call: run STEPS=checks, then
# STEPS=e2e E2E_TIMEOUT=240.
# Outputs in $OUT (default ./gpu_check_out): gpt_oss_env.txt, gpt_oss_summary.txt,
# gpt_oss_tests_*.txt, gpt_oss_attention_sinks.{txt,json}, gpt_oss_moe_bias.{txt,json},
# gpt_oss_e2e_{default,decode}.{txt,json}, cutile-cache.tar.gz.
FAMILY=gpt_oss
TT="${TEST_TIMEOUT:-120}"
# shellcheck source=benchmarks/ops/_gpu_check_steps.sh
source "$(dirname "$0")/_gpu_check_steps.sh"
# shellcheck source=benchmarks/ops/_gpu_check_lib.sh
source "$(dirname "$0")/_gpu_check_lib.sh"
echo "steps: $STEPS; commit: ${COMMIT:-not needed}" | tee -a "$OUT/${FAMILY}_env.txt"

warm_table() {  # name, table script: every variant launched once (compiles), no timing
    local name=$1
    shift
    timeout "$TT" "$PY" "$@" --warm-only >"$OUT/${FAMILY}_tests_warm_$name.txt" 2>&1 &
    pids+=($!)
}

if [[ " $STEPS " == *" checks "* ]]; then
    shard sinks_prefill tests/ops/test_attention_sinks.py -m gpu -k "prefill"
    shard sinks_decode tests/ops/test_attention_sinks.py -m gpu -k "not prefill"
    shard moe_20b tests/ops/test_moe_bias.py -m gpu -k "gpt_oss_20b"
    shard moe_odd tests/ops/test_moe_bias.py -m gpu -k "not gpt_oss_20b"
    shard cpu tests/transformers/test_gpt_oss_on_cpu.py tests/transformers/test_gpt_oss_inventory.py \
        tests/ops/test_gpt_oss_benches.py
    parity "$KS"/gpt_oss/kernel_solutions/*.json --repo-root .
    warm_table attention_sinks benchmarks/ops/bench_attention_sinks.py
    warm_table moe_bias benchmarks/ops/bench_moe_bias.py
    finish_step1

    timeout "${BENCH_TIMEOUT:-40}" "$PY" benchmarks/ops/bench_attention_sinks.py \
        --json "$OUT/${FAMILY}_attention_sinks.json" 2>&1 | tee "$OUT/${FAMILY}_attention_sinks.txt" || status=1
    # the read flush leaves clean L2 lines, as the model's previous kernels do (bench_moe_bias.py)
    TILEGYM_BENCH_FLUSH=read timeout "${BENCH_TIMEOUT:-40}" "$PY" benchmarks/ops/bench_moe_bias.py --tokens 1,8 \
        --json "$OUT/${FAMILY}_moe_bias.json" 2>&1 | tee "$OUT/${FAMILY}_moe_bias.txt" || status=1
    echo "checks done at $(($(date +%s) - start)) s, status $status" | tee -a "$OUT/${FAMILY}_summary.txt"
fi

if [[ " $STEPS " == *" e2e "* ]]; then
    e2e_runs gpt_oss "${E2E_TIMEOUT:-180}"
fi
tar -czf "$OUT/cutile-cache.tar.gz" -C build cutile-cache 2>/dev/null
echo "total $(($(date +%s) - start)) s, status $status" | tee -a "$OUT/${FAMILY}_summary.txt"
exit $status
