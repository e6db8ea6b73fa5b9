#!/usr/bin/env bash
# Set up the environment, then run the tests (tests marked `gpu` skip without a GPU).
#   bash scripts/test.sh [pytest args]        the fast tier: a few minutes on a 2-core machine
#   bash scripts/test.sh --all [pytest args]  also the slow tier (tests marked `slow`: every
#                                             Solution's AOT compile for every target, long
#                                             end-to-end CPU runs); compiles are cached by
#                                             content, so a second run with nothing changed is quick
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tier=()
if [ "${1:-}" = "--all" ]; then
  tier=(--slow)
  shift
fi
bash "$root/scripts/setup.sh"
cd "$root"
exec .venv/bin/python -m pytest ${tier[@]+"${tier[@]}"} "$@"
