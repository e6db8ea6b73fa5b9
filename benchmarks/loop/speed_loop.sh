#!/usr/bin/env bash
# One model's speed experiments through the real local loop (tilegym-bot experiment run), from
# main as it ships (every part on cuTile), on a throwaway repository made from this checkout's
# sources: each round a change an experiment on that model may make that moves no work between
# PyTorch and cuTile, so a keep is the judge's speed rule at work (kept_by "speed").
#
#   bash benchmarks/loop/speed_loop.sh OUT_DIR MODEL_KEY [bench args...]
#
# Rounds (LOOP_ROUNDS names some, default all, in order):
#   baseline     main as it is (the ledger's first row)
#   rope-heads   decode RoPE (Qwen3: q/k norm + RoPE) on the head-loop kernel with
#                SPEED_ROPE_HEADS (default 1) heads a block instead of one block a token
#                (MODEL_PATCH_KWARGS rope_heads; expected: keep, GPU time per token down).
#                qwen3 ships with rope_heads 1 (this round's keep on an H100, 12-05): for it,
#                SPEED_ROPE_HEADS=2 tries the next step
#   norm-gemv    each pre-norm layer's input RMSNorm in its QKV GEMV's K loop (MODEL_PATCH_KWARGS
#                norm_gemv 1; at decode one launch where the norm kernel and the GEMV were two).
#                llama ships with norm_gemv 1 (this round's keep on an H100, 12-06): for it the
#                round changes nothing
#   rope-gemv    decode RoPE in the epilogue of the input norm + QKV GEMV (norm_gemv 1 and
#                rope_gemv 1: norm, projection, per-head q/k norms and RoPE in one launch at one
#                row). llama ships with both (this round's keep on an H100, 12-06)
#   kv-gemv      that launch also writes the new token's keys and values into the static cache
#                (rope_gemv 2), where the KV-cache write kernel did. qwen3 ships with
#                norm_gemv 1 and rope_gemv 2 (the rope-gemv and kv-gemv keeps on an H100, 12-07):
#                for it norm-gemv and rope-gemv step back and kv-gemv changes nothing
#   norm-gemv-mlp  also the post-attention RMSNorm in the MLP's gate/up GEMV (norm_gemv 2; last,
#                so that it keeps whatever rope-gemv and kv-gemv kept)
# A post-norm model (olmo2, olmo3) has no input norm: norm_gemv 1 changes nothing there, so
# kv-gemv is its QKV GEMV with the whole-projection q/k norms, RoPE and the cache write, and
# norm-gemv-mlp its post-attention norm and residual add in the gate/up GEMV:
#   LOOP_ROUNDS="baseline kv-gemv norm-gemv-mlp" bash benchmarks/loop/speed_loop.sh OUT olmo3 ...
# OUT_DIR gets what family_loop.sh leaves (decisions, stderr, PR comments, metrics, ledger.md and
# ledger.png after every round). On a GPU host source .gpu/activate.sh first; without a GPU pass
# `--model-key tiny-<key> --device cpu` (the ops then run their PyTorch references: the loop's
# mechanics only).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=lib.sh
source "$root/benchmarks/loop/lib.sh"
model_loop_start speed_loop.sh "$@"

rounds="baseline rope-heads norm-gemv rope-gemv kv-gemv norm-gemv-mlp"
heads=${SPEED_ROPE_HEADS:-1}
if wanted "$rounds" baseline; then baseline_round; fi
if wanted "$rounds" rope-heads; then
  round rope-heads "decode RoPE on the head-loop kernel, $heads head(s) a block" "rope_heads=$heads"
fi
if wanted "$rounds" norm-gemv; then
  round norm-gemv "the input RMSNorm in the QKV GEMV's K loop" "norm_gemv=1"
fi
if wanted "$rounds" rope-gemv; then
  round rope-gemv "decode RoPE in the norm + QKV GEMV's epilogue" "norm_gemv=1" "rope_gemv=1"
fi
if wanted "$rounds" kv-gemv; then
  round kv-gemv "the static-cache write in the norm + QKV + RoPE GEMV too" "norm_gemv=1" \
    "rope_gemv=2"
fi
if wanted "$rounds" norm-gemv-mlp; then
  round norm-gemv-mlp "the post-attention RMSNorm in the gate/up GEMV's K loop too" "norm_gemv=2"
fi
