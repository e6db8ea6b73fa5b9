"""A throw-away checkout whose ``tilegym_hf_bench._cli`` is a small scripted stand-in bench.

The stand-in is a real program run as a real subprocess; what it does is chosen with
``--model-key``: ``ok`` writes valid metrics, ``crash`` dies, ``garbage`` writes junk,
``wrongcommit`` writes metrics for another commit, ``hang`` ignores SIGTERM and spawns a
grandchild that does too, ``interval`` records when it ran and on which GPU.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import git
from tilegym_bot.runner.base import BenchRequest, synthesize_metrics

FAKE_CLI = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    from pathlib import Path

    args = sys.argv[1:]

    def val(flag):
        return args[args.index(flag) + 1] if flag in args else None

    key, out = val("--model-key"), Path(val("--metrics-out"))
    print("fake bench at", __file__, "gpu", os.environ.get("CUDA_VISIBLE_DEVICES", "-"), flush=True)
    template = json.loads((Path(__file__).parent / "ok_metrics.json").read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    template["commit"] = head.strip()
    if key == "ok":
        out.write_text(json.dumps(template))
    elif key == "crash":
        print("Traceback (most recent call last):", file=sys.stderr)
        print("RuntimeError: boom in the kernel", file=sys.stderr)
        sys.exit(3)
    elif key == "garbage":
        out.write_text("{not json")
    elif key == "wrongcommit":
        template["commit"] = "0" * 40
        out.write_text(json.dumps(template))
    elif key == "hang":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
        child = subprocess.Popen([sys.executable, "-c", code])
        Path(val("--pid-file")).write_text(f"{os.getpid()} {child.pid}")
        print("hanging on purpose", file=sys.stderr, flush=True)
        time.sleep(120)
    elif key == "interval":
        start = time.time()
        time.sleep(float(val("--sleep")))
        line = json.dumps({"gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": start,
                           "end": time.time(), "out": str(out)})
        with open(val("--record"), "a") as fh:
            fh.write(line + "\\n")
        out.write_text(json.dumps(template))
    """
)


def make_fake_repo(root: Path) -> tuple[Path, str]:
    """A git repo at ``root`` with the stand-in bench committed; returns (path, HEAD sha)."""
    pkg = root / "modeling/transformers/src/tilegym_hf_bench"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Stand-in bench package for executor tests."""\n')
    (pkg / "_cli.py").write_text(FAKE_CLI)
    probe = BenchRequest(root, "0" * 40, ["--model-key", "ok"], root / "m.json", root)
    template = synthesize_metrics(probe, "ok", "", "2026-01-01T00:00:00+00:00", 1.0)
    template["error"] = None
    (pkg / "ok_metrics.json").write_text(json.dumps(template))
    repo = git.Repo.init(root)
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "t").set_value("user", "email", "t@example.com")
    repo.index.add([str(p.relative_to(root)) for p in pkg.iterdir()])
    repo.index.commit("stand-in bench")
    return root, repo.head.commit.hexsha


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")
