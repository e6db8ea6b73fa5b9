"""A side's report of how its own model routed the tokens of a sequence it generated: the
experts each MoE layer chose at every input position, from a replay of that generation
(``generate()`` in eager mode, forced onto the sequence's tokens). The routing referee offers
each side fp32 routed as it reports, wherever fp32 could make that choice within bf16's
rounding (``routing_rule.within_reach``).

Both sides make it the same way: the trusted PyTorch side here, the judged side in its worker
(``model_worker``), whose report is data the referee checks, not a fact it trusts. An upstream
router is recorded by a forward hook; a patched block that does not call its router says its
choice through ``tilegym.transformers.routing_tap``.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from tilegym_hf_bench.errors import BenchError
from tilegym_hf_bench.generation import greedy_config
from tilegym_hf_bench.modes import EAGER
from tilegym_hf_bench.routing import hooked, routers


def _tap():
    """The patched blocks' tap, where the patch is importable (the CPU tests' PyTorch-only
    workers run without it; a model nothing patched never calls it)."""
    try:
        from tilegym.transformers import routing_tap
    except ImportError:
        return None
    return routing_tap


class _Forced(LogitsProcessor):
    """Greedy decoding that can only choose the sequence's next token: the generation replayed
    on the tokens it once chose, whatever this model would choose now."""

    def __init__(self, seq: torch.Tensor):
        self.seq = seq

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor):
        nxt = self.seq[:, input_ids.shape[1]].to(scores.device)
        return torch.full_like(scores, float("-inf")).scatter_(1, nxt[:, None], 0.0)


@torch.inference_mode()
def replay_routing(model, seq: torch.Tensor, prompt_len: int, mask=None) -> list | None:
    """Per MoE layer of ``model`` (``routing.routers`` order), the [B x (S - 1), k] experts it
    routed input position p of each row of ``seq`` [B, S] to, rows then positions, as the
    teacher-forced fp32 reference indexes them; None for a model without routers. ``mask``:
    the prompt's attention mask (left padding).

    The replay is ``generate()`` itself in eager mode, forced onto ``seq``'s tokens: the
    model's own cache class (a patched model's ``TileKVCache``), masks and positions, the
    prompt in one forward and then one a token. An eager case's routing is then the one it
    was scored on; a case run with the compiled static step may have routed otherwise."""
    found = routers(model)
    if not found:
        return None
    layer_of = {id(router): i for i, (router, _) in enumerate(found)}
    chosen: list[list[torch.Tensor]] = [[] for _ in found]

    def record(router, ids) -> None:
        i = layer_of.get(id(router))
        if i is not None:
            chosen[i].append(ids.detach())

    new_tokens = seq.shape[1] - prompt_len
    config = greedy_config(model, new_tokens, EAGER, seq.device.type)
    prompt = seq[:, :prompt_len]
    attention = torch.ones_like(prompt) if mask is None else mask.to(seq.device)
    hooks = [(r, lambda m, a, out: record(m, out[2])) for r, _ in found]
    tap = _tap()
    with hooked(hooks), tap.listening(record) if tap is not None else nullcontext():
        out = model.generate(
            input_ids=prompt,
            attention_mask=attention,
            generation_config=config,
            logits_processor=LogitsProcessorList([_Forced(seq)]),
        )
    if not torch.equal(out, seq):
        raise BenchError("internal: the routing replay did not generate the sequence it replays")
    return [
        _positions(layer, i, seq.shape[0], prompt_len, new_tokens) for i, layer in enumerate(chosen)
    ]


def _positions(calls: list[torch.Tensor], layer: int, batch: int, prompt_len: int, new_tokens: int):
    """One layer's records of a replay (the prompt's forward, then one a generated token but
    the last) as [B x (S - 1), k], rows then positions."""
    if len(calls) != new_tokens or calls[0].shape[0] != batch * prompt_len:
        raise BenchError(
            f"internal: MoE layer {layer} routed {len(calls)} times in a replay of "
            f"{new_tokens} forwards (expected once a forward)"
        )
    parts = [calls[0].reshape(batch, prompt_len, -1)]
    parts += [ids.reshape(batch, 1, -1) for ids in calls[1:]]
    return torch.cat(parts, dim=1).reshape(batch * (prompt_len + new_tokens - 1), -1).long()
