"""Seeded prompts and exactly-N-token greedy generation in a ``--mode``, timed with device
synchronization."""

from __future__ import annotations

import copy
import inspect
import time
from collections.abc import Callable

import torch
from transformers import CompileConfig, GenerationConfig, StaticCache

from tilegym_hf_bench.compile_guard import require_guard
from tilegym_hf_bench.errors import BenchError
from tilegym_hf_bench.modes import DEFAULT_MODE, MODES
from tilegym_hf_bench.routing_report import install as install_routing_hooks


def make_input_ids(vocab_size: int, batch: int, length: int, seed: int, device: str):
    """Token ids uniform over the vocabulary from their own seeded stream (not the weights')."""
    gen = torch.Generator(device="cpu").manual_seed(seed + 1_000_003)
    ids = torch.randint(0, vocab_size, (batch, length), generator=gen, dtype=torch.long)
    return ids.to(device)


def _first(token_ids):
    if isinstance(token_ids, (list, tuple)):
        return token_ids[0] if token_ids else None
    return token_ids


def mode_settings(mode: str, device: str | None = None) -> dict:
    """The GenerationConfig fields of ``mode``: its cache and the decode step's compile config.

    transformers compiles the decode step only on accelerators; on a CPU ``device`` the config
    asks it to compile anyway (``_compile_all_devices``, which transformers keeps for testing),
    so a CPU run of a mode takes the path the GPU run takes."""
    m = MODES[mode]
    settings: dict = {}
    if m.cache_implementation is not None:
        settings["cache_implementation"] = m.cache_implementation
    if m.compile_config is not None:
        compile_config = CompileConfig(**m.compile_config)
        if device == "cpu":
            compile_config._compile_all_devices = True
        settings["compile_config"] = compile_config
    return settings


def greedy_config(
    model, new_tokens: int, mode: str = DEFAULT_MODE, device: str | None = None
) -> GenerationConfig:
    """Greedy, with min_new_tokens == max_new_tokens so EOS can never end a run early, in the
    cache and compile configuration of ``mode``."""
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
        **mode_settings(mode, device),
    )


def cache_kwarg(model) -> str:
    """The keyword generate() takes a cache under: the model forward's own name for it
    (``cache`` in later transformers 5 releases, ``past_key_values`` before)."""
    params = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def synchronizer(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        return torch.cuda.synchronize
    return lambda: None


class Generator:
    """``generate()`` of one model on fixed inputs in one ``--mode``, for a given number of new
    tokens.

    ``keep_cache`` (default: the mode's): one static cache for all of this side's calls, reset
    before each, instead of the fresh one generate() allocates per call. A fresh cache has new
    addresses, and the decode step's CUDA graphs were recorded against the old ones.

    The model's routers are hooked for ``routing_report`` first (a no-op without routers)."""

    def __init__(
        self,
        model,
        input_ids,
        device: str,
        mode: str = DEFAULT_MODE,
        keep_cache: bool | None = None,
    ):
        if MODES[mode].compile_config is not None:
            require_guard(mode)
        install_routing_hooks(model)  # before the first compiled step: a record must reach it
        self.model = model
        self.mode = mode
        self.device = device
        self.sync = synchronizer(device)
        self.keep_cache = MODES[mode].keep_cache if keep_cache is None else keep_cache
        if self.keep_cache and MODES[mode].cache_implementation != "static":
            raise BenchError(f"--mode {mode} has no static cache to keep across generate() calls")
        self._configs: dict[int, GenerationConfig] = {}
        self._cache: StaticCache | None = None
        self._cache_kwarg = cache_kwarg(model) if self.keep_cache else None
        self._cache_shape = (0, 0)  # (batch, length) the kept cache was made for
        self.use_prompt(input_ids)

    def use_prompt(self, input_ids, attention_mask=None) -> None:
        """Generate from ``input_ids`` from now on (a fresh prompt per timed run); a 0 in
        ``attention_mask`` marks a left-pad position."""
        self.input_ids = input_ids
        self.attention_mask = (
            torch.ones_like(input_ids) if attention_mask is None else attention_mask
        )

    def config(self, new_tokens: int) -> GenerationConfig:
        """The one GenerationConfig every generate() of ``new_tokens`` tokens uses."""
        config = self._configs.get(new_tokens)
        if config is None:
            config = greedy_config(self.model, new_tokens, self.mode, self.device)
            if self.keep_cache:
                config.cache_implementation = None  # the kept cache is passed in instead
            self._configs[new_tokens] = config
        return config

    def kept_cache(self, new_tokens: int) -> StaticCache:
        """The kept static cache, emptied, with room for the prompt and ``new_tokens``; a
        longer call than any before, or another batch size, replaces it (warm-up makes the
        longest call)."""
        batch, length = self.input_ids.shape[0], self.input_ids.shape[1] + new_tokens
        if self._cache is None or self._cache_shape[0] != batch or self._cache_shape[1] < length:
            self._cache = StaticCache(
                config=self.model.config.get_text_config(decoder=True), max_cache_len=length
            )
            self._cache_shape = (batch, length)
        self._cache.reset()
        return self._cache

    def _generate(self, config: GenerationConfig, new_tokens: int):
        with torch.inference_mode():
            kwargs = {}
            if self.keep_cache:
                kwargs[self._cache_kwarg] = self.kept_cache(new_tokens)
            out = self.model.generate(
                input_ids=self.input_ids,
                attention_mask=self.attention_mask,
                generation_config=config,
                **kwargs,
            )
        sequences = out.sequences if config.return_dict_in_generate else out
        expected = self.input_ids.shape[1] + new_tokens
        if sequences.shape[1] != expected:
            raise BenchError(
                f"generate() returned {sequences.shape[1]} tokens a row, expected {expected}"
            )
        return out

    def generate(self, new_tokens: int):
        return self._generate(self.config(new_tokens), new_tokens)

    def generate_with_logits(self, new_tokens: int):
        """(sequences, fp32 logits [B, N, V] of each generated token) from the same generate()
        call the timed runs make: same model, same cache class, same kernels."""
        config = copy.deepcopy(self.config(new_tokens))  # an equal compile config: no recompile
        config.output_logits = True
        config.return_dict_in_generate = True
        out = self._generate(config, new_tokens)
        return out.sequences, torch.stack([step.float() for step in out.logits], dim=1)

    def timed(
        self, new_tokens: int, ids=None, label: str | None = None
    ) -> tuple[float, torch.Tensor]:
        """(wall seconds, output) of one generate(), synchronized on both sides. ``ids`` (host
        tensor): the prompt, copied to the device inside the timed window as the model worker
        receives its prompt inside the caller's (``remote_side``). ``label`` names a timed run
        for the worker's guard; here the caller's own guard wraps the call."""
        self.sync()
        start = time.perf_counter()
        if ids is not None:
            self.use_prompt(ids.to(self.device))
        out = self.generate(new_tokens)
        self.sync()
        return time.perf_counter() - start, out
