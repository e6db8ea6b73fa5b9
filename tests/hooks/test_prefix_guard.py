"""``tilegym-hooks prefixes``: every coverage prefix names a ``@ct.kernel`` in src/tilegym."""

from __future__ import annotations

from hookrepo_helpers import PREFIXES, run_hooks
from hypothesis import given, settings
from hypothesis import strategies as st
from tilegym_hf_bench.profiling.cutile_names import kernel_functions
from tilegym_hooks.prefix_file import parse_prefixes
from tilegym_hooks.prefix_guard import prefix_findings


def prefixes(repo):
    return repo.run("prefixes")


def test_known_kernels_pass_and_a_plain_function_fails(hook_repo):
    hook_repo.write(PREFIXES, "prefixes:\n  - qwen3_rms_norm_kernel\n  - rope_kernel\n")
    hook_repo.commit()
    result = prefixes(hook_repo)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    hook_repo.write(PREFIXES, "prefixes:\n  - rope_kernel\n  - rms_norm\n  - aten::mm\n")
    hook_repo.commit("widen the filter")
    result = prefixes(hook_repo)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{PREFIXES}:3: PREFIX005 prefix 'rms_norm' names no @ct.kernel function under src/tilegym",
        f"{PREFIXES}:4: PREFIX005 prefix 'aten::mm' names no @ct.kernel function under src/tilegym",
    ]


def test_kernel_removed_from_the_sources_fails(hook_repo):
    hook_repo.replace("src/tilegym/ops/rope.py", "@cuda.tile.kernel(num_ctas=2)\n", "")
    hook_repo.write(PREFIXES, "prefixes: [rope_kernel]\n")
    hook_repo.commit()
    result = prefixes(hook_repo)
    assert result.returncode == 1
    assert result.stdout == (
        f"{PREFIXES}:1: PREFIX005 prefix 'rope_kernel' names no @ct.kernel function under "
        "src/tilegym\n"
    )


def test_malformed_entries_each_give_a_line(hook_repo):
    hook_repo.write(
        PREFIXES,
        "prefixes:\n"
        "  - qwen3_rms_norm_kernel\n"
        "  - 42\n"
        '  - ""\n'
        "  - qwen3_rms_norm_kernel\n"
        "  - [nested]\n"
        "  -\n",
    )
    hook_repo.commit()
    result = prefixes(hook_repo)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{PREFIXES}:3: PREFIX002 entry is a int, not a string",
        f"{PREFIXES}:4: PREFIX003 entry is an empty string",
        f"{PREFIXES}:5: PREFIX004 duplicate prefix 'qwen3_rms_norm_kernel' (first on line 2)",
        f"{PREFIXES}:6: PREFIX002 entry is a list, not a string",
        f"{PREFIXES}:7: PREFIX002 entry is a null, not a string",
    ]


MALFORMED = {
    "prefixes: [rope_kernel\n": "2: PREFIX000 invalid YAML: while parsing a flow sequence; "
    "expected ',' or ']', but got '<stream end>'",
    "- rope_kernel\n": "1: PREFIX001 must be a mapping with the single key 'prefixes'",
    "prefixes: [a]\nextra: 1\n": "1: PREFIX001 must be a mapping with the single key 'prefixes'",
    "prefixes: rope_kernel\n": "1: PREFIX001 'prefixes' must be a list of strings",
    "": "1: PREFIX001 must be a mapping with the single key 'prefixes'",
    "a: 1\n---\nb: 2\n": "2: PREFIX000 invalid YAML: expected a single document in the stream; "
    "but found another document",
    "prefixes: [\x07]\n": "1: PREFIX000 invalid YAML: character 0x0007 is not allowed",
}


def test_malformed_files_by_the_pure_rule():
    for content, tail in MALFORMED.items():
        findings = prefix_findings(content.encode(), {"rope_kernel"}, "p.yaml")
        assert [str(f) for f in findings] == [f"p.yaml:{tail}"], content


def test_bad_files_give_one_line_never_a_traceback(hook_repo):
    cases = [
        (
            "prefixes:\n  - rope_kernel\nprefixes: []\n",
            "3: PREFIX000 invalid YAML: while constructing a mapping; found duplicate key "
            "'prefixes' (first on line 1)",
        ),
        (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xd8", "1: PREFIX000 file is not UTF-8 text"),
        (
            "prefixes:\n" + "  - rope_kernel_x\n" * 200_000,
            "1: PREFIX000 file is larger than 2097152 bytes",
        ),
        (None, "1: PREFIX000 file not found"),
    ]
    for content, tail in cases:
        if content is None:
            (hook_repo.root / PREFIXES).unlink()
        else:
            hook_repo.write(PREFIXES, content)
        result = prefixes(hook_repo)
        assert (result.returncode, result.stdout, result.stderr) == (1, f"{PREFIXES}:{tail}\n", "")


def test_empty_list_is_allowed_and_the_root_is_found_from_a_subdirectory(hook_repo):
    hook_repo.write(PREFIXES, "prefixes: []\n")
    assert prefixes(hook_repo).returncode == 0
    hook_repo.write(PREFIXES, "prefixes: [nothing]\n")
    result = run_hooks(hook_repo.root / "src" / "tilegym", "prefixes")
    assert (result.returncode, result.stdout) == (
        1,
        f"{PREFIXES}:1: PREFIX005 prefix 'nothing' names no @ct.kernel function under "
        "src/tilegym\n",
    )


def test_decorator_spellings_by_ast():
    source = """
import cuda.tile as tile
from cuda.tile import kernel as k
from cuda import tile as t2
import cuda.tile as ct

@ct.kernel
def a(x): pass

@ct.kernel(occupancy=2)
def b(x): pass

@cuda.tile.kernel
def c(x): pass

@tile.kernel(num_ctas=1)
def d(x): pass

@k
def e(x): pass

@t2.kernel
def f(x): pass

@ct.function
def not_a_kernel(x): pass

@other.kernel
def g(x): pass

def plain(x): pass
"""
    assert sorted(kernel_functions(source)) == ["a", "b", "c", "d", "e", "f"]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_parser_never_raises_and_lines_are_in_the_file(data):
    parsed = parse_prefixes(data, "p.yaml")
    for finding in parsed.findings:
        assert finding.code.startswith("PREFIX")
        assert 1 <= finding.line <= data.count(b"\n") + data.count(b"\r") + 2
    assert all(isinstance(p.value, str) and p.value.strip() for p in parsed.prefixes)
