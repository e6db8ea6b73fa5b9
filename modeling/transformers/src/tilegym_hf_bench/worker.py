"""The measuring process: ``python -m tilegym_hf_bench.worker REQUEST.json PROGRESS.json``.

Started by the supervisor (``_cli``) in its own process group; whatever happens it leaves its
outcome in PROGRESS.json (status ok / crash / refused with the error text) and exits 0 or 1.
It never imports the measured tree's ``tilegym`` (an import of it fails here): the cuTile side
runs in the model worker it starts (``model_worker``).
"""

from __future__ import annotations

import json
import sys
import traceback
from importlib.abc import MetaPathFinder


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
    from tilegym_hf_bench.errors import BenchError, check_model_id
    from tilegym_hf_bench.progress import Progress

    progress = Progress(argv[1])
    try:
        from tilegym_hf_bench.options import BenchOptions

        with open(argv[0]) as fh:
            options = BenchOptions.from_json(json.load(fh))
        check_model_id(options.model_id)  # before the slow torch import
        from tilegym_hf_bench.runner import run

        run(options, progress)
    except Exception as exc:
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
    progress.update(status="ok", error=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
