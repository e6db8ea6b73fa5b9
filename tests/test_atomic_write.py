"""tilegym.atomic: the new content or the old one, never a partial file or a stray temp file."""

from __future__ import annotations

import json
import math

import pytest

from tilegym.atomic import write_json_atomic, write_text_atomic


def test_replaces_content_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "deep" / "ledger.md"
    write_text_atomic(target, "old\n")
    write_text_atomic(target, "new\n")
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["ledger.md"]


def test_json_that_cannot_be_written_leaves_the_old_file_untouched(tmp_path):
    target = tmp_path / "metrics.json"
    write_json_atomic(target, {"a": 1})
    with pytest.raises(ValueError):
        write_json_atomic(target, {"a": math.nan}, allow_nan=False)
    with pytest.raises(TypeError):
        write_json_atomic(target, {"a": object()})
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_json_options(tmp_path):
    target = tmp_path / "r.json"
    write_json_atomic(target, {"b": 1, "a": 2}, indent=1, sort_keys=True)
    assert target.read_text() == '{\n "a": 2,\n "b": 1\n}\n'
