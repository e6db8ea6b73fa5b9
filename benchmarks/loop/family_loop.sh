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
if [ $# -lt 2 ]; then
  echo "error: usage: family_loop.sh OUT_DIR MODEL_KEY [bench args...]" >&2
  exit 2
fi
out=$(realpath -m "$1"); key=$2; shift 2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
repo=$(realpath -m "${LOOP_REPO:-$out/repo}")
mkdir -p "$out"
# shellcheck source=lib.sh
source "$root/benchmarks/loop/lib.sh"
loop_repo

flags() {  # FLAG=VALUE...: set this family's MODEL_PATCH_KWARGS flags in the repository
  python3 "$root/benchmarks/loop/set_patch_flags.py" \
    "$repo/modeling/transformers/src/tilegym_hf_bench/tilegym_patch.py" "$key" "$@"
}

save_ledger() {  # the ledger and its plot as they stand: a loop cut off later keeps these rounds
  [ -f "$repo/sandbox/${key}_results.md" ] || return 0
  cp "$repo/sandbox/${key}_results.md" "$out/ledger.md.tmp" && mv "$out/ledger.md.tmp" "$out/ledger.md"
  "${bot[@]}" ledger show --model-key "$key" --plot "$out/ledger.png" > /dev/null
}

wanted() { [[ " ${LOOP_ROUNDS:-baseline cutile-linear cutile-attn drop-rope} " == *" $1 "* ]]; }

round() {  # NAME DESCRIPTION FLAG=VALUE...: an experiment that flips flags, then its round
  local name=$1 description=$2; shift 2
  wanted "$name" || return 0
  "${bot[@]}" experiment start --model-key "$key" --name "$name"
  flags "$@"
  git -C "$repo" commit -qam "$key: $description"
  loop_run "$name" "$description" -- "${bench[@]}"
  save_ledger
}

bench=("$@")
if [ "$(git -C "$repo" rev-list --count HEAD)" = 1 ]; then
  flags attn=False linear=False
  git -C "$repo" commit -qam "$key: attention and GEMMs in PyTorch (the loop's starting point)"
fi
if wanted baseline; then
  "${bot[@]}" experiment start --model-key "$key" --name baseline
  loop_run baseline "main as it is" -- "${bench[@]}"
  save_ledger
fi
round cutile-linear "every projection on the cuTile GEMMs" linear=True
round cutile-attn "attention and the KV-cache write on cuTile" attn=True
round drop-rope "RoPE back to PyTorch" rope=False
