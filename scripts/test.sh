#!/usr/bin/env bash
# Set up the environment, then run the whole test suite (GPU tests skip without a GPU).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup.sh"
cd "$root"
exec .venv/bin/python -m pytest "$@"
