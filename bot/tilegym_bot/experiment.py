"""The local experiment loop (DESIGN.md, "Local experiment loop") on the local forge.

``start`` cuts ``experiment/<model_key>/<slug>`` from main. ``run`` benchmarks main and the
branch head (or takes metrics files), decides, records the PR, then merges (keep) or archives
(anything else) and appends the ledger. Every refusal happens before anything is changed, and
``run`` again on an already decided branch + SHA only re-applies what is missing (idempotent).
``advance`` returns to main after a decision; ``reset`` abandons an undecided experiment.

A keep merges only onto the ``main`` that was measured: when another keep landed in between,
nothing is merged and the record goes back to open for a *rebench* against the new main.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import unicodedata
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from tilegym_bot import ledger, sequential
from tilegym_bot.bench import BenchConfig, bench_commit, loop_bench_args, runs_dir, timed_runs
from tilegym_bot.errors import BotError
from tilegym_bot.forge.local import MAIN, LocalForge, MainMoved, now_iso
from tilegym_bot.ledger import LedgerError, LedgerRow
from tilegym_bot.metrics_file import load_metrics
from tilegym_bot.policy import (
    DEFAULT_MARGIN,
    Decision,
    decide,
    decide_baseline,
    dig,
)
from tilegym_bot.report import build_record, render_comment
from tilegym_bot.reuse import RunIndex, find_reusable
from tilegym_bot.trusted_tree import kernel_names_at, scope_refusals

MODEL_KEY_RE = re.compile(r"[a-z][a-z0-9_]*")
SLUG_RE = re.compile(r"[a-z0-9][a-z0-9._-]*")
BRANCH_RE = re.compile(
    rf"experiment/(?P<model_key>{MODEL_KEY_RE.pattern})/(?P<slug>{SLUG_RE.pattern})"
)
DRAFT_RE = re.compile(
    r"src/tilegym/transformers/[^/]+/(kernel_definitions|kernel_solutions)/[^/]+\.json"
)


@dataclass
class RunOutcome:
    decision: Decision
    record: dict[str, Any]
    final: bool
    messages: list[str]


def branch_name(model_key: str, slug: str) -> str:
    return f"experiment/{model_key}/{slug}"


def archive_tag(model_key: str, slug: str) -> str:
    return f"experiment-archive/{model_key}/{slug}"


def _check_ref_names(model_key: str, name: str) -> None:
    """The branch and archive tag ``name`` makes must be valid refs by git's own rules
    (``git check-ref-format``: no ``..``, no ``.lock`` suffix, no trailing dot, ...)."""
    for ref in (
        f"refs/heads/{branch_name(model_key, name)}",
        f"refs/tags/{archive_tag(model_key, name)}",
    ):
        proc = subprocess.run(["git", "check-ref-format", ref], capture_output=True, check=False)
        if proc.returncode != 0:
            raise BotError(
                f"name {name!r} does not make a valid git ref ({ref}): "
                "no '..', no trailing '.' or '.lock' (see `git help check-ref-format`)"
            )


def one_line(text: str, what: str) -> str:
    """``text`` stripped, refused when it holds a line break or any other control or format
    character: it becomes a commit message subject, a tag message and a ledger cell, where a
    raw newline could forge trailers (``Signed-off-by:``) or rows."""
    text = text.strip()
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            raise BotError(
                f"{what} must be one line of printable text; it holds {ch!r} (U+{ord(ch):04X})"
            )
    if not text:
        raise BotError(f"{what} must not be empty")
    return text


def parse_branch(branch: str | None) -> tuple[str, str]:
    match = BRANCH_RE.fullmatch(branch or "")
    if not match:
        where = f"on {branch!r}" if branch else "on a detached HEAD"
        raise BotError(
            f"{where}: not an experiment branch experiment/<model_key>/<slug>; "
            "run `tilegym-bot experiment start` first"
        )
    return match["model_key"], match["slug"]


def _require_clean(forge: LocalForge, action: str) -> None:
    dirty = forge.dirty_paths()
    if dirty:
        shown = ", ".join(dirty[:5]) + (" ..." if len(dirty) > 5 else "")
        raise BotError(f"working tree is dirty ({shown}): commit or discard it before {action}")


def _read_ledger(path: Path) -> list[LedgerRow]:
    try:
        return ledger.read(path)
    except LedgerError as exc:
        raise BotError(
            f"{path} is malformed; fix it (nothing was changed)",
            [str(f) for f in exc.findings],
        ) from exc


HOW_TO_ADD_A_MODEL = (
    "to add a model, give it a preset in modeling/transformers/src/tilegym_hf_bench/presets.py "
    "(its config in configs/) and its patch flags in MODEL_PATCH_KWARGS of "
    "modeling/transformers/src/tilegym_hf_bench/tilegym_patch.py, on main"
)


def known_model_keys() -> dict[str, str | None]:
    """Every preset key that could name an experiment, with why it cannot (None: it can): the
    benchmark needs its preset and bundled config, the cuTile patch its MODEL_PATCH_KWARGS entry.
    Read from the installed benchmark package, the harness that runs the experiment's benchmark."""
    from importlib import resources

    try:
        from tilegym_hf_bench.presets import PRESETS
        from tilegym_hf_bench.tilegym_patch import MODEL_PATCH_KWARGS
    except ImportError as exc:
        raise BotError(
            f"the benchmark package tilegym_hf_bench is not importable ({exc}): "
            "run `bash scripts/setup.sh` and use .venv"
        ) from exc
    configs = resources.files("tilegym_hf_bench").joinpath("configs")
    keys: dict[str, str | None] = {}
    for key, preset in PRESETS.items():
        if not MODEL_KEY_RE.fullmatch(key):
            continue  # a CPU-sized variant (tiny-qwen3): a benchmark argument, not an experiment
        if not configs.joinpath(preset.config_file).is_file():
            keys[key] = f"its preset's config configs/{preset.config_file} is missing"
        elif preset.model_type not in MODEL_PATCH_KWARGS:
            keys[key] = f"MODEL_PATCH_KWARGS has no entry for its model type {preset.model_type!r}"
        else:
            keys[key] = None
    return keys


