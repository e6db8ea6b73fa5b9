"""Describe a transformers decoder model as a ``Family`` for the shared glue, or say why not.

``model init`` scaffolds a new family from this. The description is read off an instance
(its classes, projections, norms, activation) and the config (features the ops do not
cover); what the structure cannot show (a norm applied after a sub-block instead of before,
a residual scaled by a factor the glue does not read, a different RMSNorm formula) is caught
by running the model: the patched tiny model on the CPU (the ops' PyTorch implementations)
must reproduce every module's output, the logits and the greedy tokens of the upstream model,
or the family is refused, naming the first module whose output differs. The tiny model holds
every per-layer pattern of the config (``model init`` picks its layer count), so a layer kind
that occurs every k-th layer is run too. Never a silently wrong model.
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
#: query_pre_attn_scalar likewise) or are a ``Family`` field (Granite's residual multiplier);
#: the numeric check covers what this list does not name.
UNSUPPORTED_CONFIG = {
    "attn_logit_softcapping": "attention logit soft-capping (Gemma 2)",
}
#: the config field whose value q, k and v are clamped to (``Family.clip_qkv``; OLMoE)
CLIP_QKV = "clip_qkv"
#: attention attributes that are false on a layer without RoPE (``Family.rope_switch``)
ROPE_SWITCHES = ("use_rope",)
#: config fields upstream's model and CausalLM forwards apply outside the patched modules
OUTSIDE_SCALES = ("embedding_multiplier", "logits_scaling")
#: decoder-layer children of the three layer forwards the shared glue has: norms before the
#: attention and the MLP (Llama), after each (OLMo 2), or on both sides of each (Gemma 3)
PRE_NORM_PARTS = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
POST_NORM_PARTS = {"self_attn", "mlp", "post_attention_layernorm", "post_feedforward_layernorm"}
SANDWICH_PARTS = PRE_NORM_PARTS | POST_NORM_PARTS | {"pre_feedforward_layernorm"}
#: children of a sparse MoE block the MoE forward runs (``tilegym.transformers.moe_block``):
#: the router (``gate``; gpt-oss: ``router``, ``Family.moe_router``) and the experts
MOE_ROUTERS = ("gate", "router")
MOE_BLOCK_PARTS = {"experts"}
#: the packed expert layout the MoE ops take (attributes transformers' experts classes carry)
MOE_EXPERTS_LAYOUT = {
    "has_gate": True,
    "has_bias": False,
    "is_transposed": False,
    "is_concatenated": True,
    "has_post_expert_norm": False,
}
#: gpt-oss's expert layout (``Family.moe_experts`` "clamped"): biased, the gate and up
#: interleaved in one transposed [E, H, 2I] weight, with the clamp's ``alpha`` and ``limit``
MOE_CLAMPED_LAYOUT = dict(MOE_EXPERTS_LAYOUT, has_bias=True, is_transposed=True)
MOE_CLAMPED_LAYOUT["is_concatenated"] = False
MOE_CLAMPED_ATTRS = ("alpha", "limit", "gate_up_proj_bias", "down_proj_bias")
#: a linear-attention layer's token mixer (``Family.linear_attention``) and what the gated
#: delta net glue (``tilegym.transformers.linear_attention``) reads of it: Qwen3.5's four
#: input projections, the depthwise conv, the gates' parameters, the gated norm, out_proj
LINEAR_MIXER = "linear_attn"
GATED_DELTA_PARTS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "conv1d", "norm")
GATED_DELTA_PARTS += ("out_proj", "A_log", "dt_bias")
#: Qwen3-Next's packed form of the four input projections (relaid once by the glue)
GATED_DELTA_PACKED = ("in_proj_qkvz", "in_proj_ba", "fix_query_key_value_ordering")
#: a sparse block's sigmoid-gated shared expert (``Family.moe_shared_expert``; Qwen3-Next)
MOE_SHARED_PARTS = {"shared_expert", "shared_expert_gate"}
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
        field = "hidden_activation" if getattr(config, "hidden_act", None) is None else "hidden_act"
        known = ", ".join(GATED_ACTS)
        problems.append(
            f"activation config.{field} = {act!r}: no kernel computes it (the MLP kernels "
            f"take {known})"
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


def norm_rounds_once(norm: torch.nn.Module) -> bool:
    """Whether a Llama-form RMSNorm multiplies the fp32 normalized row by the weight and rounds
    once (``Olmo2RMSNorm``), rather than rounding the row before the weight (``LlamaRMSNorm``),
    read off a bf16 copy run on random rows: only the rounding order tells them apart."""
    g = torch.Generator().manual_seed(0)
    probe = copy.deepcopy(norm).to(torch.bfloat16)
    n = probe.weight.numel()
    with torch.no_grad():
        probe.weight.copy_(1 + torch.rand(n, generator=g))
        x = torch.randn(4, n, generator=g).to(torch.bfloat16)
        out = probe(x)
    h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + norm_eps(norm))
    return out.dtype == x.dtype and torch.equal(out, (probe.weight * h).to(x.dtype))


def _layers(model):
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise FamilyRefused("no model.model.layers: not a Llama-style decoder-only model")
    return layers


def _names(
    module, split: tuple[str, ...], packed: str, what: str, problems: list[str]
) -> tuple[str, ...]:
    """The projection names ``module`` has; a missing one is added to ``problems``, so that
    one refusal names every uncovered feature (Arcee: an ungated MLP and its relu2)."""
    if all(isinstance(getattr(module, n, None), torch.nn.Linear) for n in split):
        return split
    if isinstance(getattr(module, packed, None), torch.nn.Linear):
        return (packed,)
    problems.append(f"{what}: neither {'/'.join(split)} nor a packed {packed}")
    return split


def describe_structure(model) -> Probe:
    """The ``Family`` an instance's classes and modules describe (no numbers checked yet);
    ``FamilyRefused`` names every uncovered feature found."""
    problems = config_problems(model.config)
    layers = _layers(model)
    # a hybrid model's (Qwen3.5's) attention layer describes the family; its linear-attention
    # layers differ in their token mixer only
    layer = next((la for la in layers if hasattr(la, "self_attn")), layers[0])
    linear_attention = _linear_mixer(layers, layer, problems)
    name = type(layer).__name__
    if not name.endswith("DecoderLayer"):
        raise FamilyRefused(f"decoder layer class {name} is not <Prefix>DecoderLayer")
    prefix = name[: -len("DecoderLayer")]
    module_name = type(layer).__module__
    upstream = __import__(module_name, fromlist=["_"])
    all_sparse = all(hasattr(la.mlp, "experts") for la in _layers(model))
    needed = ("RMSNorm", "Attention") if all_sparse else ("RMSNorm", "MLP", "Attention")
    missing = [prefix + p for p in needed if not hasattr(upstream, prefix + p)]
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
    if not hasattr(layer, "self_attn"):
        raise FamilyRefused(f"{name} has no self_attn in any layer: no attention to patch")
    attn, mlp = layer.self_attn, layer.mlp
    notes = []
    if linear_attention:
        notes.append(
            f"linear-attention layers ({prefix}{linear_attention}: gated delta rule, causal "
            "conv1d, gated RMSNorm)"
        )
    moe_block, renormalize, router, experts_form = None, None, "gate", "silu"
    shared_expert = False
    sparse = next((la.mlp for la in _layers(model) if hasattr(la.mlp, "experts")), None)
    if sparse is not None:  # a sparse block; its dense twin names the MLP projections
        moe_block, mlp, renormalize, router, experts_form = _moe_block(
            model, sparse, prefix, upstream, problems
        )
        shared_expert = {n for n, _ in sparse.named_children()} >= MOE_SHARED_PARTS
        if shared_expert:
            kind = type(sparse.shared_expert)
            if kind is not getattr(upstream, prefix + "MLP", None):
                problems.append(f"a shared expert of class {kind.__name__}, not {prefix}MLP")
            notes.append("a shared expert scaled by sigmoid(shared_expert_gate(x)) in each block")
        notes.append(
            "sparse MoE MLP blocks (softmax top-k router, packed SwiGLU experts)"
            if experts_form == "silu"
            else "sparse MoE MLP blocks (biased top-k router; biased experts, gate and up "
            "interleaved, clamped and gated as gpt-oss's)"
        )
        if renormalize is not None:
            notes.append(
                "top-k routing weights always renormalized (no norm_topk_prob switch)"
                if renormalize
                else "top-k routing weights never renormalized (no norm_topk_prob switch)"
            )
    qkv = _names(attn, QKV, "qkv_proj", "attention projections", problems)
    output_gate = output_gated(model.config, attn, qkv)
    if output_gate:
        notes.append("q_proj holds [q; gate] per head, output scaled by sigmoid(gate)")
    gate_up, act = GATE_UP, "act_fn"
    if mlp is not None:  # None: every MLP is sparse and the family has no dense one (Mixtral)
        gate_up = _names(mlp, GATE_UP, "gate_up_proj", "MLP projections", problems)
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
    round_once = whole and offset is False and norm_rounds_once(attn.q_norm)
    clip_qkv = CLIP_QKV in _config_keys(model.config)
    if clip_qkv:
        notes.append(f"q, k and v clamped to +-config.{CLIP_QKV} after the q/k norms, when set")
    if post_norm:
        notes.append("norms after attention and after the MLP (post-norm)")
    if sandwich:
        notes.append("norms before and after attention and the MLP (sandwich)")
    if offset:
        notes.append("RMSNorms scaled by (1 + weight) in fp32")
    residual = getattr(model.config, "residual_multiplier", None) is not None
    if residual:
        notes.append(
            "residual + out * config.residual_multiplier after attention and after the MLP "
            "(folded into the o_proj and down_proj weights of the residual GEMMs)"
        )
        if post_norm or sandwich:
            problems.append("a residual multiplier in a layer with norms after its sub-blocks")
    outside = [f for f in OUTSIDE_SCALES if getattr(model.config, f, None) is not None]
    if outside:
        notes.append(f"{' and '.join(outside)} left to the upstream model and head forwards")
    rope_switch = next((a for a in ROPE_SWITCHES if hasattr(attn, a)), None)
    if rope_switch:
        notes.append(f"layers without RoPE where the attention's {rope_switch} is 0 (NoPE)")
    sinks = isinstance(getattr(attn, "sinks", None), torch.Tensor)
    if sinks:
        notes.append("attention sinks: a learned per-head logit in every softmax row")
    half_table = rope_half_table(model, attn)
    if half_table:
        notes.append("half-width rotary tables, q/k rotated by halves (repeated for the kernels)")
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
        residual_multiplier=residual,
        rope_switch=rope_switch,
        moe_renormalize=renormalize,
        clip_qkv=clip_qkv,
        moe_router=router,
        moe_experts=experts_form,
        sinks=sinks,
        rope_half_table=half_table,
        attn_output_gate=output_gate,
        linear_attention=linear_attention,
        moe_shared_expert=shared_expert,
        qk_norm_round_once=round_once,
    )
    return Probe(family, tuple(notes))


def output_gated(config, attn, qkv: tuple[str, ...]) -> bool:
    """True when a separate q_proj has twice the query heads' rows: [q; gate] per head, the
    output scaled by sigmoid(gate) (Qwen3.5). The numeric check judges the gate's form."""
    q = getattr(attn, qkv[0], None) if len(qkv) == 3 else None
    head_dim = getattr(attn, "head_dim", None)
    heads = getattr(config, "num_attention_heads", None)
    return bool(q is not None and head_dim and heads and q.out_features == 2 * heads * head_dim)


