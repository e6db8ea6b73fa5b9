"""Permalink parsing: precise links accepted, every drifting or vague form rejected."""

from __future__ import annotations

import pytest

from tilegym.kernel_inventory.permalink import (
    Permalink,
    PermalinkError,
    iter_source_lines,
    leading_source_lines,
    parse_permalink,
)

SHA = "a" * 8 + "0123456789abcdef0123456789abcdef"
GH = f"https://github.com/huggingface/transformers/blob/{SHA}/src/transformers/models/x.py"
HF = f"https://huggingface.co/Qwen/Qwen3-0.6B/blob/{SHA}/modeling_qwen.py"


def test_github_range_parses_into_fields():
    link = parse_permalink(f"{GH}#L10-L20")
    assert link == Permalink(
        "github", "huggingface", "transformers", SHA, "src/transformers/models/x.py", 10, 20
    )
    assert link.repo_id == "huggingface/transformers"
    assert link.url == f"{GH}#L10-L20"


def test_single_line_and_huggingface_remote_code():
    link = parse_permalink(f"{HF}#L7")
    assert isinstance(link, Permalink)
    assert (link.host, link.repo_id, link.path, link.first, link.last) == (
        "huggingface",
        "Qwen/Qwen3-0.6B",
        "modeling_qwen.py",
        7,
        7,
    )
    assert link.url == f"{HF}#L7"


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        (f"{GH.replace(SHA, 'main')}#L1", "40 lowercase hex"),
        (f"{GH.replace(SHA, SHA[:12])}#L1", "40 lowercase hex"),
        (f"{GH.replace(SHA, SHA.upper())}#L1", "40 lowercase hex"),
        (f"{GH}#L20-L10", "reversed"),
        (f"{GH}#L0", "start at 1"),
        (GH, "line anchor"),
        (f"{GH}#L1-20", "line anchor"),
        (f"{GH}#L1:L2", "line anchor"),
        (f"{GH.replace('https', 'http')}#L1", "https://"),
        (f"{GH.replace('github.com', 'gitlab.com')}#L1", "host"),
        (f"{GH.replace('/blob/', '/tree/')}#L1", "/blob/"),
        (f"https://github.com/transformers/blob/{SHA}#L1", "<owner>/<repo>"),
        (f"{GH.replace('/src/', '/../')}#L1", "normalized"),
        (f"{GH}?plain=1#L1", "query"),
        (f"{GH}#L1 extra", "whitespace"),
        ("", "empty"),
    ],
)
def test_rejected_forms_say_why(url, needle):
    result = parse_permalink(url)
    assert isinstance(result, PermalinkError)
    assert needle in result.message
    assert "\n" not in result.message


def test_non_string_is_an_error_not_an_exception():
    assert isinstance(parse_permalink(None), PermalinkError)
    assert isinstance(parse_permalink(42), PermalinkError)


def test_iter_source_lines_finds_every_source_comment_with_line_numbers():
    text = f"# Source: {GH}#L1\n#Source:{HF}#L2\nimport torch\n\n    # Source: later\ndef run(x):\n"
    found = list(iter_source_lines(text))
    assert [(s.lineno, s.url) for s in found] == [(1, f"{GH}#L1"), (2, f"{HF}#L2"), (5, "later")]
    assert [s.lineno for s in leading_source_lines(text)] == [1, 2]
    assert leading_source_lines("import torch\n# Source: x\n") == []
