"""AOT compile gate: every kernel a Solution launches compiles for every ``target_hardware``.

Convention for kernel authors: the entry-point module defines ``aot_signatures()`` returning
``{kernel: [KernelSignature, ...]}`` for each ``@ct.kernel`` it launches (its own or imported
from ``tilegym.ops``). A shared entry module (``src/tilegym/ops/entry/``), whose entry points
serve every family's Definition of an op, defines ``aot_signatures(definition, **entry_kwargs)``
instead: the gate passes the Solution's Definition (its ``const`` axes give the shapes) and the
Solution's ``spec.entry_kwargs``. The gate adds each signature's aligned twin (``aligned``): the
form a kernel takes for a model's 16-byte aligned tensors, which is the one that runs.
Each kernel is compiled to a cubin in memory with
``cuda.tile.compilation.export_kernel(..., output_format="cubin", gpu_code="sm_NN")``; no GPU is
needed. Successful compiles are cached on disk keyed by (hash of the kernel's file and every
repository file it imports, kernel, signatures, architecture, cuTile version), so an unchanged
Solution re-checks in milliseconds and Solutions sharing a kernel share its entries.

Each compile is cached the moment it succeeds, not when the whole run ends, so a run that is
stopped (a time limit, Ctrl-C) keeps what it finished and the next run continues from there.
A ``progress`` callback gets one line per compile. ``stall_s`` bounds a run by a limit that
scales with its work: it gives up only when no compile has finished for that long (a compile
takes from under a second to about 150 s on a quiet 2-core machine), so N compiles may take up to
N times ``stall_s`` and a hung worker is caught after ``stall_s``.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import io
import json
import multiprocessing
import os
import re
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from tilegym.findings import Finding
from tilegym.kernel_inventory import codes
from tilegym.kernel_inventory.aligned import with_aligned_twins
from tilegym.kernel_inventory.cache import JsonCache, cache_dir
from tilegym.kernel_inventory.entry import FILE_MODULE_PREFIX, first_line, import_entry_module
from tilegym.kernel_inventory.imports import ImportGraph
from tilegym.kernel_inventory.inventory import Loaded, load, pair_of, shown_path
from tilegym.kernel_inventory.jsonfile import finding
from tilegym.kernel_inventory.models import Definition, Solution
from tilegym.kernel_inventory.selection import select_solutions

SIGNATURES_FUNCTION = "aot_signatures"


def toolchain_problem() -> str | None:
    """Why kernels cannot be AOT-compiled here (cuTile or tileiras missing), or None."""
    try:
        import cuda.tile  # noqa: F401
        from cuda.tile.compilation import export_kernel  # noqa: F401
    except Exception as exc:  # any import failure means no toolchain
        return f"cuda.tile is not importable: {exc}"
    try:
        from cuda.tile._compile import _find_compiler_bin
    except ImportError:
        return None  # layout changed; compiling will tell
    try:
        _find_compiler_bin()
    except (FileNotFoundError, OSError) as exc:
        return f"tileiras compiler not found: {exc}"
    return None


def cutile_version() -> str:
    try:
        import cuda.tile

        return str(cuda.tile.__version__)
    except Exception:
        return "unknown"


@dataclass(frozen=True)
class CompileJob:
    """One kernel, its signatures, one architecture: the unit that is compiled and cached."""

    key: str
    shown: str
    line: int
    hardware: str
    gpu_code: str
    kernel_name: str
    entry_path: Path
    kernel: Any = field(compare=False, repr=False)
    signatures: tuple = field(compare=False, repr=False)
    definition_path: Path | None = field(default=None, compare=False, repr=False)
    entry_kwargs: tuple = field(default=(), compare=False, repr=False)


def default_jobs() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def compile_paths(
    paths: Iterable[Path],
    repo_root: Path,
    *,
    use_cache: bool = True,
    jobs: int = 1,
    progress: Callable[[str], None] | None = None,
    stall_s: float | None = None,
) -> list[Finding]:
    """Findings of the compile gate for the Solutions selected by ``paths``.

    Each distinct (kernel code, signatures, architecture) compiles once per run, in ``jobs``
    worker processes when more than one is asked for; each success is cached as it finishes.
    ``progress`` gets a line per compile. With ``stall_s`` the compiles run in worker processes
    and stop once none has finished for ``stall_s`` seconds; those not done are findings (the
    done ones stay cached).
    """
    problem = toolchain_problem()
    graph = ImportGraph(repo_root / "src")  # one import scan for the whole run
    selected = select_solutions(paths, repo_root, graph)
    if problem is not None:
        return [
            finding(shown_path(p, repo_root), 1, codes.COMPILE_NO_TOOLCHAIN, problem)
            for p in selected
        ]
    cache = JsonCache(cache_dir() / "aot_compiles.json") if use_cache else None
    findings: list[Finding] = []
    planned: list[CompileJob] = []
    for path in selected:
        loaded = load(path, repo_root)
        if not isinstance(loaded.model, Solution):
            findings.extend(loaded.findings)
            continue
        problems, solution_jobs = plan_solution(loaded, repo_root, graph)
        findings.extend(problems)
        planned.extend(solution_jobs)

    done = cache.keys() if cache is not None else set()
    todo: dict[str, CompileJob] = {}
    for job in planned:
        if job.key not in todo and job.key not in done:
            todo[job.key] = job
    record = _Recorder(todo, cache, progress, cutile_version())
    errors = _run_jobs(list(todo.values()), repo_root, jobs, record, stall_s)
    for job in planned:
        error = errors.get(job.key)
        if error is not None:
            findings.append(
                finding(
                    job.shown,
                    job.line,
                    codes.COMPILE_FAILED,
                    f"{job.kernel_name} does not compile for {job.hardware} ({job.gpu_code}): "
                    f"{error}",
                )
            )
    return findings


class _Recorder:
    """Called as each compile ends: caches a success at once and reports one progress line."""

    def __init__(self, todo, cache: JsonCache | None, progress, version: str):
        self.total, self.done = len(todo), 0
        self.cache, self.progress, self.version = cache, progress, version

    def __call__(self, job: CompileJob, error: str | None, seconds: float) -> None:
        self.done += 1
        if error is None and self.cache is not None:
            entry = {"kernel": job.kernel_name, "gpu_code": job.gpu_code, "cutile": self.version}
            self.cache.put(job.key, entry)
        if self.progress is not None:
            outcome = "ok" if error is None else "FAILED"
            self.progress(
                f"aot compile {self.done}/{self.total}: {job.kernel_name} for {job.hardware} "
                f"({job.gpu_code}): {outcome} in {seconds:.1f} s"
            )


def _timed_compile(kernel: Any, signatures: tuple, gpu_code: str) -> tuple[str | None, float]:
    start = time.monotonic()
    return compile_kernel(kernel, signatures, gpu_code), time.monotonic() - start


def _run_jobs(
    jobs: list[CompileJob],
    repo_root: Path,
    workers: int,
    record: Callable[[CompileJob, str | None, float], None],
    stall_s: float | None = None,
) -> dict[str, str | None]:
    """Compile each job, calling ``record`` as each ends; ``{key: None on success, else the
    one-line error}``. With ``stall_s`` (always in worker processes, which can be stopped),
    the jobs still undone when none has finished for ``stall_s`` get a time-limit error."""
    results: dict[str, str | None] = {}
    if not jobs:
        return results
    if stall_s is None and (workers <= 1 or len(jobs) <= 1):
        for job in jobs:
            results[job.key], seconds = _timed_compile(job.kernel, job.signatures, job.gpu_code)
            record(job, results[job.key], seconds)
        return results
    context = multiprocessing.get_context("spawn")  # no fork after torch and threads started
    children_before = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(max_workers=max(1, min(workers, len(jobs))), mp_context=context)
    pending: dict[Future, CompileJob] = {}
    try:
        pending = {
            pool.submit(
                _compile_in_worker,
                str(job.entry_path),
                str(repo_root),
                job.kernel_name,
                job.gpu_code,
                str(job.definition_path) if job.definition_path is not None else None,
                dict(job.entry_kwargs),
            ): job
            for job in jobs
        }
        while pending:
            finished, _ = wait(pending, timeout=stall_s, return_when=FIRST_COMPLETED)
            if not finished:
                break
            for future in finished:
                job = pending.pop(future)
                try:
                    error, seconds = future.result()
                except Exception as exc:  # a worker that died (crash, OOM) fails only its job
                    error, seconds = f"compile worker failed: {first_line(exc)}", 0.0
                results[job.key] = error
                record(job, error, seconds)
    finally:
        if pending:
            # After a stall (or Ctrl-C) the workers still compiling are stopped, not waited for.
            pool.shutdown(wait=False, cancel_futures=True)
            for process in set(multiprocessing.active_children()) - children_before:
                process.terminate()
        pool.shutdown(wait=True)
    if pending:
        over = _stalled(stall_s, len(pending), len(jobs))
        results.update((job.key, over) for job in pending.values())
    return results


def _stalled(stall_s: float | None, undone: int, total: int) -> str:
    return (
        f"not compiled: no compile finished for {stall_s:g} s, so the gate stopped with "
        f"{undone} of {total} compiles left (the finished ones are cached: run it again to "
        "continue)"
    )


def _compile_in_worker(
    entry_path: str,
    repo_root: str,
    kernel_name: str,
    gpu_code: str,
    definition_path: str | None = None,
    entry_kwargs: dict | None = None,
) -> tuple[str | None, float]:
    """Worker side: re-import the entry module, find the kernel by name, compile it; (error or
    None, seconds the compile took)."""
    try:
        module = import_entry_module(Path(entry_path), Path(repo_root))
        definition = None
        if definition_path is not None:
            definition = load(Path(definition_path), Path(repo_root)).model
        declared = call_signatures(
            getattr(module, SIGNATURES_FUNCTION), definition, entry_kwargs or {}
        )
        declared = with_aligned_twins(declared)
    except BaseException as exc:
        return f"worker could not re-import the entry module: {first_line(exc)}", 0.0
    for kernel, signatures in declared.items():
        if kernel_label(kernel) == kernel_name:
            return _timed_compile(kernel, signatures, gpu_code)
    return f"worker did not find {kernel_name} in {SIGNATURES_FUNCTION}()", 0.0


def takes_definition(declare: Callable) -> bool:
    """Whether ``aot_signatures`` is a shared entry module's, which takes the Definition."""
    try:
        parameters = inspect.signature(declare).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(p.kind in positional and p.default is inspect.Parameter.empty for p in parameters)


