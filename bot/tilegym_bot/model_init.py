"""``tilegym-bot model init``: scaffold a new model family from the ops that exist.

The family is read off a tiny instance of the model (``tilegym.transformers.family_probe``:
its classes and projections, and config-driven fields such as Granite's
``residual_multiplier`` and SmolLM3's per-layer RoPE switch ``use_rope``) and checked by
running it: the patched tiny model must reproduce the upstream model on the CPU, or nothing
is written and the refusal names the uncovered feature. Then, on a new branch
``model/<key>`` cut from main, one commit adds:

- ``src/tilegym/transformers/<model_type>/`` (``modeling_<model_type>.py`` with the ``FAMILY``,
  ``small_config.json`` with the real head geometry for the GPU tests); the patch dispatch
  discovers the folder, and the model-level tests parametrized over every family cover it;
- the benchmark presets ``<key>`` (the given config) and ``tiny-<key>`` (small layers, as many
  as the check ran: at least 2 and one full period of every per-layer pattern, e.g. SmolLM3's
  NoPE layer every 4th);
- the ``MODEL_PATCH_KWARGS`` entry with every flag on.

Rendering and the literal-dict insertion are pure; ``init`` does the I/O.
"""

from __future__ import annotations

import ast
import json
import math
import sys
import textwrap
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from tilegym_bot.errors import BotError

PRESETS_PY = "modeling/transformers/src/tilegym_hf_bench/presets.py"
CONFIGS_DIR = "modeling/transformers/src/tilegym_hf_bench/configs"
PATCH_PY = "modeling/transformers/src/tilegym_hf_bench/tilegym_patch.py"
FAMILIES_DIR = "src/tilegym/transformers"
ALL_FLAGS = '{"rope": True, "rms_norm": True, "swiglu": True, "attn": True, "linear": True}'
TINY = dict(intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
TINY.update(vocab_size=512)
MIN_LAYERS = 2
#: scalar config fields that make every k-th layer different (k their value): NoPE layers,
#: sliding-window layers, sparse (MoE) layers
PERIOD_FIELDS = (
    "no_rope_layer_interval",
    "sliding_window_pattern",
    "_sliding_window_pattern",
    "decoder_sparse_step",
    "interleave_moe_layer_step",
    "moe_layer_freq",
)
TOKEN_IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)


@dataclass(frozen=True)
class Scaffold:
    key: str
    model_type: str
    files: dict[str, str]  # repository path -> new file text
    notes: tuple[str, ...]


