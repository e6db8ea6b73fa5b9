"""SCOPE015/SCOPE016: experiment code may not name a ``@ct.kernel`` like a generated or vendor
kernel, nor give a custom op a name holding cuTile's mangling mark (Inductor copies op names
into the Triton kernels it fuses around them). Run through the scope check on whole changes."""

from __future__ import annotations

import re

import pytest
from tilegym_hooks.scope_rules import Change, scope_findings

KERNEL = "src/tilegym/transformers/qwen3/kernels/rope.py"
MODELING = "src/tilegym/transformers/qwen3/modeling_qwen3.py"

HEADER = "import torch\nimport cuda.tile as ct\n\n"

# (id, path, source after HEADER, expected "line: CODE word" findings)
CASES = [
    (
        "decoy_kernel",
        KERNEL,
        "@ct.kernel\ndef triton_poi_fused__to_copy_zzrope(x):\n    pass\n",
        ["5: SCOPE015 triton_poi_fused__to_copy_zzrope"],
    ),
    (
        "decoy_kernel_other_case_and_options",
        KERNEL,
        "@ct.kernel(num_ctas=1)\ndef Triton_per_fused_x(x):\n    pass\n",
        ["5: SCOPE015 Triton_per_fused_x"],
    ),
    (
        "decoy_kernel_aliased_decorator",
        KERNEL,
        "from cuda.tile import kernel as k\n\n@k\ndef cpp_fused_zz(x):\n    pass\n",
        ["7: SCOPE015 cpp_fused_zz"],
    ),
    (
        "vendor_kernel_names",
        KERNEL,
        "@ct.kernel\ndef nvjet_sm90_tst(x):\n    pass\n\n\n"
        "@ct.kernel\ndef sm90_xmma_gemm(x):\n    pass\n",
        ["5: SCOPE015 nvjet_sm90_tst", "10: SCOPE015 sm90_xmma_gemm"],
    ),
    (
        "custom_op_decorator",
        MODELING,
        '@torch.library.custom_op("exp::zzrope_Kt2_A9f32_1t", mutates_args=("x",))\n'
        "def zzrope(x: torch.Tensor) -> None:\n    pass\n",
        ["4: SCOPE016 zzrope_Kt2_A9f32_1t"],
    ),
    (
        "library_define_schema",
        KERNEL,
        'lib = torch.library.Library("exp", "DEF")\n'
        'lib.define("Kt1_A1f32_1l0_I(Tensor x) -> Tensor")\n',
        ["5: SCOPE016 Kt1_A1f32_1l0_I"],
    ),
    (
        "name_built_in_an_f_string",
        KERNEL,
        'NS = "exp"\nOP = torch.library.define(f"{NS}::zz_Kt2_A1f32_1l0_I(Tensor x) -> Tensor")\n',
        ["5: SCOPE016 zz_Kt2_A1f32_1l0_I"],
    ),
    (
        "one_line_per_name",
        KERNEL,
        'A = "a_Kt2_x"\nB = "b_Kt1"\n',
        ["4: SCOPE016 a_Kt2_x", "5: SCOPE016 b_Kt1"],
    ),
    (
        "ordinary_names_pass",
        KERNEL,
        '"""Mentions rms_norm_kernel_Kt2_A1f32_1l0 in a docstring."""\n'
        '@ct.kernel\ndef rope_kernel(x):\n    pass\n\n\nK = "rope_Kv_cache"\n'
        'T = "triton_poi_fused_x"\n',
        [],
    ),
]


def _findings(path: str, source: str) -> list[str]:
    """``line: CODE name`` for each finding, the name being the kernel or the op it is about."""
    found = scope_findings("qwen3", [Change(path, None, (HEADER + source).encode())])
    assert all(f.path == path for f in found)
    out = []
    for f in found:
        m = re.search(r"@ct.kernel (\w+)|name '(\w+)'", f.message)
        out.append(f"{f.line}: {f.code} {m and (m[1] or m[2])}")
    return out


@pytest.mark.parametrize(
    ("path", "source", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_generated_kernel_names_and_mangled_op_names_are_findings(path, source, expected):
    assert _findings(path, source) == expected


def test_the_scope_command_prints_one_line_per_finding(hook_repo):
    hook_repo.write(KERNEL, HEADER + "@ct.kernel\ndef triton_poi_fused_zz(x):\n    pass\n")
    hook_repo.commit("decoy")
    result = hook_repo.run("scope", "--base", "main")
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == [
        f"{KERNEL}:5: SCOPE015 @ct.kernel triton_poi_fused_zz starts like generated or vendor "
        "kernels ('triton_'); a cuTile kernel may not be named like another tool's kernels"
    ]
