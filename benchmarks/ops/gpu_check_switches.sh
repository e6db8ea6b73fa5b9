#!/usr/bin/env bash
# One GPU run that decides the kernel switches shipped off until measured: the GPU tests of
# each switch's kernels (against their fp32 references and against the shipped form) in
# parallel shards, then the tables that time each switch against what ships.
#
#   switch                               tests (shard)   table
#   gated_delta.PREP_TWO_PASS            gated_delta     bench_gated_delta.py: cutile-2pass
#   gated_delta.UT_BLOCK                 gated_delta     bench_gated_delta.py: cutile-ub16
#   gated_delta.SPLIT_SCAN               gated_delta     bench_gated_delta.py: cutile-split
#   moe.ROUTE_PACKED, route tile rows    moe_route       bench_moe_route.py
#   gemm.GEMV_PDL                        gemv_pdl        bench_gemv_pdl.py (end to end: the
#                                                        static benchmark with it on and off)
#   attention_sinks.SINK_EPILOGUE        sinks_decode    bench_attention_sinks.py: other us
#
# A switch goes on when its shard passes and its table is faster beyond the spread; the bar
# for each is in docs/DESIGN.md. Usage (repo root, on a GPU host with the cuTile toolchain;
# fla optional, on PYTHONPATH, for the gated delta table's fla column):
#   OUT=/some/dir bash benchmarks/ops/gpu_check_switches.sh
# Env: TEST_TIMEOUT (240 s per test process), BENCH_TIMEOUT (150 s per table).
# Outputs in $OUT (default ./gpu_check_out): switches_env.txt, switches_summary.txt,
# switches_tests_*.txt, switches_{gated_delta,moe_route,gemv_pdl,sinks}.txt, cutile-cache.tar.gz.
FAMILY=switches
TT="${TEST_TIMEOUT:-240}"
# shellcheck source=benchmarks/ops/_gpu_check_lib.sh
source "$(dirname "$0")/_gpu_check_lib.sh"

shard gated_delta tests/ops/test_gated_delta.py -m gpu -k "two_pass or split_scan or blocked"
shard moe_route tests/ops/test_moe.py -m gpu -k "route"
shard gemv_pdl tests/ops/test_gemm.py -m gpu -k "pdl"
shard sinks_decode tests/ops/test_attention_sinks.py -m gpu -k "decode or change"
finish_step1

table() {  # output name, then the table script and its arguments
    local name=$1
    shift
    timeout "${BENCH_TIMEOUT:-150}" "$PY" "$@" 2>&1 | tee "$OUT/${FAMILY}_$name.txt" || status=1
    echo "table $name done at $(($(date +%s) - start)) s, status $status" \
        | tee -a "$OUT/${FAMILY}_summary.txt"
}

table gated_delta benchmarks/ops/bench_gated_delta.py --heads 0.8b --prefill 1x2048 --decode 1 \
    --no-conv-norm --kernels
table moe_route benchmarks/ops/bench_moe_route.py --tokens 1 8
table gemv_pdl benchmarks/ops/bench_gemv_pdl.py
table sinks benchmarks/ops/bench_attention_sinks.py --lengths 128,2048 --sinks on
tar -czf "$OUT/cutile-cache.tar.gz" -C build cutile-cache 2>/dev/null
echo "total $(($(date +%s) - start)) s, status $status" | tee -a "$OUT/${FAMILY}_summary.txt"
exit $status
