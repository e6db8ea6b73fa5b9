"""Fixtures of the hook tests (helpers live in hookrepo_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hookrepo_helpers import MAIN_FILES, HookRepo


@pytest.fixture
def hook_repo(tmp_path: Path) -> HookRepo:
    """``main`` holds the toy project; ``experiment/qwen3/x`` is checked out on top of it."""
    repo = HookRepo(tmp_path / "repo")
    for path, content in MAIN_FILES.items():
        repo.write(path, content)
    repo.commit("main")
    repo.checkout("experiment/qwen3/x", create=True)
    return repo
