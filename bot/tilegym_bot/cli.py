"""``tilegym-bot``: decide on metrics, drive the local experiment loop, show/rebuild the ledger.

Exit codes (docs/DESIGN.md): 0 done (any verdict), 1 refused or failed, 2 usage / unreadable input.
Every error is one ``error: ...`` line (after any ``path:line: CODE`` findings), never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path

import git

from tilegym_bot.errors import BotError
from tilegym_bot.policy import DEFAULT_GPU_TIME_MARGIN


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage block
        print(f"error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


class _UsageError(BotError):
    """Bad input files or values: exit 2 like argparse's usage errors."""


def _margin(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1): {text}")
    return value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


# ---- decide -----------------------------------------------------------------------------------
def _summary_text(decision) -> str:
    d = decision.to_json()
    cov, tp, gpu = d["coverage"], d["throughput"], d["gpu_time_ms_per_token"]

    def num(v, fmt="{:.2f}"):
        """Unmeasured values read ``n/a`` (never 0 or ``n/a%``), as in the ledger."""
        return "n/a" if v is None else fmt.format(v)

    pct = "{:.2f}%"

    ci = tp["ratio_ci95"]
    lines = [
        f"verdict: {d['status']} (ledger: {d['ledger_status']})"
        + (f", kept by the {d['kept_by']} rule" if d["kept_by"] else ""),
        *[f"  - {r}" for r in d["reasons"]],
        f"coverage: {num(cov['base'], pct)} → {num(cov['head'], pct)} "
        f"(Δ {num(cov['delta_pp'], '{:+.2f} pp')})",
        f"cuTile throughput: {num(tp['base'])} → {num(tp['head'])} tokens/s, ratio "
        f"{num(tp['ratio'], '{:.3f}')}" + (f" (95% CI {ci[0]:.3f}–{ci[1]:.3f})" if ci else ""),
        f"GPU kernel time per token: {num(gpu['base'], '{:.4f}')} → "
        f"{num(gpu['head'], '{:.4f}')} ms (non-cuTile {num(gpu['non_cutile_base'], '{:.4f}')} → "
        f"{num(gpu['non_cutile_head'], '{:.4f}')} ms)",
    ]
    return "\n".join(lines)


def _cmd_decide(args) -> int:
    from tilegym_bot.metrics_file import load_metrics
    from tilegym_bot.policy import decide

    try:
        base, head = load_metrics(args.base), load_metrics(args.head)
    except BotError as exc:
        raise _UsageError(str(exc)) from exc
    decision = decide(
        base,
        head,
        margin=args.margin,
        rerun=args.rerun,
        gpu_margin=args.gpu_margin,
        base_kernels=_tree_kernels(args.repo, base, args.base, args.trust_metrics),
        head_kernels=_tree_kernels(args.repo, head, args.head, args.trust_metrics),
    )
    print(json.dumps(decision.to_json(), indent=2) if args.json else _summary_text(decision))
    return 0


