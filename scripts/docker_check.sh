#!/usr/bin/env bash
# The Docker runner against a real engine, from nothing: start an engine unless one answers
# (root; vfs storage, no bridge), make the Debian base and the CPU experiment image (or reuse
# them from ~/.cache/tilegym/docker), check them with `tilegym-bot doctor`, then run the
# `docker`-marked tests: the real bench of tiny-qwen3 in the container and every limit the
# runner promises, each against the engine. An engine this script started is stopped at the end
# (TILEGYM_DOCKER_KEEP_ENGINE=1 leaves it running).
#
#   bash scripts/docker_check.sh [--prepare-only | --tests-only] [pytest args]
#
# --prepare-only stops after the doctor (engine left running); --tests-only runs the tests on an
# engine and image that are there (.ci/run prepares under a time limit, then tests).
set -euo pipefail
mode=all
case "${1:-}" in
  --prepare-only) mode=prepare; shift ;;
  --tests-only) mode=tests; shift ;;
esac
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
t0=$SECONDS
image=${TILEGYM_IMAGE:-tilegym-experiment:cpu}
export TILEGYM_IMAGE=$image

[ -x .venv/bin/python ] || bash scripts/setup.sh

if [ "$mode" = tests ]; then
  TILEGYM_DOCKER_REQUIRED=1 .venv/bin/python -m pytest -m docker -p no:cacheprovider \
    tests/automation/test_docker_engine.py "$@"
  echo "docker check: tests green in $((SECONDS - t0)) s"
  exit 0
fi
started=$(bash scripts/docker_base.sh engine)
pid=${started#STARTED }
if [ -n "$started" ] && [ -z "${TILEGYM_DOCKER_KEEP_ENGINE:-}" ] && [ "$mode" = all ]; then
  # shellcheck disable=SC2064  # expand now: the pid is known
  trap "bash scripts/docker_base.sh stop $pid" EXIT
fi
bash scripts/docker_base.sh base
.venv/bin/python scripts/docker_image.py --tag "$image" >/dev/null
echo "docker check: engine and image ready after $((SECONDS - t0)) s"

skips=(--skip gpu --skip cuda-tile --skip toolchain --skip profilers --skip git)
.venv/bin/tilegym-bot doctor --image "$image" "${skips[@]}"
if [ "$mode" = prepare ]; then
  echo "docker check: prepared in $((SECONDS - t0)) s${started:+ (engine $started left running)}"
  exit 0
fi

TILEGYM_DOCKER_REQUIRED=1 .venv/bin/python -m pytest -m docker -p no:cacheprovider \
  tests/automation/test_docker_engine.py "$@"
echo "docker check: green in $((SECONDS - t0)) s"
