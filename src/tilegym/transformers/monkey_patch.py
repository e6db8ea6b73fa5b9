"""Apply (and undo) cuTile kernels on transformers models, per instance or per class.

``apply_tilegym_kernel_to_<model_key>(rope=..., rms_norm=..., swiglu=..., attn=..., linear=...,
model=None, rope_heads=0, norm_gemv=0, rope_gemv=0)`` returns a ``PatchHandle``: ``.applied``
lists the flags now routed through cuTile, ``.not_applied`` maps every other flag to the
reason, and ``.undo()`` restores the exact original forwards (and frees repacked weights). With
``model`` only that instance's modules change, so a baseline and a kernelized model can run side
by side; without it the transformers classes are patched (before instantiation) and ``undo()``
puts the original function objects back. ``rope_heads``, ``norm_gemv`` and ``rope_gemv`` tune
how routed parts run (``TUNING``).
"""

from __future__ import annotations

import ast
import importlib
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tilegym.transformers import longrope, rope_tables
from tilegym.transformers.family import GATED_ACTS, config_activation
from tilegym.transformers.fused_weights import FusedWeights

SUPPORTED_TRANSFORMERS = (5, 17)
"""Oldest supported transformers release; every 5.x after it is accepted, 6.x is not."""

FLAGS = ("rope", "rms_norm", "swiglu", "attn", "linear")
#: Tuning parameters beside the flags: how a routed part runs, not whether. ``rope_heads``: up to
#: 32 tokens (decode), the RoPE and q/k-norm + RoPE kernels run on the head-loop kernel with
#: that many heads a block instead of the per-token kernel (0; ``tilegym.ops.rope._pick``).
#: ``norm_gemv`` 1: with ``rms_norm`` and ``linear`` routed, a pre-norm layer's input norm runs
#: in its QKV GEMM (``tilegym.ops.gemm.rms_norm_linear``; one launch at decode) instead of
#: before it; 2: also its post-attention norm in the MLP's gate/up GEMM with the activation
#: (``rms_norm_gate_up``; with ``swiglu``, where o_proj takes the residual); in a post-norm
#: layer (OLMo 2/3, no input norm) 2 puts the attention's norm and residual add into the gate/up
#: GEMM (``add_rms_norm_gate_up``). Layers with their own forwards (sandwich-norm, a family's
#: own attention, MLP or layer builder, MoE blocks, linear-attention mixers) keep the norm
#: launches. ``rope_gemv`` 1: with ``rope`` and
#: ``rms_norm`` routed, a decode row's RoPE runs in the epilogue of its QKV GEMV
#: (``rms_norm_linear_rope``: the projection, its q/k norms, per head or over the whole
#: projection (OLMo), and RoPE in one launch; with ``norm_gemv`` the input norm too) where
#: nothing else sits between them (no output gate, clamp or partial rotary), in every layer
#: that runs the shared attention forward (post-norm ones included); other calls keep the RoPE
#: kernels. 2: that launch also writes the new keys and values into a static cache's layer
#: (``StaticLayer`` at the mask's device position), where the KV-cache write kernel did; other
#: caches (a sliding window's ring buffer) keep their writes.
TUNING = {"rope_heads": 0, "norm_gemv": 0, "rope_gemv": 0}
MAX_ROPE_HEADS = 64
GEMM_API = (
    "linear",
    "fused_gate_up_silu",
    "fused_gate_up_gelu_tanh",
    "linear_residual",
    "rms_norm_linear",
    "rms_norm_gate_up",
    "rms_norm_linear_rope",
    "add_rms_norm_gate_up",
)
_MARK = "_tilegym_patched"


class UnsupportedTransformersVersion(RuntimeError):
    """The installed transformers release is outside the range the patches were written for."""


class UnsupportedModelType(ValueError):
    """``apply_tilegym_kernel`` got a model whose ``config.model_type`` has no patch."""


class AlreadyPatched(RuntimeError):
    """The target already carries a tilegym patch; undo that one first."""


SHARED_GLUE = "tilegym.transformers.decoder"
"""The Llama-style decoder forwards every family below shares (no family's: out of every
experiment's scope)."""