def _check_model_key(forge: LocalForge, model_key: str) -> None:
    """Refuse, in one line, a key the benchmark or the patch does not know (an experiment on it
    could only crash) before anything is written. A key that ``model init`` committed on
    ``model/<key>`` is named with the merge it still needs."""
    keys = known_model_keys()
    usable = sorted(k for k, why in keys.items() if why is None)
    if model_key in usable:
        return
    if forge.has_ref(f"refs/heads/model/{model_key}"):
        raise BotError(
            f"model key {model_key!r} was added by `tilegym-bot model init` on branch "
            f"model/{model_key}, not yet on {MAIN}: merge it first (`git checkout {MAIN} && "
            f"git merge model/{model_key}`, then `bash scripts/setup.sh`), then start again"
        )
    why = keys.get(model_key)
    problem = f"cannot be benchmarked: {why}" if why else "has no benchmark preset"
    raise BotError(
        f"model key {model_key!r} {problem}; known model keys: {', '.join(usable) or 'none'}; "
        f"{HOW_TO_ADD_A_MODEL}"
    )


def start(forge: LocalForge, model_key: str, name: str) -> str:
    """Cut ``experiment/<model_key>/<name>`` from main; every refusal comes before any write."""
    if not MODEL_KEY_RE.fullmatch(model_key):
        raise BotError(f"model key {model_key!r} must be a transformers submodule name like qwen3")
    _check_model_key(forge, model_key)
    if not SLUG_RE.fullmatch(name):
        raise BotError(f"name {name!r} must be a slug: lowercase letters, digits, '.', '_', '-'")
    _check_ref_names(model_key, name)
    _require_clean(forge, "starting an experiment")
    if not forge.has_ref(f"refs/heads/{MAIN}"):
        raise BotError(f"the repository has no {MAIN} branch")
    branch = branch_name(model_key, name)
    if forge.has_ref(f"refs/heads/{branch}"):
        raise BotError(
            f"branch {branch} already exists: pick another name or `experiment reset` it"
        )
    if forge.tag_target(archive_tag(model_key, name)):
        raise BotError(f"{archive_tag(model_key, name)} exists: that name was used; pick another")
    forge.create_branch(branch, MAIN)
    return branch


