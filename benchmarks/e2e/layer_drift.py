"""Which decoder layer, and which sub-block of it, of the cuTile-patched bf16 model drifts from
fp32 more than the unpatched bf16 model does.

The benchmark's correctness check sees only the logits. This builds the preset's random-weight
model three times over one set of weights, as the benchmark does (``model_factory``: the bf16
model, its fp32 reference, and a twin sharing the bf16 weights with the cuTile patch applied to
that instance only; a per-instance patch lets the three live in one process, as ``_sides.py``
runs them), runs one prompt through each in one full forward (no generation) and records, with
forward hooks, every decoder layer's and sub-block's inputs and outputs and every MoE router's
choice. Then, per layer and per sub-block (attention, MLP/MoE block), each bf16 side is
teacher-forced: that module of the side runs on bf16(fp32's input to it), with the side's own
masks and position embeddings from its own forward, and its output is scored against fp32's
(relative L2 error over the real tokens). A sub-block gets no residual (the patched glue folds
the residual into its last GEMM when its layer passes one), so both sides return the block's
own output. Rows ``free`` score each layer's output and the final logits of the free-running
forward, where drift accumulates.

MoE rows also count the tokens whose top-k expert set differs from fp32's (``flips``), the error
over the tokens whose set agrees, and the largest |router score - fp32's| (``noise``; the
benchmark's near-tie margin is twice the PyTorch side's). The PyTorch side's choice is read from
its router's output; the patched block never calls its router module, so the cuTile side's is
recomputed from the block's input with the library ops the shared MoE forward calls
(``tilegym.ops.library.linear`` and ``moe_route``).

Reading it: a sub-block whose ``forced`` ratio (over agreeing tokens on MoE rows) stays well
above 1 rounds worse than PyTorch (a kernel to look at); ratios near 1 with more cuTile
``flips`` or a larger cuTile ``noise`` mean the drift is routing flips, which any change of
rounding moves. The MoE kernels pick their tiles by tokens per expert
(``tilegym.ops.moe.choose_config``): ``--length`` chooses which path runs (Mixtral: up to 32
tokens the decode-step path, 2048 the benchmark's prefill).

On a CPU the patched model runs the custom ops' PyTorch references: the same glue, not the
cuTile kernels (the MoE experts' reference computes in fp32, so there the cuTile side's MoE rows
come out closer to fp32 than PyTorch's). ``--plant BLOCK@LAYER=SCALE`` multiplies that module's
output on the cuTile side (the patched MLP returns ``residual + MoE`` inside its layer, so there
the sum), a planted fault for checking that the table finds one; ``--patch
cutile:FLAG=VALUE,...`` changes the patch flags; ``--layers N`` builds the first N layers only.

    python benchmarks/e2e/layer_drift.py --model-key mixtral --device cuda --json drift.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _drift import Row, non_finite, row_json, side_stat, table_lines  # noqa: E402
from decode_timeline import parse_variant  # noqa: E402

#: a decoder layer's sub-blocks, by the attribute names the families use
BLOCKS = ("self_attn", "linear_attn", "mlp", "block_sparse_moe")
#: routers whose patched block routes through ``moe_route`` (``tilegym.transformers.moe_block``)
ROUTE_OP_ROUTERS = (
    "MixtralTopKRouter",
    "OlmoeTopKRouter",
    "Qwen3MoeTopKRouter",
    "Qwen3NextTopKRouter",
    "GptOssTopKRouter",
)


class BadInput(Exception):
    """One line for the user: what was wrong with the arguments."""


@dataclass
class Plant:
    block: str
    layer: int
    scale: float


def parse_plant(text: str) -> Plant:
    """``BLOCK@LAYER=SCALE`` (BLOCK: ``layer`` or a sub-block's attribute name)."""
    head, eq, scale = text.partition("=")
    block, at, layer = head.partition("@")
    try:
        if not (eq and at and block):
            raise ValueError
        return Plant(block, int(layer), float(scale))
    except ValueError:
        raise BadInput(f"--plant {text!r}: expected BLOCK@LAYER=SCALE, e.g. mlp@1=1.01") from None


@dataclass
class Call:
    args: tuple
    kwargs: dict
    output: object = None


@dataclass
class Tap:
    """While entered: each named module's last call (inputs and output)."""

    modules: dict
    calls: dict = field(default_factory=dict)

    def __enter__(self):
        self.calls.clear()
        self._handles = []
        for name, module in self.modules.items():

            def pre(mod, args, kwargs, name=name):
                self.calls[name] = Call(args, kwargs)

            def post(mod, args, kwargs, output, name=name):
                self.calls[name].output = output

            self._handles += [
                module.register_forward_pre_hook(pre, with_kwargs=True),
                module.register_forward_hook(post, with_kwargs=True),
            ]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()


def first(output):
    return output[0] if isinstance(output, tuple) else output


def hidden_of(call: Call):
    return call.args[0] if call.args else call.kwargs["hidden_states"]


def with_hidden(call: Call, hidden) -> tuple[tuple, dict]:
    """The call's arguments with its hidden-state input replaced and no residual to fold."""
    kwargs = {k: v for k, v in call.kwargs.items() if k != "residual"}
    if call.args:
        return (hidden, *call.args[1:]), kwargs
    return call.args, kwargs | {"hidden_states": hidden}


class Structure:
    """A model's decoder layers, their sub-blocks and MoE routers, by ``i/name`` keys."""

    def __init__(self, model):
        from tilegym_hf_bench.routing import routers

        self.layers = list(getattr(model, model.base_model_prefix).layers)
        self.modules: dict = {}
        self.routers: dict = {}  # layer index -> (router module, its RouterForm)
        for i, layer in enumerate(self.layers):
            self.modules[f"{i}/layer"] = layer
            for name in BLOCKS:
                block = getattr(layer, name, None)
                if block is None:
                    continue
                self.modules[f"{i}/{name}"] = block
                found = routers(block)
                if found:
                    self.routers[i] = found[0]
                    self.modules[f"{i}/router"] = found[0][0]

    def moe_block(self, i: int) -> str | None:
        """The name of layer i's block holding its router (None: a layer without one)."""
        if i not in self.routers:
            return None
        for name in BLOCKS:
            key = f"{i}/{name}"
            if key in self.modules and self.modules[f"{i}/router"] in set(
                self.modules[key].modules()
            ):
                return name
        return None


@torch.inference_mode()
def routing(struct: Structure, i: int, calls: dict, patched: bool):
    """(raw scores [T, E] fp32, top-k ids [T, k]) of layer i's router in the recorded calls, or
    (None, None) for a layer without a router. The patched block computes its routing without
    calling the router module: then recomputed from the block's input with the same ops."""
    if i not in struct.routers:
        return None, None
    router, form = struct.routers[i]
    rec = calls.get(f"{i}/router")
    if rec is not None and rec.output is not None:
        logits, _, ids = rec.output
    else:
        if not patched:
            raise RuntimeError(f"internal: layer {i}'s router was not called")
        from tilegym.ops import library

        block = calls[f"{i}/{struct.moe_block(i)}"]
        x = hidden_of(block)
        x = x.reshape(-1, x.shape[-1])
        logits = library.linear(x, router.weight, getattr(router, "bias", None))
        if type(router).__name__ in ROUTE_OP_ROUTERS:
            _, ids = library.moe_route(logits, router.top_k, True)
        else:
            ids = torch.topk(form.ranking(router, logits), router.top_k, dim=-1).indices
    return form.raw(router, logits).float(), ids.long()


def _flat(t):
    return t.reshape(-1, t.shape[-1])


class Side:
    """One model (the fp32 reference or a bf16 side): its free-running forward's calls and
    logits; a bf16 side then runs its layers and sub-blocks teacher-forced on fp32's inputs."""

    def __init__(self, model, patched: bool, inputs: dict):
        self.model, self.patched = model, patched
        self.struct = Structure(model)
        with torch.inference_mode(), Tap(self.struct.modules) as tap:
            self.logits = model(**inputs).logits
        self.calls = dict(tap.calls)

    def forced(self, key: str, hidden):
        """(output, calls recorded inside) of module ``key`` run on ``hidden`` with the rest of
        its free-running call's arguments."""
        args, kwargs = with_hidden(self.calls[key], hidden)
        i = key.split("/")[0]
        inner = {k: m for k, m in self.struct.modules.items() if k.startswith(f"{i}/")}
        inner.pop(key)
        with torch.inference_mode(), Tap(inner) as tap:
            out = first(self.struct.modules[key](*args, **kwargs))
        return out, dict(tap.calls) | {key: Call(args, kwargs, out)}


def rows_for(ref, sides: dict[str, Side], real) -> list[Row]:
    """Every table row: per layer, the layer and each sub-block teacher-forced, then the layer
    free-running; then the logits."""
    struct = ref.struct
    rows = []
    for i in range(len(struct.layers)):
        ref_ids = routing(struct, i, ref.calls, False)
        names = ["layer"] + [n for n in BLOCKS if f"{i}/{n}" in ref.calls]
        for name in names:
            key = f"{i}/{name}"
            target = _flat(first(ref.calls[key].output))
            x = hidden_of(ref.calls[key]).to(torch.bfloat16)
            with_router = name == "layer" or name == struct.moe_block(i)
            row = Row(i, name, "forced")
            for label, side in sides.items():
                out, calls = side.forced(key, x)
                scores, ids = None, None
                if with_router:
                    scores, ids = routing(side.struct, i, calls, side.patched)
                row.sides[label] = side_stat(
                    _flat(out), target, real, ids, ref_ids[1], scores, ref_ids[0]
                )
            rows.append(row)
        key = f"{i}/layer"
        row = Row(i, "layer", "free")
        target = _flat(first(ref.calls[key].output))
        for label, side in sides.items():
            scores, ids = routing(side.struct, i, side.calls, side.patched)
            out = _flat(first(side.calls[key].output))
            row.sides[label] = side_stat(out, target, real, ids, ref_ids[1], scores, ref_ids[0])
        rows.append(row)
    row = Row(None, "logits", "free")
    for label, side in sides.items():
        row.sides[label] = side_stat(_flat(side.logits), _flat(ref.logits), real)
    rows.append(row)
    return rows


def prompt(vocab: int, length: int, pad: int, seed: int, device: str) -> dict:
    """Forward inputs of one seeded prompt of ``length`` tokens, left-padded by ``pad``."""
    from tilegym_hf_bench.generation import make_input_ids
    from tilegym_hf_bench.scoring import position_ids

    ids = make_input_ids(vocab, 1, length, seed, device)
    inputs = {"input_ids": ids, "use_cache": False}
    if pad:
        mask = torch.cat(
            [torch.zeros(1, pad, dtype=torch.long), torch.ones(1, length, dtype=torch.long)], 1
        ).to(device)
        ids = torch.cat([torch.zeros(1, pad, dtype=ids.dtype, device=device), ids], 1)
        inputs |= {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids(mask)}
    return inputs


def planting(model, plant: Plant | None):
    """A forward hook scaling the planted module's output on the cuTile side (None: none)."""
    if plant is None:
        return None
    struct = Structure(model)
    key = f"{plant.layer}/{plant.block}"
    if key not in struct.modules or plant.block == "router":
        known = sorted({k.split("/")[1] for k in struct.modules} - {"router"})
        raise BadInput(
            f"--plant: no {plant.block!r} in layer {plant.layer} "
            f"({len(struct.layers)} layers; blocks: {', '.join(known)})"
        )

    def scale(module, args, output):
        if isinstance(output, tuple):
            return (output[0] * plant.scale, *output[1:])
        return output * plant.scale

    return struct.modules[key].register_forward_hook(scale)


def build(args, overrides: dict):
    """(fp32 reference, bf16 model, patched bf16 twin, patch report), weights as the
    benchmark draws them."""
    from tilegym_hf_bench.model_factory import (
        fp32_reference,
        random_model,
        twin_sharing_weights,
    )
    from tilegym_hf_bench.tilegym_patch import apply_patch, patch_flags

    overrides_config = {"num_hidden_layers": args.layers} if args.layers else None
    loaded = random_model(args.model_key, args.device, args.seed, overrides_config)
    base = loaded.model
    ref = fp32_reference(base)
    twin = twin_sharing_weights(base)
    flags = patch_flags(loaded.model_type) | overrides
    report = apply_patch(twin, loaded.model_type, {loaded.model_type: flags})
    return ref, base, twin, report


def check_args(args) -> dict:
    """The patch flag overrides; BadInput for anything the run cannot start with."""
    from tilegym_hf_bench.presets import PRESETS
    from tilegym_hf_bench.tilegym_patch import PatchUnavailable, patch_flags

    if args.model_key not in PRESETS:
        raise BadInput(f"--model-key {args.model_key!r} is not a preset ({', '.join(PRESETS)})")
    if args.length < 1 or args.pad < 0 or (args.layers is not None and args.layers < 1):
        raise BadInput("--length and --layers must be at least 1 and --pad at least 0")
    try:
        side, overrides = parse_variant(args.patch)
        known = patch_flags(PRESETS[args.model_key].model_type)
    except (ValueError, PatchUnavailable) as exc:
        raise BadInput(str(exc)) from None
    if side != "cutile":
        raise BadInput(f"--patch {args.patch!r}: expected cutile or cutile:FLAG=VALUE,...")
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise BadInput(f"--patch: no patch flag {unknown[0]!r} ({', '.join(known)})")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise BadInput("--device cuda: torch sees no CUDA device")
    return overrides


def run(args) -> int:
    overrides = check_args(args)
    plant = parse_plant(args.plant) if args.plant else None

    start = time.perf_counter()
    ref_model, base, twin, report = build(args, overrides)
    hook = planting(twin, plant)
    inputs = prompt(base.config.vocab_size, args.length, args.pad, args.seed, args.device)
    real = torch.ones(args.length + args.pad, dtype=torch.bool, device=args.device)
    real[: args.pad] = False
    built = time.perf_counter()
    ref = Side(ref_model, False, inputs)
    sides = {"pytorch": Side(base, False, inputs), "cutile": Side(twin, True, inputs)}
    rows = rows_for(ref, sides, real)
    if hook is not None:
        hook.remove()
    done = time.perf_counter()
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(
        f"# {args.model_key} on {device}: 1 x {args.length} tokens"
        + (f" (+{args.pad} left pad)" if args.pad else "")
        + f", seed {args.seed}; relative L2 error against fp32 over the real tokens; "
        "forced: each bf16 module fed bf16(fp32's input to it); free: the whole forward"
    )
    for line in report.lines():
        print(f"# {line}")
    if plant:
        print(f"# planted: cuTile side's {plant.block} of layer {plant.layer} x {plant.scale}")
    print("\n".join(table_lines(rows)))
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device == "cuda" else None
    print(
        f"# build {built - start:.1f} s, forwards {done - built:.1f} s"
        + (f", peak GPU memory {peak:.1f} GiB" if peak is not None else ""),
        file=sys.stderr,
    )
    if args.json:
        doc = {
            "model_key": args.model_key,
            "device": device,
            "seed": args.seed,
            "length": args.length,
            "pad": args.pad,
            "patch": {
                "flags": report.flags,
                "applied": report.applied,
                "not_applied": report.not_applied,
            },
            "plant": None if plant is None else vars(plant),
            "torch": torch.__version__,
            "rows": [row_json(r) for r in rows],
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    bad = non_finite(rows)
    if bad:
        print(f"error: non-finite errors: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-key", required=True, help="a benchmark preset (tiny-mixtral, ...)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--seed", type=int, default=0, help="weights and prompt, as the benchmark's")
    p.add_argument("--length", type=int, default=64, help="prompt tokens (batch 1)")
    p.add_argument("--pad", type=int, default=0, help="left padding positions before them")
    p.add_argument(
        "--layers", type=int, help="build only this many decoder layers (the preset's: all)"
    )
    p.add_argument("--patch", default="cutile", help="cutile or cutile:FLAG=VALUE,...")
    p.add_argument("--plant", help="BLOCK@LAYER=SCALE: scale that module's cuTile output")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    try:
        return run(args)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
