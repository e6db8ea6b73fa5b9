# Shared steps of the per-family GPU check scripts (sourced, not run): environment, the parallel
# step 1 (sharded pytest runs, inventory parity, cache-warming benchmark workers) and its summary.
# The sourcing script sets FAMILY (the output prefix) and TT (seconds per test process) first.
# shellcheck shell=bash

set -o pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT" build/cutile-cache
export CUDA_TILE_CACHE_DIR="$PWD/build/cutile-cache"
export PYTHONPATH="$PWD/src:$PWD/modeling/transformers/src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
WARM="${WARM:-5}"
# shellcheck disable=SC2034  # used by the sourcing scripts
KS=src/tilegym/transformers
status=0
pids=()
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv 2>&1 | tee "$OUT/${FAMILY}_env.txt"
"$PY" -c "import torch, transformers, cuda.tile as ct; print(torch.__version__, transformers.__version__, ct.__version__)" 2>&1 | tee -a "$OUT/${FAMILY}_env.txt"
# the caller's COMMIT names the tree where it is set: a GPU host's own .git, if any, may be stale
if [ -n "${COMMIT:-}" ]; then
    echo "commit $COMMIT (COMMIT)"
else
    git log -1 --format='commit %h %s (git log here)' 2>/dev/null
fi | tee -a "$OUT/${FAMILY}_env.txt"
start=$(date +%s)

shard() {  # name, then pytest arguments: one test process in the background
    local name=$1
    shift
    timeout "$TT" "$PY" -m pytest -q -rA -p no:cacheprovider "$@" >"$OUT/${FAMILY}_tests_$name.txt" 2>&1 &
    pids+=($!)
}

parity() {  # Solution files: inventory runtime parity (entry points, sampled shapes)
    { timeout "$TT" "$PY" -m tilegym.kernel_inventory.cli parity "$@" \
        && echo "inventory parity: ok"; } >"$OUT/${FAMILY}_tests_inventory.txt" 2>&1 &
    pids+=($!)
}

warm() {  # benchmark script, time cap: WARM workers filling cuTile's disk cache
    local i
    for ((i = 0; i < WARM; i++)); do
        timeout "$2" "$PY" "$1" --warm "$i/$WARM" >"$OUT/${FAMILY}_warm_$i.txt" 2>&1 &
        pids+=($!)
    done
}

finish_step1() {  # wait for everything started, then summarize each test file and warm-up
    local p f summary="$OUT/${FAMILY}_summary.txt"
    for p in "${pids[@]}"; do wait "$p" || status=1; done
    echo "step 1 (tests + warm) took $(($(date +%s) - start)) s, status $status" | tee "$summary"
    for f in "$OUT"/"${FAMILY}"_tests_*.txt; do
        echo "== $f: $(tail -n 1 "$f")" | tee -a "$summary"
        grep -E "^(FAILED|ERROR)" "$f" | head -20 | tee -a "$summary"
    done
    for f in "$OUT"/"${FAMILY}"_warm_*.txt; do
        [ -s "$f" ] && { echo "== $f (should be empty)"; tail -n 5 "$f"; } | tee -a "$summary"
    done
}

e2e_runs() {  # model key, seconds per run: the static end-to-end benchmark at both workloads
    local key=$1 limit=$2 workload
    for workload in default decode; do
        timeout "$((limit + 10))" "$PY" -m tilegym_hf_bench._cli --model-key "$key" --device cuda \
            --mode static --workload "$workload" --timed-runs 5 --commit "$COMMIT" \
            --timeout "$limit" --metrics-out "$OUT/${FAMILY}_e2e_$workload.json" 2>&1 \
            | tee "$OUT/${FAMILY}_e2e_$workload.txt" || status=1
        echo "e2e $workload done at $(($(date +%s) - start)) s, status $status" \
            | tee -a "$OUT/${FAMILY}_summary.txt"
    done
}