MOE_GLUE = "tilegym.transformers.moe_block"
LINEAR_ATTENTION_GLUE = "tilegym.transformers.linear_attention"
_BUILDERS = {  # upstream class suffix -> (module, the shared builder of its forward)
    "RMSNorm": (SHARED_GLUE, "make_rms_norm_forward"),
    "MLP": (SHARED_GLUE, "make_mlp_forward"),
    "Attention": (SHARED_GLUE, "make_attention_forward"),
    "DecoderLayer": (SHARED_GLUE, "make_decoder_layer_forward"),
    "MoeBlock": (MOE_GLUE, "make_moe_block_forward"),  # Family.moe_block's class
    # Family.linear_attention's class, on the cuTile ops with the ``attn`` flag
    "LinearAttention": (LINEAR_ATTENTION_GLUE, "make_linear_attention_forward"),
}
FAMILY_ONLY_PARTS = ("RotaryEmbedding",)
"""Parts a family may name in ``Family.forwards`` with no shared builder: the model's rotary
module, built as ``builder(routes, family)`` and patched only with ``rope`` (DeepSeek-V2's
complex table); every other family's rotary modules get the cuTile tables with ``rope`` where
their forward is Llama's form (``rope_tables``, checked per instance)."""


@dataclass(frozen=True)
class ModelFamily:
    """A patchable model type and the module that describes it (its ``FAMILY``). The family's
    key (its folder, ``apply_tilegym_kernel_to_<key>``) is the model type unless the module
    says otherwise (``MODEL_TYPE``: gemma3 patches ``gemma3_text``)."""

    model_type: str
    glue_module: str

    def glue(self):
        return importlib.import_module(SHARED_GLUE)

    def description(self):
        """The family's ``Family`` (upstream classes, q/k norms, projection names)."""
        return importlib.import_module(self.glue_module).FAMILY


def _discover_families() -> dict[str, ModelFamily]:
    """Every ``tilegym/transformers/<key>/modeling_<key>.py`` is a family (``model init``
    adds one by writing that folder; nothing else lists them), keyed by its folder."""
    root = Path(__file__).parent
    return {
        d.name: ModelFamily(
            folder_model_type(d), f"tilegym.transformers.{d.name}.modeling_{d.name}"
        )
        for d in sorted(root.iterdir())
        if (d / f"modeling_{d.name}.py").is_file()
    }


def folder_model_type(folder: Path) -> str:
    """The ``config.model_type`` a family folder patches: its module's top-level ``MODEL_TYPE =
    "..."``, read as text like ``_what``, else the folder's name."""
    tree = ast.parse((folder / f"modeling_{folder.name}.py").read_text())
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["MODEL_TYPE"]
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    return folder.name


FAMILIES = _discover_families()


@dataclass
class PatchHandle:
    """What one apply call did, and how to take it back."""

    model_type: str
    applied: list[str] = field(default_factory=list)
    not_applied: dict[str, str] = field(default_factory=dict)
    repacked: object = field(default=None, repr=False)
    """The ``FusedWeights`` holding concatenated QKV / gate+up weights (``linear`` only)."""
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def undo(self) -> None:
        """Restore every patched forward, the attention setting and free repacked weights."""
        while self._undo:
            self._undo.pop()()


def transformers_version_error(version: str) -> str | None:
    """Why ``version`` is unsupported, or None (pure; tested with plain strings)."""
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(version)
    except InvalidVersion:
        return f"cannot parse transformers version {version!r}"
    lo = ".".join(map(str, SUPPORTED_TRANSFORMERS))
    if v.release[:2] < SUPPORTED_TRANSFORMERS or v.major >= 6:
        return (
            f"transformers {version} is not supported by tilegym patches "
            f"(supported: >= {lo}, < 6); install a supported release"
        )
    return None


def check_transformers_version() -> None:
    """Raise ``UnsupportedTransformersVersion`` unless the installed release is supported."""
    import transformers

    reason = transformers_version_error(transformers.__version__)
    if reason:
        raise UnsupportedTransformersVersion(reason)


def optional_module(name: str, attrs: tuple[str, ...]) -> tuple[object | None, str | None]:
    """(module, None) when ``name`` imports and has ``attrs``; else (None, reason)."""
    try:
        mod = importlib.import_module(name)
    except Exception as exc:  # any failure (missing file, toolchain) is a reason, not a crash
        return None, f"{name} is not importable: {type(exc).__name__}: {exc}"
    missing = [a for a in attrs if not hasattr(mod, a)]
    if missing:
        return None, f"{name} lacks {', '.join(missing)}"
    return mod, None


