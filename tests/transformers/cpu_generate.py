"""What the CPU family tests build and generate from: a small config and its patched twin, a
left-padded batch and its greedy new tokens."""

from __future__ import annotations

import copy

import torch

#: A small Llama-shaped config (fp32 on the CPU) whose head size the attention kernels take, so
#: attention is patched too; each family test adds its own fields.
SMALL = dict(
    hidden_size=128,
    intermediate_size=192,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=256,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def patched_pair(model_type: str, **extra):
    """(upstream model, its patched deep copy, the patch's handle) from ``SMALL`` + ``extra``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tilegym.transformers import monkey_patch as mp

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**SMALL, **extra})
    base = AutoModelForCausalLM.from_config(config).eval().float()
    patched = copy.deepcopy(base)
    return base, patched, mp.apply_tilegym_kernel(patched)


def small_family_pair(model_type: str, dtype: torch.dtype = torch.float32, **flags):
    """(upstream model, its patched deep copy, the handle) of a family's ``small_config.json``
    made tiny: 128 wide, 2 layers (all where per-layer lists need them: SmolLM3's 4th is NoPE),
    heads of 64, random nonzero biases; ``flags`` go to ``apply_tilegym_kernel``."""
    import json
    from pathlib import Path

    from transformers import AutoConfig, AutoModelForCausalLM

    import tilegym.transformers
    from tilegym.transformers import monkey_patch as mp

    path = Path(tilegym.transformers.__file__).parent / model_type / "small_config.json"
    d = json.loads(path.read_text())
    heads = d["num_attention_heads"] // d["num_key_value_heads"]
    n = d["num_hidden_layers"]
    per_layer = any(
        isinstance(v, list) and len(v) == n for k, v in d.items() if k != "architectures"
    )
    layers = n if per_layer else 2
    d.update(hidden_size=128, intermediate_size=192, num_hidden_layers=layers, vocab_size=256)
    d.update(num_key_value_heads=2, num_attention_heads=2 * heads, head_dim=64)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(AutoConfig.for_model(**d)).eval().to(dtype)
    with torch.no_grad():  # biases start at zero: make them count
        for name, p in base.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    patched = copy.deepcopy(base)
    return base, patched, mp.apply_tilegym_kernel(patched, **flags)


def left_padded_batch(pads: tuple[int, ...] = (0, 4, 10), seed: int | None = None, low: int = 1):
    """(ids, mask) of ``len(pads)`` rows of 11 tokens in [low, 256); row r has its first
    ``pads[r]`` masked."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    ids = torch.randint(low, 256, (len(pads), 11), generator=generator)
    mask = torch.ones_like(ids)
    for row, pad in enumerate(pads):
        mask[row, :pad] = 0
    return ids, mask


def greedy(model, ids, mask, new_tokens: int = 5, **kw):
    """``new_tokens`` greedy new tokens per row (``kw``: the cache implementation, compile
    config)."""
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            **kw,
        )
    return out[:, ids.shape[1] :]


def assert_same_as_upstream(base, patched, ids, mask):
    """Logits at every unpadded position within 1e-4, and the same greedy tokens."""
    with torch.no_grad():
        want = base(input_ids=ids, attention_mask=mask).logits
        got = patched(input_ids=ids, attention_mask=mask).logits
    valid = mask.bool()
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-4)
    assert torch.equal(greedy(patched, ids, mask), greedy(base, ids, mask))


def assert_compiles_like_upstream(base, patched):
    """The patched model's greedy tokens with a static cache and the whole decode step compiled
    (fullgraph, aot_eager) equal upstream's eager ones."""
    from transformers import CompileConfig

    torch._dynamo.reset()
    ids, mask = left_padded_batch((0, 4, 9), seed=1)
    cfg = CompileConfig(fullgraph=True, backend="aot_eager")
    cfg._compile_all_devices = True
    got = greedy(patched, ids, mask, cache_implementation="static", compile_config=cfg)
    assert torch.equal(got, greedy(base, ids, mask))
