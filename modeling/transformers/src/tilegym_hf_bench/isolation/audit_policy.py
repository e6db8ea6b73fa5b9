"""Which audit events a confined worker refuses: pure rules over plain data.

The hook (``audit_hook``) turns CPython's raw audit arguments into an event dict (paths resolved,
the calling stack summarized); this module only decides, so every rule is tested on plain data.
Returns the refusal text, or None when the event is allowed.
"""

from __future__ import annotations

import os

# Writing flags of open(2): any of them makes an ``open`` event a write.
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

# event -> ((path index, dir_fd index or None), ...): the paths it creates, changes or removes.
PATH_EVENTS: dict[str, tuple[tuple[int, int | None], ...]] = {
    "os.remove": ((0, 1),),
    "os.rmdir": ((0, 1),),
    "os.mkdir": ((0, 2),),
    "os.rename": ((0, 2), (1, 3)),
    "os.link": ((0, 2), (1, 3)),
    "os.symlink": ((1, 2),),
    "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),),
    "os.chflags": ((0, None),),
    "os.lchflags": ((0, None),),
    "os.truncate": ((0, None),),
    "os.utime": ((0, 3),),
    "os.setxattr": ((0, None),),
    "os.removexattr": ((0, None),),
    "shutil.copyfile": ((1, None),),
    "shutil.copymode": ((1, None),),
    "shutil.copystat": ((1, None),),
    "shutil.copytree": ((1, None),),
    "shutil.move": ((0, None), (1, None)),
    "shutil.rmtree": ((0, 1),),
    "shutil.make_archive": ((0, None),),
    "shutil.unpack_archive": ((1, None),),
    "tempfile.mkstemp": ((0, None),),
    "tempfile.mkdtemp": ((0, None),),
}

# event -> (program index, argv index): starts a program; it must be an allowed toolchain.
PROGRAM_EVENTS: dict[str, tuple[int, int]] = {
    "subprocess.Popen": (0, 1),
    "os.exec": (0, 1),
    "os.posix_spawn": (0, 1),
    "os.spawn": (1, 2),
}

# Programs that only report, allowed beside the toolchains when every argument is one of the
# read-only forms below: Triton's ``nvsmi`` (``nvidia-smi -i 0 --query-gpu=clocks.max.sm
# --format=...``, which Inductor calls to size its GEMM padding when a compiled step keeps
# PyTorch's GEMMs) must run, while nvidia-smi's setters (``-lgc``, ``-pm``, ``-r``...) would let
# an experiment change the clocks the other side is measured at.
READ_ONLY_QUERIES: dict[str, tuple[str, ...]] = {
    "nvidia-smi": ("-i", "--id=", "--query-gpu=", "--format="),
}

ALWAYS_REFUSED = {
    "os.system": "a shell command",
    "os.fork": "fork of the worker",
    "os.forkpty": "fork of the worker",
    "os.startfile": "start of a program",
    "pty.spawn": "start of a program",
    "os.killpg": "signal to a process group",
    "socket.connect": "network connection",
    "socket.bind": "network bind",
    "socket.sendto": "network send",
    "socket.sendmsg": "network send",
}

# Reach into frames, other threads, the tracer or the object graph: refused when the experiment
# is the caller (through the standard library at most); torch uses some of them for itself.
INTROSPECTION = {
    "sys._getframe": "frame access",
    "sys._getframemodulename": "frame access",
    "sys._current_frames": "frames of all threads",
    "sys._current_exceptions": "exceptions of all threads",
    "sys.settrace": "a tracer",
    "sys.setprofile": "a profiler hook",
    "gc.get_objects": "walk of all objects",
    "gc.get_referrers": "walk of the object graph",
    "gc.get_referents": "walk of the object graph",
    "sys.addaudithook": "another audit hook",
    "sys.monitoring.register_callback": "a monitoring callback",
    # 3.12+: a thread whose target is a builtin (setattr) has no experiment frame on its stack
    "_thread.start_new_thread": "a thread started by experiment code",
    "_thread.start_joinable_thread": "a thread started by experiment code",
}