def call_signatures(declare: Callable, definition: Definition | None, entry_kwargs: dict) -> dict:
    """``aot_signatures()`` of a family's own module, or ``aot_signatures(definition,
    **entry_kwargs)`` of a shared one."""
    if not takes_definition(declare):
        return declare()
    if not isinstance(definition, Definition):
        raise ValueError("needs the Solution's Definition, which does not load")
    return declare(definition, **entry_kwargs)


def solution_definition(loaded: Loaded, repo_root: Path) -> tuple[Path | None, Definition | None]:
    """The Solution's Definition by the pair layout: its path and, when valid, its model."""
    path = pair_of(loaded.path)
    if path is None or not path.is_file():
        return None, None
    model = load(path, repo_root).model
    return path, model if isinstance(model, Definition) else None


def plan_solution(
    loaded: Loaded, repo_root: Path, graph: ImportGraph | None = None
) -> tuple[list[Finding], list[CompileJob]]:
    """Import the entry module and list what to compile, or the findings that stop it."""
    solution = loaded.model
    assert isinstance(solution, Solution)
    doc = loaded.doc
    entry_line = doc.line_of(("spec", "entry_point")) if doc else 1
    hw_line = doc.line_of(("spec", "target_hardware")) if doc else 1
    entry_path = repo_root / solution.spec.entry_file

    def at(line: int, code: str, message: str) -> Finding:
        return finding(loaded.shown, line, code, message)

    try:
        module = import_entry_module(entry_path, repo_root)
    except BaseException as exc:  # an import may raise anything, even SystemExit
        if isinstance(exc, KeyboardInterrupt):
            raise
        message = f"cannot import {solution.spec.entry_file}: {first_line(exc)}"
        return [at(entry_line, codes.COMPILE_IMPORT, message)], []

    declare = getattr(module, SIGNATURES_FUNCTION, None)
    if not callable(declare):
        message = (
            f"{solution.spec.entry_file} defines no {SIGNATURES_FUNCTION}() "
            "returning {kernel: [KernelSignature, ...]}"
        )
        return [at(entry_line, codes.COMPILE_NO_SIGNATURES, message)], []
    definition_path, definition = solution_definition(loaded, repo_root)
    try:
        declared = call_signatures(declare, definition, solution.spec.entry_kwargs)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        message = f"{SIGNATURES_FUNCTION}() raised {first_line(exc)}"
        return [at(entry_line, codes.COMPILE_BAD_SIGNATURES, message)], []
    problem = signatures_problem(declared)
    if problem:
        message = f"{SIGNATURES_FUNCTION}() {problem}"
        return [at(entry_line, codes.COMPILE_BAD_SIGNATURES, message)], []
    declared = with_aligned_twins(declared)

    findings: list[Finding] = []
    for name in kernels_defined_in(module, entry_path):
        if getattr(module, name) not in declared:
            findings.append(
                at(
                    entry_line,
                    codes.COMPILE_KERNEL_UNDECLARED,
                    f"@ct.kernel {name} in {solution.spec.entry_file} is missing from "
                    f"{SIGNATURES_FUNCTION}(), so it is never compiled ahead of time",
                )
            )

    version = cutile_version()
    graph = graph or ImportGraph(repo_root / "src")
    jobs: list[CompileJob] = []
    for kernel, signatures in declared.items():
        kernel_name = kernel_label(kernel)
        code_hash = kernel_code_hash(kernel, repo_root, graph)
        for hardware, gpu_code in zip(
            solution.spec.target_hardware, solution.gpu_codes(), strict=True
        ):
            jobs.append(
                CompileJob(
                    key=_cache_key(code_hash, kernel, signatures, gpu_code, version),
                    shown=loaded.shown,
                    line=hw_line,
                    hardware=hardware,
                    gpu_code=gpu_code,
                    kernel_name=kernel_name,
                    entry_path=entry_path,
                    kernel=kernel,
                    signatures=tuple(signatures),
                    definition_path=definition_path,
                    entry_kwargs=tuple(solution.spec.entry_kwargs.items()),
                )
            )
    return findings, jobs