class _Patcher:
    """Sets forwards on instances or classes and remembers exactly how to restore them."""

    def __init__(self, handle: PatchHandle) -> None:
        self.handle = handle

    def instance(self, module: torch.nn.Module, fn: Callable) -> None:
        if getattr(getattr(module, "forward", None), _MARK, False):
            raise AlreadyPatched(f"{type(module).__name__} instance is already tilegym-patched")
        had = "forward" in module.__dict__
        old = module.__dict__.get("forward")
        bound = types.MethodType(fn, module)
        setattr(fn, _MARK, True)
        module.forward = bound

        def undo() -> None:
            if had:
                module.forward = old
            else:
                module.__dict__.pop("forward", None)

        self.handle._undo.append(undo)

    def cls(self, klass: type, fn: Callable) -> None:
        old = klass.__dict__["forward"]
        if getattr(old, _MARK, False):
            raise AlreadyPatched(f"{klass.__name__}.forward is already tilegym-patched")
        setattr(fn, _MARK, True)
        fn.__qualname__ = f"{klass.__name__}.forward"
        klass.forward = fn
        self.handle._undo.append(lambda: setattr(klass, "forward", old))


def _apply(family: ModelFamily, flags: dict[str, bool], model, tuning: dict) -> PatchHandle:
    desc = family.description()
    return _apply_description(family.model_type, desc, flags, model, tuning)


def apply_family(model, description, **flags) -> PatchHandle:
    """Patch one instance by a ``Family`` description that need not be registered (how
    ``model init`` checks a family it is about to scaffold); flags as for the entry points."""
    _check_flags(flags)
    chosen = {flag: bool(flags.get(flag, True)) for flag in FLAGS}
    model_type = getattr(model.config, "model_type", "unknown")
    tuning = {name: flags.get(name, default) for name, default in TUNING.items()}
    return _apply_description(model_type, description, chosen, model, tuning)