# object.__getattr__ names that hand out a frame.
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})

# Standard-library files that call sys._getframe for their own bookkeeping (a module name, the
# caller of a log line) and never return the frame: the experiment may use them.
FRAME_SAFE_STDLIB = ("/logging/__init__.py", "/typing.py", "/collections/__init__.py", "/enum.py")

# Class attributes the standard library's class factories set on the class they just created.
FACTORY_ATTRIBUTES = frozenset({"__module__", "__qualname__", "__doc__"})
FACTORY_STDLIB = ("/collections/__init__.py", "/typing.py", "/enum.py", "/dataclasses.py")


EVENT_DEFAULTS = {
    "site": None,  # file:line of the nearest experiment frame on the stack, None if none
    "direct": False,  # the nearest frame outside the standard library is experiment code
    "top_file": "",  # file of the frame that raised the event
    "attribute": "",
    "target_module": None,  # object.__setattr__/__delattr__: the owner's __module__
    "paths": (),  # resolved absolute paths the event writes
    "relative": False,  # an open() for writing names a relative path
    "program": "",
    "program_real": "",
    "command": "",  # the start of the argument list, for the refusal line
    "argv": (),  # the whole argument list (program first) as strings
    "filename": "",  # compile / code.__new__: the file name the new code will claim
    "pid": 0,
    "own_pid": 0,
}


def rules(owned_modules, writable, protected, allowed_executables, planted, experiment=()) -> dict:
    """The confinement as a plain dict (built-in types cannot be rebound by the experiment)."""
    return {
        "owned_modules": tuple(owned_modules),
        "writable": tuple(writable),
        "protected": tuple(protected),
        "allowed_executables": tuple(allowed_executables),
        "planted": tuple(planted),
        "experiment": tuple(experiment),
    }