def insert_dict_entry(source: str, name: str, entry: str, key: str) -> str:
    """``source`` with ``entry`` (one or more lines, indented) added as the last item of the
    module-level literal dict assigned to ``name``; refuses a key that is already there."""
    tree = ast.parse(source)
    for node in tree.body:
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and isinstance(
            node.value, ast.Dict
        ):
            keys = {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
            if key in keys:
                raise BotError(f"{name} already has an entry {key!r}")
            lines = source.splitlines(keepends=True)
            end = node.value.end_lineno - 1  # the line holding the closing brace
            return "".join(lines[:end]) + entry.rstrip("\n") + "\n" + "".join(lines[end:])
    raise BotError(f"no literal dict {name} = {{...}} found")


def _with_layers(config: dict[str, Any], layers: int) -> dict[str, Any]:
    """``config`` with ``layers`` decoder layers; per-layer lists (``layer_types``, ...) cut to
    their first ``layers`` entries."""
    n = config.get("num_hidden_layers")
    out = {
        k: v[:layers] if isinstance(v, list) and n and len(v) == n else v for k, v in config.items()
    }
    out["num_hidden_layers"] = layers
    return out


def pattern_period(values: list) -> int:
    """The shortest k with ``values[i] == values[i - k]`` for every i (pure)."""
    for k in range(1, len(values) + 1):
        if all(values[i] == values[i - k] for i in range(k, len(values))):
            return k
    return max(len(values), 1)


def check_layers(config: dict[str, Any], at_least: int = MIN_LAYERS) -> tuple[int, list[str]]:
    """How many layers a shrunk model keeps so that it holds one full period of every per-layer
    pattern the config declares, and those patterns (``name (k)``): lists as long as the layer
    count (``layer_types``, ``no_rope_layers``), every-k-th-layer fields, leading dense layers
    (``first_k_dense_replace``) and listed MLP-only layers. At most the real count (pure)."""
    n = int(config.get("num_hidden_layers") or at_least)
    periods: dict[str, int] = {}
    for key, value in config.items():
        if isinstance(value, list) and len(value) == n and n > 1:
            periods[key] = pattern_period(value)
    for key in PERIOD_FIELDS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            periods[key] = value
    needed = math.lcm(*periods.values()) if periods else 1
    leading = config.get("first_k_dense_replace")
    if isinstance(leading, int) and leading > 0:
        periods["first_k_dense_replace"] = leading + 1
        needed = max(needed, leading + 1)
    listed = config.get("mlp_only_layers")
    if isinstance(listed, list) and listed and all(isinstance(i, int) for i in listed):
        periods["mlp_only_layers"] = max(listed) + 2
        needed = max(needed, max(listed) + 2)
    patterns = [f"{k} ({v})" for k, v in sorted(periods.items()) if v > 1]
    return min(n, max(at_least, needed)), patterns


def _fewer_experts(config: dict[str, Any], experts: int, per_token: int, width: int):
    """A mixture of experts' config (``num_experts`` or ``num_local_experts``) with at most
    ``experts`` experts, ``per_token`` of them per token and ``width``-wide experts: at the
    real count a tiny Qwen3-MoE keeps 128 x 3 x 768 x hidden weights a layer. Dense configs
    pass unchanged."""
    key = next((k for k in ("num_experts", "num_local_experts") if config.get(k)), None)
    if key is None:  # transformers 5.24 writes Qwen3-MoE's count as num_local_experts
        return config
    out = dict(config, **{key: min(config[key], experts)})
    out["num_experts_per_tok"] = min(config.get("num_experts_per_tok", 1), per_token)
    if "moe_intermediate_size" in out:
        out["moe_intermediate_size"] = min(out["moe_intermediate_size"], width)
    return out


def small_config(config: dict[str, Any]) -> dict[str, Any]:
    """The GPU tests' config: the real head geometry, at most 1024 wide, 3 layers or one full
    period of every per-layer pattern."""
    layers, _ = check_layers(config, at_least=3)
    out = _with_layers({k: v for k, v in config.items() if not k.startswith("_")}, layers)
    heads, kv = (
        out["num_attention_heads"],
        out.get("num_key_value_heads", out["num_attention_heads"]),
    )
    head_dim = out.get("head_dim") or out["hidden_size"] // heads
    if out["hidden_size"] > 1024:
        group = heads // kv
        heads = max(group, 1024 // head_dim // group * group)
        out.update(num_attention_heads=heads, num_key_value_heads=heads // group)
        out["hidden_size"] = heads * head_dim
    out["head_dim"] = head_dim
    out["intermediate_size"] = min(out["intermediate_size"], 3 * out["hidden_size"])
    out.update(vocab_size=4096, **TOKEN_IDS)
    return _fewer_experts(out, experts=16, per_token=4, width=256)


def tiny_config(config: dict[str, Any], model_type: str) -> dict[str, Any]:
    """The CPU check's and the ``tiny-<key>`` preset's config: small dimensions, the layers of
    ``check_layers`` (every per-layer pattern once at least)."""
    layers, _ = check_layers(config)
    out = _with_layers({k: v for k, v in config.items() if not k.startswith("_")}, layers)
    # the real head dim: per-dimension RoPE tables (long-rope factors) are sized by it
    out["head_dim"] = out.get("head_dim") or out["hidden_size"] // out["num_attention_heads"]
    out.update(TINY, **TOKEN_IDS)
    out["hidden_size"] = TINY["num_attention_heads"] * out["head_dim"]  # some derive head_dim
    out = _fewer_experts(out, experts=8, per_token=2, width=64)
    out["_source"] = (
        f"{model_type} architecture shrunk to {layers} layers and small dimensions (CPU)"
    )
    return out


def _literal(value) -> str:
    """Python source of a str / bool / tuple of str, double-quoted as ruff formats it."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, tuple):
        items = ", ".join(_literal(v) for v in value)
        return f"({items},)" if len(value) == 1 else f"({items})"
    return repr(value)


def render_family(model_type: str, architecture: str, family, notes: tuple[str, ...]) -> str:
    """``modeling_<model_type>.py``: the family description, non-default fields only."""
    defaults = type(family)(family.upstream_module, family.class_prefix)
    args = [_literal(family.upstream_module), _literal(family.class_prefix)]
    for f in fields(family)[2:]:
        value = getattr(family, f.name)
        if value != getattr(defaults, f.name):
            args.append(f"{f.name}={_literal(value)}")
    found = "; ".join(notes) if notes else "the Llama decoder layer as it is"
    body = textwrap.fill(f"Scaffolded by ``tilegym-bot model init {model_type}``: {found}.", 96)
    return (
        f'"""cuTile forwards for {family.class_prefix} (architecture of {architecture}).\n\n'
        f"{body}\n"
        '"""\n\n'
        "from tilegym.transformers.family import Family\n\n"
        f"FAMILY = Family({', '.join(args)})\n"
    )


def scaffold(
    root: Path, model_type: str, key: str, config: dict, architecture: str, probe
) -> Scaffold:
    """Every file ``model init`` writes, rendered from the repository's current texts (pure
    apart from reading those two files)."""
    folder = f"{FAMILIES_DIR}/{model_type}"
    family_doc = f'"""{architecture}: the family description (scaffolded by model init)."""\n'
    full = {"_source": f"architecture of {architecture} (the config given to model init)"}
    full.update(_written(config, model_type))
    presets = (root / PRESETS_PY).read_text()
    tiny = tiny_config(config, model_type)
    small = f"{tiny['num_hidden_layers']} small layers"
    for name, what, cpu in ((key, architecture, False), (f"tiny-{key}", small, True)):
        args = f'"{name}", "{model_type}", "{what}", "{name}.json", {cpu}'
        presets = insert_dict_entry(presets, "PRESETS", f'    "{name}": Preset({args}),\n', name)
    patch = insert_dict_entry(
        (root / PATCH_PY).read_text(),
        "MODEL_PATCH_KWARGS",
        f'    "{model_type}": {ALL_FLAGS},\n',
        model_type,
    )
    files = {
        f"{folder}/__init__.py": family_doc,
        f"{folder}/modeling_{model_type}.py": render_family(
            model_type, architecture, probe.family, probe.notes
        ),
        f"{folder}/small_config.json": json.dumps(
            _written(small_config(config), model_type) | {"model_type": model_type}, indent=2
        )
        + "\n",
        f"{CONFIGS_DIR}/{key}.json": json.dumps(full, indent=2) + "\n",
        f"{CONFIGS_DIR}/tiny-{key}.json": json.dumps(
            {"_source": tiny["_source"]} | _written(tiny, model_type),
            indent=2,
        )
        + "\n",
        PRESETS_PY: presets,
        PATCH_PY: patch,
    }
    return Scaffold(key, model_type, files, probe.notes)


def load_config(model_type: str, config_path: Path | None) -> dict[str, Any]:
    """The complete config as a plain dict: the given config.json over transformers' defaults
    for ``model_type`` (or the defaults alone)."""
    given: dict[str, Any] = {}
    if config_path is not None:
        try:
            given = json.loads(config_path.read_text())
        except (OSError, ValueError) as exc:
            raise BotError(f"{config_path}: cannot read a JSON config: {exc}") from exc
        if given.get("model_type") != model_type:
            raise BotError(
                f"{config_path}: model_type is {given.get('model_type')!r}, not {model_type!r}"
            )
    from transformers import AutoConfig

    given.pop("model_type", None)
    try:
        config = AutoConfig.for_model(model_type, **given)
    except ValueError as exc:
        raise BotError(f"transformers has no model type {model_type!r}: {exc}") from exc
    return config.to_dict()


def _written(config: dict[str, Any], model_type: str) -> dict[str, Any]:
    """What a config file keeps: the values that differ from the class defaults (transformers'
    ``to_diff_dict``), which loads back to the same config."""
    from transformers import AutoConfig

    full = AutoConfig.for_model(
        model_type, **{k: v for k, v in config.items() if k != "model_type"}
    )
    out = full.to_diff_dict()
    for noise in ("transformers_version", "_name_or_path", "dtype", "torch_dtype"):
        out.pop(noise, None)
    return out


def family_patching(root: Path, model_type: str) -> str | None:
    """The family folder of the repository at ``root`` that patches ``model_type`` (its
    ``MODEL_TYPE``, e.g. gemma3 for gemma3_text, or its name), or None."""
    from tilegym.transformers.monkey_patch import folder_model_type

    families = root / FAMILIES_DIR
    folders = sorted(families.iterdir()) if families.is_dir() else []
    for folder in folders:
        module = folder / f"modeling_{folder.name}.py"
        if module.is_file() and folder_model_type(folder) == model_type:
            return folder.name
    return None


def probe_family(model_type: str, config: dict[str, Any]):
    """Describe and verify the family on a tiny CPU instance; (the probe, the check's result in
    one line). ``BotError`` names a refusal."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tilegym.transformers.family_probe import FamilyRefused, check_family, describe_structure
    from tilegym.transformers.monkey_patch import apply_family

    tiny = {k: v for k, v in tiny_config(config, model_type).items() if not k.startswith("_")}
    _, patterns = check_layers(config)
    try:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny)).eval()
    except Exception as exc:  # transformers' config validation raises several types
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise BotError(f"cannot build a {model_type} model from that config: {first}") from exc
    try:
        probe = describe_structure(model)
        check = check_family(model, probe.family, lambda m, **f: apply_family(m, probe.family, **f))
    except FamilyRefused as exc:
        raise BotError(
            f"model init {model_type}: not covered by the existing ops: {exc}; nothing was written"
        ) from exc
    covers = f"; its layers hold every per-layer pattern: {', '.join(patterns)}" if patterns else ""
    return probe, check.summary() + covers


def _ruff_format(root: Path, paths: list[str]) -> None:
    """Format the written Python files as the project's pre-commit would (skipped, with the
    files as rendered, where ruff is not installed)."""
    import shutil
    import subprocess

    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff and paths:
        subprocess.run([ruff, "format", "--quiet", *paths], cwd=root, check=False, timeout=60)


def init(
    repo: Path, model_type: str, config_path: Path | None, key: str | None, architecture: str
) -> tuple[str, Scaffold]:
    """Check, render, then write and commit on ``model/<key>`` (cut from main)."""
    from git import Repo

    from tilegym.atomic import write_text_atomic

    key = key or model_type
    root = Path(repo).resolve()
    if (root / FAMILIES_DIR / model_type).exists():
        raise BotError(f"{FAMILIES_DIR}/{model_type} exists: {model_type} is already a family")
    owner = family_patching(root, model_type)
    if owner is not None:
        raise BotError(f"{FAMILIES_DIR}/{owner} patches {model_type}: it is already a family")
    git = Repo(root)
    if git.is_dirty(untracked_files=False):
        raise BotError("the working tree has uncommitted changes: commit or stash them first")
    branch = f"model/{key}"
    if branch in [h.name for h in git.heads]:
        raise BotError(f"branch {branch} already exists")
    config = load_config(model_type, config_path)
    probe, checked = probe_family(model_type, config)
    result = scaffold(root, model_type, key, config, architecture, probe)
    result = replace(result, notes=(checked, *result.notes))
    git.create_head(branch, "main").checkout()
    for path, text in result.files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(target, text)
    _ruff_format(root, [p for p in result.files if p.endswith(".py")])
    git.index.add(list(result.files))
    git.index.commit(f"model init {model_type}: family, presets {key} and tiny-{key}, patch flags")
    return branch, result