def _check_commit(forge: LocalForge, doc: Any, expected: str, path: Path, what: str) -> None:
    """The metrics must be of ``expected`` or of a commit with the same tree (same code)."""
    commit = dig(doc, "commit")
    if not isinstance(commit, str) or commit == expected:
        return
    tree = forge.tree_of(commit)
    if tree is None:
        raise BotError(
            f"{path}: metrics are of commit {commit[:8]}, which this repository does not have: "
            f"benchmark {what} ({expected[:8]}) again; nothing was changed"
        )
    if tree != forge.tree_of(expected):
        raise BotError(
            f"{path}: metrics are of commit {commit[:8]} but {what} is {expected[:8]} "
            f"(a different tree): benchmark {what} again; nothing was changed"
        )


def _copy_drafts(forge: LocalForge, model_key: str, slug: str, base: str, head: str) -> list[str]:
    """The branch's Definitions/Solutions (as committed on ``head``) → sandbox/K/drafts/SLUG/."""
    dest_root = forge.store_root / "sandbox" / model_key / "drafts" / slug
    copied = []
    for path in forge.changed_files(base, head):
        if not DRAFT_RE.fullmatch(path):
            continue
        parts = Path(path).parts
        dest = dest_root / parts[-2] / parts[-1]
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(forge.file_at(head, path))
        copied.append(str(dest.relative_to(forge.store_root)))
    return copied


def _row_description(record: dict[str, Any]) -> str:
    if record["baseline"]:
        return "baseline"
    return f"{record['description']}{Decision.from_json(record['decision']).ledger_marker}"


def merge_message(record: dict[str, Any]) -> str:
    """One line (the reasons stay in the PR record): nothing in it can start a trailer."""
    description = " ".join(str(record["description"]).split())
    return f"Merge {record['branch']}: {description} (keep, PR #{record['number']})"


def _merge_or_archive(forge: LocalForge, record: dict[str, Any]) -> list[str]:
    """keep: merge the head into main, only while main is the measured base (MainMoved
    otherwise); anything else: archive tag and drafts. Idempotent."""
    head, model_key, slug = record["head_sha"], record["model_key"], record["slug"]
    if record["state"] == "merged":
        if forge.is_ancestor(head, forge.rev(MAIN)):
            return []
        new = forge.merge_into_main(head, merge_message(record), record["base_sha"])
        return [f"merged {record['branch']} into {MAIN} ({new[:8]})"]
    messages = []
    tag = archive_tag(model_key, slug)
    if forge.tag_target(tag) is None:
        forge.tag(tag, head, f"{record['decision']['status']}: {record['description']}")
        messages.append(f"archived {record['branch']} as tag {tag}; {MAIN} untouched")
    drafts = _copy_drafts(forge, model_key, slug, record["base_sha"], head)
    if drafts:
        messages.append(f"copied drafts: {', '.join(drafts)}")
    return messages


def _finish(forge: LocalForge, record: dict[str, Any]) -> list[str]:
    """Apply a final decision; every step checks the state first, so repeating it is a no-op.
    A baseline (main measured as is) has nothing to merge or archive. A keep whose measured
    main is gone is not applied at all (``_rebench``)."""
    model_key = record["model_key"]
    try:
        messages = [] if record["baseline"] else _merge_or_archive(forge, record)
    except MainMoved as moved:
        _rebench(forge, record, moved)
    path = ledger.ledger_path(forge.store_root, model_key)
    base_row = record.get("baseline_row")
    if base_row and ledger.append(path, LedgerRow(**base_row), skip_if_commit_present=True):
        messages.append(f"ledger: baseline row for {base_row['commit'][:8]}")
    decision = record["decision"]
    row = LedgerRow(
        record["head_sha"],
        decision["coverage"]["head"],
        decision["throughput"]["head"],
        decision["ledger_status"],
        _row_description(record),
    )
    if ledger.append(path, row, skip_if_commit_present=True):
        messages.append(f"ledger: {row.format()}")
    from tilegym_bot.plot import plot_ledger

    png = forge.prs_dir / f"{record['number']}.png"
    plot_ledger(ledger.read(path), png, title=f"{model_key}: cuTile coverage and throughput")
    return messages


