#!/usr/bin/env bash
# One model family through the real local loop (tilegym-bot experiment run): the ledger a
# family's loop leaves, with kept and discarded experiments, on a throwaway repository made
# from this checkout's sources.
#
#   bash benchmarks/loop/family_loop.sh OUT_DIR MODEL_KEY [bench args...]
#
# The repository's main starts the family with attention and the GEMMs in PyTorch (its
# MODEL_PATCH_KWARGS entry: attn and linear off); then four rounds, each the one-line flag
# change an experiment on that model may make:
#   baseline        main as it is (the ledger's first row)
#   cutile-linear   every projection on the cuTile GEMMs        (expected: keep)
#   cutile-attn     attention and the KV-cache write on cuTile  (expected: keep)
#   drop-rope       RoPE back to PyTorch                        (expected: discard, coverage)
# OUT_DIR gets each round's decision, the bot's stderr, PR comment and metrics, the ledger
# (ledger.md) and its plot (ledger.png), both rewritten after every round. LOOP_ROUNDS
# (default: all four, in order) runs some rounds now and the rest in a later call on the same
# OUT_DIR (its repository carries the state). On a GPU host source .gpu/activate.sh first (pin
# a GPU with CUDA_VISIBLE_DEVICES to run families side by side); without a GPU pass
# `--model-key tiny-<key> --device cpu`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=lib.sh
source "$root/benchmarks/loop/lib.sh"
model_loop_start family_loop.sh "$@"

rounds="baseline cutile-linear cutile-attn drop-rope"
if [ "$(git -C "$repo" rev-list --count HEAD)" = 1 ]; then
  flags attn=False linear=False
  git -C "$repo" commit -qam "$key: attention and GEMMs in PyTorch (the loop's starting point)"
fi
if wanted "$rounds" baseline; then baseline_round; fi
if wanted "$rounds" cutile-linear; then
  round cutile-linear "every projection on the cuTile GEMMs" linear=True
fi
if wanted "$rounds" cutile-attn; then
  round cutile-attn "attention and the KV-cache write on cuTile" attn=True
fi
if wanted "$rounds" drop-rope; then round drop-rope "RoPE back to PyTorch" rope=False; fi
