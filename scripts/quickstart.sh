#!/usr/bin/env bash
# Set up .venv, then run the main job once: one experiment (benchmark + decision) through the
# embedded local forge, on a throwaway clone of this repository's main under sandbox/quickstart/.
#
#   bash scripts/quickstart.sh [MODEL_KEY]      (default qwen3)
#
# With a usable GPU the model's real preset is benchmarked; without one the CPU path runs the
# tiny preset of the same family and the output says what could not be measured.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup.sh"
model_key=${1:-qwen3}
bot="$root/.venv/bin/tilegym-bot"
py="$root/.venv/bin/python"

if "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  bench=(--model-key "$model_key" --device cuda)
  echo "quickstart: GPU found, benchmarking the $model_key preset"
else
  bench=(--model-key "tiny-$model_key" --device cpu)
  echo "quickstart: no GPU here: running the CPU path with the tiny-$model_key preset."
  echo "quickstart: cuTile throughput and kernel coverage need a CUDA GPU and are reported as not measured."
fi

work="$root/sandbox/quickstart"
rm -rf "$work/repo"
mkdir -p "$work"
git clone -q "$root" "$work/repo"
cd "$work/repo"
git config user.name >/dev/null || git config user.name "tilegym quickstart"
git config user.email >/dev/null || git config user.email "quickstart@tilegym.invalid"
"$bot" experiment start --model-key "$model_key" --name quickstart
"$bot" experiment run --description "quickstart: main as it is" -- "${bench[@]}"
echo "quickstart: that run measured main as it is (the branch has no commits of its own): its"
echo "quickstart: \"status\" is the ledger's baseline row, the reference later experiments are compared"
echo "quickstart: with, not a verdict on an experiment. Without a GPU an experiment's verdict is inconclusive."
"$bot" ledger show --model-key "$model_key"
echo "quickstart: the experiment repository, its ledger and the PR record are in $work/repo"