def _rebench(forge: LocalForge, record: dict[str, Any], moved: MainMoved) -> NoReturn:
    """A keep measured against a main that another merge replaced: nothing merged, no ledger
    row; the record goes back to open (``rebench``) so the next ``experiment run`` benchmarks
    the branch against the new main. Raised as one error line (exit 1)."""
    at = now_iso()
    record.update(
        state="open",
        awaiting_rerun=False,
        rebench={"measured": moved.measured, "main": moved.now, "at": at},
    )
    record.pop("decided_at", None)
    record["history"].append(
        {"at": at, "rebench": True, "measured": moved.measured, "main": moved.now}
    )
    outcome = (
        f"not merged: {MAIN} moved from {moved.measured[:8]} to {moved.now[:8]} after this was "
        f"benchmarked; rebench against the new {MAIN}"
    )
    _write_comment(forge, record, at, final=False, outcome=outcome)
    forge.save_pr(record)
    raise BotError(
        f"rebench: {MAIN} moved from {moved.measured[:8]} to {moved.now[:8]} after "
        f"{record['branch']} was benchmarked against it, so its keep is not merged (no ledger "
        f"row; PR record #{record['number']} is open again): run `tilegym-bot experiment run` "
        f"again to benchmark it against the new {MAIN}"
    )


def _load_files(
    base_path: Path | None, head_path: Path | None, baseline_only: bool
) -> tuple[Any, Any]:
    if baseline_only:
        path = head_path or base_path
        return None, load_metrics(path)
    if base_path is None or head_path is None:
        raise BotError("--base-metrics and --head-metrics go together")
    return load_metrics(base_path), load_metrics(head_path)


@dataclass
class _Plan:
    """What ``run`` found before measuring anything (all refusals are checked by then)."""

    branch: str
    model_key: str
    slug: str
    head_sha: str
    main_sha: str
    record: dict[str, Any] | None
    needs_baseline: bool  # the model has no ledger rows yet
    baseline_only: bool  # the branch has no commits beyond main
    rerun: bool  # the previous run of this SHA was inconclusive


def _preflight(forge: LocalForge, description: str) -> _Plan:
    branch = forge.current_branch()
    model_key, slug = parse_branch(branch)
    one_line(description, "--description")
    _require_clean(forge, "running the experiment")
    head_sha, main_sha = forge.rev("HEAD"), forge.rev(MAIN)
    record = forge.find_pr(branch)
    if record and record["state"] in ("merged", "closed") and record["head_sha"] != head_sha:
        raise BotError(
            f"{branch} was already decided ({record['decision']['status']}) at "
            f"{record['head_sha'][:8]}: start a new experiment for new commits"
        )
    plan = _Plan(
        branch=branch,
        model_key=model_key,
        slug=slug,
        head_sha=head_sha,
        main_sha=main_sha,
        record=record,
        needs_baseline=not _read_ledger(ledger.ledger_path(forge.store_root, model_key)),
        baseline_only=head_sha == main_sha,
        rerun=bool(record and record.get("awaiting_rerun") and record["head_sha"] == head_sha),
    )
    if record and record["state"] in ("merged", "closed"):
        return plan  # already decided for this SHA: only re-applied
    if plan.baseline_only and not plan.needs_baseline:
        raise BotError(f"{branch} has no commits beyond {MAIN}: commit the experiment first")
    tag_sha = forge.tag_target(archive_tag(model_key, slug))
    if tag_sha and tag_sha != head_sha:
        raise BotError(f"tag {archive_tag(model_key, slug)} already exists for another commit")
    _refuse_out_of_scope(forge, plan)
    if not forge.is_ancestor(main_sha, head_sha):
        tree, conflicts = forge.merge_conflicts(main_sha, head_sha)
        if tree is None:
            raise BotError(
                f"{MAIN} moved since {branch} was cut and the merge would conflict in "
                f"{', '.join(conflicts)}: rebase the experiment on {MAIN}; nothing was changed"
            )
    return plan