def _apply_description(
    model_type: str, desc, flags: dict[str, bool], model, tuning: dict | None = None
) -> PatchHandle:
    tuning = {**TUNING, **(tuning or {})}
    check_transformers_version()
    glue = importlib.import_module(SHARED_GLUE)
    upstream = importlib.import_module(desc.upstream_module)
    prefix = desc.class_prefix
    classes = {
        part: getattr(upstream, f"{prefix}{part}")
        for part in ("RMSNorm", "MLP", "Attention", "DecoderLayer")
        if part != "MLP"
        or not desc.moe_block
        or (desc.moe_block != "MLP" and hasattr(upstream, f"{prefix}MLP"))
    }  # a family whose every MLP is sparse may have no dense MLP class (Mixtral), or call its
    # sparse block MLP (gpt-oss), patched as the sparse block only
    if desc.moe_block:  # the sparse MLP block, called by the layer forward with the residual
        classes["MoeBlock"] = getattr(upstream, f"{prefix}{desc.moe_block}")
    if desc.linear_attention:  # the token mixer of the linear-attention layers
        classes["LinearAttention"] = getattr(upstream, f"{prefix}{desc.linear_attention}")
    unknown = sorted(set(desc.forwards) - set(_BUILDERS) - set(FAMILY_ONLY_PARTS))
    if unknown:
        raise ValueError(
            f"Family.forwards of {model_type!r} names {unknown}; "
            f"known parts: {', '.join((*_BUILDERS, *FAMILY_ONLY_PARTS))}"
        )
    handle = PatchHandle(model_type)
    for flag, wanted in flags.items():
        if not wanted:
            handle.not_applied[flag] = "disabled by the caller"

    library, _ = optional_module("tilegym.ops.library", ("register_inductor_fallbacks",))
    if library is not None:  # before the compiled decode step first meets the ops
        library.register_inductor_fallbacks()
    gemm = None
    if flags["linear"]:
        gemm, reason = optional_module("tilegym.ops.library", GEMM_API)
        if reason:
            handle.not_applied["linear"] = reason
    swiglu, act = flags["swiglu"], desc.gated_act
    if swiglu and model is not None:  # the instance's config names its activation
        name = config_activation(model.config)
        act = GATED_ACTS.get(name)
        if act is None:
            known = ", ".join(GATED_ACTS)
            handle.not_applied["swiglu"] = f"hidden_act {name!r} has no gated kernel ({known})"
            swiglu, act = False, desc.gated_act
    routes = glue.Routes(
        rms_norm=flags["rms_norm"],
        rope=flags["rope"],
        swiglu=swiglu,
        linear=gemm is not None,
        act=act,
        rope_heads=tuning["rope_heads"],
        norm_gemv=tuning["norm_gemv"] if _norm_gemv_fits(desc, flags, gemm) else 0,
        rope_gemv=tuning["rope_gemv"] if _rope_gemv_fits(desc, flags, gemm) else 0,
    )
    fused = FusedWeights()
    handle.repacked = fused
    handle._undo.append(fused.clear)
    patcher = _Patcher(handle)
    forwards = {}

    def builder(part: str) -> Callable:
        """The family's own builder for ``part`` (``Family.forwards``), else the shared one."""
        module, name = _BUILDERS[part]
        return desc.forwards.get(part) or getattr(importlib.import_module(module), name)

    if routes.rms_norm:
        forwards["RMSNorm"] = builder("RMSNorm")(desc)
    if routes.rms_norm or routes.rope or routes.swiglu or routes.linear:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        takes_kwargs = glue.cache_update_takes_kwargs(classes["Attention"])
        eager = upstream.eager_attention_forward
        forwards["MLP"] = builder("MLP")(routes, fused, gemm, desc)
        forwards["Attention"] = builder("Attention")(
            routes, fused, gemm, eager, ALL_ATTENTION_FUNCTIONS, takes_kwargs, desc
        )
        forwards["DecoderLayer"] = builder("DecoderLayer")(routes, desc)
        if desc.moe_block:
            forwards["MoeBlock"] = builder("MoeBlock")(routes, gemm, desc, fused)
        forwards = {part: fn for part, fn in forwards.items() if part in classes}
    if routes.rope and "RotaryEmbedding" in desc.forwards:  # the family's own RoPE tables
        classes["RotaryEmbedding"] = getattr(upstream, f"{prefix}RotaryEmbedding")
        forwards["RotaryEmbedding"] = desc.forwards["RotaryEmbedding"](routes, desc)
    if desc.linear_attention and (flags["attn"] or "DecoderLayer" in forwards):
        # with attn off the mixer stays upstream's, wrapped to take the patched layer's residual
        forwards["LinearAttention"] = builder("LinearAttention")(
            routes, fused, gemm, desc, kernels=flags["attn"]
        )

    try:
        if model is None:
            for part, fn in forwards.items():
                patcher.cls(classes[part], fn)
        else:
            _patch_instance(model, classes, forwards, patcher, routes, fused, gemm, desc)
        _apply_attention(flags["attn"], model, handle, desc.upstream_module)
    except Exception:
        handle.undo()
        raise
    for flag, on in (
        ("rope", routes.rope),
        ("rms_norm", routes.rms_norm),
        ("swiglu", routes.swiglu),
        ("linear", routes.linear),
    ):
        if on:
            handle.applied.append(flag)
    if flags["attn"] and "attn" not in handle.not_applied:
        handle.applied.append("attn")
    handle.applied.sort(key=FLAGS.index)
    return handle


#: the projection whose GEMM adds the residual, per part: where a residual multiplier is folded
_SCALED = {"Attention": "o_proj", "MLP": "down_proj"}


def _scaled_here(module, part: str) -> bool:
    """True when ``module``'s residual GEMM (unbiased o_proj/down_proj) reads a scaled weight,
    which is built at patch time, before anything is compiled."""
    proj = getattr(module, _SCALED.get(part, ""), None)
    return isinstance(proj, torch.nn.Linear) and proj.bias is None


def _patch_instance(model, classes, forwards, patcher, routes, fused, gemm, desc) -> None:
    unbiased = importlib.import_module(SHARED_GLUE).unbiased
    for module in model.modules():
        for part, fn in forwards.items():
            if type(module) is classes[part] or isinstance(module, classes[part]):
                patcher.instance(module, fn)
                if routes.linear and part == "Attention":
                    fused.build(module, desc.qkv)
                if routes.linear and part == "MLP" and unbiased(module, desc.gate_up):
                    fused.build(module, desc.gate_up)
                if part == "MoeBlock":  # relaid expert weights, before anything compiles
                    importlib.import_module(MOE_GLUE).prepare(module, routes, fused, desc)
                if part == "LinearAttention" and routes.linear:  # fused input projections
                    importlib.import_module(LINEAR_ATTENTION_GLUE).prepare(module, fused)
                if routes.linear and desc.residual_multiplier and _scaled_here(module, part):
                    fused.scaled(module, _SCALED[part], module.config.residual_multiplier)
                break
    _check_mlps(model, classes, forwards, desc)
    if routes.rope:  # the decode step's RoPE tables, computed without a host read
        for module in model.modules():
            forward = longrope.branch_free_forward(module)
            if forward is not None:
                patcher.instance(module, forward)
    if routes.rope and "RotaryEmbedding" not in desc.forwards:  # the tables on cuTile
        for module in rope_tables.rotary_modules(model, desc.class_prefix):
            if getattr(getattr(module, "forward", None), _MARK, False):
                continue  # longrope's branch-free forward above
            forward = rope_tables.make_forward(module)
            if forward is not None:
                patcher.instance(module, forward)
    head = getattr(model, "lm_head", None)
    if routes.linear and isinstance(head, torch.nn.Linear):

        def lm_head_forward(self, x):
            return gemm.linear(x, self.weight, self.bias)

        patcher.instance(head, lm_head_forward)