def event(name: str, **facts) -> dict:
    """One audit event as plain data; facts an event does not use keep their defaults."""
    unknown = set(facts) - set(EVENT_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown event facts: {sorted(unknown)}")
    return {"name": name, **EVENT_DEFAULTS, **facts}


def under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def owned(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def matches_tool(name: str, allowed: tuple[str, ...]) -> bool:
    """``gcc`` matches ``gcc``, ``x86_64-linux-gnu-gcc-12`` and ``gcc-12``, not ``gcc-ar``.

    String methods only: a rebound ``re.fullmatch`` would change nothing.
    """
    for tool in allowed:
        stem, dash, version = name.rpartition("-")
        if dash and version and version.replace(".", "").isdigit():
            name_candidates = (name, stem)
        else:
            name_candidates = (name,)
        for candidate in name_candidates:
            if candidate == tool or candidate.endswith("-" + tool):
                return True
    return False


def _at(ev: dict) -> str:
    return f" at {ev['site']}" if ev["site"] else ""


def decide(ev: dict, rules: dict) -> str | None:
    """The refusal text for ``ev`` under ``rules`` (``<event>: <detail>``), or None."""
    name = ev["name"]
    if name in ALWAYS_REFUSED:
        return f"{name}: {ALWAYS_REFUSED[name]}{_at(ev)}"
    if name == "os.kill":
        if ev["pid"] != ev["own_pid"]:
            return f"os.kill: signal to process {ev['pid']}{_at(ev)}"
        return None
    if name in PROGRAM_EVENTS:
        return _program(ev, rules)
    if name.startswith("ctypes."):
        return f"{name}: ctypes from experiment code{_at(ev)}" if ev["direct"] else None
    if name in INTROSPECTION:
        if not ev["direct"]:
            return None
        if name == "sys._getframe" and ev["top_file"].endswith(FRAME_SAFE_STDLIB):
            return None
        return f"{name}: {INTROSPECTION[name]}{_at(ev)}"
    if name == "object.__getattr__":
        if ev["direct"] and ev["attribute"] in FRAME_ATTRIBUTES:
            return f"object.__getattr__: {ev['attribute']} hands out a frame{_at(ev)}"
        return None
    if name in ("compile", "code.__new__"):
        return _disguise(ev, rules)
    if name in ("object.__setattr__", "object.__delattr__"):
        return _rebinding(ev, rules)
    if name == "open" or name in PATH_EVENTS:
        return _write(ev, rules)
    return None


def read_only_query(argv: tuple[str, ...]) -> bool:
    """Whether ``argv`` runs a reporting program (``READ_ONLY_QUERIES``) with only its read-only
    options: each word one of them, or the GPU index right after ``-i``."""
    if not argv:
        return False
    forms = READ_ONLY_QUERIES.get(argv[0].rsplit("/", 1)[-1])
    if forms is None or len(argv) == 1:
        return False
    after_i = False
    for word in argv[1:]:
        if after_i:
            if not word.isdigit():
                return False
            after_i = False
        elif word == "-i":
            after_i = True
        elif not any(f.endswith("=") and word.startswith(f) and len(word) > len(f) for f in forms):
            return False
    return not after_i


def _program(ev: dict, rules: dict) -> str | None:
    given = ev["program"].rsplit("/", 1)[-1]
    real = ev["program_real"].rsplit("/", 1)[-1]
    allowed = rules["allowed_executables"]
    if read_only_query(ev["argv"]) and given in READ_ONLY_QUERIES:
        allowed = (*allowed, given)
    if not matches_tool(given, allowed):
        what = f"program {ev['program']!r} ({ev['command']})"
        return f"{ev['name']}: {what} is not an allowed toolchain{_at(ev)}"
    if not ev["program_real"]:
        return f"{ev['name']}: program {ev['program']!r} not found{_at(ev)}"
    if not matches_tool(real, allowed):
        resolved = f"{ev['program']!r} is {ev['program_real']}"
        return f"{ev['name']}: {resolved}, not an allowed toolchain{_at(ev)}"
    if under(ev["program_real"], rules["planted"]):
        return (
            f"{ev['name']}: {ev['program_real']} lies in a writable or experiment folder{_at(ev)}"
        )
    return None


def _disguise(ev: dict, rules: dict) -> str | None:
    """Frames are told apart by ``co_filename``: experiment code may not claim a library file.

    Importlib compiles a module's source under its own path (from its frozen bootstrap).
    """
    filename = ev["filename"]
    if not ev["direct"] or filename.startswith("<") or under(filename, rules["experiment"]):
        return None
    if ev["name"] == "compile" and ev["top_file"].startswith("<frozen importlib"):
        return None
    return f"{ev['name']}: code named after {filename}{_at(ev)}"


def _rebinding(ev: dict, rules: dict) -> str | None:
    if ev["target_module"] is None or not ev["direct"]:
        return None
    if owned(ev["target_module"], rules["owned_modules"]):
        return None
    if ev["attribute"] in FACTORY_ATTRIBUTES and ev["top_file"].endswith(FACTORY_STDLIB):
        return None
    verb = "rebinding" if ev["name"] == "object.__setattr__" else "deletion"
    return f"{ev['name']}: {verb} of {ev['target_module']}.{ev['attribute']}{_at(ev)}"


def _write(ev: dict, rules: dict) -> str | None:
    if ev["relative"]:
        return f"{ev['name']}: write to a relative path (its folder is not visible){_at(ev)}"
    for path in ev["paths"]:
        if under(path, rules["protected"]):
            return f"{ev['name']}: write to {path} (the refusal log){_at(ev)}"
        if not under(path, rules["writable"]):
            return f"{ev['name']}: write to {path}, outside the writable folders{_at(ev)}"
    return None
