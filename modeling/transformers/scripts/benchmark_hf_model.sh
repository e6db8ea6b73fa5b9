#!/usr/bin/env bash
# One benchmark of one model (DESIGN.md "Benchmark output"). Run from modeling/transformers/:
#   bash scripts/benchmark_hf_model.sh --model-key qwen3 [--workload decode] [--mode static]
#     [--metrics-out m.json]
# --mode eager (default) times eager generate(); --mode static a static KV cache with the compiled
# decode step (CUDA graphs), where the kernels rather than the host set the pace.
# Every flag goes to tilegym-hf-bench unchanged. Uses the project's .venv when there is one,
# otherwise the python on PATH with this checkout's packages on PYTHONPATH.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../.." && pwd)
if [ -x "$root/.venv/bin/python" ]; then
  python="$root/.venv/bin/python"
else
  python=${PYTHON:-python3}
fi
export PYTHONPATH="$root/modeling/transformers/src:$root/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" -m tilegym_hf_bench._cli "$@"