def _check_mlps(model, classes, forwards, desc) -> None:
    """Refuse a model whose pre-norm layers were patched but one of whose MLPs was not: the
    patched layer forward hands its MLP the residual, which an upstream forward does not take
    (gpt-oss loaded with transformers' MXFP4 kernels swaps GptOssMLP for Mxfp4GptOssMLP)."""
    if "DecoderLayer" not in forwards or desc.post_norm or desc.sandwich_norm:
        return
    for module in model.modules():
        if isinstance(module, classes["DecoderLayer"]):
            mlp = getattr(module, "mlp", None)
            if mlp is not None and not getattr(getattr(mlp, "forward", None), _MARK, False):
                raise TypeError(
                    f"{type(mlp).__name__} in {type(module).__name__} has no tilegym forward "
                    "(not the family's MLP or sparse block class); the patched layer cannot "
                    "call it"
                )


def _apply_attention(wanted: bool, model, handle: PatchHandle, upstream_module: str) -> None:
    if not wanted:
        return
    attention, reason = optional_module(
        "tilegym.transformers.attention", ("enable", "unsupported_reason")
    )
    if reason:
        handle.not_applied["attn"] = reason
        return
    if model is None:
        handle.not_applied["attn"] = (
            "attention is switched per model instance (AttentionInterface 'tilegym'); "
            "pass model= or call tilegym.transformers.attention.enable(model)"
        )
        return
    unsupported = attention.unsupported_reason(model.config)
    if unsupported:
        handle.not_applied["attn"] = unsupported
        return
    handle._undo.append(attention.enable(model))
    handle._undo.append(attention.pass_tile_masks(importlib.import_module(upstream_module)))


def use_tile_kv_cache(handle: PatchHandle, model) -> None:
    """With cuTile attention on ``model``: its ``generate()`` keeps the KV cache in a
    ``TileKVCache`` (preallocated, written by a cuTile kernel) instead of transformers'
    ``DynamicCache`` (a ``torch.cat`` per layer and step). Undone with the handle; a no-op for
    class-level patches and when attention was not applied."""
    if model is None or "attn" not in handle.applied:
        return
    from tilegym.transformers.attention import use_tile_cache

    handle._undo.append(use_tile_cache(model))


def _flags(rope, rms_norm, swiglu, attn, linear) -> dict[str, bool]:
    return {
        "rope": bool(rope),
        "rms_norm": bool(rms_norm),
        "swiglu": bool(swiglu),
        "attn": bool(attn),
        "linear": bool(linear),
    }


def _entry_point(key: str, what: str) -> Callable[..., PatchHandle]:
    """``apply_tilegym_kernel_to_<key>``: one per family, all alike."""

    def apply(
        rope=True,
        rms_norm=True,
        swiglu=True,
        attn=True,
        linear=True,
        model=None,
        rope_heads=0,
        norm_gemv=0,
        rope_gemv=0,
    ) -> PatchHandle:
        flags = _flags(rope, rms_norm, swiglu, attn, linear)
        tuning = {"rope_heads": rope_heads, "norm_gemv": norm_gemv, "rope_gemv": rope_gemv}
        check_tuning(tuning)
        handle = _apply(FAMILIES[key], flags, model, tuning)
        use_tile_kv_cache(handle, model)
        return handle

    apply.__name__ = apply.__qualname__ = f"apply_tilegym_kernel_to_{key}"
    apply.__doc__ = (
        f"Route {what} through cuTile kernels; see the module doc. With cuTile attention on an "
        "instance, generate() keeps its KV cache in a TileKVCache."
    )
    return apply


