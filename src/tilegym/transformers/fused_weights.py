"""Concatenated projection weights (QKV, gate+up) for the fused GEMMs, projection weights
with a residual multiplier folded in (Granite) and relaid expert weights (gpt-oss), shared by
every family."""

from __future__ import annotations

import weakref

import torch


class FusedWeights:
    """Concatenated projection weights (QKV, gate+up) built once per module, freed on undo.

    Kept on the module as a plain attribute (``_tilegym_fused_<names>``), which ``torch.compile``
    reads like any module attribute, and marked as a static address so that a CUDA graph uses
    the weight in place instead of copying it in before every replay."""

    def __init__(self) -> None:
        self._owners: list[tuple[weakref.ref, str]] = []

    def get(self, module: torch.nn.Module, names: tuple[str, ...]) -> tuple[torch.Tensor, ...]:
        """(weight, bias) of the projections ``names`` as one; a packed projection's own."""
        if len(names) == 1:
            proj = getattr(module, names[0])
            return proj.weight, proj.bias
        attr = "_tilegym_fused_" + "_".join(names)
        cached = getattr(module, attr, None)
        if cached is None:
            projs = [getattr(module, n) for n in names]
            weight = torch.cat([p.weight.detach() for p in projs], dim=0)
            biases = [p.bias for p in projs]
            bias = None
            if any(b is not None for b in biases):
                bias = torch.cat(
                    [
                        b.detach() if b is not None else weight.new_zeros(p.out_features)
                        for b, p in zip(biases, projs, strict=True)
                    ]
                )
            for t in (weight, bias):
                if t is not None:
                    torch._dynamo.mark_static_address(t)
            cached = (weight, bias)
            setattr(module, attr, cached)
            self._owners.append((weakref.ref(module), attr))
        return cached

    def build(self, module: torch.nn.Module, names: tuple[str, ...]) -> None:
        self.get(module, names)

    def scaled(self, module: torch.nn.Module, name: str, factor: float | None) -> torch.Tensor:
        """The projection ``name``'s weight times ``factor``, built once: a residual multiplier
        (Granite's ``residual + out * m``) folded into the GEMM that adds the residual. The
        weight itself for no factor or a factor of 1 (no copy)."""
        weight = getattr(module, name).weight
        if factor is None or factor == 1:
            return weight
        attr = f"_tilegym_scaled_{name}"
        cached = getattr(module, attr, None)
        if cached is None:
            cached = weight.detach() * factor
            torch._dynamo.mark_static_address(cached)
            setattr(module, attr, cached)
            self._owners.append((weakref.ref(module), attr))
        return cached

    def derived(self, module: torch.nn.Module, name: str, build) -> tuple[torch.Tensor, ...]:
        """Tensors ``build()`` derives from ``module``'s weights (e.g. gpt-oss's experts in the
        MoE kernels' row layout), built once, kept as ``_tilegym_<name>`` and freed on undo."""
        attr = f"_tilegym_{name}"
        cached = getattr(module, attr, None)
        if cached is None:
            cached = tuple(build())
            for t in cached:
                torch._dynamo.mark_static_address(t)
            setattr(module, attr, cached)
            self._owners.append((weakref.ref(module), attr))
        return cached

    def __len__(self) -> int:
        """How many repacked weights this holds (each on its module)."""
        return len(self._owners)

    def clear(self) -> None:
        for ref, attr in self._owners:
            module = ref()
            if module is not None:
                module.__dict__.pop(attr, None)
        self._owners = []
