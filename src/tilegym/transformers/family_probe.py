"""Describe a transformers decoder model as a ``Family`` for the shared glue, or say why not.

``model init`` scaffolds a new family from this. The description is read off an instance
(its classes, projections, norms, activation) and the config (features the ops do not
cover); what the structure cannot show (a norm applied after a sub-block instead of before,
a scaled residual, a different RMSNorm formula) is caught by running the model: the patched
tiny model on the CPU (the ops' PyTorch implementations) must reproduce the upstream model's
logits and greedy tokens, or the family is refused. Never a silently wrong model.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from tilegym.transformers.llama.modeling_llama import GATE_UP, QKV, Family

#: config fields whose computation the shared glue replaces without reproducing it. Others
#: that look alike are reproduced because they live outside the patched modules or in the
#: module's own attributes the glue reads (Granite's embedding multiplier and logits scaling in
#: the model and head forwards, its attention multiplier in ``self.scaling``; Gemma's
#: query_pre_attn_scalar likewise); the numeric check covers what this list does not name.
UNSUPPORTED_CONFIG = {
    "residual_multiplier": "scaled residual adds (Granite)",
    "attn_logit_softcapping": "attention logit soft-capping (Gemma 2)",
}
#: decoder-layer children of the two layer forwards the shared glue has: norms before the
#: attention and the MLP (Llama), or after each (OLMo 2)
PRE_NORM_PARTS = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
POST_NORM_PARTS = {"self_attn", "mlp", "post_attention_layernorm", "post_feedforward_layernorm"}
SWIGLU_ACTS = ("silu", "swish")
#: largest |logit difference| (fp32, CPU) between the patched and upstream tiny models
LOGIT_TOLERANCE = 1e-4


class FamilyRefused(ValueError):
    """The model has a feature the existing ops and glue do not cover (named in the message)."""


@dataclass(frozen=True)
class Probe:
    family: Family
    notes: tuple[str, ...]  # what was found that the scaffold should mention


def config_problems(config) -> list[str]:
    """Names of config features the shared glue does not reproduce (pure)."""
    problems = []
    for field, what in UNSUPPORTED_CONFIG.items():
        value = getattr(config, field, None)
        if value not in (None, 1, 1.0):
            problems.append(f"{what}: config.{field} = {value!r}")
    act = getattr(config, "hidden_act", None) or getattr(config, "hidden_activation", None)
    if act not in SWIGLU_ACTS:
        problems.append(f"activation {act!r}: the MLP kernels are SwiGLU (silu)")
    return problems


def _layers(model):
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise FamilyRefused("no model.model.layers: not a Llama-style decoder-only model")
    return layers


def _names(module, split: tuple[str, ...], packed: str, what: str) -> tuple[str, ...]:
    if all(isinstance(getattr(module, n, None), torch.nn.Linear) for n in split):
        return split
    if isinstance(getattr(module, packed, None), torch.nn.Linear):
        return (packed,)
    raise FamilyRefused(f"{what}: neither {'/'.join(split)} nor a packed {packed}")


def describe_structure(model) -> Probe:
    """The ``Family`` an instance's classes and modules describe (no numbers checked yet);
    ``FamilyRefused`` names every uncovered feature found."""
    problems = config_problems(model.config)
    layer = _layers(model)[0]
    name = type(layer).__name__
    if not name.endswith("DecoderLayer"):
        raise FamilyRefused(f"decoder layer class {name} is not <Prefix>DecoderLayer")
    prefix = name[: -len("DecoderLayer")]
    module_name = type(layer).__module__
    upstream = __import__(module_name, fromlist=["_"])
    missing = [
        prefix + p for p in ("RMSNorm", "MLP", "Attention") if not hasattr(upstream, prefix + p)
    ]
    if missing:
        raise FamilyRefused(f"{module_name} has no {', '.join(missing)}")
    parts = {n for n, c in layer.named_children() if not isinstance(c, torch.nn.Dropout)}
    post_norm = parts == POST_NORM_PARTS
    extra = sorted(parts - (POST_NORM_PARTS if post_norm else PRE_NORM_PARTS))
    if extra:
        problems.append(f"decoder layer parts the shared glue does not run: {', '.join(extra)}")
    attn, mlp = layer.self_attn, layer.mlp
    notes = []
    qkv = _names(attn, QKV, "qkv_proj", "attention projections")
    gate_up = _names(mlp, GATE_UP, "gate_up_proj", "MLP projections")
    if not isinstance(getattr(mlp, "down_proj", None), torch.nn.Linear):
        problems.append("MLP has no down_proj")
    act = next((a for a in ("act_fn", "activation_fn") if hasattr(mlp, a)), None)
    if act is None:
        problems.append("MLP has no act_fn / activation_fn")
    qk_norm = hasattr(attn, "q_norm") or hasattr(attn, "k_norm")
    whole = False
    if qk_norm:
        width = getattr(attn.q_norm, "weight", torch.empty(0)).numel()
        whole = width != getattr(attn, "head_dim", None)
        if whole and width != model.config.num_attention_heads * attn.head_dim:
            problems.append(f"a q norm of width {width}, neither a head nor the projection")
        notes.append(
            "q/k RMSNorm over the whole projection before RoPE"
            if whole
            else "per-head q/k RMSNorm before RoPE"
        )
    if post_norm:
        notes.append("norms after attention and after the MLP (post-norm)")
    if problems:
        raise FamilyRefused("; ".join(problems))
    if any(getattr(attn, n).bias is not None for n in qkv):
        notes.append("q/k/v biases (added in the QKV GEMM's epilogue)")
    if len(qkv) == 1 or len(gate_up) == 1:
        notes.append("packed projections, used as they are")
    config_window = not hasattr(attn, "sliding_window") and hasattr(model.config, "sliding_window")
    family = Family(
        module_name, prefix, qk_norm, qkv, gate_up, act, config_window, whole, post_norm
    )
    return Probe(family, tuple(notes))


def verify(model, family: Family, apply) -> float:
    """Largest |logit difference| between ``model`` (fp32, CPU, tiny) and its copy patched by
    ``apply(copy)`` on a left-padded batch; raises ``FamilyRefused`` above the tolerance or when
    greedy tokens differ."""
    base = model.float().eval()
    patched = copy.deepcopy(base)
    handle = apply(patched)
    gen = torch.Generator().manual_seed(0)
    vocab = base.config.vocab_size
    ids = torch.randint(1, vocab, (2, 9), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    try:
        with torch.no_grad():
            want = base(input_ids=ids, attention_mask=mask).logits
            got = patched(input_ids=ids, attention_mask=mask).logits
            valid = mask.bool()
            diff = float((got[valid] - want[valid]).abs().max())
            if not diff <= LOGIT_TOLERANCE:
                raise FamilyRefused(
                    f"the shared glue does not reproduce {family.class_prefix} "
                    f"(max |logit difference| {diff:.3g} > {LOGIT_TOLERANCE}): a computation "
                    "the description cannot show (post-norms, scaled residuals, another norm)"
                )
            kw = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)
            a = base.generate(input_ids=ids, attention_mask=mask, **kw)
            b = patched.generate(input_ids=ids, attention_mask=mask, **kw)
            if not torch.equal(a, b):
                raise FamilyRefused("patched greedy tokens differ from the upstream model's")
    finally:
        handle.undo()
    return diff
