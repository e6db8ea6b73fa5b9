#!/usr/bin/env bash
# One GPU run that decides kernel switches: the GPU tests of each switch's kernels (against
# their fp32 references and against the other form) in parallel shards, then the tables that
# time each switch's forms side by side. A switch's row says whether it ships on or off; one
# that went on stays as the check to rerun when its kernels change.
#
#   switch                  ships  tests (shards)            table
#   gated_delta.SPLIT_SCAN  on     split_scan, scan_widths   bench_gated_delta.py: cutile (the
#                                                            split) against cutile-one-kernel;
#                                                            bench_gated_delta_scan.py (widths);
#                                                            diag_split_scan.py (its errors)
#
# A switch goes on when its shard passes and its table is faster beyond the spread; the bar
# for each is in docs/DESIGN.md. Usage (repo root, on a GPU host with the cuTile toolchain;
# fla optional, on PYTHONPATH, for the gated delta table's fla column):
#   COMMIT=<this tree's commit> OUT=/some/dir bash benchmarks/ops/gpu_check_switches.sh
# Env: COMMIT (printed as the code's commit: the GPU host has no .git of this tree),
# TEST_TIMEOUT (240 s per test process), BENCH_TIMEOUT (150 s per table).
# Outputs in $OUT (default ./gpu_check_out): switches_env.txt, switches_summary.txt,
# switches_tests_*.txt, switches_gated_delta{,_scan}.txt, switches_split_scan_errors.txt,
# cutile-cache.tar.gz.
FAMILY=switches
TT="${TEST_TIMEOUT:-240}"
# shellcheck source=benchmarks/ops/_gpu_check_lib.sh
source "$(dirname "$0")/_gpu_check_lib.sh"

# two shards, so that each finishes inside TEST_TIMEOUT and prints its failures
shard split_scan tests/ops/test_gated_delta.py -m gpu -k "split_scan"
shard scan_widths tests/ops/test_gated_delta.py -m gpu -k "scan_widths"
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
table gated_delta_scan benchmarks/ops/bench_gated_delta_scan.py --kernels
table split_scan_errors benchmarks/ops/diag_split_scan.py --reps 2
tar -czf "$OUT/cutile-cache.tar.gz" -C build cutile-cache 2>/dev/null
echo "total $(($(date +%s) - start)) s, status $status" | tee -a "$OUT/${FAMILY}_summary.txt"
exit $status