def _linear_mixer(layers, attention_layer, problems: list[str]) -> str | None:
    """The class suffix of the linear-attention mixer (``linear_attn``) some layers have instead
    of ``self_attn``, or None; a mixer the gated delta net glue cannot run, or a linear layer
    whose other parts differ from the attention layer's, is added to ``problems``."""
    hybrid = [la for la in layers if hasattr(la, LINEAR_MIXER)]
    if not hybrid:
        return None
    mixer = getattr(hybrid[0], LINEAR_MIXER)
    prefix = type(attention_layer).__name__.removesuffix("DecoderLayer")
    name = type(mixer).__name__
    missing = [p for p in GATED_DELTA_PARTS if not hasattr(mixer, p)]
    if all(hasattr(mixer, p) for p in GATED_DELTA_PACKED):  # Qwen3-Next's packed projections
        missing = [p for p in missing if p not in GATED_DELTA_PARTS[:4]]
    if not name.startswith(prefix) or missing:
        lacks = f" (lacks {', '.join(missing)})" if missing else ""
        problems.append(
            f"linear-attention mixer {name}{lacks}: the gated delta net glue runs "
            f"{prefix}GatedDeltaNet-style mixers with {', '.join(GATED_DELTA_PARTS[:4])} "
            f"(or packed: {', '.join(GATED_DELTA_PACKED[:2])}); no cuTile op computes this one"
        )
        return None
    own = {n for n, _ in attention_layer.named_children()} - {"self_attn"}
    theirs = {n for n, _ in hybrid[0].named_children()} - {LINEAR_MIXER}
    if own != theirs:
        problems.append(
            f"linear-attention layers with other parts than the attention layers: "
            f"{', '.join(sorted(own ^ theirs))}"
        )
    return name[len(prefix) :]


