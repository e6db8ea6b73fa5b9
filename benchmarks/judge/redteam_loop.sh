#!/usr/bin/env bash
# The judge against planted experiments, through the real local loop (tilegym-bot experiment
# run) on a throwaway repository made from this checkout's sources.
#
#   bash benchmarks/judge/redteam_loop.sh OUT_DIR STEP [bench args...]
#
# STEP: baseline   main measured as is (the ledger's first row)
#       planted    qwen3's QKV GEMM launched three times (same output), in the model's own glue:
#                  a planted slowdown that raises coverage; the judge must discard it in one round
#       neutral    a comment-only change, base measured afresh (--fresh-base): the same code
#                  twice, i.e. the run-to-run spread of GPU time and throughput; must not keep
#       triton     a Triton kernel added to the model's kernels: refused before any benchmark
# Steps build on each other's repository ($REDTEAM_REPO, default OUT_DIR/repo); run them in this
# order. Each step leaves in OUT_DIR its decision, the bot's stderr, the PR comment and the
# metrics of the runs it made. On a GPU host source .gpu/activate.sh first; without a GPU pass
# `--model-key tiny-qwen3 --device cpu`.
set -euo pipefail
out=$(realpath -m "$1"); step=$2; shift 2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
repo=$(realpath -m "${REDTEAM_REPO:-$out/repo}")
bot=(python3 -m tilegym_bot -C "$repo")
mkdir -p "$out"
log() { printf '== %s: %s\n' "$step" "$*"; }

if [ ! -d "$repo/.git" ]; then
  mkdir -p "$repo"
  for d in src modeling/transformers/src bot hooks; do
    mkdir -p "$repo/$(dirname "$d")"
    cp -r "$root/$d" "$repo/$d"
  done
  find "$repo" -name __pycache__ -prune -exec rm -rf {} +
  mkdir -p "$repo/sandbox" && printf '*\n!.gitignore\n' > "$repo/sandbox/.gitignore"
  git -C "$repo" init -q -b main
  git -C "$repo" -c user.name=redteam -c user.email=redteam@tilegym.invalid add -A
  git -C "$repo" -c user.name=redteam -c user.email=redteam@tilegym.invalid commit -qm main
fi
git -C "$repo" config user.name redteam
git -C "$repo" config user.email redteam@tilegym.invalid

run() {  # experiment NAME DESCRIPTION [experiment-run flags] -- edits via a function
  local name=$1 description=$2; shift 2
  local t0=$SECONDS status=0
  "${bot[@]}" experiment run --description "$description" "$@" \
    > "$out/$name.decision.json" 2> "$out/$name.stderr" || status=$?
  log "$name: exit $status after $((SECONDS - t0)) s"
  tail -n 5 "$out/$name.stderr"
  cat "$out/$name.decision.json"
  local run
  for run in "$repo"/sandbox/runs/*-"$name"-*/; do
    [ -f "$run/metrics.json" ] && cp "$run/metrics.json" "$out/$(basename "$run").metrics.json"
  done
  local report
  report=$(find "$repo/.git/tilegym-bot/prs" -name '*.md' 2>/dev/null | sort -V | tail -n 1)
  [ "$status" = 0 ] && [ -n "$report" ] && cp "$report" "$out/$name.comment.md"
  "${bot[@]}" experiment advance >/dev/null 2>&1 || "${bot[@]}" experiment reset >/dev/null 2>&1 || true
  return 0
}

kernels=$repo/src/tilegym/transformers/qwen3/kernels
case $step in
  baseline)
    "${bot[@]}" experiment start --model-key qwen3 --name baseline
    run baseline "main as it is" -- "$@"
    ;;
  planted)
    # In scope (the model's own module): qwen3's family description wires its own attention
    # builder (Family.forwards, as an experiment wiring a new kernel does), which hands the
    # shared attention forward a GEMM module that launches the QKV GEMM three times and
    # returns the last (same output).
    "${bot[@]}" experiment start --model-key qwen3 --name planted-3x-gemm
    cat >> "$repo/src/tilegym/transformers/qwen3/modeling_qwen3.py" <<'PY'

from tilegym.transformers.llama.modeling_llama import make_attention_forward as _shared_attention


class _ThriceGemm:
    def __init__(self, gemm):
        self._gemm = gemm

    def linear(self, *args, **kwargs):
        self._gemm.linear(*args, **kwargs)
        self._gemm.linear(*args, **kwargs)
        return self._gemm.linear(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._gemm, name)


def make_attention_forward(routes, fused, gemm, *rest):
    return _shared_attention(routes, fused, _ThriceGemm(gemm), *rest)


FAMILY = Family(
    "transformers.models.qwen3.modeling_qwen3",
    "Qwen3",
    qk_norm=True,
    forwards={"Attention": make_attention_forward},
)
PY
    git -C "$repo" commit -qam "qwen3: QKV GEMM launched three times (planted slowdown)"
    run planted "planted: QKV GEMM launched 3x" -- "$@"
    ;;
  neutral)
    "${bot[@]}" experiment start --model-key qwen3 --name neutral
    printf '\n# (a comment: the same code)\n' >> "$kernels/rms_norm.py"
    git -C "$repo" commit -qam "qwen3: comment only"
    run neutral "neutral: the same code twice" --fresh-base -- "$@"
    ;;
  triton)
    "${bot[@]}" experiment start --model-key qwen3 --name triton-rmsnorm
    cat > "$kernels/fused_rmsnorm.py" <<'PY'
import triton
import triton.language as tl


@triton.jit
def fused_rmsnorm_Kt2(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
PY
    git -C "$repo" add -A && git -C "$repo" commit -qm "qwen3: a Triton kernel named like cuTile"
    run triton "triton kernel with a cuTile-like name" -- "$@"
    ;;
  *) echo "error: unknown step $step (baseline, planted, neutral, triton)" >&2; exit 2 ;;
esac
cp "$repo/sandbox/qwen3_results.md" "$out/ledger.md" 2>/dev/null || true
