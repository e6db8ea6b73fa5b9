#!/usr/bin/env bash
# One GPU run for the attention and KV-cache kernels: their GPU tests, inventory parity, then the
# benchmark tables against SDPA / torch.cat. Logs in $OUT (default ./gpu_check_out).
#
# Usage (repo root, on a GPU host with the cuTile toolchain):
#   bash benchmarks/ops/gpu_check_attention.sh [bench_attention.py flags]
# The flags go to benchmarks/ops/bench_attention.py (its warm-up and its timed run), e.g.
#   bash benchmarks/ops/gpu_check_attention.sh                      # every table
#   bash benchmarks/ops/gpu_check_attention.sh --sweep              # + prefill tiles, decode variants
#   bash benchmarks/ops/gpu_check_attention.sh --only floor --only decode --sweep --iters 40
#                                                                   # the decode-variant sweep alone
#
# Tests: prefill, plans and the reference mask; decode of every launch scheme / MMA form / split
# plan against fp32 (cache lengths 1..8192 incl. odd ones, per-sequence lengths, padding and
# window, cache views, poisoned outputs, back-to-back launches); the KV-cache write; the
# model-level attention and patch tests. They run as parallel pytest processes (split by model
# and scheme) next to one benchmark warm-up per model, so the cuTile JIT compiles overlap;
# compiled kernels land in cuTile's disk cache, so the timed benchmark afterwards compiles
# nothing.
# Env: TEST_TIMEOUT (150 s per test process and warm-up), BENCH_TIMEOUT (150 s).
# Outputs in $OUT: attention_status.txt (one "... exit N" line per part), attention_tests_*.txt,
# attention_parity.txt, attention_bench_warm_*.txt, attention_bench.txt and .json.
set -o pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT="${OUT:-gpu_check_out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src:$PWD/modeling/transformers/src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
T="${TEST_TIMEOUT:-150}"
BENCH_ARGS=("$@")
STATUS="$OUT/attention_status.txt"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c 'import torch, transformers, cuda.tile as ct; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "cuda-tile", ct.__version__)'
  git log -1 --format='commit %h %s' 2>/dev/null
} 2>&1 | tee "$STATUS"

t0=$(date +%s)
run_tests() {  # name, pytest args...
  local name=$1; shift
  timeout "$T" "$PY" -m pytest -q -rA -p no:cacheprovider -W ignore::FutureWarning "$@" \
    >"$OUT/attention_tests_$name.txt" 2>&1
  echo "tests $name exit $?" >>"$STATUS"
}

# 1. tests (parallel shards), inventory parity and the benchmark warm-ups, all at once
F=tests/ops/test_attention.py
run_tests prefill "$F" -k "test_prefill or test_reference" &
run_tests misc "$F" -k "kv_end or plan or unknown_mode or bench or back_to_back or aot" &
for m in qwen3 llama; do
  # decode_modes_match: variants auto, rows-auto / pdl, split, rows-pdl, pdl-o2 (every split
  # plan, cache lengths 1..8192 incl. odd ones, batch 1 and 5)
  run_tests "modes_auto_$m" "$F" -k "decode_modes_match and $m and auto" &
  run_tests "modes_pdl_$m" "$F" -k "decode_modes_match and $m and (pdl or split)" &
  run_tests "masks_$m" "$F" -k "(decode_modes_padding or decode_modes_cache_views) and $m" &
  run_tests "default_$m" "$F" \
    -k "(decode_matches_fp32 or decode_padding_window or decode_per_sequence) and $m" &
  (
    timeout "$T" "$PY" benchmarks/ops/bench_attention.py "${BENCH_ARGS[@]}" --warm-only \
      --models "$m" >"$OUT/attention_bench_warm_$m.txt" 2>&1
    echo "bench warm-up $m exit $?" >>"$STATUS"
  ) &
done
run_tests kv_cache tests/ops/test_kv_cache.py &
run_tests model tests/transformers/test_attention_model.py tests/transformers/test_patch_framework.py &
run_tests patch_models tests/transformers/test_patch_models.py -k "all_flags" &
(
  KS=src/tilegym/transformers
  timeout "$T" "$PY" -m tilegym.kernel_inventory.cli parity --repo-root . \
    "$KS"/{qwen3,llama}/kernel_solutions/*_{attention,kv_cache}*.json >"$OUT/attention_parity.txt" 2>&1
  echo "inventory parity exit $?" >>"$STATUS"
) &
wait
echo "tests + warm-up took $(( $(date +%s) - t0 )) s" | tee -a "$STATUS"
for f in "$OUT"/attention_tests_*.txt; do
  echo "== $f"; grep -E "^(FAILED|ERROR)" "$f" | head -n 20; tail -n 1 "$f"
done

# 2. the timed benchmark, alone on the GPU
timeout "${BENCH_TIMEOUT:-150}" "$PY" benchmarks/ops/bench_attention.py "${BENCH_ARGS[@]}" \
  --json "$OUT/attention_bench.json" 2>&1 | tee "$OUT/attention_bench.txt"
echo "bench exit $?" | tee -a "$STATUS"
echo "total $(( $(date +%s) - t0 )) s" | tee -a "$STATUS"
! grep -q " exit [^0]" "$STATUS"