def rope_half_table(model, attn) -> bool:
    """True when the model's rotary module hands out tables half a head wide (gpt-oss: q/k
    rotate by halves against ``head_dim / 2`` frequencies), read off one call; False when it
    has none or the call fails (the numeric check judges what this misses)."""
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    head_dim = getattr(attn, "head_dim", None)
    if rotary is None or not head_dim:
        return False
    try:
        with torch.no_grad():
            cos, _ = rotary(torch.zeros(1, 2, 1), torch.arange(2).unsqueeze(0))
    except Exception:  # a rotary module with another signature: not this form
        return False
    return cos.shape[-1] * 2 == head_dim


def _config_keys(config) -> set[str]:
    return set(config.to_dict() if hasattr(config, "to_dict") else vars(config))


def router_renormalizes(router: torch.nn.Module) -> bool | None:
    """Whether an MoE router without a ``norm_topk_prob`` switch renormalizes its top-k
    weights, read off a copy run in fp32 (Mixtral's: its weights sum to 1); None when it has the
    switch (read at run time) or when its output is not (logits, weights, ids)."""
    if hasattr(router, "norm_topk_prob"):
        return None
    probe = copy.deepcopy(router).float()
    x = torch.randn(5, router.weight.shape[1], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = probe(x)
    if not (isinstance(out, tuple) and len(out) == 3):
        return None
    sums = out[1].float().sum(-1)
    return bool(torch.allclose(sums, torch.ones_like(sums), rtol=1e-5, atol=1e-6))


def _moe_block(model, block, prefix: str, upstream, problems: list[str]):
    """(class suffix, a dense MLP of the family, ``Family.moe_renormalize``, the router's
    attribute, the experts' form) for a sparse MoE block; what the MoE forward does not cover
    is added to ``problems``. The dense MLP is a
    layer's own (``mlp_only_layers``) or one built on the meta device, so that its projection
    names are read either way; None where every layer is sparse and there is no MLP class."""
    name = type(block).__name__
    suffix = name[len(prefix) :] if name.startswith(prefix) else None
    if suffix is None or getattr(upstream, name, None) is not type(block):
        problems.append(f"MoE block class {name} is not {prefix}<suffix> of {upstream.__name__}")
    children = {n for n, _ in block.named_children()}
    router_name = next((n for n in MOE_ROUTERS if n in children), MOE_ROUTERS[0])
    shared = MOE_SHARED_PARTS if children >= MOE_SHARED_PARTS else set()
    extra = sorted(children - MOE_BLOCK_PARTS - {router_name} - shared)
    if extra:
        problems.append(f"MoE block parts the MoE forward does not run: {', '.join(extra)}")
    router, experts = getattr(block, router_name, None), block.experts
    renormalize = None
    if not all(hasattr(router, a) for a in ("weight", "top_k")):
        problems.append("an MoE router without weight and top_k (softmax top-k)")
    else:
        renormalize = router_renormalizes(router)
    packed = [getattr(experts, n, None) for n in ("gate_up_proj", "down_proj")]
    if not all(isinstance(p, torch.nn.Parameter) and p.dim() == 3 for p in packed):
        problems.append("MoE experts without packed 3-D gate_up_proj and down_proj weights")
    form = "silu"
    clamped = all(getattr(experts, k, v) == v for k, v in MOE_CLAMPED_LAYOUT.items())
    if clamped and all(hasattr(experts, a) for a in MOE_CLAMPED_ATTRS):
        form = "clamped"
    else:
        odd = [
            f"{k}={getattr(experts, k)!r}"
            for k, v in MOE_EXPERTS_LAYOUT.items()
            if getattr(experts, k, v) != v
        ]
        if odd:
            problems.append(f"an MoE experts layout the MoE ops do not take: {', '.join(odd)}")
    dense = next((la.mlp for la in _layers(model) if not hasattr(la.mlp, "experts")), None)
    if dense is None and (suffix == "MLP" or not hasattr(upstream, prefix + "MLP")):
        # every MLP sparse, no dense class (Mixtral) or the sparse block is it (gpt-oss)
        return suffix, None, renormalize, router_name, form
    if dense is None:
        try:
            with torch.device("meta"):
                dense = getattr(upstream, prefix + "MLP")(model.config)
        except Exception as exc:  # a constructor taking other arguments: name it, do not crash
            problems.append(f"cannot build {prefix}MLP from the config: {type(exc).__name__}")
            dense = torch.nn.Module()
    return suffix, dense, renormalize, router_name, form


@dataclass(frozen=True)
class Check:
    """What the numeric check compared, for the accept message."""

    max_logit_difference: float
    layers: int
    batch: int
    tokens: int  # per row, the second row left-padded by PAD tokens
    new_tokens: int  # greedy tokens generated by both and compared

    def summary(self) -> str:
        return (
            f"checked: the patched {self.layers}-layer model reproduces the upstream one "
            f"(max |logit difference| {self.max_logit_difference:.2g} <= {LOGIT_TOLERANCE:g} "
            f"over {self.batch} x {self.tokens} tokens, one row left-padded; the same "
            f"{self.new_tokens} greedy tokens)"
        )


BATCH, TOKENS, PAD, NEW_TOKENS = 2, 9, 3, 4


def verify(model, family: Family, apply) -> float:
    """``check_family`` with a plain ``apply(copy)``: its largest |logit difference|."""
    return check_family(model, family, lambda m, **_: apply(m), isolate=False).max_logit_difference


def check_family(model, family: Family, apply, *, isolate: bool = True) -> Check:
    """Compare ``model`` (fp32, CPU, tiny) with its copy patched by ``apply(copy, **flags)``
    on a left-padded batch: each decoder layer's output, the logits and the greedy tokens.
    Raises ``FamilyRefused`` naming the first module whose output differs, that layer's
    per-layer config entries and (``isolate``) the patch flags that alone make a layer differ;
    or when greedy tokens differ."""
    base = model.float().eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, base.config.vocab_size, (BATCH, TOKENS), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :PAD] = 0
    valid = mask.bool()
    want = _run(base, ids, mask)
    patched = copy.deepcopy(base)
    handle = apply(patched)
    try:
        got = _run(patched, ids, mask)
        diff = float((got.logits[valid] - want.logits[valid]).abs().max())
        first = first_difference(want, got, valid)
        if first is not None or not diff <= LOGIT_TOLERANCE:
            culprits = _flags_that_differ(base, apply, want, ids, mask) if isolate else []
            raise FamilyRefused(_difference_message(base, family, first, diff, culprits))
        with torch.no_grad():
            kw = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
            a = base.generate(input_ids=ids, attention_mask=mask, pad_token_id=0, **kw)
            b = patched.generate(input_ids=ids, attention_mask=mask, pad_token_id=0, **kw)
        if not torch.equal(a, b):
            raise FamilyRefused("patched greedy tokens differ from the upstream model's")
    finally:
        handle.undo()
    return Check(diff, len(_layers(base)), BATCH, TOKENS, NEW_TOKENS)


