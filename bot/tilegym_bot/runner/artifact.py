"""The benchmark artifact handed from the GPU job to the bot job, and its checks.

The GPU job ran code from the pull request, so the bot treats everything in the artifact as
untrusted data: the PR record must have exactly the expected shape, the metrics files must pass
the schema, and every name of a commit or PR must agree across ``pr.json``, ``base.json``,
``head.json`` and what the GitHub API says (the run's head SHA, the PR found by that SHA, a base
the caller checked is on the default branch).

Artifact folder: ``pr.json`` (``{"pr": N, "base_sha": ..., "head_sha": ...}``), ``base.json``
and ``head.json`` (metrics files, ``tilegym-bench-metrics/1`` or ``/2``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tilegym_hf_bench.metrics_schema import validation_errors

from tilegym.findings import Finding

PR_FILE, BASE_FILE, HEAD_FILE = "pr.json", "base.json", "head.json"
MAX_BYTES = 16 * 1024 * 1024
SHA_RE = re.compile(r"^[0-9a-f]{40}$")


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
    """Findings for ``pr.json``: exactly pr (positive int), base_sha and head_sha (40 hex). Pure."""
    if not isinstance(doc, dict) or set(doc) != {"pr", "base_sha", "head_sha"}:
        return [Finding(path, 1, "ART002", "must be an object with exactly pr, base_sha, head_sha")]
    findings = []
    if isinstance(doc["pr"], bool) or not isinstance(doc["pr"], int) or doc["pr"] < 1:
        findings.append(Finding(path, 1, "ART002", "pr must be a positive integer"))
    for key in ("base_sha", "head_sha"):
        if not isinstance(doc[key], str) or not SHA_RE.match(doc[key]):
            findings.append(Finding(path, 1, "ART002", f"{key} must be 40 lowercase hex digits"))
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
) -> tuple[dict | None, list[Finding]]:
    """The PR record when the whole artifact is sound, and the findings either way.

    ``expect_*`` are what the API says (None: not known to the caller); ``pr.json`` must agree
    with each, and each metrics file must name the commit ``pr.json`` gives for its side.
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
    for name, sha in ((BASE_FILE, record["base_sha"]), (HEAD_FILE, record["head_sha"])):
        path = folder / name
        doc = _load(path, findings)
        if doc is not None:
            findings += check_metrics(doc, str(path), sha)
    return (None if findings else record), findings
