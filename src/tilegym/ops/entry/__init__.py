"""Shared kernel entry points: one per op, named by every family's Solution of that op.

A family's Definition (its shapes, its ``# Source:`` permalinks) pairs with a Solution whose
``spec.entry_point`` is a function here; the function takes the Definition's tensors
positionally (inputs, in the Definition's order, under any names) and the family's constants
(eps, softmax scale, norm form) as keyword-only parameters bound from ``spec.entry_kwargs``.
Each module's ``aot_signatures(definition, **entry_kwargs)`` gives the AOT gate the kernels it
launches at the Definition's ``const`` axes. A family folder keeps only the kernels that are
its own (DESIGN.md, "Kernel inventory").
"""

from __future__ import annotations

from typing import Any


def const_axes(definition: Any, *names: str) -> tuple[int, ...]:
    """The values of the Definition's ``const`` axes ``names`` (ValueError naming a missing one)."""
    values = []
    for name in names:
        axis = definition.axes.get(name)
        if axis is None or axis.kind != "const":
            raise ValueError(f"{definition.name} has no const axis {name!r}")
        values.append(int(axis.value))
    return tuple(values)


def tensor_dtype(definition: Any):
    """The torch dtype of the Definition's first input (the model dtype the kernels run in)."""
    import torch

    name = next(iter(definition.inputs.values())).dtype
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{definition.name}: dtype {name!r} is not a torch dtype")
    return dtype