def _tree_kernels(repo: Path, doc, path: Path, trust: bool) -> frozenset[str] | None:
    """The @ct.kernel names of the commit a metrics file measured, read from ``repo``. Without
    that commit, coverage could only trust the file's own kernel list, so it is refused unless
    ``--trust-metrics`` says to (None: every demangled cuTile symbol counts)."""
    from tilegym_hooks.git_io import GitError

    from tilegym_bot.policy import dig
    from tilegym_bot.trusted_tree import kernel_names_at

    commit = dig(doc, "commit")
    if not (isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{40}", commit)):
        return None  # not a metrics file by the schema: the policy refuses it with the reason
    try:
        return kernel_names_at(repo, commit)
    except (GitError, git.GitError) as exc:
        if not trust:
            raise BotError(
                f"{path}: {exc}, so the measured tree's kernels cannot be read: pass --repo "
                "with the repository that has it, or --trust-metrics to count every cuTile "
                "symbol the file reports"
            ) from None
        print(
            f"warning: {path}: {exc}; --trust-metrics: coverage is recounted without the "
            "measured tree's kernel names (every demangled cuTile symbol counts)",
            file=sys.stderr,
        )
        return None


# ---- experiment -------------------------------------------------------------------------------
def _forge(args):
    from tilegym_bot.forge.local import LocalForge

    return LocalForge(args.repo)


def _cmd_start(args) -> int:
    from tilegym_bot import experiment

    branch = experiment.start(_forge(args), args.model_key, args.name)
    print(f"on {branch}: commit the experiment, then `tilegym-bot experiment run`")
    return 0


def _cmd_model_init(args) -> int:
    from tilegym_bot import model_init

    architecture = args.architecture or args.model_type
    branch, result = model_init.init(
        args.repo, args.model_type, args.config, args.key, architecture
    )
    found = "; ".join(result.notes) or "the Llama decoder layer as it is"
    print(f"on {branch}: {result.model_type} scaffolded ({found}); files:")
    for path in result.files:
        print(f"  {path}")
    print(
        f"next: run the tests (the family tests cover {result.model_type}), benchmark "
        f"`--model-key {result.key}` on a GPU, merge {branch} into main, then "
        f"`tilegym-bot experiment start --model-key {result.key} --name ...`"
    )
    return 0


def _cmd_run(args) -> int:
    from tilegym_bot import experiment
    from tilegym_bot.bench import BenchConfig

    if args.base_metrics and not args.head_metrics:
        raise _UsageError("--base-metrics needs --head-metrics")
    outcome = experiment.run(
        _forge(args),
        description=args.description,
        base_metrics=args.base_metrics,
        head_metrics=args.head_metrics,
        bench=BenchConfig(
            [*(args.bench_arg or []), *args.bench_args],
            args.timeout,
            args.gpu_uuid,
            args.sampling_budget,
        ),
        margin=args.margin,
        reuse_base=not args.fresh_base,
    )
    for message in outcome.messages:
        print(message, file=sys.stderr)
    print(
        f"PR record #{outcome.record['number']}: {outcome.record['report_path']}", file=sys.stderr
    )
    if outcome.record.get("baseline"):
        print(baseline_note(outcome.record), file=sys.stderr)
    print(json.dumps(outcome.decision.to_json(), indent=2))
    return 0


def baseline_note(record) -> str:
    """What a baseline run's output means: its ``status`` is the ledger's reference row for
    main, which later experiments are compared with, not a verdict on an experiment."""
    status = record["decision"]["ledger_status"]
    return (
        f"baseline: main ({record['head_sha'][:8]}) measured as it is and recorded as the first "
        f"row of the {record['model_key']} ledger, the reference later experiments are compared "
        f'with; "status": "{status}" below is that row\'s, not a verdict on an experiment'
    )


def _cmd_advance(args) -> int:
    from tilegym_bot import experiment

    print(experiment.advance(_forge(args)))
    return 0


def _cmd_reset(args) -> int:
    from tilegym_bot import experiment

    print(experiment.reset(_forge(args)))
    return 0


# ---- ledger -----------------------------------------------------------------------------------
def _cmd_ledger_show(args) -> int:
    from tilegym_bot import ledger
    from tilegym_bot.experiment import MODEL_KEY_RE
    from tilegym_bot.forge.local import LocalForge

    if not MODEL_KEY_RE.fullmatch(args.model_key):
        raise _UsageError(f"model key {args.model_key!r} is not a transformers submodule name")
    path = ledger.ledger_path(LocalForge(args.repo).store_root, args.model_key)
    try:
        rows = ledger.read(path)
    except ledger.LedgerError as exc:
        raise BotError(f"{path} is malformed", [str(f) for f in exc.findings]) from exc
    if not rows:
        print(f"no experiments recorded yet for {args.model_key} ({path})", file=sys.stderr)
    print(ledger.render(rows), end="")
    if args.plot:
        from tilegym_bot.plot import plot_ledger

        plot_ledger(rows, args.plot, title=f"{args.model_key}: cuTile coverage and throughput")
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0


def _cmd_ledger_rebuild(args) -> int:
    from tilegym_bot import ledger
    from tilegym_bot.forge.local import LocalForge
    from tilegym_bot.rebuild import rows_from_records

    root = LocalForge(args.repo).store_root
    if args.github:
        from tilegym_bot.forge.github import GitHubForge

        records = GitHubForge(args.github).records()
    else:
        from tilegym_bot.rebuild import local_records

        records = local_records(LocalForge(args.repo))
    rows = rows_from_records(records, args.model_key)
    path = ledger.ledger_path(root, args.model_key)
    ledger.rewrite(path, rows)
    print(f"{path}: {len(rows)} rows rebuilt from {'GitHub' if args.github else 'local'} PRs")
    return 0


def _cmd_github_apply(args) -> int:
    from tilegym_bot.forge.github import GitHubForge, apply_artifact

    if not args.artifact.is_dir():
        raise _UsageError(f"--artifact {args.artifact} is not a folder")
    result = apply_artifact(
        GitHubForge(args.repo),
        args.artifact,
        run_id=args.run_id,
        checkout=args.checkout,
        margin=args.margin,
        rerun=True if args.rerun else None,
    )
    for action in result.actions:
        print(action, file=sys.stderr)
    if args.report_out and result.comment:
        args.report_out.parent.mkdir(parents=True, exist_ok=True)
        args.report_out.write_text(result.comment, encoding="utf-8")
    if args.github_output:
        with args.github_output.open("a", encoding="utf-8") as fh:
            fh.write(f"outcome={result.outcome}\npr={result.pr_number or ''}\n")
    print(json.dumps(result.to_json(), indent=2))
    if result.failure:
        raise BotError(result.failure, result.refusals)
    return 0


def _run_id(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a workflow run id: {text!r}")
    return int(text)


RUN_HELP = """\
Benchmark main (base) and this branch's HEAD (or take --base-metrics/--head-metrics), decide,
and record the PR under .git/tilegym-bot/prs/. keep: merge into main (merge commit, the working
tree is not touched). Anything else: main untouched, the branch is kept as the tag
experiment-archive/<model_key>/<slug>, its Definitions/Solutions are copied to
sandbox/<model_key>/drafts/<slug>/. Either way one ledger row is appended. The first run of a
model with no ledger also records main as the baseline row (a branch without commits records
only that). inconclusive: the benchmark is repeated once with twice the samples (the first
round is recorded before, so an interrupted rerun resumes with the next run); with metrics
files, run again with the rerun's files. Refuses, changing nothing, when the tree is dirty, the
branch is not experiment/<model_key>/<slug>, main moved and the merge would conflict, or a
metrics file is of another tree. Running it again for the same branch and SHA changes nothing.
A keep merges only while main is still the main it was measured against: if another keep
landed since, nothing is merged, the PR record is open again and the run exits 1 with
`error: rebench: ...` (run it again: it benchmarks against the new main). --description is
one line. Orphaned benchmark worktrees of killed runs are pruned first; one run of a branch
at a time. The ledger, sandbox/ and PR records are the repository's (its main working tree
and git common dir), whatever worktree runs this.
The head is benchmarked first; a stored run in sandbox/runs/ of main's tree (after a discard
main is unchanged, after a keep its tree is the merged head) with the same model, workload, GPU
and versions is reused as the base instead of benchmarking main again (--fresh-base: do not).
Benchmark flags go after --, e.g. `-- --device cuda --timed-runs 10` (or --bench-arg=--device
--bench-arg=cuda); --timed-runs is replaced by twice the first run's count on the rerun."""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tilegym-bot",
        description="Decide on benchmark metrics, drive the experiment loop, keep the ledger.",
    )
    parser.add_argument(
        "-C",
        dest="repo",
        type=Path,
        default=Path("."),
        help="run as if started in this directory (default: .)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "decide",
        help='decision on two metrics files (the rules: docs/DESIGN.md, "Decision")',
        description="Keep/discard decision on the metrics of main (--base) and of the experiment "
        '(--head), by the rules in docs/DESIGN.md, section "Decision".',
    )
    p.add_argument("--base", type=Path, required=True, help="metrics of main")
    p.add_argument("--head", type=Path, required=True, help="metrics of the experiment")
    p.add_argument("--json", action="store_true", help="print the decision JSON")
    p.add_argument("--margin", type=_margin, default=0.02, help="throughput margin (default 0.02)")
    p.add_argument(
        "--gpu-margin",
        type=_margin,
        default=DEFAULT_GPU_TIME_MARGIN,
        help=f"allowed rise of GPU kernel time per token (default {DEFAULT_GPU_TIME_MARGIN})",
    )
    p.add_argument(
        "--repo",
        type=Path,
        default=Path("."),
        help="repository holding the measured commits: their @ct.kernel functions decide what "
        "coverage counts (default: .)",
    )
    p.add_argument(
        "--rerun",
        action="store_true",
        help="these metrics are the rerun with twice the samples: "
        "a still unclear throughput drop becomes discard",
    )
    p.add_argument(
        "--trust-metrics",
        action="store_true",
        help="decide even when --repo lacks a measured commit (refused otherwise): coverage "
        "then counts every cuTile symbol the files report",
    )
    p.set_defaults(func=_cmd_decide)

    exp = sub.add_parser(
        "experiment",
        help="the local experiment loop",
        description="start → commit the kernel → run (decide, merge or archive, ledger row) → "
        "advance (back to main); reset abandons an undecided experiment.",
    )
    esub = exp.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = esub.add_parser(
        "start",
        help="cut experiment/<model_key>/<name> from main",
        description="Create and check out experiment/<model_key>/<name> from "
        "main. Refuses a dirty tree, a used name, or a model key without a benchmark preset "
        "and a cuTile patch entry (the error lists the known keys), before changing anything.",
    )
    p.add_argument(
        "--model-key",
        required=True,
        help="a model with a benchmark preset and a patch entry, e.g. qwen3 or llama",
    )
    p.add_argument("--name", required=True, help="slug: lowercase letters, digits, . _ -")
    p.set_defaults(func=_cmd_start)
    p = esub.add_parser(
        "run",
        help="benchmark, decide, merge or archive, ledger row",
        description=RUN_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--description", required=True, help="what this experiment kernelized")
    p.add_argument("--base-metrics", type=Path, help="metrics of main (skip benchmarking)")
    p.add_argument("--head-metrics", type=Path, help="metrics of HEAD (skip benchmarking)")
    p.add_argument("--timeout", type=_positive, default=900.0, help="per benchmark, seconds")
    p.add_argument("--gpu-uuid", help="pin the benchmark to this GPU")
    p.add_argument(
        "--bench-arg",
        action="append",
        metavar="ARG",
        help="extra tilegym-hf-bench argument (repeat; use --bench-arg=--flag)",
    )
    p.add_argument("--margin", type=_margin, default=0.02, help="throughput margin (default 0.02)")
    p.add_argument(
        "--fresh-base",
        action="store_true",
        help="benchmark main even when a stored run of its tree can be reused",
    )
    p.add_argument(
        "--sampling-budget",
        type=float,
        default=900.0,
        metavar="S",
        help="seconds the sequential sampling may spend on base/head pairs (default 900; "
        "0: the fixed scheme, one pair and a rerun with twice the runs when in doubt)",
    )
    p.add_argument(
        "bench_args",
        nargs="*",
        metavar="-- BENCH_ARG",
        help="tilegym-hf-bench arguments after --, e.g. -- --device cuda",
    )
    p.set_defaults(func=_cmd_run)
    p = esub.add_parser(
        "advance",
        help="after a decision: back to main, delete the branch",
        description="After `experiment run` decided: check out main and delete "
        "the experiment branch (merged into main, or kept as its "
        "archive tag). Refuses an undecided branch or a dirty tree.",
    )
    p.set_defaults(func=_cmd_advance)
    p = esub.add_parser(
        "reset",
        help="abandon the undecided experiment (archived as a tag)",
        description="Abandon the current undecided experiment: tag its commits "
        "as experiment-archive/<model_key>/<slug>, copy its drafts "
        "to sandbox/, check out main, delete the branch. No ledger "
        "row. Refuses a dirty tree (never throws work away).",
    )
    p.set_defaults(func=_cmd_reset)

    mod = sub.add_parser("model", help="add a model family")
    msub = mod.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = msub.add_parser(
        "init",
        help="scaffold a family from the existing ops (refused by name when they do not cover it)",
        description="Describe MODEL_TYPE for the shared decoder glue, check on the CPU that the "
        "patched model reproduces the upstream one, and commit the family, its presets and its "
        "patch flags on a new branch model/<key> cut from main.",
    )
    p.add_argument("model_type", help="transformers model type (config.model_type), e.g. mistral")
    p.add_argument("--config", type=Path, help="the checkpoint's config.json (default: defaults)")
    p.add_argument("--key", help="preset key (default: the model type)")
    p.add_argument("--architecture", help="what the config reproduces, e.g. org/checkpoint")
    p.set_defaults(func=_cmd_model_init)

    led = sub.add_parser("ledger", help="the experiment ledger sandbox/<model_key>_results.md")
    lsub = led.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = lsub.add_parser("show", help="print the ledger")
    p.add_argument("--model-key", required=True)
    p.add_argument("--plot", type=Path, help="also write a PNG of coverage and throughput")
    p.set_defaults(func=_cmd_ledger_show)
    p = lsub.add_parser("rebuild", help="regenerate the ledger from the PR records/comments")
    p.add_argument("--model-key", required=True)
    p.add_argument(
        "--github",
        metavar="OWNER/NAME",
        help="read the bot comments of this GitHub repository (GITHUB_TOKEN, "
        "GITHUB_API_URL) instead of the local PR records",
    )
    p.set_defaults(func=_cmd_ledger_rebuild)

    gh = sub.add_parser("github", help="act on a GitHub pull request")
    gsub = gh.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = gsub.add_parser(
        "apply",
        help="check a benchmark artifact, decide, merge or close, comment, label, ledger row",
        description="Act on the gpu-benchmark workflow run --run-id and its downloaded artifact "
        "(--artifact: pr.json, base.json, head.json). Refuses (exit 1, nothing written) a run "
        "that is not the default branch's .github/workflows/gpu-benchmark.yml for a pull "
        "request, or an artifact that disagrees with the API (PR found by the run's head SHA, "
        "base on the default branch). Refuses and closes a PR whose diff breaks main's scope "
        "rules or touches .github/. Otherwise: keep is squash-merged (sha= the head) while the "
        "default branch is still the benchmarked base (else labelled autokernel:rebench), other "
        "verdicts close the PR (a first inconclusive stays open for the rerun); then the sticky "
        "comment and label say what happened, and the ledger row goes to the ledger branch "
        "(TILEGYM_LEDGER_BRANCH, default tilegym-ledger). A refused merge exits 1. Token from "
        "GITHUB_TOKEN, API from GITHUB_API_URL.",
    )
    p.add_argument("--repo", required=True, metavar="OWNER/NAME")
    p.add_argument("--run-id", type=_run_id, required=True, help="the gpu-benchmark run")
    p.add_argument("--artifact", type=Path, required=True, help="its bench-metrics folder")
    p.add_argument(
        "--checkout",
        type=Path,
        default=Path("."),
        help="the bot's git checkout of the default branch; the benchmarked commits are "
        "fetched into it as data, never run (default: .)",
    )
    p.add_argument("--margin", type=_margin, default=0.02)
    p.add_argument(
        "--rerun",
        action="store_true",
        help="these metrics are the rerun (default: when the PR has autokernel:inconclusive)",
    )
    p.add_argument("--report-out", type=Path, help="also write the comment here (job summary)")
    p.add_argument("--github-output", type=Path, help="append outcome=... and pr=... here")
    p.set_defaults(func=_cmd_github_apply)

    for module in ("tilegym_bot.runner.cli", "tilegym_bot.doctor"):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        register = getattr(mod, "register", None)
        if callable(register):
            register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.func is _cmd_run:
            from tilegym_bot.trusted_exec import reexec_from_main

            code = reexec_from_main(_forge(args), argv)
            if code is not None:
                return code
        return int(args.func(args) or 0)
    except _UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BotError as exc:
        for line in exc.details:
            print(line, file=sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (git.GitError, OSError) as exc:
        print(f"error: {type(exc).__name__}: {str(exc).strip()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
