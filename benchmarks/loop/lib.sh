# Shared by the scripted loops (sourced, not run): a throwaway git repository made from this
# checkout's sources, and one experiment round through `tilegym-bot experiment run`.
#
# The caller sets: out (a directory for the results), repo (the throwaway repository), root
# (this checkout), and calls `loop_repo` once, then `loop_run` per experiment. LOOP_RUN_ARGS
# (words) go to every `experiment run`, e.g. "--sampling-budget 240" to cap each round.

bot=()

loop_repo() {  # the throwaway repository: this checkout's sources, one commit on main
  bot=(python3 -m tilegym_bot -C "$repo")
  if [ ! -d "$repo/.git" ]; then
    mkdir -p "$repo"
    local d
    for d in src modeling/transformers/src bot hooks; do
      mkdir -p "$repo/$(dirname "$d")"
      cp -r "$root/$d" "$repo/$d"
    done
    find "$repo" -name __pycache__ -prune -exec rm -rf {} +
    mkdir -p "$repo/sandbox" && printf '*\n!.gitignore\n' > "$repo/sandbox/.gitignore"
    git -C "$repo" init -q -b main
    git -C "$repo" -c user.name=loop -c user.email=loop@tilegym.invalid add -A
    git -C "$repo" -c user.name=loop -c user.email=loop@tilegym.invalid commit -qm main
  fi
  git -C "$repo" config user.name loop
  git -C "$repo" config user.email loop@tilegym.invalid
}

loop_run() {  # NAME DESCRIPTION [experiment-run flags] -- [bench args]: one round, then advance
  local name=$1 description=$2; shift 2
  local t0=$SECONDS status=0
  # shellcheck disable=SC2086  # LOOP_RUN_ARGS is a word list
  "${bot[@]}" experiment run --description "$description" ${LOOP_RUN_ARGS:-} "$@" \
    > "$out/$name.decision.json" 2> "$out/$name.stderr" || status=$?
  printf '== %s: exit %s after %s s\n' "$name" "$status" "$((SECONDS - t0))"
  tail -n 5 "$out/$name.stderr"
  cat "$out/$name.decision.json"
  local run
  for run in "$repo"/sandbox/runs/*-"$name"-*/; do
    [ -f "$run/metrics.json" ] && cp "$run/metrics.json" "$out/$(basename "$run").metrics.json"
  done
  local report
  report=$(find "$repo/.git/tilegym-bot/prs" -name '*.md' 2>/dev/null | sort -V | tail -n 1)
  [ "$status" = 0 ] && [ -n "$report" ] && cp "$report" "$out/$name.comment.md"
  "${bot[@]}" experiment advance >/dev/null 2>&1 || "${bot[@]}" experiment reset >/dev/null 2>&1 || true
  return 0
}
