"""The benchmark artifact handed from the GPU job to the bot job, and its checks.

The GPU job ran code from the pull request, so the bot treats everything in the artifact as
untrusted data: the PR record must have exactly the expected shape, the metrics files must pass
the schema, and every name of a commit or PR must agree across ``pr.json``, ``base.json``,
``head.json`` and what the GitHub API says (the run's head SHA, the PR found by that SHA, a base
the caller checked is on the default branch).

Artifact folder: ``pr.json`` (``{"pr": N, "base_sha": ..., "head_sha": ...}``, plus
``"pairs": P`` and ``"budget_s": B`` when the job sampled sequentially), ``base.json`` and
``head.json`` (the first pair's metrics files, ``tilegym-bench-metrics/1`` or ``/2``), and
``base-K.json`` / ``head-K.json`` for each later pair K = 2..P. Every pair is complete, no pair
file lies beyond P, and every metrics file names its side's commit and the one model key.
Without ``pairs`` the artifact is one pair (the fixed scheme, ``budget_s`` 0).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from tilegym_hf_bench.metrics_schema import validation_errors

from tilegym.findings import Finding

PR_FILE, BASE_FILE, HEAD_FILE = "pr.json", "base.json", "head.json"
MAX_BYTES = 16 * 1024 * 1024
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
PAIR_FILE_RE = re.compile(r"^(base|head)-([0-9]+)\.json$")
MAX_PAIRS = 8  # sequential.MAX_PAIRS: the most pairs the sampling ever runs


def pair_files(k: int) -> tuple[str, str]:
    """(base, head) file names of pair ``k`` (1-based; pair 1 keeps the old names)."""
    if k < 1:
        raise ValueError(f"pairs count from 1, got {k}")
    return (BASE_FILE, HEAD_FILE) if k == 1 else (f"base-{k}.json", f"head-{k}.json")


def pair_count(record: dict) -> int:
    """How many pairs a sound ``pr.json`` announces (1 without ``pairs``)."""
    return int(record.get("pairs", 1))


def budget_of(record: dict) -> float:
    """The sampling budget a sound ``pr.json`` names (0: the fixed scheme)."""
    return float(record.get("budget_s", 0.0))


def _load(path: Path, findings: list[Finding]) -> Any:
    try:
        if path.stat().st_size > MAX_BYTES:
            findings.append(Finding(str(path), 1, "ART001", f"larger than {MAX_BYTES} bytes"))
            return None
        return json.loads(path.read_text())
    except FileNotFoundError:
        findings.append(Finding(str(path), 1, "ART001", "missing from the artifact"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        findings.append(Finding(str(path), 1, "ART001", f"not readable JSON: {exc}"))
    return None


def check_pr_record(doc: Any, path: str) -> list[Finding]:
    """Findings for ``pr.json``: pr (positive int), base_sha and head_sha (40 hex), optionally
    pairs (1..MAX_PAIRS) and budget_s (finite, >= 0; more than one pair needs a budget). Pure."""
    required, optional = {"pr", "base_sha", "head_sha"}, {"pairs", "budget_s"}
    if not isinstance(doc, dict) or not required <= set(doc) <= required | optional:
        return [
            Finding(
                path,
                1,
                "ART002",
                "must be an object with exactly pr, base_sha, head_sha (and optionally pairs, "
                "budget_s)",
            )
        ]
    findings = []
    if isinstance(doc["pr"], bool) or not isinstance(doc["pr"], int) or doc["pr"] < 1:
        findings.append(Finding(path, 1, "ART002", "pr must be a positive integer"))
    for key in ("base_sha", "head_sha"):
        if not isinstance(doc[key], str) or not SHA_RE.match(doc[key]):
            findings.append(Finding(path, 1, "ART002", f"{key} must be 40 lowercase hex digits"))
    pairs = doc.get("pairs", 1)
    if isinstance(pairs, bool) or not isinstance(pairs, int) or not 1 <= pairs <= MAX_PAIRS:
        findings.append(Finding(path, 1, "ART002", f"pairs must be an integer 1..{MAX_PAIRS}"))
    budget = doc.get("budget_s", 0)
    if (
        isinstance(budget, bool)
        or not isinstance(budget, (int, float))
        or not (math.isfinite(budget) and budget >= 0)
    ):
        findings.append(Finding(path, 1, "ART002", "budget_s must be a finite number >= 0"))
    elif not findings and pairs > 1 and budget == 0:
        findings.append(
            Finding(path, 1, "ART002", f"{pairs} pairs with budget_s 0: the fixed scheme is one")
        )
    return findings


def check_metrics(doc: Any, path: str, expected_sha: str) -> list[Finding]:
    """Findings for one metrics document that must describe ``expected_sha``. Pure."""
    errors = validation_errors(doc)
    if errors:
        return [Finding(path, 1, "ART003", f"breaks the metrics schema: {e}") for e in errors]
    if doc["commit"] != expected_sha:
        return [Finding(path, 1, "ART004", f"is for {doc['commit']}, expected {expected_sha}")]
    return []


def check_artifact(
    folder: Path,
    expect_head_sha: str | None,
    *,
    expect_base_sha: str | None = None,
    expect_pr: int | None = None,
    expect_model_key: str | None = None,
) -> tuple[dict | None, list[Finding]]:
    """The PR record when the whole artifact is sound, and the findings either way.

    ``expect_*`` are what the API says (None: not known to the caller); ``pr.json`` must agree
    with each, every pair ``pr.json`` announces must be there whole and no other, each metrics
    file must name the commit ``pr.json`` gives for its side, and all one model key.
    """
    findings: list[Finding] = []
    pr_path = folder / PR_FILE
    record = _load(pr_path, findings)
    if record is None:
        return None, findings
    findings += check_pr_record(record, str(pr_path))
    if findings:
        return None, findings
    expected = (("head_sha", expect_head_sha), ("base_sha", expect_base_sha), ("pr", expect_pr))
    for key, want in expected:
        if want is not None and record[key] != want:
            msg = f"{key} {record[key]} is not the benchmarked run's {want}"
            findings.append(Finding(str(pr_path), 1, "ART004", msg))
    if findings:
        return None, findings
    pairs = pair_count(record)
    for entry in sorted(p.name for p in folder.iterdir()):
        match = PAIR_FILE_RE.match(entry)
        if match and not 2 <= int(match[2]) <= pairs:
            findings.append(
                Finding(
                    str(folder / entry),
                    1,
                    "ART005",
                    f"is not one of the {pairs} pair(s) {PR_FILE} announces",
                )
            )
    keys: dict[str, str] = {}
    for k in range(1, pairs + 1):
        names = pair_files(k)
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            msg = f"missing from the artifact: pair {k} of {pairs} is not whole"
            findings += [Finding(str(folder / name), 1, "ART001", msg) for name in missing]
            continue
        for name, sha in zip(names, (record["base_sha"], record["head_sha"]), strict=True):
            path = folder / name
            doc = _load(path, findings)
            if doc is None:
                continue
            found = check_metrics(doc, str(path), sha)
            findings += found
            if not found:
                keys[str(path)] = doc["model_key"]
    want_key = expect_model_key or next(iter(keys.values()), None)
    for path, key in keys.items():
        if key != want_key:
            findings.append(
                Finding(path, 1, "ART006", f"is of model {key!r}, expected {want_key!r}")
            )
    return (None if findings else record), findings
