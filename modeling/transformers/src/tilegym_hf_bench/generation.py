"""Seeded prompts and exactly-N-token greedy generation, timed with device synchronization."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from transformers import GenerationConfig

from tilegym_hf_bench.errors import BenchError


def make_input_ids(vocab_size: int, batch: int, length: int, seed: int, device: str):
    """Token ids uniform over the vocabulary from their own seeded stream (not the weights')."""
    gen = torch.Generator(device="cpu").manual_seed(seed + 1_000_003)
    ids = torch.randint(0, vocab_size, (batch, length), generator=gen, dtype=torch.long)
    return ids.to(device)


def _first(token_ids):
    if isinstance(token_ids, (list, tuple)):
        return token_ids[0] if token_ids else None
    return token_ids


def greedy_config(model, new_tokens: int) -> GenerationConfig:
    """Greedy, with min_new_tokens == max_new_tokens so EOS can never end a run early."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = _first(eos) if eos is not None else 0
    return GenerationConfig(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        num_beams=1,
        eos_token_id=eos,
        pad_token_id=pad,
        use_cache=True,
    )


def synchronizer(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        return torch.cuda.synchronize
    return lambda: None


class Generator:
    """``generate()`` of one model on fixed inputs, for a given number of new tokens."""

    def __init__(self, model, input_ids, device: str):
        self.model = model
        self.sync = synchronizer(device)
        self._configs: dict[int, GenerationConfig] = {}
        self.use_prompt(input_ids)

    def use_prompt(self, input_ids) -> None:
        """Generate from ``input_ids`` from now on (a fresh prompt per timed run)."""
        self.input_ids = input_ids
        self.attention_mask = torch.ones_like(input_ids)

    def _generate(self, new_tokens: int, **extra):
        config = self._configs.get(new_tokens)
        if config is None:
            config = self._configs[new_tokens] = greedy_config(self.model, new_tokens)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=self.input_ids,
                attention_mask=self.attention_mask,
                generation_config=config,
                **extra,
            )
        sequences = out.sequences if extra else out
        expected = self.input_ids.shape[1] + new_tokens
        if sequences.shape[1] != expected:
            raise BenchError(
                f"generate() returned {sequences.shape[1]} tokens a row, expected {expected}"
            )
        return out

    def generate(self, new_tokens: int):
        return self._generate(new_tokens)

    def generate_with_logits(self, new_tokens: int):
        """(sequences, fp32 logits [B, N, V] of each generated token) from the same generate()
        call the timed runs make: same model, same cache class, same kernels."""
        out = self._generate(new_tokens, output_logits=True, return_dict_in_generate=True)
        return out.sequences, torch.stack([step.float() for step in out.logits], dim=1)

    def timed(self, new_tokens: int) -> tuple[float, torch.Tensor]:
        """(wall seconds, output) of one generate(), synchronized on both sides."""
        self.sync()
        start = time.perf_counter()
        out = self.generate(new_tokens)
        self.sync()
        return time.perf_counter() - start, out
