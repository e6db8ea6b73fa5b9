"""Every family's patched model against its unpatched twin on the CPU (fp32).

On a CPU the cuTile ops run their PyTorch implementations (``tilegym.ops.library``), so what
these tests check is the glue: that each family's description (projection names, packed
weights, biases, q/k norms, window source) routes the upstream model's computation exactly,
eagerly, through ``generate()`` with left padding, and compiled with a static cache.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, CompileConfig

import tilegym.transformers
from tilegym.transformers import monkey_patch as mp

FAMILIES = sorted(mp.FAMILIES)


def _pair(model_type: str):
    path = Path(tilegym.transformers.__file__).parent / model_type / "small_config.json"
    d = json.loads(path.read_text())
    heads = d["num_attention_heads"] // d["num_key_value_heads"]
    d.update(hidden_size=128, intermediate_size=192, num_hidden_layers=2, vocab_size=256)
    d.update(num_key_value_heads=2, num_attention_heads=2 * heads, head_dim=64)
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(AutoConfig.for_model(**d)).eval()
    with torch.no_grad():  # biases start at zero: make them count
        for name, p in base.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    patched = copy.deepcopy(base)
    handle = mp.apply_tilegym_kernel(patched)
    return base, patched, handle


def _batch():
    ids = torch.randint(1, 256, (3, 11))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    mask[2, :10] = 0
    return ids, mask


def _greedy(model, ids, mask, **kw):
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=5,
            min_new_tokens=5,
            do_sample=False,
            pad_token_id=0,
            **kw,
        )
    return out[:, ids.shape[1] :]


@pytest.mark.parametrize("model_type", FAMILIES)
def test_the_patched_family_computes_the_upstream_model(model_type):
    base, patched, handle = _pair(model_type)
    assert handle.applied == list(mp.FLAGS), handle.not_applied
    ids, mask = _batch()
    with torch.no_grad():
        want = base(input_ids=ids, attention_mask=mask).logits
        got = patched(input_ids=ids, attention_mask=mask).logits
    valid = mask.bool()
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-4)
    assert torch.equal(_greedy(patched, ids, mask), _greedy(base, ids, mask))


@pytest.mark.parametrize("model_type", FAMILIES)
def test_the_patched_family_compiles_with_a_static_cache(model_type):
    torch._dynamo.reset()
    base, patched, _ = _pair(model_type)
    ids, mask = _batch()
    cfg = CompileConfig(fullgraph=True, backend="aot_eager")
    cfg._compile_all_devices = True
    got = _greedy(patched, ids, mask, cache_implementation="static", compile_config=cfg)
    assert torch.equal(got, _greedy(base, ids, mask))