def _what(model_type: str) -> str:
    """The family's name from its module docstring, read as text: importing this module
    imports no family (nor transformers or cuda.tile) until a patch is applied."""
    path = Path(__file__).parent / model_type / f"modeling_{model_type}.py"
    doc = ast.get_docstring(ast.parse(path.read_text())) or model_type
    return doc.strip().splitlines()[0].removeprefix("cuTile forwards for ").rstrip(".")


APPLY_BY_KEY = {key: _entry_point(key, _what(key)) for key in FAMILIES}
APPLY_BY_MODEL_TYPE = {FAMILIES[key].model_type: apply for key, apply in APPLY_BY_KEY.items()}
apply_tilegym_kernel_to_qwen3 = APPLY_BY_KEY["qwen3"]
apply_tilegym_kernel_to_llama = APPLY_BY_KEY["llama"]


def __getattr__(name: str):
    """``apply_tilegym_kernel_to_<key>`` of every family, the scaffolded ones too."""
    prefix = "apply_tilegym_kernel_to_"
    if name.startswith(prefix) and name[len(prefix) :] in APPLY_BY_KEY:
        return APPLY_BY_KEY[name[len(prefix) :]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def supported_model_types() -> list[str]:
    """Model types (``config.model_type``) that have a patch."""
    return sorted(APPLY_BY_MODEL_TYPE)


def apply_tilegym_kernel(model, **flags) -> PatchHandle:
    """Patch ``model`` according to its ``config.model_type`` (not its name or id)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    apply = APPLY_BY_MODEL_TYPE.get(model_type)
    if apply is None:
        raise UnsupportedModelType(
            f"no tilegym patch for model_type {model_type!r}; "
            f"supported: {', '.join(supported_model_types())}"
        )
    _check_flags(flags)
    return apply(model=model, **flags)


def _check_flags(flags: dict) -> None:
    unknown = sorted(set(flags) - set(FLAGS) - set(TUNING))
    if unknown:
        known = ", ".join((*FLAGS, *TUNING))
        raise TypeError(f"unknown patch flags {unknown}; known: {known}")
    check_tuning({k: v for k, v in flags.items() if k in TUNING})


def check_tuning(tuning: dict) -> None:
    """``ValueError`` (one line) for a tuning parameter out of its range."""
    heads = tuning.get("rope_heads", 0)
    if type(heads) is not int or not 0 <= heads <= MAX_ROPE_HEADS:
        raise ValueError(f"rope_heads must be an int in 0..{MAX_ROPE_HEADS}, got {heads!r}")
    norm_gemv = tuning.get("norm_gemv", 0)
    if type(norm_gemv) is not int or norm_gemv not in (0, 1, 2):
        raise ValueError(f"norm_gemv must be 0, 1 or 2, got {norm_gemv!r}")
    rope_gemv = tuning.get("rope_gemv", 0)
    if type(rope_gemv) is not int or rope_gemv not in (0, 1, 2):
        raise ValueError(f"rope_gemv must be 0, 1 or 2, got {rope_gemv!r}")


def parse_setting(item: str) -> tuple[str, bool | int]:
    """``FLAG=True|False`` or ``TUNING=N``, as the loop's scripts and benches take them on a
    command line: ``(name, value)``, or a one-line ``ValueError`` saying what was expected."""
    flag, _, value = item.partition("=")
    if flag in TUNING and value.isdigit():
        return flag, int(value)
    if flag not in TUNING and value in ("True", "False"):
        return flag, value == "True"
    want = f"{flag}=N (an integer)" if flag in TUNING else f"{flag}=True or {flag}=False"
    raise ValueError(f"{item}: expected {want}")


def _rope_gemv_fits(desc, flags: dict[str, bool], gemm) -> bool:
    """Whether the shared attention forward runs with norms and GEMMs routed (``rope_gemv``'s
    path; any layer form: a post-norm layer's QKV GEMV has no input norm to take)."""
    return "Attention" not in desc.forwards and flags["rms_norm"] and gemm is not None


def _norm_gemv_fits(desc, flags: dict[str, bool], gemm) -> bool:
    """Whether the shared pre-norm or post-norm layer and attention forwards run
    (``norm_gemv``'s path): norms and GEMMs routed, no family builder of its own for either,
    no sandwich norm."""
    own = {"Attention", "DecoderLayer"} & set(desc.forwards)
    plain = not (own or desc.sandwich_norm)
    return plain and flags["rms_norm"] and gemm is not None