def _refuse_out_of_scope(forge: LocalForge, plan: _Plan) -> None:
    """The hook's scope rules again, with main's code, on the whole diff main...head: a commit
    made with ``--no-verify`` (or any path around the hook) is refused before any benchmark."""
    findings = scope_refusals(forge.root, plan.main_sha, plan.head_sha, plan.model_key)
    if findings:
        raise BotError(
            f"{plan.branch} changes what a {plan.model_key!r} experiment may not "
            f"({len(findings)} finding(s)); nothing was benchmarked and {MAIN} is untouched",
            [str(f) for f in findings],
        )


@dataclass
class _Measured:
    base: Any
    head: Any
    decision: Decision
    rerun: bool
    base_reused_from: str | None = None


def _measure_and_decide(
    forge: LocalForge,
    plan: _Plan,
    base_metrics: Path | None,
    head_metrics: Path | None,
    cfg: BenchConfig,
    margin: float,
    reuse_base: bool,
) -> _Measured:
    """Metrics from the files or the runner, and the decision of this round. The head is
    measured first, so a stored run of main's tree under the same conditions can stand in for
    the base (``reuse``). A rerun (the record awaits one) measures both afresh with twice the
    first round's samples."""

    def run_name(sha: str, label: str) -> str:
        return f"{plan.model_key}-{plan.slug}-{sha[:8]}-{label}"

    index = RunIndex(forge.state_dir / "runs.json", runs_dir(forge))

    walls: list[tuple[Any, float]] = []  # (metrics, wall seconds) of each benchmark measured

    def measure(sha: str, label: str, runs: int | None = None) -> Any:
        name = run_name(sha, label)
        started = time.monotonic()
        doc = bench_commit(
            forge,
            cfg,
            model_key=plan.model_key,
            run_name=name,
            sha=sha,
            runs=runs,
            harness_sha=plan.main_sha,
            label=label.replace("-", " "),
        )
        walls.append((doc, time.monotonic() - started))
        index.record(runs_dir(forge) / name / "metrics.json")
        return doc

    files = base_metrics is not None or head_metrics is not None
    reused = None
    if files:
        base, head = _load_files(base_metrics, head_metrics, plan.baseline_only)
        what = f"HEAD of {plan.branch}"
        _check_commit(forge, head, plan.head_sha, Path(head_metrics or base_metrics), what)
        if base is not None:
            _check_commit(forge, base, plan.main_sha, Path(base_metrics), MAIN)
    elif plan.rerun:
        first = plan.record["metrics"]
        runs = 2 * (timed_runs(first.get("head"), first.get("base")) or 5)
        base = measure(plan.main_sha, "base-rerun", runs)
        head = measure(plan.head_sha, "head-rerun", runs)
    else:
        started = time.monotonic()
        head = measure(plan.head_sha, "head")
        base = None
        if not plan.baseline_only:
            found = None
            if reuse_base:
                found = find_reusable(
                    index,
                    tree=forge.tree_of(plan.main_sha),
                    head=head,
                    tree_of=forge.tree_of,
                    exclude=[runs_dir(forge) / run_name(plan.head_sha, "head")],
                )
            if found is None:
                base = measure(plan.main_sha, "base")
            else:
                path, base = found
                reused = str(path.relative_to(forge.store_root))
    head_kernels = kernel_names_at(forge.root, plan.head_sha)
    if plan.baseline_only:
        return _Measured(None, head, decide_baseline(head, kernels=head_kernels), False)
    base_kernels = kernel_names_at(forge.root, plan.main_sha)
    decision = decide(
        base,
        head,
        margin=margin,
        rerun=plan.rerun,
        base_kernels=base_kernels,
        head_kernels=head_kernels,
    )
    if files or plan.rerun or cfg.sampling_budget_s <= 0:  # the fixed scheme: rerun once
        return _Measured(base, head, decision, plan.rerun, reused)
    kernels = (base_kernels, head_kernels)
    return _sample_sequentially(
        plan, base, head, measure, walls, started, cfg, margin, kernels, reused
    )