#: how often a compile the compiler crashed on is tried again before it is a finding
CRASH_RETRIES = 2
#: tileiras killed by a signal (its exit status negative): SIGABRT and SIGSEGV were seen on a
#: loaded 2-core CI host for kernels that compiled on the next run; a real error exits >= 1
_CRASHED = re.compile(r"\bReturn code -\d+\b")


def crashed(error: str | None) -> bool:
    """Whether a compile's one-line error is the compiler dying, not a verdict on the kernel."""
    return error is not None and _CRASHED.search(error) is not None


def retrying_crashes(attempt: Callable[[], str | None], retries: int = CRASH_RETRIES) -> str | None:
    """``attempt()``'s error (None: success), tried again up to ``retries`` times while the
    compiler crashed; the last error stands."""
    error = attempt()
    for _ in range(retries):
        if not crashed(error):
            break
        error = attempt()
    return error


def compile_kernel(kernel: Any, signatures: list, gpu_code: str) -> str | None:
    """Compile to an in-memory cubin; None on success, else the error in one line (a compile
    the compiler crashed on is tried again: ``retrying_crashes``)."""
    from cuda.tile.compilation import export_kernel

    def attempt() -> str | None:
        try:
            export_kernel(
                kernel, list(signatures), io.BytesIO(), output_format="cubin", gpu_code=gpu_code
            )
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            return first_line(exc)
        return None

    return retrying_crashes(attempt)


