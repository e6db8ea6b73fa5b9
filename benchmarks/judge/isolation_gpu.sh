#!/usr/bin/env bash
# The judge out of the experiment's process, on a GPU host: benchmark runs of this tree and of
# an older judge (wall time), and planted experiments the judge must stop. Metrics JSON and logs
# in OUT_DIR, one pair per step.
#
#   bash benchmarks/judge/isolation_gpu.sh OUT_DIR [OLD_TREE_TARBALL]
#
# STEPS (default "new planted", plus "old" with a tarball), run in the order given:
#   new       this tree, the qwen3 default workload in static mode
#   old       the judge in OLD_TREE_TARBALL (`git archive <rev> src/tilegym
#             modeling/transformers/src | xz`), same arguments
#   planted   every attention output scaled by 1.01 on the patched model: correctness must fail
#   squatter  after each of its generate() calls the patched model queues SQUAT_CYCLES GPU
#             clock cycles of spinning (default 2e9, about a second) on a side stream, which would
#             run while the PyTorch side is timed: the PyTorch side must keep its speed (the
#             runner waits for a quiet GPU with the worker stopped), and spinning longer than
#             the wait's limit (5 s) must be refused
# Env: RUNS (timed runs, default 3), MODEL (default qwen3), COMMIT (the commit to record,
# for a copy without .git), AUDIT=record (record what the
# worker's confinement would refuse instead of refusing it), CACHES=DIR (each step's compile
# caches under DIR/STEP: the first call with a new DIR measures cold caches, a second call with
# the same DIR warm ones; unset, the user's caches).
set -uo pipefail
out=$(realpath -m "$1"); old=${2:-}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$out"
args=(--model-key "${MODEL:-qwen3}" --device cuda --mode static --timed-runs "${RUNS:-3}")
[ -n "${COMMIT:-}" ] && args+=(--commit "$COMMIT")  # a host without the .git folder
export TILEGYM_WORKER_AUDIT=${AUDIT:-enforce}

bench() {  # STEP PYTHONPATH_PREFIX [bench args]: one run with the step's caches, timed
  local step=$1 path=$2; shift 2
  local env=()
  if [ -n "${CACHES:-}" ]; then
    local c=$CACHES/$step
    mkdir -p "$c/home" "$c/inductor" "$c/triton"
    env=(HOME="$c/home" TORCHINDUCTOR_CACHE_DIR="$c/inductor" TRITON_CACHE_DIR="$c/triton")
  fi
  local pythonpath=${PYTHONPATH:-}
  [ -n "$path" ] && pythonpath=$path${pythonpath:+:$pythonpath}
  local t0=$SECONDS
  env "${env[@]}" PYTHONPATH="$pythonpath" timeout 420 \
    python3 -m tilegym_hf_bench._cli "${args[@]}" "$@" --metrics-out "$out/$step.json" \
    > "$out/$step.txt" 2>&1
  echo "$step: exit $? after $((SECONDS - t0)) s"
  grep -E "^(time spent|correctness:|worker's GPU|error)" "$out/$step.txt"
}

planted_tree() {  # CODE: a copy of this tree's src/ with CODE appended to the patch entry
  local tree
  tree=$(mktemp -d)
  cp -r "$root/src" "$tree/src"
  printf '%s\n' "$1" >> "$tree/src/tilegym/transformers/monkey_patch.py"
  echo "$tree/src"
}

scaled_attention='
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


_mp.apply_tilegym_kernel = _scaled_attention'

squatter='
import torch
import tilegym.transformers.monkey_patch as _mp

_orig = _mp.apply_tilegym_kernel
_streams = []


def _squatting(model, **flags):
    handle = _orig(model, **flags)
    generate = model.generate

    def squat(*a, **k):
        out = generate(*a, **k)
        if not _streams:
            _streams.append(torch.cuda.Stream())
        with torch.cuda.stream(_streams[0]):
            torch.cuda._sleep(CYCLES)  # spinning, queued, not awaited
        return out

    model.generate = squat
    return handle


_mp.apply_tilegym_kernel = _squatting'

for step in ${STEPS:-new planted${old:+ old}}; do
  case $step in
    new) bench new "" ;;
    planted) bench planted "$(planted_tree "$scaled_attention")" --timed-runs 2 --skip-coverage ;;
    squatter)
      bench squatter "$(planted_tree "${squatter//CYCLES/${SQUAT_CYCLES:-2000000000}}")" \
        --timed-runs 2 --skip-coverage
      ;;
    old)
      [ -n "$old" ] || { echo "error: step old needs OLD_TREE_TARBALL" >&2; exit 2; }
      tree=$(mktemp -d)
      tar -xJf "$old" -C "$tree"
      bench old "$tree/src:$tree/modeling/transformers/src" --commit "$(printf '0%.0s' {1..40})"
      ;;
    *) echo "error: unknown step $step (new, old, planted, squatter)" >&2; exit 2 ;;
  esac
done
