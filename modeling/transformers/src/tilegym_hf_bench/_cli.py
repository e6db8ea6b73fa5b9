"""``tilegym-hf-bench``: the supervisor. Parses flags, runs the measuring worker under a hard
time limit, writes the metrics file and prints the lines the auto-kernelize loop greps.

Exit codes: 0 the run completed (status ok), 1 it did not (crash, timeout), 2 bad usage.
"""

from __future__ import annotations

import shutil
import sys
import time
from datetime import datetime, timezone

from tilegym_hf_bench.envinfo import CommitError, resolve_commit, static_env
from tilegym_hf_bench.metrics_schema import validation_errors
from tilegym_hf_bench.options import UsageError, parse_options
from tilegym_hf_bench.report import detail_lines, summary_lines
from tilegym_hf_bench.supervisor import Outcome, build_document, run_worker, write_metrics


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        options = parse_options(argv)
        commit, dirty = resolve_commit(options.commit)
    except (UsageError, CommitError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    start = time.monotonic()
    print(
        f"tilegym-hf-bench: model {options.model_key}, commit {commit[:12]}"
        + (" (working tree has uncommitted changes)" if dirty else "")
    )
    wants_nsys = options.profiler == "nsys" and not options.skip_coverage
    nsys = shutil.which("nsys") if wants_nsys else None
    if wants_nsys and nsys is None:
        outcome = Outcome("crash", "--profiler nsys: Nsight Systems (nsys) is not on PATH", {})
    else:
        outcome = run_worker(options, nsys)

    doc = build_document(
        options, outcome, commit, started_at, time.monotonic() - start, static_env()
    )
    problems = validation_errors(doc)
    if problems:
        outcome = Outcome(
            "crash", f"internal: metrics do not match the schema: {problems[0]}", outcome.progress
        )
        doc = build_document(
            options, outcome, commit, started_at, time.monotonic() - start, static_env()
        )
    not_measured = outcome.progress.get("not_measured") or {}
    if doc["status"] == "ok":
        for line in detail_lines(doc, not_measured) + summary_lines(doc, not_measured):
            print(line)
    else:
        print(f"error: benchmark {doc['status']}: {doc['error']}", file=sys.stderr)
        print(f"status: {doc['status']} (no throughput or coverage is reported for this run)")
    if options.metrics_out:
        try:
            write_metrics(options.metrics_out, doc)
        except OSError as exc:
            print(f"error: cannot write {options.metrics_out}: {exc}", file=sys.stderr)
            return 1
        print(f"metrics: {options.metrics_out}")
    sys.stdout.flush()
    return 0 if doc["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
