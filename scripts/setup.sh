#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv and install everything the
# tools and tests need. Idempotent: a second run only re-checks the install.
# A host that already has torch (a GPU host) keeps it: the venv then sees the system packages.
# TILEGYM_VENV picks another venv folder and TILEGYM_TRANSFORMERS_SPEC pins transformers in it
# (CI uses both to test the oldest transformers the project claims).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
venv=${TILEGYM_VENV:-.venv}
py=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  if "$py" -c "import torch" >/dev/null 2>&1; then
    echo "setup: reusing the host's torch ($("$py" -c 'import torch; print(torch.__version__)'))"
    "$py" -m venv --system-site-packages "$venv"
  else
    echo "setup: creating $venv"
    "$py" -m venv "$venv"
  fi
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
  # No GPU here: the CPU build is enough (and is what this project's CI machine has on disk).
  echo "setup: installing ${TILEGYM_TORCH_SPEC:-torch==2.13.0} (CPU build; about a minute)"
  "${pip[@]}" install "${TILEGYM_TORCH_SPEC:-torch==2.13.0}"
fi
stamp=$venv/.tilegym-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing the project and its dev tools into $venv (about a minute)"
  "${pip[@]}" install -e ".[dev]" ${TILEGYM_TRANSFORMERS_SPEC:+"$TILEGYM_TRANSFORMERS_SPEC"}
  touch "$stamp"
fi
echo "setup: $venv ready ($("$venv/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
