"""Installs the worker's audit hook: the first thing the worker does, before experiment code.

Every refusal appends ``refused: <event>: <detail>`` to the refusal log through a descriptor
opened here, and ends the process with ``os._exit(REFUSED_EXIT)``: an exception could be caught by
the experiment. A hook can be neither removed nor replaced (PEP 578). The hook keeps its state in
closures and binds every function it calls at install time, so rebinding a module attribute
(``os._exit = ...``, this module's names) after ``install`` changes nothing the hook does.
"""

from __future__ import annotations

import _thread
import builtins
import os
import posixpath
import sys
import sysconfig
import types
from dataclasses import dataclass
from pathlib import Path

from tilegym_hf_bench.isolation import audit_policy

REFUSED_EXIT = 87


@dataclass(frozen=True)
class Confinement:
    """What the worker may do; ``install`` copies it, so changing it later changes nothing."""

    experiment_roots: tuple[Path, ...]
    owned_modules: tuple[str, ...]
    writable: tuple[Path, ...]
    allowed_executables: tuple[str, ...]
    record_only: bool = False


def read_refusals(path: Path) -> list[str]:
    """The refusal log's lines (``refused: ...`` / ``would refuse: ...``); none if it is absent."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    return [line for line in text.splitlines() if line.strip()]


def install(conf: Confinement, refusal_log: Path) -> None:
    """Add the audit hook for ``conf``; refusals go to ``refusal_log`` (appended)."""
    sys.dont_write_bytecode = True  # a .pyc next to experiment code is a write into the checkout
    real = os.path.realpath
    log_path = real(os.fspath(refusal_log))
    rules = audit_policy.rules(
        owned_modules=tuple(conf.owned_modules),
        writable=(*(real(os.fspath(p)) for p in conf.writable), "/dev/null"),
        protected=(log_path,),
        allowed_executables=tuple(conf.allowed_executables),
        planted=tuple(real(os.fspath(p)) for p in (*conf.writable, *conf.experiment_roots)),
        experiment=tuple(real(os.fspath(p)) for p in conf.experiment_roots),
    )
    # Code in a writable folder is the experiment's too (it could write a module and import it).
    roots = rules["planted"]
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    make_hook = _private(_make_hook, globals(), audit_policy)
    sys.addaudithook(make_hook(rules, roots, fd, conf.record_only))


def _private(func, module_globals: dict, *modules):
    """``func`` re-made over a private copy of its globals and of builtins (and of the globals
    of ``modules``' functions it reaches): a name the experiment rebinds later in this module,
    in ``audit_policy`` or in ``builtins`` no longer reaches the hook."""
    private_builtins = dict(builtins.__dict__)

    def copy(namespace: dict) -> dict:
        private = dict(namespace)
        private["__builtins__"] = private_builtins
        for name, value in namespace.items():
            if isinstance(value, (dict, set, list)):
                private[name] = type(value)(value)  # a mutated module table changes nothing
            elif isinstance(value, types.FunctionType) and value.__globals__ is namespace:
                private[name] = types.FunctionType(
                    value.__code__, private, value.__name__, value.__defaults__, value.__closure__
                )
        return private

    private = copy(module_globals)
    for module in modules:
        private[module.__name__.rsplit(".", 1)[-1]] = types.SimpleNamespace(**copy(vars(module)))
    return private[func.__name__]


def _make_hook(rules, roots, fd, record_only):  # noqa: C901 - one closure keeps all state private
    """The hook, with everything it uses bound now (closure cells, not module globals)."""
    decide, make_event = audit_policy.decide, audit_policy.event
    program_events, path_events = audit_policy.PROGRAM_EVENTS, audit_policy.PATH_EVENTS
    write_flags, frame_attrs = audit_policy.WRITE_FLAGS, audit_policy.FRAME_ATTRIBUTES
    watched = frozenset(
        {*audit_policy.ALWAYS_REFUSED, *audit_policy.INTROSPECTION, *program_events, *path_events}
        | {"os.kill", "open", "object.__getattr__", "object.__setattr__", "object.__delattr__"}
        | {"compile", "code.__new__"}
    )
    getframe, get_ident, write, exit_ = sys._getframe, _thread.get_ident, os.write, os._exit
    getpid, getcwd, readlink, lstat, fspath = os.getpid, os.getcwd, os.readlink, os.lstat, os.fspath
    environ_holder, isinstance_, str_, bytes_, int_, type_ = os, isinstance, str, bytes, int, type
    normpath, join, dirname = posixpath.normpath, posixpath.join, posixpath.dirname
    function_type = types.FunctionType
    stdlib = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})
    site_dirs = tuple({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    busy: set[int] = set()
    kinds: dict[str, str] = {}
    prefix = "would refuse: " if record_only else "refused: "

    def resolve(path: str, depth: int = 0) -> str:
        """Real absolute path without the stdlib (whose functions an experiment can rebind)."""
        parts, out = normpath(path).split("/")[1:], "/"
        for i, part in enumerate(parts):
            nxt = join(out, part)
            try:
                is_link = (lstat(nxt).st_mode & 0o170000) == 0o120000
            except OSError:
                return normpath(join(nxt, *parts[i + 1 :]))
            if is_link and depth < 40:
                target = readlink(nxt)
                nxt = resolve(join(out, target) if target[:1] != "/" else target, depth + 1)
            out = nxt
        return out

    def fd_path(num: int) -> str | None:
        try:
            target = readlink(f"/proc/self/fd/{num}")
        except OSError:
            return None
        return target if target[:1] == "/" else None

    def absolute(path, dir_fd) -> str | None:
        if isinstance_(path, int_):
            return fd_path(path)
        path = fspath(path)
        if isinstance_(path, bytes_):
            path = path.decode("utf-8", "surrogateescape")
        if path[:1] != "/":
            base = getcwd() if dir_fd in (None, -1, -100) else fd_path(dir_fd)
            path = join(base or "/nonexistent", path)
        return path

    def both(path: str) -> tuple[str, ...]:
        return (resolve(path), join(resolve(dirname(path)), path.rsplit("/", 1)[-1]))

    def kind(filename: str) -> str:
        found = kinds.get(filename)
        if found is None:
            resolved = resolve(filename) if filename[:1] == "/" else filename
            if audit_policy.under(resolved, roots):
                found = "exp"
            elif filename[:1] == "<" or (
                resolved.startswith(stdlib) and not resolved.startswith(site_dirs)
            ):
                found = "std"
            else:
                found = "lib"
            kinds[filename] = found
        return found

    def stack():
        """(first experiment frame as file:line, experiment is the caller, caller's file)."""
        frame = getframe(1).f_back  # 0 is this function, 1 the hook; None from a bare C call
        site, direct, top, first = None, False, frame.f_code.co_filename if frame else "", True
        while frame is not None:
            code = frame.f_code
            k = kind(code.co_filename)
            if first and k != "std":
                direct, first = k == "exp", False
            if k == "exp":
                site = f"{code.co_filename}:{frame.f_lineno}"
                break
            frame = frame.f_back
        return site, direct, top

    def program_facts(args, prog_i, argv_i, env):
        program = args[prog_i] if args[prog_i] is not None else None
        argv = args[argv_i]
        if program is None and argv:
            program = argv if isinstance_(argv, (str_, bytes_)) else argv[0]
        program = fspath(program) if program is not None else ""
        if isinstance_(program, bytes_):
            program = program.decode("utf-8", "surrogateescape")
        if "/" in program:
            return program, resolve(absolute(program, None))
        env = env if env is not None else environ_holder.environ
        search = ""
        for key in ("PATH", b"PATH"):
            try:
                search = env.get(key) or ""
            except (TypeError, AttributeError):  # os.environ takes str keys only
                continue
            if search:
                break
        if isinstance_(search, bytes_):
            search = search.decode("utf-8", "surrogateescape")
        for folder in search.split(":"):
            candidate = join(folder or ".", program)
            try:
                lstat(candidate)
            except OSError:
                continue
            return program, resolve(absolute(candidate, None))
        return program, ""

    def facts(event: str, args) -> dict:
        got: dict = {}
        if event in ("object.__getattr__", "object.__setattr__", "object.__delattr__"):
            got["attribute"] = args[1] if isinstance_(args[1], str_) else ""
        if event in ("object.__setattr__", "object.__delattr__"):
            target = args[0]
            # A class, or a function's code/defaults; `__class__` of an instance is the
            # instance's own business (like patching its attributes).
            owner = target if isinstance_(target, (type_, function_type)) else None
            module = getattr(owner, "__module__", None) if owner is not None else None
            got["target_module"] = (
                module if isinstance_(module, str_) else (None if owner is None else "<unknown>")
            )
        if event == "open":
            flags = args[2] if isinstance_(args[2], int_) else 0
            mode = args[1] if isinstance_(args[1], str_) else ""
            if not (flags & write_flags or any(c in mode for c in "wax+")):
                return got
            if isinstance_(args[0], int_) and args[0] in (0, 1, 2):
                return got
            path = absolute(args[0], None)
            if isinstance_(args[0], (str_, bytes_)) and fspath(args[0])[:1] not in ("/", b"/"):
                got["relative"] = True
            elif path is not None:
                got["paths"] = both(path)
        elif event in path_events:
            paths = []
            for path_i, fd_i in path_events[event]:
                if path_i >= len(args) or args[path_i] is None:
                    continue
                path = absolute(args[path_i], args[fd_i] if fd_i is not None else None)
                if path is not None:
                    paths.extend(both(path))
            got["paths"] = tuple(paths)
        elif event in program_events:
            prog_i, argv_i = program_events[event]
            env = args[-1] if event != "os.spawn" else args[3]
            got["program"], got["program_real"] = program_facts(args, prog_i, argv_i, env)
            argv = args[argv_i]
            words = [argv] if isinstance_(argv, (str_, bytes_)) else list(argv or ())[:64]
            got["command"] = " ".join(str_(w) for w in words[:4])[:200]
            got["argv"] = tuple(str_.__str__(w) if isinstance_(w, str_) else "?" for w in words)
        elif event in ("compile", "code.__new__"):
            name = args[1]
            if isinstance_(name, bytes_):
                name = name.decode("utf-8", "surrogateescape")
            if isinstance_(name, str_):
                got["filename"] = resolve(name) if name[:1] == "/" else name
            else:
                got["filename"] = "?"
        elif event == "os.kill":
            got["pid"], got["own_pid"] = args[0], getpid()
        return got

    def refuse(text: str) -> None:
        write(fd, (prefix + text.replace("\n", " ") + "\n").encode("utf-8", "replace"))
        if not record_only:
            exit_(REFUSED_EXIT)

    def cheap_pass(event: str, args: tuple) -> bool:
        """Events the policy always lets through, told without walking the stack: the common
        ones while modules import (reads, rebinding on plain objects, generated code)."""
        if event == "open":
            flags = args[2] if isinstance_(args[2], int_) else 0
            mode = args[1] if isinstance_(args[1], str_) else ""
            return not (flags & write_flags or any(c in mode for c in "wax+"))
        if event in ("object.__setattr__", "object.__delattr__"):
            return not isinstance_(args[0], (type_, function_type))
        if event in ("compile", "code.__new__"):
            name = args[1]
            return isinstance_(name, str_) and name[:1] == "<"
        return False

    def hook(event: str, args: tuple) -> None:
        if event not in watched and not event.startswith("ctypes."):
            return
        if event == "object.__getattr__" and args[1] not in frame_attrs:
            return
        if cheap_pass(event, args):
            return
        tid = get_ident()
        if tid in busy:
            return
        busy.add(tid)
        try:
            site, direct, top = stack()
            ev = make_event(event, site=site, direct=direct, top_file=top, **facts(event, args))
            text = decide(ev, rules)
        except BaseException as exc:  # fail closed: a hook that cannot decide refuses
            text = f"{event}: the confinement could not decide ({type(exc).__name__}: {exc})"
        finally:
            busy.discard(tid)
        if text is not None:
            refuse(text)

    return hook
