"""Model instances of one experiment: the bf16 baseline, a twin sharing its weights for the cuTile
patch, and an fp32 copy as the correctness reference.

Random weights are drawn on the target device from a seeded generator after building the model
with transformers' default init switched off (the default init is slow on CPU and the weights are
overwritten anyway): matrices N(0, initializer_range), biases 0, and norms as the model's own
init sets them: scale 1 for most, but 0 for Gemma's ``(1 + weight)`` norms, whose scale 1 doubled
every norm of the random gemma3 and put its bf16 logits 0.93 away from fp32's. Modules holding
only 1-D parameters of their own (norms; gpt-oss's attention: its sinks; Qwen3.5's gated delta
nets: A_log, dt_bias) get the model's own init
under a generator seeded from ``seed``.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.initialization import no_init_weights

from tilegym_hf_bench.errors import BenchError, check_model_id
from tilegym_hf_bench.presets import PRESETS, config_dict

DTYPE = torch.bfloat16


@dataclass
class LoadedModel:
    model: torch.nn.Module
    model_type: str
    weights: str  # "random" | "pretrained"
    source: str  # what the weights came from, for the output


def resolve_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise BenchError(f"--device {requested}: torch sees no CUDA device")
    return requested


def _empty_model(config, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """Parameters allocated on ``device`` but not initialized; buffers (RoPE) computed."""
    with no_init_weights(), torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


@torch.no_grad()
def init_random_(model: torch.nn.Module, seed: int, device: str) -> None:
    std = float(getattr(model.config, "initializer_range", 0.02))
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if p.ndim >= 2:
            p.normal_(0.0, std, generator=gen)
        elif name.endswith("bias"):
            p.zero_()
        else:
            p.fill_(1.0)
    # A module's own init may draw from the global generator (gpt-oss's attention draws its
    # sinks, Qwen3.5's gated delta nets A_log): seeded here, so the model worker and the
    # measuring process, which build the model apart, hold the same weights (unseeded, one seed
    # gave different sinks or A_log in the two processes and a correctness case passed or failed
    # from run to run)
    cuda = torch.device(device).type == "cuda"
    devices = [torch.device(device).index or 0] if cuda else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for module in model.modules():
            if _is_norm(module):
                model._init_weights(module)
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()


def _is_norm(module: torch.nn.Module) -> bool:
    """A module that holds only 1-D parameters of its own (a norm's scale, maybe its bias)."""
    own = list(module.parameters(recurse=False))
    return bool(own) and all(p.ndim == 1 for p in own)


def random_model(
    model_key: str, device: str, seed: int, overrides: dict | None = None
) -> LoadedModel:
    """The preset's model with random weights (``overrides``: config fields changed first, as
    tests change a tiny preset's routing)."""
    preset = PRESETS[model_key]
    config = AutoConfig.for_model(**(config_dict(preset) | (overrides or {})))
    model = _empty_model(config, device, DTYPE)
    init_random_(model, seed, device)
    return LoadedModel(model, preset.model_type, "random", f"config of {preset.architecture}")


def pretrained_model(model_key: str, model_id: str, device: str) -> LoadedModel:
    check_model_id(model_id)
    try:
        model = AutoModelForCausalLM.from_pretrained(os.path.expanduser(model_id), dtype=DTYPE)
    except (OSError, ValueError) as exc:
        raise BenchError(f"--model-id {model_id}: cannot load weights: {exc}") from exc
    model = model.to(device).eval()
    model_type = model.config.model_type
    expected = PRESETS[model_key].model_type if model_key in PRESETS else model_key
    if model_type != expected:
        raise BenchError(
            f"--model-id {model_id} is a {model_type!r} model, but --model-key {model_key} "
            f"expects {expected!r}"
        )
    return LoadedModel(model, model_type, "pretrained", model_id)


def twin_sharing_weights(model: torch.nn.Module) -> torch.nn.Module:
    """A second instance over the SAME parameter tensors, with its own (deep-copied) config so
    that setting its attention implementation leaves the original alone."""
    device = next(model.parameters()).device
    twin = _empty_model(copy.deepcopy(model.config), str(device), DTYPE)
    for name, p in model.named_parameters(remove_duplicate=False):
        owner, _, leaf = name.rpartition(".")
        setattr(twin.get_submodule(owner), leaf, p)
    twin.generation_config = copy.deepcopy(model.generation_config)
    mine = {n: p.data_ptr() for n, p in model.named_parameters(remove_duplicate=False)}
    theirs = {n: p.data_ptr() for n, p in twin.named_parameters(remove_duplicate=False)}
    if mine != theirs:
        raise BenchError("internal: the cuTile twin does not share every weight of the baseline")
    return twin


@torch.no_grad()
def fp32_reference(model: torch.nn.Module) -> torch.nn.Module:
    """The same weights upcast to fp32 in a separate instance."""
    device = next(model.parameters()).device
    ref = _empty_model(copy.deepcopy(model.config), str(device), torch.float32)
    source = dict(model.named_parameters(remove_duplicate=False))
    for name, p in ref.named_parameters(remove_duplicate=False):
        p.copy_(source[name].float())
    return ref


@torch.no_grad()
def weight_fingerprint(model: torch.nn.Module) -> torch.Tensor:
    """Per-parameter fp32 sums: a cheap way to notice an in-place change of shared weights."""
    return torch.stack([p.float().sum() for p in model.parameters()]).cpu()
