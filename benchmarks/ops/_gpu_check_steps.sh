# STEPS and COMMIT of the per-family GPU check scripts (sourced first, before anything runs):
# STEPS ("checks e2e" by default) holds only "checks" and "e2e"; an "e2e" step needs COMMIT as
# 40 hex digits (the GPU host has no .git). A bad value is one line and exit 2.
# shellcheck shell=bash

STEPS="${STEPS:-checks e2e}"
for step in $STEPS; do
    case "$step" in
    checks | e2e) ;;
    *)
        echo "error: STEPS='$STEPS': each step is 'checks' or 'e2e'" >&2
        exit 2
        ;;
    esac
done
if [[ " $STEPS " == *" e2e "* ]]; then
    COMMIT="${COMMIT:-$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse HEAD 2>/dev/null)}"
    if ! [[ "$COMMIT" =~ ^[0-9a-f]{40}$ ]]; then
        echo "error: COMMIT='$COMMIT' is not a 40-hex commit (no .git here: pass COMMIT=\$(git rev-parse HEAD))" >&2
        exit 2
    fi
fi
