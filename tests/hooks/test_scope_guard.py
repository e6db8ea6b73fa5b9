"""``tilegym-hooks scope`` on a real repository with ``main`` and ``experiment/qwen3/x``."""

from __future__ import annotations

from pathlib import Path

from hookrepo_helpers import MONKEY_PATCH, PREFIXES, QWEN3_KERNEL, TILEGYM_PATCH, run_hooks

import tilegym.transformers


def scope(repo, *args, env=None):
    return repo.run("scope", "--base", "main", *args, env=env)


def assert_findings(result, *lines):
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines() == list(lines)
    assert "Traceback" not in result.stderr


def assert_clean(result):
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_allowed_experiment_changes_pass(hook_repo):
    hook_repo.replace(MONKEY_PATCH, '"Qwen3RMSNorm", object)', '"Qwen3RMSNorm", type)')
    hook_repo.replace(TILEGYM_PATCH, '"qwen3": {"rms_norm": True}', '"qwen3": {"rms_norm": False}')
    hook_repo.replace(
        PREFIXES, "- qwen3_rms_norm_kernel", "- qwen3_rms_norm_kernel\n  - rope_kernel"
    )
    hook_repo.replace(QWEN3_KERNEL, "return x", "return x * 1")
    base = "src/tilegym/transformers/qwen3"
    hook_repo.write(f"{base}/kernels/silu_and_mul.py", "def silu_and_mul(g, u):\n    return g\n")
    hook_repo.write(f"{base}/kernel_definitions/qwen3_silu_and_mul.json", "{}\n")
    hook_repo.write(f"{base}/kernel_solutions/qwen3_silu_and_mul.json", "{}\n")
    hook_repo.write(f"{base}/modeling_qwen3.py", "class Qwen3Model:\n    pass\n")
    hook_repo.write("modeling/transformers/scripts/benchmark_hf_model.sh", "echo bench\n")
    hook_repo.commit("qwen3 experiment")
    assert_clean(scope(hook_repo))


def test_console_script_rejects_another_models_patch_function(hook_repo):
    hook_repo.replace(MONKEY_PATCH, '"LlamaRMSNorm", object)', '"LlamaRMSNorm", type)')
    hook_repo.commit()
    result = hook_repo.run("scope", "--base", "main", console_script=True)
    assert_findings(
        result,
        f"{MONKEY_PATCH}:19: SCOPE002 changes outside apply_tilegym_kernel_to_qwen3(): "
        "function 'apply_tilegym_kernel_to_llama'",
    )


def test_helper_function_change_fails_but_comment_and_blank_lines_pass(hook_repo):
    hook_repo.replace(
        MONKEY_PATCH, "# keep the original for undo", "# the original, kept for undo\n"
    )
    hook_repo.replace(MONKEY_PATCH, "    return original", "\n    return original  # for undo")
    hook_repo.commit("comments only")
    assert_clean(scope(hook_repo))
    hook_repo.replace(MONKEY_PATCH, "    return original", "    return fn")
    hook_repo.commit("helper change")
    assert_findings(
        scope(hook_repo),
        f"{MONKEY_PATCH}:6: SCOPE002 changes outside apply_tilegym_kernel_to_qwen3(): "
        "function '_swap'",
    )


def test_new_model_function_is_allowed_and_new_import_is_not(hook_repo):
    addition = "\n\ndef apply_tilegym_kernel_to_qwen3(model=None):\n    return model\n"
    hook_repo.replace(MONKEY_PATCH, "def apply_tilegym_kernel_to_qwen3(", "def _old_qwen3(")
    hook_repo.commit("rename")
    assert_findings(
        scope(hook_repo),
        f"{MONKEY_PATCH}:13: SCOPE002 changes outside apply_tilegym_kernel_to_qwen3(): "
        "function '_old_qwen3'",
    )
    hook_repo.replace(MONKEY_PATCH, "def _old_qwen3(", "def apply_tilegym_kernel_to_qwen3(")
    hook_repo.write(MONKEY_PATCH, hook_repo.read(MONKEY_PATCH) + addition, dedent=False)
    hook_repo.commit("second definition")
    assert_clean(scope(hook_repo))
    hook_repo.replace(MONKEY_PATCH, "import importlib", "import importlib\nimport os")
    hook_repo.commit("import")
    result = scope(hook_repo)
    assert_findings(
        result,
        f"{MONKEY_PATCH}:4: SCOPE002 changes outside apply_tilegym_kernel_to_qwen3(): import",
    )


def test_other_models_patch_kwargs_entry_fails(hook_repo):
    hook_repo.replace(TILEGYM_PATCH, '"llama": {"rms_norm": True}', '"llama": {"rms_norm": False}')
    hook_repo.commit()
    assert_findings(
        scope(hook_repo),
        f"{TILEGYM_PATCH}:3: SCOPE003 changes MODEL_PATCH_KWARGS entries other than 'qwen3'",
    )


