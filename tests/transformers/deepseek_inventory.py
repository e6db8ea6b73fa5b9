"""What the DeepSeek-V2 and DeepSeek-V3 inventory tests share.

Both families' inventories (``tilegym/transformers/deepseek_v2`` and ``.../deepseek_v3``) hold
the same MLA, norm, MLP, routed-expert, RoPE and lm_head Definitions under their own prefix, and
both tests check them the same way. Loading a Definition or a Solution, the presets, the checks
of those common Definitions and the completeness test's driver live here once, each taking the
family (``"deepseek_v2"`` or ``"deepseek_v3"``; a Definition's name starts with it), so that
``test_deepseek_v2_inventory.py`` and ``test_deepseek_v3_inventory.py`` keep only what is their
family's own (V2's greedy router and fp32 route, V3's q_a/q_b and its PyTorch route).
"""

from __future__ import annotations

import importlib
import json
import random
from pathlib import Path

import torch
from cpu_generate import greedy, left_padded_batch
from op_calls import OpCalls

import tilegym.transformers
from tilegym.ops import mla, moe
from tilegym.ops.attention import reference_mask

TRANSFORMERS = Path(tilegym.transformers.__file__).parent

# ------------------------------------------------------------------ the inventory and presets


def definitions_dir(family: str) -> Path:
    """The family's folder of Definitions."""
    return TRANSFORMERS / family / "kernel_definitions"


def solutions_dir(family: str) -> Path:
    """The family's folder of Solutions."""
    return TRANSFORMERS / family / "kernel_solutions"


def definition_names(family: str) -> set[str]:
    """The names of the family's Definitions (its folder's files)."""
    return {p.stem for p in definitions_dir(family).glob("*.json")}


def _json(folder: Path, name: str) -> dict:
    return json.loads((folder / f"{name}.json").read_text())


def definition(family: str, name: str):
    """The Definition ``name`` of the family, parsed."""
    from tilegym.kernel_inventory.models import Definition

    return Definition.from_dict(_json(definitions_dir(family), name))


def reference(family: str, name: str):
    """The ``run`` of the Definition's reference source."""
    namespace: dict = {}
    source = _json(definitions_dir(family), name)["reference"]
    exec(compile(source, name, "exec"), namespace)  # noqa: S102
    return namespace["run"]


def solution_spec(family: str, name: str) -> dict:
    """The ``spec`` of the Solution for the Definition ``name``."""
    return _json(solutions_dir(family), name)["spec"]


def entry_kwargs(family: str, name: str) -> dict:
    """The constants the Solution's entry point takes."""
    return solution_spec(family, name).get("entry_kwargs", {})


def preset(key: str) -> dict:
    """The benchmark preset's config fields (``"deepseek_v2"``, ``"tiny-deepseek_v3"``, ...)."""
    from tilegym_hf_bench.presets import PRESETS, config_dict

    return config_dict(PRESETS[key])


def config(d: dict, layers: int = 1):
    """The transformers config of the fields ``d``, with ``layers`` layers."""
    from transformers import AutoConfig

    return AutoConfig.for_model(**dict(d, num_hidden_layers=layers))


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


def upstream_class(family: str, name: str):
    """transformers' ``Deepseek<V2|V3><name>`` class of the family's modeling module."""
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    return getattr(module, "Deepseek" + family.removeprefix("deepseek_").upper() + name)


# ------------------------------------------------------------------ shapes and constants


