"""The measuring process: ``python -m tilegym_hf_bench.worker REQUEST.json PROGRESS.json``.

Started by the supervisor (``_cli``) in its own process group; whatever happens it leaves its
outcome in PROGRESS.json (status ok / crash / refused with the error text) and exits 0 or 1.
It never imports the measured tree's ``tilegym`` (an import of it fails here): the cuTile side
runs in the model worker it starts (``model_worker``).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import traceback
from importlib.abc import MetaPathFinder
from pathlib import Path


class NoExperimentCode(MetaPathFinder):
    """Refuses ``tilegym`` and its submodules in the trusted process, wherever they would be
    found (the measured ``src/`` is off its path; an installed copy is refused too)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "tilegym" or fullname.startswith("tilegym."):
            raise ImportError(
                f"the trusted measuring process does not import {fullname} (experiment code "
                "runs only in the model worker)"
            )
        return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sys.meta_path.insert(0, NoExperimentCode())
    if len(argv) != 2:
        print("error: usage: python -m tilegym_hf_bench.worker REQUEST.json PROGRESS.json")
        return 2
    from tilegym_hf_bench.errors import check_model_id
    from tilegym_hf_bench.progress import Progress

    progress = Progress(argv[1])
    begun = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tilegym-worker-") as scratch:
        started = None
        try:
            from tilegym_hf_bench.experiment_tree import measured_tree
            from tilegym_hf_bench.options import BenchOptions
            from tilegym_hf_bench.worker_client import start_model_worker

            with open(argv[0]) as fh:
                options = BenchOptions.from_json(json.load(fh))
            check_model_id(options.model_id)  # before the slow torch import
            # the model worker first: its imports, CUDA context and model build run while this
            # process imports torch and builds its own side
            started = start_model_worker(options, measured_tree(), Path(scratch), _log)
            from tilegym_hf_bench.runner import run

            progress.add_phase("startup", time.perf_counter() - begun)
            run(options, progress, started)
        except Exception as exc:
            return _failed(progress, exc)
        finally:
            if started is not None:
                closing = time.perf_counter()
                started.worker.close()
                progress.add_phase("worker_exit", time.perf_counter() - closing)
    progress.update(status="ok", error=None)
    return 0


def _log(message: str) -> None:
    print(message, flush=True)


def _failed(progress, exc: Exception) -> int:
    """Record the run's failure: ``refused`` for the worker's confinement, else ``crash``."""
    from tilegym_hf_bench.errors import BenchError

    expected = type(exc).__name__ in (
        "BenchError",
        "PatchUnavailable",
        "ProfilerError",
        "ExperimentTreeError",
        "WorkerRefused",
    )
    if not expected:
        traceback.print_exc()
    text = str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"
    status = "refused" if type(exc).__name__ == "WorkerRefused" else "crash"
    progress.update(status=status, error=text.strip() or type(exc).__name__)
    return 1


if __name__ == "__main__":
    sys.exit(main())
