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

from tilegym.transformers.family import (
    GATE_UP,
    GATED_ACTS,
    QKV,
    Family,
    config_activation,
    norm_eps,
)

#: config fields whose computation the shared glue replaces without reproducing it. Others
#: that look alike are reproduced because they live outside the patched modules or in the
#: module's own attributes the glue reads (Granite's embedding multiplier and logits scaling in
#: the model and head forwards, its attention multiplier in ``self.scaling``; Gemma's
#: query_pre_attn_scalar likewise); the numeric check covers what this list does not name.
UNSUPPORTED_CONFIG = {
    "residual_multiplier": "scaled residual adds (Granite)",
    "attn_logit_softcapping": "attention logit soft-capping (Gemma 2)",
}
#: decoder-layer children of the three layer forwards the shared glue has: norms before the
#: attention and the MLP (Llama), after each (OLMo 2), or on both sides of each (Gemma 3)
PRE_NORM_PARTS = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
POST_NORM_PARTS = {"self_attn", "mlp", "post_attention_layernorm", "post_feedforward_layernorm"}
SANDWICH_PARTS = PRE_NORM_PARTS | POST_NORM_PARTS | {"pre_feedforward_layernorm"}
#: children of a sparse MoE block the MoE forward runs (``tilegym.transformers.moe_block``)
MOE_BLOCK_PARTS = {"gate", "experts"}
#: the packed expert layout the MoE ops take (attributes transformers' experts classes carry)
MOE_EXPERTS_LAYOUT = {
    "has_gate": True,
    "has_bias": False,
    "is_transposed": False,
    "is_concatenated": True,
    "has_post_expert_norm": False,
}
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
    act = config_activation(config)
    if act not in GATED_ACTS:
        known = ", ".join(GATED_ACTS)
        problems.append(
            f"activation {act!r}: the MLP kernels are gated SiLU or GELU-tanh ({known})"
        )
    return problems


def norm_form(norm: torch.nn.Module) -> bool | None:
    """Which RMSNorm ``norm`` computes, read off a copy run with a zero weight: False for
    ``weight * x / rms(x)`` (Llama: zero out), True for ``(1 + weight) * x / rms(x)`` (Gemma:
    the normalized row), None for anything else."""
    weight = getattr(norm, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        return None
    probe = copy.deepcopy(norm).float()
    x = torch.randn(3, weight.numel(), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        probe.weight.zero_()
        out = probe(x)
    if torch.equal(out, torch.zeros_like(out)):
        return False
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm_eps(norm))
    return True if torch.allclose(out, normed, rtol=1e-5, atol=1e-6) else None


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
    sandwich = parts == SANDWICH_PARTS
    runs = POST_NORM_PARTS if post_norm else SANDWICH_PARTS if sandwich else PRE_NORM_PARTS
    extra = sorted(parts - runs)
    if extra:
        problems.append(f"decoder layer parts the shared glue does not run: {', '.join(extra)}")
    offset = norm_form(getattr(layer, "post_attention_layernorm", None))
    if offset is None:
        problems.append(
            "an RMSNorm that is neither Llama's (weight * x / rms(x)) nor Gemma's "
            "((1 + weight) * x / rms(x))"
        )
    attn, mlp = layer.self_attn, layer.mlp
    notes = []
    moe_block = None
    sparse = next((la.mlp for la in _layers(model) if hasattr(la.mlp, "experts")), None)
    if sparse is not None:  # a sparse block; its dense twin names the MLP projections
        moe_block, mlp = _moe_block(model, sparse, prefix, upstream, problems)
        notes.append("sparse MoE MLP blocks (softmax top-k router, packed SwiGLU experts)")
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
    if sandwich:
        notes.append("norms before and after attention and the MLP (sandwich)")
    if offset:
        notes.append("RMSNorms scaled by (1 + weight) in fp32")
    gated_act = GATED_ACTS.get(config_activation(model.config))  # None: a problem above
    if gated_act == "gelu_tanh":
        notes.append("GeGLU MLP (tanh GELU)")
    if problems:
        raise FamilyRefused("; ".join(problems))
    if any(getattr(attn, n).bias is not None for n in qkv):
        notes.append("q/k/v biases (added in the QKV GEMM's epilogue)")
    if len(qkv) == 1 or len(gate_up) == 1:
        notes.append("packed projections, used as they are")
    config_window = not hasattr(attn, "sliding_window") and hasattr(model.config, "sliding_window")
    family = Family(
        module_name,
        prefix,
        qk_norm,
        qkv,
        gate_up,
        act,
        config_window,
        whole,
        post_norm,
        norm_unit_offset=bool(offset),
        sandwich_norm=sandwich,
        gated_act=gated_act,
        moe_block=moe_block,
    )
    return Probe(family, tuple(notes))


def _moe_block(model, block, prefix: str, upstream, problems: list[str]):
    """(class suffix, a dense MLP of the family) for a sparse MoE block; what the MoE forward
    does not cover is added to ``problems``. The dense MLP is a layer's own (``mlp_only_layers``)
    or one built on the meta device, so that its projection names are read either way."""
    name = type(block).__name__
    suffix = name[len(prefix) :] if name.startswith(prefix) else None
    if suffix is None or getattr(upstream, name, None) is not type(block):
        problems.append(f"MoE block class {name} is not {prefix}<suffix> of {upstream.__name__}")
    extra = sorted({n for n, _ in block.named_children()} - MOE_BLOCK_PARTS)
    if extra:
        problems.append(f"MoE block parts the MoE forward does not run: {', '.join(extra)}")
    router, experts = getattr(block, "gate", None), block.experts
    if not all(hasattr(router, a) for a in ("weight", "top_k", "norm_topk_prob")):
        problems.append("an MoE router without weight, top_k and norm_topk_prob (softmax top-k)")
    packed = [getattr(experts, n, None) for n in ("gate_up_proj", "down_proj")]
    if not all(isinstance(p, torch.nn.Parameter) and p.dim() == 3 for p in packed):
        problems.append("MoE experts without packed 3-D gate_up_proj and down_proj weights")
    odd = [
        f"{k}={getattr(experts, k)!r}"
        for k, v in MOE_EXPERTS_LAYOUT.items()
        if getattr(experts, k, v) != v
    ]
    if odd:
        problems.append(f"an MoE experts layout the MoE ops do not take: {', '.join(odd)}")
    dense = next((la.mlp for la in _layers(model) if not hasattr(la.mlp, "experts")), None)
    if dense is None:
        try:
            with torch.device("meta"):
                dense = getattr(upstream, prefix + "MLP")(model.config)
        except Exception as exc:  # a constructor taking other arguments: name it, do not crash
            problems.append(f"cannot build {prefix}MLP from the config: {type(exc).__name__}")
            dense = torch.nn.Module()
    return suffix, dense


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
