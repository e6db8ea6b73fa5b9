#!/usr/bin/env bash
# GPU check of the decode attention variants (issue 5, helper attn3): the decode tests of every
# launch scheme / MMA form / split plan (fp32 reference, odd cache lengths, per-sequence
# lengths, padding + window, poisoned outputs, back-to-back launches), the model-level
# attention tests, then the harness floor and the decode sweep with every variant interleaved
# against SDPA. Logs in $OUT; < 4 min.
#
#   source .gpu/activate.sh && OUT=/tmp/attn3 bash benchmarks/ops/gpu_check_attn3.sh
#
# Tests run as parallel pytest processes (split by model and scheme) next to two benchmark
# warm-ups, so the cuTile JIT compiles overlap; compiled kernels land in cuTile's disk cache and
# the timed benchmark afterwards compiles nothing.
set -o pipefail
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
T=${TEST_TIMEOUT:-150}
STATUS="$OUT/attn3_status.txt"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import torch, transformers, cuda.tile as ct; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "cuda-tile", ct.__version__)'
} 2>&1 | tee "$STATUS"

t0=$(date +%s)
run_tests() {  # name, pytest args...
  local name=$1; shift
  timeout "$T" $PY -m pytest -q -rA -p no:cacheprovider -W ignore::FutureWarning "$@" \
    >"$OUT/attn3_tests_$name.txt" 2>&1
  echo "tests $name exit $?" >>"$STATUS"
}
F=tests/ops/test_attention.py
for m in qwen3 llama; do
  # decode_modes_match: variants auto, rows-auto / pdl, split, rows-pdl, pdl-o2 (every split
  # plan, cache lengths 1..8192 incl. odd ones, batch 1 and 5)
  run_tests "modes_auto_$m" $F -k "decode_modes_match and $m and auto" &
  run_tests "modes_pdl_$m" $F -k "decode_modes_match and $m and (pdl or split)" &
  run_tests "masks_$m" $F -k "(decode_modes_padding or decode_modes_cache_views) and $m" &
  run_tests "default_$m" $F -k "(decode_matches_fp32 or decode_padding_window or decode_per_sequence) and $m" &
  (
    timeout "$T" $PY benchmarks/ops/bench_attention.py --only floor --only decode --sweep \
      --warm-only --models "$m" >"$OUT/attn3_bench_warm_$m.txt" 2>&1
    echo "bench warm-up $m exit $?" >>"$STATUS"
  ) &
done
run_tests misc $F -k "kv_end or plan or unknown_mode or bench or back_to_back or aot" &
run_tests model tests/transformers/test_attention_model.py tests/transformers/test_patch_framework.py &
run_tests patch_models tests/transformers/test_patch_models.py -k "all_flags" &
wait
echo "tests + warm-up took $(( $(date +%s) - t0 )) s" | tee -a "$STATUS"
for f in "$OUT"/attn3_tests_*.txt; do
  echo "== $f"; grep -E "^(FAILED|ERROR)" "$f" | head -n 20; tail -n 1 "$f"
done

timeout "${BENCH_TIMEOUT:-80}" $PY benchmarks/ops/bench_attention.py --only floor --only decode \
  --sweep --iters "${BENCH_ITERS:-40}" --json "$OUT/attn3_bench.json" 2>&1 | tee "$OUT/attn3_bench.txt"
echo "bench exit $?" | tee -a "$STATUS"
echo "total $(( $(date +%s) - t0 )) s" | tee -a "$STATUS"
! grep -q " exit [^0]" "$STATUS"