def signatures_problem(declared: object) -> str | None:
    """Why ``declared`` is not ``{@ct.kernel: non-empty [KernelSignature]}``, or None."""
    import cuda.tile as ct
    from cuda.tile.compilation import KernelSignature

    if not isinstance(declared, dict) or not declared:
        return f"must return a non-empty dict, got {type(declared).__name__}"
    for kernel, signatures in declared.items():
        if not isinstance(kernel, ct.kernel):
            return f"key {kernel!r} is not a @ct.kernel"
        if (
            not isinstance(signatures, list | tuple)
            or not signatures
            or not all(isinstance(s, KernelSignature) for s in signatures)
        ):
            return f"value for {kernel_label(kernel)} must be a non-empty list of KernelSignature"
    return None


def kernels_defined_in(module: ModuleType, entry_path: Path) -> list[str]:
    """Module-level names bound to ``@ct.kernel`` functions defined in the entry file itself."""
    import cuda.tile as ct

    try:
        tree = ast.parse(entry_path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return []
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any(_is_kernel_decorator(d) for d in node.decorator_list)
        and isinstance(getattr(module, node.name, None), ct.kernel)
    ]


def _is_kernel_decorator(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Attribute):
        return target.attr == "kernel"
    return isinstance(target, ast.Name) and target.id == "kernel"