def _sample_sequentially(
    plan: _Plan,
    base: Any,
    head: Any,
    measure: Any,
    walls: list[tuple[Any, float]],
    started: float,
    cfg: BenchConfig,
    margin: float,
    kernels: tuple[frozenset[str], frozenset[str]],
    reused: str | None,
) -> _Measured:
    """Sequential paired sampling (``sequential``): more base/head pairs until the pooled
    throughput ratio's 95% CI is decisive against the margin or the budget is spent; the
    decision on the pooled samples, with how many pairs and why it stopped. A first pair that
    another rule decides (crash, incorrect, GPU time, coverage/speed) stops at once."""
    budget = cfg.sampling_budget_s
    bases, heads = [base], [head]
    sides = {"base_kernels": kernels[0], "head_kernels": kernels[1]}
    while True:
        step = sequential.assess(
            bases,
            heads,
            margin=margin,
            elapsed_s=time.monotonic() - started,
            budget_s=budget,
            cost=sequential.cost_of(walls),
            **sides,
        )
        if step.stopped != sequential.DECIDED:
            print(f"tilegym-bot: sampling: {step.why}", file=sys.stderr, flush=True)
        if step.stop:
            break
        k = len(heads) + 1
        # head first in odd pairs, base first in even ones: a drift falls on both sides
        order = ("head", "base") if k % 2 else ("base", "head")
        got = {
            side: measure(
                plan.head_sha if side == "head" else plan.main_sha, f"{side}-{k}", step.runs
            )
            for side in order
        }
        bases.append(got["base"])
        heads.append(got["head"])
    decision = sequential.conclude(
        bases,
        heads,
        step,
        margin=margin,
        seconds=time.monotonic() - started,
        budget_s=budget,
        **sides,
    )
    if step.stopped == sequential.PAIR_REJECTED:  # the rejected pair is the record's metrics
        return _Measured(bases[-1], heads[-1], decision, False, reused)
    return _Measured(sequential.pool(bases), sequential.pool(heads), decision, False, reused)


def _save_record(forge: LocalForge, plan: _Plan, m: _Measured, description: str) -> dict[str, Any]:
    """The PR record with its comment (report) saved under .git/tilegym-bot/prs/."""
    final = plan.baseline_only or m.rerun or not m.decision.rerun_useful
    record = plan.record or {
        "number": None,
        "model_key": plan.model_key,
        "slug": plan.slug,
        "branch": plan.branch,
        "history": [],
    }
    record.update(
        base_sha=plan.main_sha,
        head_sha=plan.head_sha,
        description=one_line(description, "--description"),
        baseline=plan.baseline_only,
        metrics={"base": m.base, "head": m.head},
        decision=m.decision.to_json(),
        rerun=m.rerun,
        base_reused_from=m.base_reused_from,
        awaiting_rerun=not final,
        state=("merged" if m.decision.status == "keep" else "closed") if final else "open",
    )
    record.pop("rebench", None)  # this round measured the current main
    if plan.needs_baseline and not plan.baseline_only:
        main_measured = decide_baseline(m.base, kernels=kernel_names_at(forge.root, plan.main_sha))
        record["baseline_row"] = {
            "commit": plan.main_sha,
            "coverage": main_measured.coverage_head,
            "throughput": main_measured.throughput_head,
            "status": main_measured.ledger_status,
            "description": "baseline",
        }
    decided_at = now_iso()
    record["history"].append({"at": decided_at, "rerun": m.rerun, "decision": m.decision.to_json()})
    if final:
        record["decided_at"] = decided_at
    record = forge.save_pr(record)  # allocates the number the comment names
    _write_comment(forge, record, decided_at, final)
    return forge.save_pr(record)


