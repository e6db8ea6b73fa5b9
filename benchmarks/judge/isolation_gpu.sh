#!/usr/bin/env bash
# The judge out of the experiment's process, on a GPU host: one benchmark run of this tree and
# (OLD=1) of an older judge for wall time, and (PLANTED=1) a uniform 1% attention error that must
# fail correctness. Results in OUT_DIR (metrics JSON and logs).
#
#   bash benchmarks/judge/isolation_gpu.sh OUT_DIR [OLD_TREE_TARBALL]
#
# OLD_TREE_TARBALL: `git archive <rev> src/tilegym modeling/transformers/src | xz` of the judge to
# compare with. Env: RUNS (timed runs, default 3), MODEL (default qwen3), AUDIT=record to record
# what the worker's confinement would refuse instead of refusing it.
set -uo pipefail
out=$(realpath -m "$1"); old=${2:-}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$out"
args=(--model-key "${MODEL:-qwen3}" --device cuda --mode static --timed-runs "${RUNS:-3}")
t0=$SECONDS
TILEGYM_WORKER_AUDIT=${AUDIT:-enforce} timeout 420 python3 -m tilegym_hf_bench._cli "${args[@]}" \
  --metrics-out "$out/new.json" > "$out/new.txt" 2>&1
echo "new judge: exit $? after $((SECONDS - t0)) s"
if [ "${PLANTED:-1}" = 1 ]; then
  tree=$(mktemp -d)
  cp -r "$root/src" "$tree/src"
  cat >> "$tree/src/tilegym/transformers/monkey_patch.py" <<'PY'

import tilegym.transformers.monkey_patch as _mp

_orig = _mp.apply_tilegym_kernel


def _scaled_attention(model, **flags):
    handle = _orig(model, **flags)
    for layer in model.model.layers:
        def scaled(*a, _f=layer.self_attn.forward, **k):
            out = _f(*a, **k)
            return (out[0] * 1.01, *out[1:])
        layer.self_attn.forward = scaled
    return handle


_mp.apply_tilegym_kernel = _scaled_attention
PY
  t0=$SECONDS
  PYTHONPATH="$tree/src:${PYTHONPATH:-}" timeout 300 python3 -m tilegym_hf_bench._cli "${args[@]}" \
    --timed-runs 2 --skip-coverage --metrics-out "$out/planted1pct.json" > "$out/planted1pct.txt" 2>&1
  echo "planted 1% attention error: exit $? after $((SECONDS - t0)) s (correctness must fail)"
  grep -E "^correctness" "$out/planted1pct.txt"
fi
if [ -n "$old" ]; then
  tree=$(mktemp -d)
  tar -xJf "$old" -C "$tree"
  t0=$SECONDS
  PYTHONPATH="$tree/src:$tree/modeling/transformers/src:${PYTHONPATH:-}" timeout 420 \
    python3 -m tilegym_hf_bench._cli "${args[@]}" --commit "$(printf '0%.0s' {1..40})" \
    --metrics-out "$out/old.json" > "$out/old.txt" 2>&1
  echo "old judge: exit $? after $((SECONDS - t0)) s"
fi
