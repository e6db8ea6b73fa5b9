#!/usr/bin/env bash
# GPU validation of the benchmark: qwen3 and llama, default and decode workloads, few timed runs.
# Run from the project root on the GPU host (after `source .gpu/activate.sh` where that applies):
#   OUT=/some/dir bash modeling/transformers/scripts/gpu_smoke.sh
# Writes $OUT/<model>-<workload>.json (metrics) and .log (full output), and prints each run's
# three grep lines and status. TIMED_RUNS (default 3), WARMUP_RUNS (default 2), MODELS
# (default "qwen3 llama") and WORKLOADS (default "default decode") tune it; split the runs over
# several calls where one command may only run 10 minutes, e.g. MODELS=qwen3 then MODELS=llama.
# Afterwards: python -m pytest tests/bench -m gpu (the tiny preset with coverage attribution).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
out=${OUT:?set OUT to the directory for metrics and logs}
mkdir -p "$out"
commit=${COMMIT:-$(git -C "$root" rev-parse HEAD 2>/dev/null || true)}
commit_flag=()
if [ -n "$commit" ]; then
  commit_flag=(--commit "$commit")
else
  echo "note: no git checkout here and COMMIT unset; recording commit 0000... for this smoke run"
  commit_flag=(--commit 0000000000000000000000000000000000000000)
fi
status=0
for model in ${MODELS:-qwen3 llama}; do
  for workload in ${WORKLOADS:-default decode}; do
    name="$model-$workload"
    start=$(date +%s)
    bash "$root/modeling/transformers/scripts/benchmark_hf_model.sh" \
      --model-key "$model" --workload "$workload" --device cuda \
      --timed-runs "${TIMED_RUNS:-3}" --warmup-runs "${WARMUP_RUNS:-2}" \
      --timeout "${TIMEOUT:-900}" --metrics-out "$out/$name.json" "${commit_flag[@]}" \
      >"$out/$name.log" 2>&1
    rc=$?
    echo "== $name: exit $rc, $(( $(date +%s) - start )) s"
    grep -E '^(Average throughput|>>> cuTile|correctness:|error:|cuTile patch)' "$out/$name.log"
    [ $rc -eq 0 ] || status=1
  done
done
PYTHONPATH="$root/modeling/transformers/src${PYTHONPATH:+:$PYTHONPATH}" python3 - "$out" <<'PY' || status=1
import json, sys, pathlib
from tilegym_hf_bench.metrics_schema import validation_errors
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    errs = validation_errors(json.loads(f.read_text()))
    print(f"{f.name}: schema {'valid' if not errs else 'INVALID: ' + errs[0]}")
    if errs:
        sys.exit(1)
PY
exit $status
