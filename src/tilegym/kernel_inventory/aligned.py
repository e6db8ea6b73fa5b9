"""The aligned twin of a declared signature: the form a kernel compiles to for a model's tensors.

At launch cuTile specializes a kernel on its arrays' alignment. A model's activations and
weights have 16-byte aligned bases and row strides, and that form moves its tiles by TMA; a
signature declared for arrays of any stride compiles a different program (``ld.global``, other
registers and shared memory). Odd test shapes run the second, models the first, so the compile
gate compiles both: to every declared signature whose unit-stride arrays claim no alignment it
adds the twin that claims it, unless the declaration already holds it.
"""

from __future__ import annotations

import dataclasses
import math

#: the alignment, in bytes, of a model tensor's base and row strides that the twin claims
ALIGN_BYTES = 16


def aligned_array(constraint):
    """``constraint`` with 16-byte aligned base and row strides when its last axis has unit
    stride and it claims less; otherwise ``constraint`` itself."""
    from cuda.tile.compilation import ArrayConstraint

    if not isinstance(constraint, ArrayConstraint):
        return constraint
    strides = constraint.stride_constant
    if strides is None or strides[-1] != 1:
        return constraint
    step = max(1, ALIGN_BYTES * 8 // constraint.dtype.bitwidth)
    divisible = tuple(
        d if fixed is not None else math.lcm(d, step)
        for d, fixed in zip(constraint.stride_divisible_by[:-1], strides[:-1], strict=True)
    )
    aligned = dataclasses.replace(
        constraint,
        stride_divisible_by=(*divisible, constraint.stride_divisible_by[-1]),
        base_addr_divisible_by=math.lcm(constraint.base_addr_divisible_by, ALIGN_BYTES),
    )
    return constraint if aligned == constraint else aligned


def aligned_twin(signature):
    """``signature`` with every array it can be, aligned (``aligned_array``); the same object
    when none can. The twin takes the compiler's own symbol name, not a declared one, which
    the original keeps."""
    params = tuple(aligned_array(p) for p in signature.parameters)
    if all(a is b for a, b in zip(params, signature.parameters, strict=True)):
        return signature
    return dataclasses.replace(signature, parameters=params, symbol=None)


def with_aligned_twins(declared: dict) -> dict:
    """``{kernel: signatures}`` with each signature's aligned twin after it, where the twin is
    new to that kernel's list."""
    out = {}
    for kernel, signatures in declared.items():
        listed = list(signatures)
        for signature in signatures:
            twin = aligned_twin(signature)
            if twin not in listed:
                listed.append(twin)
        out[kernel] = listed
    return out
