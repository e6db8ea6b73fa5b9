# Shared by the scripted loops (sourced, not run): a throwaway git repository made from this
# checkout's sources, and one experiment round through `tilegym-bot experiment run`.
#
# The caller sets: out (a directory for the results), repo (the throwaway repository), root
# (this checkout), and calls `loop_repo` once (a one-model loop: `model_loop_start`, which sets
# them from its arguments), then `loop_run` per experiment. LOOP_RUN_ARGS
# (words) go to every `experiment run`, e.g. "--sampling-budget 240" to cap each round. A
# one-model loop also sets key (the model key) and bench (the bench args) and runs its
# experiments as `round`s: each the change of some MODEL_PATCH_KWARGS entries, as an experiment
# on that model may make; LOOP_ROUNDS (default: every round) names the rounds to run now.

bot=()

model_loop_start() {  # SCRIPT "$@": a one-model loop's arguments (OUT_DIR MODEL_KEY [bench
  # args...]) into out, key, bench and repo (LOOP_REPO, default OUT_DIR/repo), then its repository
  if [ $# -lt 3 ]; then
    echo "error: usage: $1 OUT_DIR MODEL_KEY [bench args...]" >&2
    exit 2
  fi
  out=$(realpath -m "$2"); key=$3; bench=("${@:4}")
  repo=$(realpath -m "${LOOP_REPO:-$out/repo}")
  mkdir -p "$out"
  loop_repo
}

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

flags() {  # FLAG=VALUE...: set this model's MODEL_PATCH_KWARGS entries in the repository
  python3 "$root/benchmarks/loop/set_patch_flags.py" \
    "$repo/modeling/transformers/src/tilegym_hf_bench/tilegym_patch.py" "$key" "$@"
}

save_ledger() {  # the ledger and its plot as they stand: a loop cut off later keeps these rounds
  [ -f "$repo/sandbox/${key}_results.md" ] || return 0
  cp "$repo/sandbox/${key}_results.md" "$out/ledger.md.tmp" && mv "$out/ledger.md.tmp" "$out/ledger.md"
  "${bot[@]}" ledger show --model-key "$key" --plot "$out/ledger.png" > /dev/null
}

wanted() { [[ " ${LOOP_ROUNDS:-$1} " == *" $2 "* ]]; }  # EVERY-ROUND NAME

baseline_round() {  # the ledger's first row: the repository's main as it is
  "${bot[@]}" experiment start --model-key "$key" --name baseline
  loop_run baseline "main as it is" -- "${bench[@]}"
  save_ledger
}

round() {  # NAME DESCRIPTION FLAG=VALUE...: an experiment that sets entries, then its round
  local name=$1 description=$2; shift 2
  "${bot[@]}" experiment start --model-key "$key" --name "$name"
  flags "$@"
  git -C "$repo" commit -qam "$key: $description"
  loop_run "$name" "$description" -- "${bench[@]}"
  save_ledger
}
