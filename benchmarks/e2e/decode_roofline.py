"""GPU time per decode token against the weight-read floor, per model family (static mode).

At batch 1 a decode step must read every weight it multiplies by once from HBM, plus the KV
cache up to the current position, so no kernel set can do a step faster than

    floor = (weight bytes read per token + KV bytes read per token) / HBM bandwidth

Weight bytes per token (bf16, 2 bytes a parameter), counted on a meta-device instance of the
preset (no memory, exact parameter counts): every parameter once, except the embedding table
(one row a token; when it is tied to ``lm_head`` the whole matrix counts once, as ``lm_head``
reads it) and the MoE experts (``top_k`` of ``num_experts`` experts a layer; a batch of one
token reads no other expert). KV bytes: K and V of every layer at the mean decode position of
the workload (input + output / 2), a sliding-window layer only its window. Bandwidth: the
running GPU's spec HBM bandwidth (``--tbps`` sets another; ``--floor-only`` without it: the
H200's 4.8 TB/s, the target); measured copies reach about 90% of it, so 1.0x the floor is not
reachable and ~1.1x is the practical best.

The measured side profiles one warm ``generate()`` of the workload and one 1-token
``generate()`` (its prefill) per side, and takes (full - prefill) / (new tokens - 1) of summed
kernel GPU time: the decode step's kernels alone, host gaps excluded. Repeated ``--repeats``
times, sides interleaved; the median is shown with the range.

    python benchmarks/e2e/decode_roofline.py --model-keys qwen3 llama       # on the GPU
    python benchmarks/e2e/decode_roofline.py --floor-only [--tbps 3.35]      # any machine
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ops"))
from _timing import running_gpu_tbps  # noqa: E402

H200_HBM_TBPS = 4.8
BF16_BYTES = 2
_PER_EXPERT = re.compile(r"\.experts\.\d+\.")


@dataclass(frozen=True)
class Floor:
    weight_bytes: int
    kv_bytes: int
    bandwidth: float = H200_HBM_TBPS * 1e12  # bytes/s

    @property
    def ms(self) -> float:
        return 1e3 * (self.weight_bytes + self.kv_bytes) / self.bandwidth


def weight_bytes_per_token(
    params: Iterable[tuple[str, tuple[int, ...]]],
    *,
    hidden: int,
    tied: bool,
    experts: tuple[int, int] | None = None,
    dtype_bytes: int = BF16_BYTES,
) -> int:
    """Bytes of weights one decode token reads. ``params``: (name, shape) of every parameter
    (a tied lm_head listed once, under the embedding's name); ``experts``: (top_k,
    num_experts) of a sparse MoE model."""
    total = 0.0
    for name, shape in params:
        numel = 1
        for d in shape:
            numel *= d
        if name.endswith("embed_tokens.weight"):
            total += numel if tied else hidden  # tied: read whole as lm_head
        elif (
            experts is not None
            and ".experts." in name
            and (len(shape) == 3 or _PER_EXPERT.search(name))
        ):
            top_k, count = experts
            total += numel * top_k / count
        else:
            total += numel
    return int(total * dtype_bytes)


def kv_bytes_per_token(config, position: int, dtype_bytes: int = BF16_BYTES) -> int:
    """Bytes of K and V one decode token reads at ``position``, over every layer."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_key_value_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kinds = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    window = getattr(text, "sliding_window", None)
    total = 0
    for kind in kinds[: text.num_hidden_layers]:
        length = min(position, window) if kind == "sliding_attention" and window else position
        total += 2 * heads * head_dim * length * dtype_bytes
    return total


def experts_of(config) -> tuple[int, int] | None:
    """(top_k, num_experts) of a sparse MoE config, else None."""
    text = config.get_text_config()
    count = getattr(text, "num_experts", None) or getattr(text, "num_local_experts", None)
    top_k = getattr(text, "num_experts_per_tok", None)
    return (int(top_k), int(count)) if count and top_k else None