def shared_axes(family: str, c: dict) -> dict[str, dict[str, int]]:
    """The const axes, at the preset's fields ``c``, of the Definitions both families have."""
    h, heads, lat = c["hidden_size"], c["num_attention_heads"], c["kv_lora_rank"]
    r, n, v = c["qk_rope_head_dim"], c["qk_nope_head_dim"], c["v_head_dim"]
    inter, mi, e, k = (
        c["intermediate_size"],
        c["moe_intermediate_size"],
        c["n_routed_experts"],
        c["num_experts_per_tok"],
    )
    shared = mi * c["n_shared_experts"]
    axes = {
        "rms_norm": {"H": h},
        "kv_a_layernorm": {"H": lat},
        "linear_kv_b": {"K": lat, "NKV": heads * (n + v)},
        "linear_o_proj_residual": {"Q": heads * v, "H": h},
        "linear_gate_up_silu": {"H": h, "I2": 2 * inter, "I": inter},
        "linear_down_residual": {"I": inter, "H": h},
        "shared_experts_gate_up_silu": {"H": h, "I2": 2 * shared, "I": shared},
        "shared_experts_down_residual": {"I": shared, "H": h},
        "linear_lm_head": {"H": h, "V": c["vocab_size"]},
        "rope": {"HQ": heads, "HK": 1, "D": r},
        "rotary_tables": {"RH": r // 2, "R": r},
        "mla_prefill": {"H": heads, "N": n, "R": r, "V": v, "ONE": 1},
        "mla_decode": {"H": heads, "L": lat, "R": r, "ONE": 1},
        "mla_absorb_query": {"H": heads, "N": n, "L": lat, "HNV": heads * (n + v)},
        "mla_latent_to_heads": {"H": heads, "L": lat, "V": v, "HNV": heads * (n + v)},
        "latent_cache_update": {"ONE": 1, "L": lat, "R": r},
        "router_logits": {"H": h, "E": e},
        "experts_gate_up_silu": {"K": k, "E": e, "H": h, "I2": 2 * mi, "I": mi},
        "experts_down_combine": {"K": k, "E": e, "H": h, "I": mi},
    }
    return {f"{family}_{name}": value for name, value in axes.items()}


def check_const_axes(family: str, expected: dict, fp32_only: frozenset[str] = frozenset()):
    """The Definitions and the Solutions are exactly ``expected``'s, each Definition's const axes
    ``expected``'s and its float tensors in the preset's dtype (fp32 allowed too), those of
    ``fp32_only`` in fp32 alone."""
    cfg = preset(family)
    assert set(expected) == definition_names(family)
    assert {p.stem for p in solutions_dir(family).glob("*.json")} == set(expected)
    for name, axes in expected.items():
        d = definition(family, name)
        const = {a: x.value for a, x in d.axes.items() if x.kind == "const"}
        assert const == axes, name
        floats = [
            s.dtype
            for s in (*d.inputs.values(), *d.outputs.values())
            if s.dtype.startswith(("bfloat", "float"))
        ]
        model_dtype = [t for t in floats if t != "float32"]
        if name in fp32_only:
            assert floats and not model_dtype, name
            continue
        assert model_dtype and set(model_dtype) == {cfg["torch_dtype"]}, name


def check_mla_scale(family: str):
    """The MLA Solutions' only constant is the preset attention module's ``scaling`` (YaRN's
    mscale counts: it is not the head size's)."""
    cfg = config(preset(family))
    scaling = upstream_class(family, "Attention")(cfg, 0).scaling
    assert scaling != cfg.qk_head_dim**-0.5
    for name in (f"{family}_mla_decode", f"{family}_mla_prefill"):
        assert entry_kwargs(family, name) == {"scale": scaling}


def check_solution_constants(family: str, norms: tuple[str, ...] = ()):
    """The rotary tables' Solution takes the preset rotary module's ``attention_scaling`` and the
    preset's dtype, for as many frequencies as the module has; latent_to_heads the value width;
    the norms (the two both families have and ``norms``) the config's eps."""
    d = preset(family)
    rotary = upstream_class(family, "RotaryEmbedding")(config(d))
    assert entry_kwargs(family, f"{family}_rotary_tables") == {
        "scaling": rotary.attention_scaling,
        "dtype": d["torch_dtype"],
    }
    tables = definition(family, f"{family}_rotary_tables")
    assert tables.axes["RH"].value == rotary.inv_freq.shape[0] == d["qk_rope_head_dim"] // 2
    assert entry_kwargs(family, f"{family}_mla_latent_to_heads") == {"v_dim": d["v_head_dim"]}
    for name in (f"{family}_rms_norm", f"{family}_kv_a_layernorm", *norms):
        assert entry_kwargs(family, name) == {"eps": d["rms_norm_eps"]}


# ------------------------------------------------------------------ MLA


def check_decode_reference(family: str, heads: int):
    """The absorbed decode's reference is ``mla``'s latent attention at the Solution's scale."""
    gen = generator(0)
    b, h, t = 2, heads, 37
    ql, qp = torch.randn(b, h, 512, generator=gen) * 0.05, torch.randn(b, h, 64, generator=gen)
    ckv, kpe = torch.randn(b, 1, t, 512, generator=gen), torch.randn(b, 1, t, 64, generator=gen)
    scale = entry_kwargs(family, f"{family}_mla_decode")["scale"]
    got = reference(family, f"{family}_mla_decode")(ql, qp, ckv, kpe)
    want = mla.reference_mla_decode(ql, qp, ckv, kpe, torch.ones(b, t, dtype=torch.bool), scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def check_prefill_reference(family: str, heads: int, seed: int):
    """The prefill's reference is ``mla``'s causal prefill at the Solution's scale."""
    gen = generator(seed)
    b, h, s, t = 2, heads, 9, 13
    qn, qp = torch.randn(b, h, s, 128, generator=gen), torch.randn(b, h, s, 64, generator=gen)
    kn, kp = torch.randn(b, h, t, 128, generator=gen), torch.randn(b, 1, t, 64, generator=gen)
    v = torch.randn(b, h, t, 128, generator=gen)
    scale = entry_kwargs(family, f"{family}_mla_prefill")["scale"]
    got = reference(family, f"{family}_mla_prefill")(qn, qp, kn, kp, v)
    want = mla.reference_mla_prefill(qn, qp, kn, kp, v, reference_mask(b, s, t), scale)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def check_prefill_shapes(family: str):
    """Parity draws prefill shapes with the new tokens the last ``S`` of ``T`` keys (``S <= T``;
    drawn without that constraint, parity asked the kernel for a negative query offset)."""
    from tilegym.kernel_inventory.parity import sample_shapes

    shapes = sample_shapes(definition(family, f"{family}_mla_prefill"), 32, random.Random(0))
    assert len(shapes) == 32
    assert all(b["S"] <= b["T"] for b in shapes)


# ------------------------------------------------------------------ RoPE, norms and GEMMs


def check_rope(family: str, q, k, cos, sin, want=None, **tol):
    """The RoPE Definition's reference and the op at ``(q, k, cos, sin)`` are ``want`` (q's, k's;
    to ``tol``); without ``want``, the reference is the op's to 1e-12 (tables whose halves
    differ, as parity draws them)."""
    from tilegym.ops.library import apply_rope

    got = reference(family, f"{family}_rope")(q, k, cos, sin)
    ops = apply_rope(q, k, cos, sin)
    if want is None:
        for g, o in zip(got, ops, strict=True):
            torch.testing.assert_close(g, o, rtol=1e-12, atol=1e-12)
        return
    for g, o, w in zip(got, ops, want, strict=True):
        torch.testing.assert_close(g, w, **tol)
        torch.testing.assert_close(o, w, **tol)


def check_norm_references(family: str, names: tuple[str, ...], gen: torch.Generator):
    """Each norm Definition of ``names``, at its width and its Solution's eps, is the family's
    RMSNorm module and the op."""
    from tilegym.ops.library import rms_norm

    for name in names:
        width = definition(family, name).axes["H"].value
        eps = entry_kwargs(family, name)["eps"]
        norm = upstream_class(family, "RMSNorm")(width, eps=eps)
        with torch.no_grad():
            norm.weight.normal_(1.0, 0.2, generator=gen)
            x = torch.randn(5, width, generator=gen)
            got = reference(family, name)(x, norm.weight)
            torch.testing.assert_close(got, norm(x))
            torch.testing.assert_close(got, rms_norm(x, norm.weight, eps))


def check_gemms(
    family: str,
    linear_names: tuple[str, ...],
    gen: torch.Generator,
    shared_experts_at_their_width: bool = False,
):
    """The plain GEMMs ``linear_names`` are F.linear and the op; the MLP Definitions (dense and
    shared experts) compose to the family's MLP module plus the residual, each equal to its op
    on the packed [gate; up] weight. The shared experts' module is at the tiny preset's shared
    width where asked, else at the dense width."""
    from tilegym.ops import library

    x, w = torch.randn(5, 48, generator=gen), torch.randn(40, 48, generator=gen)
    for name in linear_names:
        torch.testing.assert_close(reference(family, name)(x, w), torch.nn.functional.linear(x, w))
        torch.testing.assert_close(reference(family, name)(x, w), library.linear(x, w))
    d = preset(f"tiny-{family}")
    cfg = config(dict(d, hidden_size=32, intermediate_size=24))
    shared = d["moe_intermediate_size"] * d["n_shared_experts"]
    widths = {
        f"{family}_linear_gate_up_silu": (f"{family}_linear_down_residual", None),
        f"{family}_shared_experts_gate_up_silu": (
            f"{family}_shared_experts_down_residual",
            shared if shared_experts_at_their_width else None,
        ),
    }
    for gate_up, (down, width) in widths.items():
        mlp = upstream_class(family, "MLP")(cfg, intermediate_size=width)
        with torch.no_grad():
            for p in mlp.parameters():
                p.normal_(0, 0.3, generator=gen)
            x, res = torch.randn(7, 32, generator=gen), torch.randn(7, 32, generator=gen)
            packed = torch.cat((mlp.gate_proj.weight, mlp.up_proj.weight))
            act = reference(family, gate_up)(x, packed)
            torch.testing.assert_close(act, library.fused_gate_up_silu(x, packed))
            got = reference(family, down)(act, mlp.down_proj.weight, res)
            torch.testing.assert_close(got, res + mlp(x))
            torch.testing.assert_close(got, library.linear_residual(act, mlp.down_proj.weight, res))


# ------------------------------------------------------------------ the experts


def check_expert_stages(family: str, weight_scale: float = 1.0):
    """The gate/up Definition's activations through the down/combine Definition (fp32 routing
    weights, drawn in [0, ``weight_scale``), the residual) are the residual plus the family's
    Experts module's output, the moe_experts op's reference and the op (fp32). Returns
    ``(act, ids, w, down, res)`` for a family's further checks."""
    from tilegym.ops import library

    gen = generator(7)
    cfg = config(dict(preset(f"tiny-{family}"), hidden_size=32, n_routed_experts=6))
    experts = upstream_class(family, "Experts")(cfg)
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, 0.2, generator=gen)
        experts.down_proj.normal_(0, 0.2, generator=gen)
    t, k = 7, 3
    x, res = torch.randn(t, 32, generator=gen), torch.randn(t, 32, generator=gen)
    ids = torch.stack([torch.randperm(6, generator=gen)[:k] for _ in range(t)]).to(torch.int32)
    w = torch.rand(t, k, generator=gen) * weight_scale
    gu, down = experts.gate_up_proj.detach(), experts.down_proj.detach()
    act = reference(family, f"{family}_experts_gate_up_silu")(x, ids, gu)
    got = reference(family, f"{family}_experts_down_combine")(act, ids, w, down, res)
    with torch.no_grad():
        torch.testing.assert_close(got, res + experts(x, ids.long(), w), rtol=1e-5, atol=1e-5)
    want = moe.moe_experts_reference(x, ids, w, gu, down, res)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, library.moe_experts(x, ids, w, gu, down, res))
    return act, ids, w, down, res