def _write_comment(
    forge: LocalForge, record: dict[str, Any], at: str, final: bool, outcome: str | None = None
) -> None:
    """The record's comment (report) with its embedded ledger record; a non-final one is
    left out by ``ledger rebuild``."""
    decision = Decision.from_json(record["decision"], baseline=record["baseline"])
    embedded = build_record(
        decision,
        model_key=record["model_key"],
        description=_row_description(record),
        base_sha=None if record["baseline"] else record["base_sha"],
        head_sha=record["head_sha"],
        decided_at=at,
        pr=record["number"],
        final=final,
        baseline_row=record.get("baseline_row"),
    )
    metrics = record["metrics"]
    record["comment"] = render_comment(
        decision, metrics["base"], metrics["head"], embedded, outcome
    )
    record["report_path"] = str(forge.write_report(record["number"], record["comment"]))


def run(
    forge: LocalForge,
    *,
    description: str,
    base_metrics: Path | None = None,
    head_metrics: Path | None = None,
    bench: BenchConfig | None = None,
    margin: float = DEFAULT_MARGIN,
    reuse_base: bool = True,
) -> RunOutcome:
    """One ``experiment run``: orphaned bot worktrees of killed runs are pruned first, and one
    run of a branch at a time holds the repository's lock for it."""
    pruned = forge.prune_orphans()
    if pruned:
        print(
            f"tilegym-bot: pruned {len(pruned)} orphaned bot worktree(s) of killed runs: "
            + ", ".join(map(str, pruned)),
            file=sys.stderr,
        )
    parse_branch(forge.current_branch())
    with forge.run_lock(forge.current_branch()):
        return _run(forge, description, base_metrics, head_metrics, bench, margin, reuse_base)


def _run(
    forge: LocalForge,
    description: str,
    base_metrics: Path | None,
    head_metrics: Path | None,
    bench: BenchConfig | None,
    margin: float,
    reuse_base: bool,
) -> RunOutcome:
    plan = _preflight(forge, description)
    if plan.record and plan.record["state"] in ("merged", "closed"):
        messages = _finish(forge, plan.record) or ["already decided: nothing changed"]
        return RunOutcome(Decision.from_json(plan.record["decision"]), plan.record, True, messages)
    files = base_metrics is not None or head_metrics is not None
    cfg = bench or BenchConfig()
    if not files:
        args, note = loop_bench_args(plan.model_key, cfg.bench_args)
        if note:
            print(f"tilegym-bot: {note}", file=sys.stderr, flush=True)
        cfg = replace(cfg, bench_args=args)
    measured = _measure_and_decide(forge, plan, base_metrics, head_metrics, cfg, margin, reuse_base)
    record = _record_round(forge, plan, measured, description)
    if record["awaiting_rerun"] and not files:
        # the inconclusive first round is on record before the rerun starts, so an interrupted
        # rerun resumes with the next `experiment run` instead of starting over
        plan = replace(plan, record=record, rerun=True)
        measured = _measure_and_decide(forge, plan, None, None, cfg, margin, reuse_base)
        record = _record_round(forge, plan, measured, description)
    notes = []
    if measured.base_reused_from:
        notes.append(
            f"base: reused {measured.base_reused_from} (same tree as {MAIN} {plan.main_sha[:8]}; "
            "same model, workload, GPU and versions; --fresh-base measures it)"
        )
    if record["awaiting_rerun"]:
        hint = (
            "inconclusive: benchmark base and head again with twice the samples "
            "(--timed-runs 2N) and run `experiment run` again with those metrics files"
        )
        return RunOutcome(measured.decision, record, False, [*notes, hint])
    return RunOutcome(measured.decision, record, True, [*notes, *_finish(forge, record)])