def test_patch_kwargs_entry_for_the_model_may_be_added(hook_repo):
    hook_repo.replace(TILEGYM_PATCH, '    "qwen3": {"rms_norm": True},\n', "")
    hook_repo.commit("drop qwen3", TILEGYM_PATCH)
    hook_repo.repo.git.branch("-f", "main", "HEAD")
    hook_repo.replace(
        TILEGYM_PATCH, "MODEL_PATCH_KWARGS = {", 'MODEL_PATCH_KWARGS = {\n    "qwen3": {},'
    )
    hook_repo.commit("add qwen3")
    assert_clean(scope(hook_repo))
    hook_repo.replace(TILEGYM_PATCH, "return MODEL_PATCH_KWARGS", "return dict(MODEL_PATCH_KWARGS)")
    hook_repo.commit("touch the function")
    assert_findings(
        scope(hook_repo),
        f'{TILEGYM_PATCH}:7: SCOPE003 changes outside MODEL_PATCH_KWARGS["qwen3"]: '
        "function 'patch_kwargs'",
    )


def test_prefix_removal_fails(hook_repo):
    hook_repo.write(PREFIXES, "prefixes:\n  - rope_kernel\n")
    hook_repo.commit()
    assert_findings(
        scope(hook_repo),
        f"{PREFIXES}:2: SCOPE004 removes prefix 'qwen3_rms_norm_kernel'; "
        "an experiment may only add prefixes",
    )


def test_out_of_scope_files_one_finding_each_at_first_changed_line(hook_repo):
    hook_repo.write("README.md", "# toy project\nmore\n")
    hook_repo.replace(QWEN3_KERNEL, "return x", "return -x")
    hook_repo.write("src/tilegym/transformers/llama/kernels/rms_norm.py", "x = 1\ny = 2\n")
    hook_repo.write("src/tilegym/transformers/qwen3/kernels/sub/deep.py", "x = 1\n")
    hook_repo.write("src/tilegym/transformers/qwen3/__init__.py", "")
    hook_repo.commit()
    hook_repo.replace("README.md", "more", "more\nand more")
    hook_repo.commit("second commit")
    assert_findings(
        scope(hook_repo),
        "README.md:2: SCOPE001 outside the scope of a 'qwen3' experiment",
        "src/tilegym/transformers/llama/kernels/rms_norm.py:1: SCOPE001 outside the scope of a "
        "'qwen3' experiment",
        "src/tilegym/transformers/qwen3/__init__.py:1: SCOPE001 outside the scope of a "
        "'qwen3' experiment",
        "src/tilegym/transformers/qwen3/kernels/sub/deep.py:1: SCOPE001 outside the scope of a "
        "'qwen3' experiment",
    )


def test_rename_and_delete_count_for_both_paths(hook_repo):
    moved = "src/tilegym/transformers/llama/kernels/rms_norm.py"
    (hook_repo.root / moved).parent.mkdir(parents=True)
    hook_repo.repo.git.mv(QWEN3_KERNEL, moved)
    hook_repo.repo.git.rm("-q", "src/tilegym/ops/rope.py")
    hook_repo.commit("move and delete")
    assert_findings(
        scope(hook_repo),
        "src/tilegym/ops/rope.py:1: SCOPE001 outside the scope of a 'qwen3' experiment",
        "src/tilegym/transformers/llama/kernels/rms_norm.py:1: SCOPE001 outside the scope of a "
        "'qwen3' experiment",
    )
    hook_repo.repo.git.rm("-q", MONKEY_PATCH)
    hook_repo.commit("delete the patch module")
    result = scope(hook_repo)
    assert result.returncode == 1
    assert (
        f"{MONKEY_PATCH}:1: SCOPE002 deleted; an experiment may only change "
        "apply_tilegym_kernel_to_qwen3()" in result.stdout.splitlines()
    )


def test_unparsable_guarded_files_give_one_line_each(hook_repo):
    hook_repo.replace(MONKEY_PATCH, "if rms_norm:", "if rms_norm")
    hook_repo.write(TILEGYM_PATCH, b"\x00\xff\xfe junk \x89PNG\r\n")
    hook_repo.write(PREFIXES, "prefixes:\n  - qwen3_rms_norm_kernel\nprefixes:\n  - rope_kernel\n")
    hook_repo.commit("bad input")
    assert_findings(
        scope(hook_repo),
        f"{PREFIXES}:3: SCOPE005 cannot check scope: invalid YAML: while constructing a mapping; "
        "found duplicate key 'prefixes' (first on line 1)",
        f"{TILEGYM_PATCH}:1: SCOPE005 cannot check scope: file is not UTF-8 text",
        f"{MONKEY_PATCH}:15: SCOPE005 cannot check scope: Python syntax error: expected ':'",
    )


def test_non_experiment_branch_is_silent_unless_an_experiment_is_required(hook_repo):
    hook_repo.write("README.md", "changed\n")
    hook_repo.commit()
    hook_repo.checkout("feature/docs", create=True)
    assert_clean(scope(hook_repo))
    result = scope(hook_repo, "--require-experiment")
    assert result.returncode == 1
    assert result.stderr == (
        "error: branch 'feature/docs' is not experiment/<model_key>/<slug>; pass --model-key\n"
    )
    assert_findings(
        scope(hook_repo, "--model-key", "llama"),
        "README.md:1: SCOPE001 outside the scope of a 'llama' experiment",
    )