# ------------------------------------------------------------------ parity on the CPU


def split_kv_b(kv_b_weight, heads, v_dim=128):
    """kv_b_proj's weight split into its key (nope) and value parts, per head."""
    return mla.split_kv_b_weight(kv_b_weight, heads, kv_b_weight.shape[0] // heads - v_dim, v_dim)


def cpu_path(family: str, name: str):
    """What the patched model runs on the CPU for a Definition both families have (the library's
    custom ops' CPU implementations), taking the Definition's tensors as the Solution's entry
    point does."""
    from tilegym.ops import library

    kw = entry_kwargs(family, name)
    op = name.removeprefix(f"{family}_")
    if op == "mla_absorb_query":
        return lambda q, w: library.mla_absorb_query(q, split_kv_b(w, q.shape[1])[0])
    if op == "mla_latent_to_heads":
        return lambda c, w: library.mla_latent_to_heads(
            c, split_kv_b(w, c.shape[1], kw["v_dim"])[1]
        )
    if op == "router_logits":
        return library.router_logits
    if op == "rotary_tables":
        return lambda pos, inv: library.rotary_tables(
            pos, inv, kw["scaling"], getattr(torch, kw["dtype"])
        )
    if op == "rope":
        return library.apply_rope
    if "eps" in kw:
        return lambda x, w: library.rms_norm(x, w, kw["eps"])
    if op == "latent_cache_update":

        def write(k, v, kc, vc):
            pos, length = torch.zeros(1, dtype=torch.int32), torch.zeros((), dtype=torch.int64)
            library.latent_cache_write_at(k, v, kc, vc, pos, length)

        return write
    raise KeyError(name)


def check_cpu_parity(family: str, name: str, path, n_shapes: int):
    """The parity harness on the CPU (fresh random inputs at the Definition's shapes, fp64
    reference) finds nothing with ``path`` (the model's CPU path) in the Solution's place."""
    from tilegym.kernel_inventory.parity import check_parity

    dps = solution_spec(family, name)["destination_passing_style"]
    issues = check_parity(
        definition(family, name),
        path,
        device="cpu",
        destination_passing_style=dps,
        n_shapes=n_shapes,
    )
    assert issues == []


# ------------------------------------------------------------------ completeness

#: ``model_weights``' label for a router weight whose Definition its op tells (DeepSeek-V2's)
GATE = "the router's weight"

#: the Definitions (less the family's prefix) of the ops told by their name alone
NAMED_OPS = {
    "apply_rope": ("rope",),
    "rotary_tables": ("rotary_tables",),
    "mla_prefill": ("mla_prefill",),
    "mla_decode": ("mla_decode",),
    "mla_absorb_query": ("mla_absorb_query",),
    "mla_latent_to_heads": ("mla_latent_to_heads",),
    "latent_cache_write_at": ("latent_cache_update",),
    "moe_experts": ("experts_gate_up_silu", "experts_down_combine"),
}


def model_weights(family: str, model, gate: str) -> dict[int, str]:
    """The Definition of each op that reads one of the model's own weights (both families' MLA,
    norms, MLPs and lm_head), by the weight; the sparse layers' router weight is ``gate``."""
    out = {model.lm_head.weight.data_ptr(): f"{family}_linear_lm_head"}
    out[model.model.norm.weight.data_ptr()] = f"{family}_rms_norm"
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            out[norm.weight.data_ptr()] = f"{family}_rms_norm"
        out[attn.kv_a_layernorm.weight.data_ptr()] = f"{family}_kv_a_layernorm"
        out[attn.kv_b_proj.weight.data_ptr()] = f"{family}_linear_kv_b"
        out[attn.o_proj.weight.data_ptr()] = f"{family}_linear_o_proj_residual"
        if hasattr(mlp, "experts"):
            out[mlp.gate.weight.data_ptr()] = gate
            down = mlp.shared_experts.down_proj.weight
            out[down.data_ptr()] = f"{family}_shared_experts_down_residual"
        else:
            out[mlp.down_proj.weight.data_ptr()] = f"{family}_linear_down_residual"
    return out


def definitions_of(
    family: str,
    name: str,
    args,
    model,
    weights: dict[int, str],
    built: dict[tuple, str],
    by_weight: tuple[str, ...] = (),
) -> list[str]:
    """The Definitions one op call computes: the GEMMs and norms (and the ops ``by_weight``) by
    the model weight they read (``weights``), else a linear by the shape of a weight the patch
    built (``built``: the first projection, ...); the gate/up GEMMs by their rows (the patch's
    packed [gate; up]); the rest by the op's name (``NAMED_OPS``)."""
    c = model.config
    if name in ("linear", "linear_residual", "rms_norm", *by_weight):
        which = weights.get(args[1].data_ptr())
        shape = tuple(args[1].shape)
        if which is None and name == "linear":
            which = built.get(shape)
        return [which if which not in (None, GATE) else f"unknown {name} {shape}"]
    if name == "fused_gate_up_silu":
        shared = c.moe_intermediate_size * c.n_shared_experts
        rows = {
            2 * c.intermediate_size: f"{family}_linear_gate_up_silu",
            2 * shared: f"{family}_shared_experts_gate_up_silu",
        }
        return [rows.get(args[1].shape[0], f"unknown gate/up {tuple(args[1].shape)}")]
    if name in NAMED_OPS:
        return [f"{family}_{op}" for op in NAMED_OPS[name]]
    return [f"unknown op {name}"]


def hits(model, caches, weights, definitions) -> set[str]:
    """The Definitions hit by ``model`` (a tiny preset's, on the CPU), patched here, generating
    from a left-padded batch with each of ``caches``: ``definitions(op, args, model,
    weights(model))`` of each op call."""
    from tilegym.transformers import monkey_patch as mp

    handle = mp.apply_tilegym_kernel(model)
    assert set(handle.applied) == {"rope", "rms_norm", "swiglu", "attn", "linear"}
    cfg = model.config
    shared = cfg.moe_intermediate_size * cfg.n_shared_experts
    assert cfg.intermediate_size != shared  # the two gate/up GEMMs tell apart by their rows
    by_weight = weights(model)
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    hit: set[str] = set()
    for cache in caches:
        recorder = OpCalls()
        with recorder:
            greedy(model, ids, mask, new_tokens=4, **cache)
        for name, args in recorder.calls:
            hit.update(definitions(name, args, model, by_weight))
    return hit
