#!/usr/bin/env bash
# GPU check of the decode attention variants (issue 5): decode tests, then the decode benchmark
# with every variant interleaved against SDPA. No prefill sweep. Logs in $OUT; < 4 min.
#
#   source .gpu/activate.sh && OUT=/tmp/attn2 bash benchmarks/ops/gpu_check_attn2.sh
#
# The tests run as parallel pytest processes (split by model and test group) next to two
# benchmark warm-ups, so the cuTile JIT compiles overlap; compiled kernels land in cuTile's disk
# cache and the timed benchmark afterwards compiles nothing.
set -o pipefail
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
T=${TEST_TIMEOUT:-150}
STATUS="$OUT/attn2_status.txt"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c 'import torch, transformers, cuda.tile as ct; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "cuda-tile", ct.__version__)'
} 2>&1 | tee "$STATUS"

t0=$(date +%s)
run_tests() {  # name, pytest args...
  local name=$1; shift
  timeout "$T" $PY -m pytest -q -rA -p no:cacheprovider -W ignore::FutureWarning "$@" \
    >"$OUT/attn2_tests_$name.txt" 2>&1
  echo "tests $name exit $?" >>"$STATUS"
}
F=tests/ops/test_attention.py
for m in qwen3 llama; do
  run_tests "modes_pdl_$m" $F -k "decode_modes_match and $m and pdl" &
  run_tests "modes_split_$m" $F -k "decode_modes_match and $m and split" &
  run_tests "padding_old_$m" $F -k "decode_padding_window_and_splits and $m" &
  run_tests "padding_modes_$m" $F -k "decode_modes_padding and $m" &
  run_tests "lens_$m" $F -k "decode and $m and (per_sequence or counters)" &
  run_tests "old_$m" $F -k "decode_matches_fp32_reference and $m" &
  (
    timeout "$T" $PY benchmarks/ops/bench_attention.py --only decode --sweep --warm-only \
      --models "$m" >"$OUT/attn2_bench_warm_$m.txt" 2>&1
    echo "bench warm-up $m exit $?" >>"$STATUS"
  ) &
done
run_tests misc $F tests/ops/test_kv_cache.py -k "kv_end or plan_splits or unknown_mode or bench or test_kv_cache" &
run_tests model tests/transformers/test_attention_model.py &
wait
echo "tests + warm-up took $(( $(date +%s) - t0 )) s" | tee -a "$STATUS"
for f in "$OUT"/attn2_tests_*.txt; do
  echo "== $f"; grep -E "^(FAILED|ERROR)" "$f" | head -n 20; tail -n 3 "$f"
done

timeout "${BENCH_TIMEOUT:-100}" $PY benchmarks/ops/bench_attention.py --only decode --sweep \
  --iters "${BENCH_ITERS:-40}" --json "$OUT/attn2_bench.json" 2>&1 | tee "$OUT/attn2_bench.txt"
echo "bench exit $?" | tee -a "$STATUS"
echo "total $(( $(date +%s) - t0 )) s" | tee -a "$STATUS"
! grep -q " exit [^0]" "$STATUS"
