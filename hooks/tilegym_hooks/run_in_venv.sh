#!/usr/bin/env bash
# Run a console script of the project's Python environment: pre-commit's local hooks call this.
#
# pre-commit runs `language: system` entries with the caller's PATH, which lacks the venv's bin/
# when pre-commit is started as `.venv/bin/pre-commit` (or from a git hook) without activating
# the venv. So look in order: the activated venv, the repository's .venv (scripts/setup.sh), PATH.
set -euo pipefail
tool=${1:?usage: run_in_venv.sh TOOL [ARGS...]}
shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
for candidate in ${VIRTUAL_ENV:+"$VIRTUAL_ENV/bin/$tool"} "$root/.venv/bin/$tool"; do
  if [ -x "$candidate" ]; then
    exec "$candidate" "$@"
  fi
done
if command -v "$tool" >/dev/null 2>&1; then
  exec "$tool" "$@"
fi
echo "error: $tool not found: run scripts/setup.sh (creates .venv) or activate the project's environment" >&2
exit 1
