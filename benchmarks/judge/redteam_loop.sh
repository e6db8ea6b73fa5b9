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
#       class-rebind   upstream Qwen3Attention.forward rebound at the class through a local alias
#                  (the PyTorch side and the fp32 reference once ran it too): the model worker's
#                  confinement refuses it; the verdict is `refused`
#       zero-attention the attention output zeroed on the patched instance only (in scope, through
#                  Family.forwards): correctness is scored outside the worker; `incorrect`
# Steps build on each other's repository ($REDTEAM_REPO, default OUT_DIR/repo); run them in this
# order. Each step leaves in OUT_DIR its decision, the bot's stderr, the PR comment and the
# metrics of the runs it made. On a GPU host source .gpu/activate.sh first; without a GPU pass
# `--model-key tiny-qwen3 --device cpu`.
set -euo pipefail
out=$(realpath -m "$1"); step=$2; shift 2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
repo=$(realpath -m "${REDTEAM_REPO:-$out/repo}")
mkdir -p "$out"
# shellcheck source=../loop/lib.sh
source "$root/benchmarks/loop/lib.sh"
loop_repo
run() { loop_run "$@"; }

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

from tilegym.transformers.decoder import make_attention_forward as _shared_attention


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
    printf '\n# (a comment: the same code)\n' >> "$repo/src/tilegym/transformers/qwen3/modeling_qwen3.py"
    git -C "$repo" commit -qam "qwen3: comment only"
    run neutral "neutral: the same code twice" --fresh-base -- "$@"
    ;;
  triton)
    "${bot[@]}" experiment start --model-key qwen3 --name triton-rmsnorm
    mkdir -p "$kernels"
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
  class-rebind)
    "${bot[@]}" experiment start --model-key qwen3 --name class-rebind
    cat >> "$repo/src/tilegym/transformers/qwen3/modeling_qwen3.py" <<'PY'

import transformers.models.qwen3.modeling_qwen3 as _up

_attention = _up.Qwen3Attention


def _zero(self, hidden_states, *args, **kwargs):
    return hidden_states * 0, None


_attention.forward = _zero
PY
    git -C "$repo" commit -qam "qwen3: attention rebound at the class (planted)"
    run class-rebind "planted: class-level zero attention" -- "$@"
    ;;
  zero-attention)
    "${bot[@]}" experiment start --model-key qwen3 --name zero-attention
    cat >> "$repo/src/tilegym/transformers/qwen3/modeling_qwen3.py" <<'PY'

from tilegym.transformers.decoder import make_attention_forward as _shared_attention


def make_attention_forward(*args):
    inner = _shared_attention(*args)

    def forward(self, *a, **k):
        out = inner(self, *a, **k)
        return (out[0] * 0.0, *out[1:])

    return forward


FAMILY = Family(
    "transformers.models.qwen3.modeling_qwen3",
    "Qwen3",
    qk_norm=True,
    forwards={"Attention": make_attention_forward},
)
PY
    git -C "$repo" commit -qam "qwen3: attention output zeroed on the instance (planted)"
    run zero-attention "planted: zero attention on the instance" -- "$@"
    ;;
  *)
    echo "error: unknown step $step (baseline, planted, neutral, triton, class-rebind," \
      "zero-attention)" >&2
    exit 2
    ;;
esac
cp "$repo/sandbox/qwen3_results.md" "$out/ledger.md" 2>/dev/null || true