def kernel_label(kernel: Any) -> str:
    function = getattr(kernel, "_pyfunc", None)
    if function is not None:
        module = getattr(function, "__module__", None) or ""
        name = getattr(function, "__qualname__", "?")
        return name if module.startswith(FILE_MODULE_PREFIX) or not module else f"{module}.{name}"
    return repr(kernel)


def _kernel_file(kernel: Any) -> Path | None:
    function = getattr(kernel, "_pyfunc", None)
    try:
        source = inspect.getsourcefile(function) if function is not None else None
    except TypeError:
        return None
    return Path(source) if source else None


def _file_hash(path: Path | None) -> str:
    if path is None:
        return "unknown"
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


def kernel_code_hash(kernel: Any, repo_root: Path, graph: ImportGraph | None = None) -> str:
    """Hash of the file defining ``kernel`` and every repository file it imports.

    Keyed on the kernel's own code rather than the Solution's, so Solutions that share a
    kernel (qwen3 and llama both launching ``tilegym.ops`` kernels) share cache entries.
    """
    kernel_file = _kernel_file(kernel)
    if kernel_file is None:
        return "unknown"
    graph = graph or ImportGraph(repo_root / "src")
    files = {kernel_file.resolve(), *graph.dependencies(kernel_file)}
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(_file_hash(path).encode())
    return digest.hexdigest()


def _cache_key(code_hash: str, kernel: Any, signatures: list, gpu_code: str, version: str) -> str:
    """Key of one compile: the kernel's compiler hints are part of it, so that two variants of a
    kernel with the same signatures (e.g. another occupancy, `with_hints`) are each compiled."""
    hints = repr(getattr(kernel, "_compiler_options", None))
    sigs = [repr(s) for s in signatures]
    payload = json.dumps([code_hash, kernel_label(kernel), hints, sigs, gpu_code, version])
    return hashlib.sha256(payload.encode()).hexdigest()