#: what each patch flag replaces, for a refusal's message
FLAG_PARTS = {
    "rope": "RoPE",
    "rms_norm": "the RMSNorms",
    "swiglu": "the gated MLP activation",
    "attn": "attention",
    "linear": "the linear projections",
}


@dataclass
class _Recorded:
    logits: torch.Tensor
    outputs: dict[str, torch.Tensor]  # compared module -> its first call's tensor output
    order: list[str]  # compared modules in call (exit) order
    classes: dict[str, str]


def _flags_that_differ(base, apply, want: _Recorded, ids, mask) -> list[str]:
    """The patch flags that, each alone, make some layer's output differ (the glue's layer
    forward with every flag off is ``layer forward``)."""
    from tilegym.transformers.monkey_patch import FLAGS

    valid = mask.bool()
    out = []
    for only in (None, *FLAGS):
        patched = copy.deepcopy(base)
        handle = apply(patched, **{flag: flag == only for flag in FLAGS})
        try:
            if first_difference(want, _run(patched, ids, mask), valid) is not None:
                out.append(only or "layer forward")
        finally:
            handle.undo()
    return out


def _compared(name: str) -> bool:
    """A module whose output contract the patch keeps: a decoder layer (``...layers.N``), or
    a module outside the layers whose parent is the model (embedding, final norm, head). A
    layer's own parts are not compared: the shared layer forward may split them differently
    (its attention returns the output before ``o_proj``, which it fuses with the residual)."""
    parts = name.split(".")
    if "layers" in parts:
        return len(parts) == parts.index("layers") + 2
    return len(parts) <= 2