def test_malformed_experiment_branch_and_model_key(hook_repo):
    hook_repo.checkout("experiment/Qwen3", create=True)
    result = scope(hook_repo)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr.startswith("error: branch 'experiment/Qwen3' is not experiment/")
    usage = scope(hook_repo, "--model-key", "../x")
    assert usage.returncode == 2
    assert "is not a model key" in usage.stderr.splitlines()[-1]


def test_missing_base_is_an_error_or_a_skip(hook_repo):
    result = hook_repo.run("scope", "--base", "no-such-branch")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == "error: base ref 'no-such-branch' does not exist in this repository\n"
    skipped = hook_repo.run("scope", "--skip-missing-base", env={"TILEGYM_SCOPE_BASE": "nope"})
    assert skipped.returncode == 0
    assert skipped.stdout == "scope: skipped: base ref 'nope' does not exist in this repository\n"


def test_base_from_environment_and_staged_changes_with_index(hook_repo):
    hook_repo.checkout("main")
    hook_repo.write("docs.md", "on main\n")
    hook_repo.commit("main moves on")
    hook_repo.repo.git.branch("-f", "snapshot", "HEAD")
    hook_repo.checkout("experiment/qwen3/x")
    hook_repo.write("notes.txt", "staged, not committed\n")
    hook_repo.stage("notes.txt")
    # main...HEAD starts at the merge base: main's own later commit is no finding.
    assert_clean(hook_repo.run("scope", env={"TILEGYM_SCOPE_BASE": "snapshot"}))
    assert_findings(
        hook_repo.run("scope", "--index", env={"TILEGYM_SCOPE_BASE": "snapshot"}),
        "notes.txt:1: SCOPE001 outside the scope of a 'qwen3' experiment",
    )


def test_outside_a_repository_is_one_error_line(tmp_path):
    for command in ("scope", "sandbox"):
        result = run_hooks(tmp_path, command)
        assert (result.returncode, result.stdout) == (1, "")
        assert result.stderr == f"error: {tmp_path} is not inside a git repository\n"


def test_detached_head_takes_the_branch_from_github_head_ref(hook_repo):
    hook_repo.write("README.md", "changed\n")
    hook_repo.commit()
    hook_repo.repo.git.checkout("-q", "--detach")
    assert_clean(scope(hook_repo, env={"GITHUB_HEAD_REF": ""}))
    assert_findings(
        scope(hook_repo, env={"GITHUB_HEAD_REF": "experiment/qwen3/x"}),
        "README.md:1: SCOPE001 outside the scope of a 'qwen3' experiment",
    )
    result = scope(hook_repo, "--require-experiment", env={"GITHUB_HEAD_REF": ""})
    assert (result.returncode, result.stderr) == (
        1,
        "error: a detached HEAD is not experiment/<model_key>/<slug>; pass --model-key\n",
    )


TRANSFORMERS = Path(tilegym.transformers.__file__).parent
LLAMA_DESCRIPTION = "src/tilegym/transformers/llama/modeling_llama.py"
SHARED = ("src/tilegym/transformers/decoder.py", "src/tilegym/transformers/family.py")


def llama_experiment_on_real_files(hook_repo, *paths):
    """main gets this repository's own ``paths``; then ``experiment/llama/x`` is cut from it."""
    hook_repo.checkout("main")
    for path in paths:
        real = TRANSFORMERS / Path(path).relative_to("src/tilegym/transformers")
        hook_repo.write(path, real.read_text(), dedent=False)
    hook_repo.commit("the real glue")
    hook_repo.checkout("experiment/llama/x", create=True)


def test_a_llama_experiment_may_edit_its_own_description(hook_repo):
    llama_experiment_on_real_files(hook_repo, LLAMA_DESCRIPTION)
    hook_repo.replace(LLAMA_DESCRIPTION, '"Llama")', '"Llama", forwards={})')
    hook_repo.commit("llama: its own description")
    assert_clean(scope(hook_repo))


def test_a_llama_experiment_touching_the_shared_glue_is_refused_naming_the_file(hook_repo):
    llama_experiment_on_real_files(hook_repo, *SHARED)
    edits = {
        SHARED[0]: ("    return all(", "    return not any("),
        SHARED[1]: ("= False", "= True"),
    }
    lines = []
    for path, (old, new) in edits.items():
        hook_repo.replace(path, old, new)
        text = hook_repo.read(path)
        line = text[: text.index(new)].count("\n") + 1
        lines.append(
            f"{path}:{line}: SCOPE001 shared by every family, outside the scope of a 'llama' "
            "experiment (wire a kernel in through Family.forwards in modeling_llama.py)"
        )
    hook_repo.commit("llama: a change every family would run")
    assert_findings(scope(hook_repo), *lines)
