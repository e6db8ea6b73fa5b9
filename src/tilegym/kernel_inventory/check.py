"""``tilegym-inventory check``: schema, semantic, pairing and (optionally) permalink content."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tilegym.findings import Finding
from tilegym.kernel_inventory.inventory import Loaded, check_files, find_repo_root, resolve_targets
from tilegym.kernel_inventory.jsonfile import finding
from tilegym.kernel_inventory.models import Definition
from tilegym.kernel_inventory.permalink import Permalink, iter_source_lines, parse_permalink
from tilegym.kernel_inventory.sources import CiteError, SourceVerifier


def check_paths(
    paths: Iterable[Path | str] = (),
    repo_root: Path | str | None = None,
    *,
    verifier: SourceVerifier | None = None,
) -> list[Finding]:
    """All findings for ``paths`` (and their pairs; every inventory file when empty).

    ``repo_root`` defaults to the nearest directory with ``.git`` above the cwd. With a
    ``verifier`` the cited permalink regions are checked as well.
    """
    repo_root = Path(repo_root) if repo_root is not None else find_repo_root()
    targets = resolve_targets([Path(p) for p in paths], repo_root)
    loaded_files, findings = check_files(targets, repo_root)
    if verifier is not None:
        for loaded in loaded_files:
            findings.extend(source_findings(loaded, verifier))
    return findings


def source_findings(loaded: Loaded, verifier: SourceVerifier) -> list[Finding]:
    """Content findings for the well-formed permalinks of one Definition."""
    if not isinstance(loaded.model, Definition) or loaded.doc is None:
        return []
    line = loaded.doc.line_of(("reference",))
    found: list[Finding] = []
    for source in iter_source_lines(loaded.model.reference):
        link = parse_permalink(source.url)
        if not isinstance(link, Permalink):
            continue  # already reported by the structural check
        try:
            verifier.verify(link)
        except CiteError as exc:
            found.append(
                finding(
                    loaded.shown, line, exc.code, f"reference line {source.lineno}: {exc.message}"
                )
            )
    return found