def _run(model, ids, mask) -> _Recorded:
    """One forward pass recording each compared module's first floating tensor output."""
    outputs: dict[str, torch.Tensor] = {}
    order: list[str] = []
    classes: dict[str, str] = {}

    def keeper(name: str):
        def keep(_module, _args, output):
            tensor = output
            if isinstance(output, tuple | list):
                tensor = next((t for t in output if isinstance(t, torch.Tensor)), None)
            floating = isinstance(tensor, torch.Tensor) and tensor.is_floating_point()
            if floating and name not in outputs:
                order.append(name)
                outputs[name] = tensor.detach().float().clone()

        return keep

    handles = []
    for name, module in model.named_modules():
        if name and _compared(name):
            classes[name] = type(module).__name__
            handles.append(module.register_forward_hook(keeper(name)))
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits
    finally:
        for h in handles:
            h.remove()
    return _Recorded(logits, outputs, order, classes)


@dataclass(frozen=True)
class Difference:
    module: str
    module_class: str
    difference: float


def _differs_by(want: torch.Tensor, got: torch.Tensor, valid: torch.Tensor) -> float | None:
    """Largest |difference| on real (not padded) tokens when above tolerance, else None."""
    if want.shape != got.shape:
        return float("inf")
    if want.dim() >= 2 and tuple(want.shape[:2]) == tuple(valid.shape):
        want, got = want[valid], got[valid]
    if want.numel() == 0:
        return None
    diff = float((got - want).abs().max())
    scale = max(1.0, float(want.abs().max()))
    return None if diff <= LOGIT_TOLERANCE * scale else diff