def _record_round(
    forge: LocalForge, plan: _Plan, measured: _Measured, description: str
) -> dict[str, Any]:
    """Save one round's decision, unless HEAD or main moved while it was measured."""
    now = (forge.current_branch(), forge.rev("HEAD"), forge.rev(MAIN))
    if now != (plan.branch, plan.head_sha, plan.main_sha):
        raise BotError(
            f"HEAD or {MAIN} moved while benchmarking (benchmarked {plan.head_sha[:8]} against "
            f"{plan.main_sha[:8]}): nothing was recorded; run again"
        )
    _require_clean(forge, "recording the result")
    return _save_record(forge, plan, measured, description)


def advance(forge: LocalForge) -> str:
    """After a decision: check out main and delete the experiment branch (it is merged or kept
    as its archive tag)."""
    branch = forge.current_branch()
    model_key, slug = parse_branch(branch)
    _require_clean(forge, "advancing")
    record = forge.find_pr(branch)
    if not record or record["state"] not in ("merged", "closed"):
        raise BotError(_undecided(forge, branch, model_key))
    head = forge.rev(f"refs/heads/{branch}")
    if record["state"] == "merged" and not forge.is_ancestor(head, forge.rev(MAIN)):
        raise BotError(f"{branch} has commits that are not in {MAIN}: run `experiment run` again")
    archived = forge.tag_target(archive_tag(model_key, slug))
    if record["state"] == "closed" and not record.get("baseline") and archived != head:
        raise BotError(f"{branch} has commits after its archive tag: nothing was changed")
    forge.checkout(MAIN)
    forge.delete_branch(branch)
    record["retired"] = True
    forge.save_pr(record)
    kept = (
        "merged" if record["state"] == "merged" else f"archived as {archive_tag(model_key, slug)}"
    )
    return f"on {MAIN} at {forge.rev(MAIN)[:8]}; deleted {branch} ({kept})"


def _undecided(forge: LocalForge, branch: str, model_key: str) -> str:
    """Why ``advance`` cannot go on, and the command that can: a branch the scope rules refuse
    will never get a decision, so it can only be reset."""
    head, main = forge.rev(f"refs/heads/{branch}"), forge.rev(MAIN)
    findings = scope_refusals(forge.root, main, head, model_key) if head != main else []
    if findings:
        return (
            f"{branch} has no decision: `experiment run` refuses it ({len(findings)} scope "
            f"finding(s), e.g. {findings[0]}); `tilegym-bot experiment reset` abandons it "
            f"(archived as {archive_tag(*parse_branch(branch))}), or fix its commits"
        )
    return (
        f"{branch} has no decision yet: run `tilegym-bot experiment run`, or abandon it with "
        "`tilegym-bot experiment reset`"
    )


def reset(forge: LocalForge) -> str:
    """Abandon an undecided experiment: archive its commits as a tag, copy its drafts, check out
    main and delete the branch. No ledger row (nothing was decided)."""
    branch = forge.current_branch()
    model_key, slug = parse_branch(branch)
    _require_clean(forge, "resetting (reset never throws away uncommitted work)")
    record = forge.find_pr(branch)
    if record and record["state"] in ("merged", "closed"):
        raise BotError(f"{branch} was already decided: use `tilegym-bot experiment advance`")
    head, main = forge.rev("HEAD"), forge.rev(MAIN)
    tag = archive_tag(model_key, slug)
    notes = []
    if not forge.is_ancestor(head, main):
        if forge.tag_target(tag) not in (None, head):
            raise BotError(f"tag {tag} already exists for another commit: nothing was changed")
        if forge.tag_target(tag) is None:
            forge.tag(tag, head, f"abandoned: {branch}")
        notes.append(f"archived as {tag}")
        drafts = _copy_drafts(forge, model_key, slug, main, head)
        if drafts:
            notes.append(f"drafts in {', '.join(drafts)}")
    forge.checkout(MAIN)
    forge.delete_branch(branch)
    record = record or {
        "number": None,
        "model_key": model_key,
        "slug": slug,
        "branch": branch,
        "head_sha": head,
        "base_sha": main,
        "history": [],
    }
    record.update(state="abandoned", retired=True, abandoned_at=now_iso())
    forge.save_pr(record)
    return f"abandoned {branch}" + (f" ({'; '.join(notes)})" if notes else "") + f"; on {MAIN}"