def preset_floor(model_key: str, position: int, tbps: float = H200_HBM_TBPS) -> Floor:
    """The floor of a preset's architecture, from a meta-device instance."""
    import torch
    from tilegym_hf_bench.presets import PRESETS, config_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**config_dict(PRESETS[model_key]))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    text = config.get_text_config()
    tied = bool(getattr(text, "tie_word_embeddings", False) or config.tie_word_embeddings)
    params = [(n, tuple(p.shape)) for n, p in model.named_parameters()]  # tied: listed once
    return Floor(
        weight_bytes_per_token(
            params, hidden=text.hidden_size, tied=tied, experts=experts_of(config)
        ),
        kv_bytes_per_token(config, position),
        tbps * 1e12,
    )


def decode_ms_per_token(gen, new_tokens: int) -> float:
    """Summed kernel GPU ms of one full generate() minus its prefill's, per decode step."""
    from tilegym_hf_bench.profiling.torch_trace import profile_call

    def kernel_ms(tokens: int) -> float:
        kernels, _, _ = profile_call(gen.model, lambda: gen.generate(tokens))
        return sum(k.duration_ns for k in kernels) / 1e6

    return (kernel_ms(new_tokens) - kernel_ms(1)) / (new_tokens - 1)


def measure(model_key: str, repeats: int) -> tuple:
    """(workload, {side: [decode ms per token, ...]}) of both static sides, interleaved."""
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from _sides import static_sides

    wl, sides, _ = static_sides(model_key, "default", seed=0)
    for gen in sides.values():  # compile, capture graphs, JIT: warm-up
        gen.generate(wl.output_length)
        gen.generate(1)
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, gen in sides.items():
            samples[name].append(decode_ms_per_token(gen, wl.output_length))
    return wl, samples


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-keys", nargs="+", default=None, help="default: every GPU preset")
    p.add_argument("--floor-only", action="store_true", help="the floors, no GPU")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tbps", type=float, default=None, help="HBM TB/s (default: the GPU's spec)")
    args = p.parse_args(argv)
    if args.tbps is not None and not args.tbps > 0:
        print(f"error: --tbps {args.tbps}: a positive number", file=sys.stderr)
        return 2
    tbps, source = args.tbps, "--tbps"
    if tbps is None and args.floor_only:
        tbps, source = H200_HBM_TBPS, "H200 HBM3e spec, the target"
    elif tbps is None:
        import torch

        if not torch.cuda.is_available():
            print("error: no CUDA GPU here (--floor-only needs none)", file=sys.stderr)
            return 2
        try:
            tbps, source = running_gpu_tbps()
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        source += " spec"
    from tilegym_hf_bench.presets import PRESETS
    from tilegym_hf_bench.workloads import resolve_workload

    keys = args.model_keys or [k for k, v in PRESETS.items() if not v.cpu_sized]
    unknown = [k for k in keys if k not in PRESETS]
    if unknown:
        print(f"error: unknown model key(s): {', '.join(unknown)}", file=sys.stderr)
        return 2
    wl = resolve_workload("default")
    position = wl.input_length + wl.output_length // 2
    print(f"batch 1, mean decode position {position}; floor at {tbps:g} TB/s ({source})")
    head = "| model | weights read / token | KV read / token | floor ms / token |"
    if not args.floor_only:
        head += " PyTorch static ms / token (x floor) | cuTile static ms / token (x floor) |"
    print(head)
    print("|" + "---|" * head.count(" |"))
    for key in keys:
        floor = preset_floor(key, position, tbps)
        row = (
            f"| {key} | {floor.weight_bytes / 1e9:.3f} GB | {floor.kv_bytes / 1e6:.1f} MB "
            f"| {floor.ms:.4f} |"
        )
        if not args.floor_only:
            _, samples = measure(key, args.repeats)
            for values in samples.values():
                med = statistics.median(values)
                row += f" {med:.4f} ({min(values):.4f}-{max(values):.4f}; {med / floor.ms:.2f}x) |"
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