def first_difference(want: _Recorded, got: _Recorded, valid: torch.Tensor) -> Difference | None:
    """The first compared module, in the upstream model's call order, whose output the patched
    model does not reproduce."""
    for name in want.order:
        if name not in got.outputs:
            continue
        diff = _differs_by(want.outputs[name], got.outputs[name], valid)
        if diff is not None:
            return Difference(name, want.classes.get(name, "?"), diff)
    return None


def _difference_message(
    model, family: Family, first: Difference | None, logits: float, culprits: list[str]
) -> str:
    head = f"the shared glue does not reproduce {family.class_prefix}"
    tail = f"max |logit difference| {logits:.3g} (tolerance {LOGIT_TOLERANCE:g})"
    if first is None:
        where = "no layer's output differs, but the logits do"
    else:
        where = (
            f"the first module whose output differs is {first.module} ({first.module_class}, "
            f"max |difference| {first.difference:.3g})"
        )
        entries = layer_entries(model.config, _layer_index(first.module))
        if entries:
            where += f"; that layer's config: {', '.join(entries)}"
    if culprits:
        named = ", ".join(
            f"{flag} ({FLAG_PARTS[flag]})" if flag in FLAG_PARTS else flag for flag in culprits
        )
        where += f"; patched alone, these differ: {named}"
    return f"{head}: {where}; {tail}"


def _layer_index(module: str) -> int | None:
    parts = module.split(".")
    if "layers" in parts and len(parts) > parts.index("layers") + 1:
        number = parts[parts.index("layers") + 1]
        return int(number) if number.isdigit() else None
    return None


def layer_entries(config, index: int | None) -> list[str]:
    """``name[index] = value`` for each per-layer list of the config (a list as long as the
    layer count: layer types, NoPE flags, ...) (pure)."""
    n = getattr(config, "num_hidden_layers", None)
    if index is None or not n:
        return []
    values = config.to_dict() if hasattr(config, "to_dict") else dict(vars(config))
    return [
        f"{key}[{index}] = {value[index]!r}"
        for key, value in sorted(values.items())
        if isinstance(value, list) and len(value) == n and index < n
    ]
