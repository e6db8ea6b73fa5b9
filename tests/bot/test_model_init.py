"""``tilegym-bot model init`` on a real temporary git repository holding this project's
presets and patch table: a covered family is checked, scaffolded and committed on its own
branch; an uncovered one is refused by name with nothing written."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import git
import pytest
from tilegym_bot.cli import main
from tilegym_bot.model_init import (
    PATCH_PY,
    PRESETS_PY,
    check_layers,
    insert_dict_entry,
    small_config,
    tiny_config,
)

PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "repo"
    r = git.Repo.init(root, initial_branch="main")
    with r.config_writer() as cfg:
        cfg.set_value("user", "name", "Test")
        cfg.set_value("user", "email", "test@example.com")
    for path in (PRESETS_PY, PATCH_PY):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(PROJECT / path, root / path)
    (root / "src/tilegym/transformers").mkdir(parents=True)
    (root / "src/tilegym/transformers/__init__.py").write_text("")
    r.index.add([PRESETS_PY, PATCH_PY, "src/tilegym/transformers/__init__.py"])
    r.index.commit("project")
    return root, r


def _without_family(root: Path, repo, model_type: str) -> None:
    """The temporary project as it was before ``model_type`` had presets and patch flags
    (committed): its ``PRESETS`` entries and its ``MODEL_PATCH_KWARGS`` line removed."""
    presets = root / PRESETS_PY
    source = presets.read_text()
    lines = source.splitlines(True)
    drop: set[int] = set()
    for node in ast.parse(source).body:
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        if any(getattr(t, "id", None) == "PRESETS" for t in targets):
            for value in node.value.values:
                if ast.literal_eval(value.args[1]) == model_type:
                    drop |= set(range(value.lineno - 1, value.end_lineno))
    presets.write_text("".join(li for i, li in enumerate(lines) if i not in drop))
    repo.index.add([PRESETS_PY])
    _without_patch_flags(root, repo, model_type)


def _literal_keys(source: str, name: str) -> set[str]:
    for node in ast.parse(source).body:
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        if any(getattr(t, "id", None) == name for t in targets):
            return {k.value for k in node.value.keys}
    raise AssertionError(name)


def test_a_covered_family_is_scaffolded_and_committed_on_its_branch(project, tmp_path, capsys):
    root, repo = project
    _without_family(root, repo, "granite")
    config = tmp_path / "config.json"  # Granite's class defaults: unit multipliers
    config.write_text(
        json.dumps({"model_type": "granite", "hidden_size": 2048, "vocab_size": 49152})
    )
    code = main(["-C", str(root), "model", "init", "granite", "--config", str(config)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert repo.active_branch.name == "model/granite" and not repo.is_dirty()
    assert (
        "Scaffolded" in (root / "src/tilegym/transformers/granite/modeling_granite.py").read_text()
    )
    assert {"granite", "tiny-granite"} <= _literal_keys((root / PRESETS_PY).read_text(), "PRESETS")
    assert "granite" in _literal_keys((root / PATCH_PY).read_text(), "MODEL_PATCH_KWARGS")
    small = json.loads((root / "src/tilegym/transformers/granite/small_config.json").read_text())
    assert small["hidden_size"] <= 1024 and small["num_hidden_layers"] == 3
    namespace: dict = {}
    exec((root / "src/tilegym/transformers/granite/modeling_granite.py").read_text(), namespace)
    assert namespace["FAMILY"].class_prefix == "Granite"
    assert repo.head.commit.message.startswith("model init granite")


def test_an_uncovered_feature_is_refused_by_name_and_nothing_is_written(project, tmp_path, capsys):
    root, repo = project
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gemma2", "attn_logit_softcapping": 30.0}))
    before = repo.head.commit.hexsha
    assert main(["-C", str(root), "model", "init", "gemma2", "--config", str(config)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: model init gemma2: not covered by the existing ops: ")
    assert "soft-capping (Gemma 2): config.attn_logit_softcapping = 30.0" in err[-1]
    assert repo.active_branch.name == "main" and repo.head.commit.hexsha == before
    assert not (root / "src/tilegym/transformers/gemma2").exists()


def test_bad_inputs_get_one_line(project, tmp_path, capsys):
    root, _ = project
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama"}))
    assert main(["-C", str(root), "model", "init", "granite", "--config", str(config)]) == 1
    assert "model_type is 'llama', not 'granite'" in capsys.readouterr().err
    assert main(["-C", str(root), "model", "init", "no_such_type"]) == 1
    assert "no model type 'no_such_type'" in capsys.readouterr().err


def test_insert_dict_entry_appends_and_refuses_duplicates():
    source = 'X = 1\nTABLE = {\n    "a": 1,\n}\n'
    out = insert_dict_entry(source, "TABLE", '    "b": 2,\n', "b")
    assert out == 'X = 1\nTABLE = {\n    "a": 1,\n    "b": 2,\n}\n'
    with pytest.raises(Exception, match="already has an entry 'a'"):
        insert_dict_entry(source, "TABLE", '    "a": 3,\n', "a")


def test_the_scaffold_of_a_registered_family_equals_its_hand_written_description(
    project, tmp_path, capsys
):
    """Phi-3.5-mini as published (long-rope tables sized by its head dim, packed projections):
    model init reads off the same Family the repository registers by hand."""
    from tilegym.transformers import monkey_patch as mp

    root, repo = project
    patch = root / PATCH_PY
    patch.write_text("".join(li for li in patch.read_text().splitlines(True) if '"phi3"' not in li))
    repo.index.add([PATCH_PY])
    repo.index.commit("no phi3 yet")
    preset = json.loads(
        (PROJECT / "modeling/transformers/src/tilegym_hf_bench/configs/phi3.json").read_text()
    )
    preset.pop("_source")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(preset))
    args = ["-C", str(root), "model", "init", "phi3", "--config", str(config), "--key", "phi35"]
    assert main(args) == 0, capsys.readouterr().err
    namespace: dict = {}
    exec((root / "src/tilegym/transformers/phi3/modeling_phi3.py").read_text(), namespace)
    assert namespace["FAMILY"] == mp.FAMILIES["phi3"].description()


def _without_patch_flags(root: Path, repo, model_type: str) -> None:
    """The temporary project as it was before ``model_type`` had patch flags (committed)."""
    patch = root / PATCH_PY
    lines = patch.read_text().splitlines(True)
    patch.write_text("".join(li for li in lines if f'"{model_type}"' not in li))
    repo.index.add([PATCH_PY])
    repo.index.commit(f"no {model_type} yet")


def _preset_config(tmp_path: Path, name: str, **changes) -> Path:
    preset = json.loads(
        (PROJECT / f"modeling/transformers/src/tilegym_hf_bench/configs/{name}.json").read_text()
    )
    preset.pop("_source")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**preset, **changes}))
    return config


def test_gemma3_is_covered_and_scaffolds_its_registered_description(project, tmp_path, capsys):
    """Gemma 3 1B as published (GeGLU, (1 + weight) norms on both sides of each sub-block,
    per-head q/k norms): model init accepts it and reads off the Family the repository
    registers by hand in its gemma3 folder."""
    from tilegym.transformers import monkey_patch as mp

    root, repo = project
    _without_patch_flags(root, repo, "gemma3_text")
    config = _preset_config(tmp_path, "gemma3")
    args = ["-C", str(root), "model", "init", "gemma3_text", "--config", str(config)]
    assert main([*args, "--key", "gemma31b"]) == 0, capsys.readouterr().err
    namespace: dict = {}
    path = root / "src/tilegym/transformers/gemma3_text/modeling_gemma3_text.py"
    exec(path.read_text(), namespace)
    assert namespace["FAMILY"] == mp.FAMILIES["gemma3"].description()


def test_qwen3_5_is_covered_and_scaffolds_its_registered_description(project, tmp_path, capsys):
    """Qwen3.5-0.8B's text model as its preset has it (gated delta net layers, gated attention
    output, zero-centred norms, partial M-RoPE): model init checks one layer_types period
    and reads off the Family the repository registers by hand in its qwen3_5 folder."""
    from tilegym.transformers import monkey_patch as mp

    root, repo = project
    _without_family(root, repo, "qwen3_5_text")
    config = _preset_config(tmp_path, "qwen3_5")
    args = ["-C", str(root), "model", "init", "qwen3_5_text", "--config", str(config)]
    assert main([*args, "--key", "qwen35"]) == 0, capsys.readouterr().err
    assert "checked: the patched 4-layer model reproduces the upstream one" in (
        capsys.readouterr().out
    )
    namespace: dict = {}
    path = root / "src/tilegym/transformers/qwen3_5_text/modeling_qwen3_5_text.py"
    exec(path.read_text(), namespace)
    assert namespace["FAMILY"] == mp.FAMILIES["qwen3_5"].description()


def test_qwen3_next_is_covered_and_scaffolds_its_registered_description(project, tmp_path, capsys):
    """Qwen3-Next as its preset has it (packed gated delta net projections, MoE with a shared
    expert on every layer): model init checks one layer_types period with few small experts and
    reads off the Family the repository registers by hand."""
    from tilegym.transformers import monkey_patch as mp

    pytest.importorskip("transformers.models.qwen3_next")
    root, repo = project
    _without_family(root, repo, "qwen3_next")
    config = _preset_config(tmp_path, "qwen3_next")
    args = ["-C", str(root), "model", "init", "qwen3_next", "--config", str(config)]
    assert main([*args, "--key", "qwen3next"]) == 0, capsys.readouterr().err
    assert "checked: the patched 4-layer model reproduces the upstream one" in (
        capsys.readouterr().out
    )
    namespace: dict = {}
    exec(
        (root / "src/tilegym/transformers/qwen3_next/modeling_qwen3_next.py").read_text(), namespace
    )
    assert namespace["FAMILY"] == mp.FAMILIES["qwen3_next"].description()


def test_a_model_type_an_existing_family_patches_is_refused(project, tmp_path, capsys):
    """The gemma3 folder patches gemma3_text (its MODEL_TYPE): a second family for that model
    type is refused before anything is checked or written."""
    root, repo = project
    folder = root / "src/tilegym/transformers/gemma3"
    folder.mkdir()
    source = PROJECT / "src/tilegym/transformers/gemma3/modeling_gemma3.py"
    shutil.copy(source, folder / "modeling_gemma3.py")
    repo.index.add(["src/tilegym/transformers/gemma3/modeling_gemma3.py"])
    repo.index.commit("gemma3 family")
    before = repo.head.commit.hexsha
    assert main(["-C", str(root), "model", "init", "gemma3_text"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "error: src/tilegym/transformers/gemma3 patches gemma3_text: it is already a family"
    )
    assert repo.active_branch.name == "main" and repo.head.commit.hexsha == before


def test_gemma3_with_attention_soft_capping_is_refused_by_name(project, tmp_path, capsys):
    root, repo = project
    config = _preset_config(tmp_path, "gemma3", attn_logit_softcapping=50.0)
    before = repo.head.commit.hexsha
    args = ["-C", str(root), "model", "init", "gemma3_text", "--config", str(config)]
    assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "attention logit soft-capping (Gemma 2): config.attn_logit_softcapping = 50.0" in err[-1]
    assert repo.head.commit.hexsha == before
    assert not (root / "src/tilegym/transformers/gemma3_text").exists()


def test_a_mixture_of_experts_scaffolds_with_few_small_experts(project, tmp_path, capsys):
    """Qwen3-30B-A3B's config (128 experts of width 768, 8 a token): the scaffold's tiny CPU
    preset keeps 8 experts of width 64, 2 a token, and the GPU tests' config 16 of width 256;
    the description is the registered one (the sparse block included)."""
    from tilegym.transformers import monkey_patch as mp

    root, repo = project
    _without_patch_flags(root, repo, "qwen3_moe")
    config = _preset_config(tmp_path, "qwen3_moe")
    args = ["-C", str(root), "model", "init", "qwen3_moe", "--config", str(config)]
    assert main([*args, "--key", "moe30b"]) == 0, capsys.readouterr().err
    configs = root / "modeling/transformers/src/tilegym_hf_bench/configs"
    tiny = json.loads((configs / "tiny-moe30b.json").read_text())
    count = tiny.get("num_experts", tiny.get("num_local_experts"))  # 5.24 renames it
    assert (count, tiny["num_experts_per_tok"], tiny["moe_intermediate_size"]) == (8, 2, 64)
    small = json.loads((root / "src/tilegym/transformers/qwen3_moe/small_config.json").read_text())
    experts = small.get("num_experts", small.get("num_local_experts"))  # 5.24 renames it
    assert (experts, small["num_experts_per_tok"]) == (16, 4)
    assert small["moe_intermediate_size"] == 256
    namespace: dict = {}
    exec((root / "src/tilegym/transformers/qwen3_moe/modeling_qwen3_moe.py").read_text(), namespace)
    assert namespace["FAMILY"] == mp.FAMILIES["qwen3_moe"].description()


def test_the_accept_message_states_the_checks_result(project, capsys):
    root, repo = project
    _without_family(root, repo, "granite")
    assert main(["-C", str(root), "model", "init", "granite"]) == 0
    out = capsys.readouterr().out
    assert "checked: the patched 2-layer model reproduces the upstream one" in out
    assert "max |logit difference| " in out and "over 2 x 9 tokens" in out


@pytest.mark.parametrize("model_type", ["granite", "smollm3", "olmo3", "olmoe", "mixtral"])
def test_a_published_config_scaffolds_the_registered_description(
    project, tmp_path, capsys, model_type
):
    """granite-3.3-2b-instruct (muP scales: residual_multiplier 0.22 read into the description)
    and SmolLM3-3B (RoPE left out of every 4th layer: ``no_rope_layers``, checked on 4 layers,
    the 4th without RoPE), Olmo-3-7B (checked on one layer_types period: three sliding-window
    layers, one full), OLMoE-1B-7B (clip_qkv read off the config, the router's norm_topk_prob
    switch read at run time) and Mixtral-8x7B (no dense MLP class; the router renormalizes
    without a switch, read off a run) as their presets have them: model init accepts each and
    reads off the Family the repository registers by hand."""
    from tilegym.transformers import monkey_patch as mp

    root, repo = project
    _without_family(root, repo, model_type)
    config = _preset_config(tmp_path, model_type)
    args = ["-C", str(root), "model", "init", model_type, "--config", str(config)]
    assert main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    namespace: dict = {}
    folder = root / f"src/tilegym/transformers/{model_type}"
    exec((folder / f"modeling_{model_type}.py").read_text(), namespace)
    assert namespace["FAMILY"] == mp.FAMILIES[model_type].description()
    tiny = json.loads(
        (
            root / f"modeling/transformers/src/tilegym_hf_bench/configs/tiny-{model_type}.json"
        ).read_text()
    )
    if model_type == "smollm3":
        assert "checked: the patched 4-layer model reproduces the upstream one" in out
        assert "no_rope_layers (4)" in out
        assert tiny["num_hidden_layers"] == 4 and tiny["no_rope_layers"] == [1, 1, 1, 0]
    elif model_type == "olmo3":
        assert "checked: the patched 4-layer model reproduces the upstream one" in out
        assert tiny["layer_types"] == ["sliding_attention"] * 3 + ["full_attention"]
    elif model_type in ("olmoe", "mixtral"):
        assert "checked: the patched 2-layer model reproduces the upstream one" in out
        experts = tiny.get("num_experts", tiny.get("num_local_experts"))
        assert (experts, tiny["num_experts_per_tok"]) == (8, 2)
    else:
        assert "checked: the patched 2-layer model reproduces the upstream one" in out
        assert tiny["residual_multiplier"] == 0.22 and tiny["embedding_multiplier"] == 12.0


def test_a_refusal_names_the_differing_module_not_a_guess(project, capsys):
    """ERNIE 4.5 rotates interleaved pairs: the refusal names layer 0 and the rope patch."""
    root, _ = project
    assert main(["-C", str(root), "model", "init", "ernie4_5"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "model.layers.0 (Ernie4_5DecoderLayer" in err
    assert "patched alone, these differ: rope (RoPE)" in err
    assert "post-norms, scaled residuals" not in err


def test_an_unknown_activation_is_named_by_its_config_field(project, capsys):
    root, _ = project
    assert main(["-C", str(root), "model", "init", "arcee"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "activation config.hidden_act = 'relu2': no kernel computes it" in err
    assert "MLP projections: neither gate_proj/up_proj nor a packed gate_up_proj" in err


@pytest.mark.parametrize(
    ("config", "layers", "patterns"),
    [
        ({"num_hidden_layers": 32}, 2, []),
        ({"num_hidden_layers": 36, "no_rope_layers": [1, 1, 1, 0] * 9}, 4, ["no_rope_layers (4)"]),
        ({"num_hidden_layers": 26, "layer_types": (["s"] * 5 + ["f"]) * 4 + ["s", "s"]}, 6, None),
        (
            {"num_hidden_layers": 3, "layer_types": ["s", "s", "f"], "no_rope_layer_interval": 4},
            3,
            None,
        ),
        (
            {"num_hidden_layers": 48, "layer_types": ["a", "b"] * 24, "decoder_sparse_step": 3},
            6,
            None,
        ),
        ({"num_hidden_layers": 28, "first_k_dense_replace": 3}, 4, None),
        ({"num_hidden_layers": 28, "mlp_only_layers": [0, 4]}, 6, None),
        ({"num_hidden_layers": 5, "layer_types": ["a", "b", "c", "d", "e"]}, 5, None),
    ],
)
def test_check_layers_holds_a_full_period_of_every_per_layer_pattern(config, layers, patterns):
    got, named = check_layers(config)
    assert got == layers
    if patterns is not None:
        assert named == patterns


def test_the_tiny_preset_keeps_every_layer_kind():
    config = {"num_hidden_layers": 36, "hidden_size": 2048, "num_attention_heads": 16}
    config["no_rope_layers"] = [1, 1, 1, 0] * 9
    config["intermediate_size"] = 8192
    tiny = tiny_config(config, "smollm3")
    assert tiny["num_hidden_layers"] == 4 and tiny["no_rope_layers"] == [1, 1, 1, 0]
    assert small_config(config)["num_hidden_layers"] == 4
