#!/usr/bin/env bash
# Several families' loops at once, one GPU each (family_loop.sh per key, CUDA_VISIBLE_DEVICES
# = its position in the list), for a multi-GPU host.
#
#   bash benchmarks/loop/families_on_gpus.sh OUT_DIR KEY[,KEY...] [bench args...]
#
# OUT_DIR/<key>/ is each family's family_loop.sh output and OUT_DIR/<key>.log its console.
# LOOP_ROUNDS passes through. Exits non-zero if any family's script did.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "error: usage: families_on_gpus.sh OUT_DIR KEY[,KEY...] [bench args...]" >&2
  exit 2
fi
out=$(realpath -m "$1"); IFS=, read -r -a keys <<< "$2"; shift 2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$out"
pids=()
for i in "${!keys[@]}"; do
  key=${keys[$i]}
  CUDA_VISIBLE_DEVICES=$i bash "$here/family_loop.sh" "$out/$key" "$key" "$@" \
    > "$out/$key.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    echo "${keys[$i]}: done"
  else
    echo "${keys[$i]}: failed, see $out/${keys[$i]}.log" >&2
    status=1
  fi
done
exit $status
