"""Runtime parity: a Solution against its Definition's reference on fresh random inputs.

For several shapes (``var`` axes sampled from odd and non-power-of-two sizes that satisfy the
``constraints``; ``const`` axes fixed) inputs are drawn in the Definition's dtypes on the given
device; an integer input with ``index_of`` (expert ids) is drawn in [0, size of that axis). The
reference ``run`` sees upcast copies (float64 on the CPU, float32 elsewhere); the
Solution sees the originals. Each output must have the declared shape and dtype, be finite
where the reference is, and meet ``||out - ref|| / ||ref|| <= tolerance[dtype]``. Inputs must
come back bit-identical unless a ``mutates:<input>`` tag says otherwise. With
``destination_passing_style`` the outputs are pre-filled with NaN, so an unwritten element shows.

The logic is device-agnostic: on the CPU it is exercised with plain torch functions.
"""

from __future__ import annotations

import ast
import functools
import math
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tilegym.findings import Finding
from tilegym.kernel_inventory import codes
from tilegym.kernel_inventory.entry import first_line, import_entry_module
from tilegym.kernel_inventory.inventory import load, pair_of, shown_path
from tilegym.kernel_inventory.jsonfile import finding
from tilegym.kernel_inventory.models import Definition, Solution
from tilegym.kernel_inventory.selection import select_solutions
from tilegym.kernel_inventory.tolerances import TOLERANCES

VAR_AXIS_SIZES = (1, 2, 3, 5, 7, 12, 13, 17, 24, 31, 33, 48, 63, 96, 100, 127, 129, 192, 255, 257)
"""Odd and non-power-of-two sizes first; half the draws come uniformly from 1..512 instead."""
_ODD_SIZES = tuple(v for v in VAR_AXIS_SIZES if v % 2 and v > 2)
MAX_ELEMENTS = 1 << 22
INT_HIGH = 16


@dataclass(frozen=True)
class ParityIssue:
    code: str
    message: str


def torch_dtype(name: str):
    import torch

    mapping = {
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
        "float8_e4m3fn": getattr(torch, "float8_e4m3fn", None),
        "float8_e5m2": getattr(torch, "float8_e5m2", None),
        "int64": torch.int64,
        "int32": torch.int32,
        "int16": torch.int16,
        "int8": torch.int8,
        "bool": torch.bool,
    }
    return mapping.get(name)


def sample_shapes(
    definition: Definition, count: int, rng: random.Random, max_elements: int = MAX_ELEMENTS
) -> list[dict[str, int]]:
    """Up to ``count`` distinct axis bindings satisfying the constraints (may return fewer)."""
    const = {a.name: a.value for a in definition.axes.values() if a.kind == "const"}
    var = [a.name for a in definition.axes.values() if a.kind == "var"]
    checks = [
        compile(ast.parse(c, mode="eval"), "<constraint>", "eval") for c in definition.constraints
    ]
    shapes: list[dict[str, int]] = []
    seen: set[tuple[int, ...]] = set()
    attempts = 400 * max(count, 1)
    for attempt in range(attempts):
        if len(shapes) >= count:
            break
        # The first shape is odd in every var axis (when the constraints allow it).
        odd_only = not shapes and attempt < attempts // 4
        values = {name: _draw(rng, odd_only) for name in var}
        key = tuple(values[n] for n in var)
        if key in seen:
            if not var:
                break
            continue
        binding = {**const, **values}
        if not _satisfies(checks, binding) or _too_large(definition, binding, max_elements):
            continue
        seen.add(key)
        shapes.append(binding)
    return shapes


def _draw(rng: random.Random, odd_only: bool = False) -> int:
    if odd_only:
        return rng.choice(_ODD_SIZES) if rng.random() < 0.5 else 2 * rng.randint(1, 255) + 1
    return rng.choice(VAR_AXIS_SIZES) if rng.random() < 0.5 else rng.randint(1, 512)


def _satisfies(checks: list, binding: dict[str, int]) -> bool:
    for check in checks:
        try:
            if not eval(check, {"__builtins__": {}}, dict(binding)):  # noqa: S307 (AST-checked)
                return False
        except Exception:
            return False
    return True


def _too_large(definition: Definition, binding: Mapping[str, int], max_elements: int) -> bool:
    """Whether the var axes blow a tensor past ``max_elements`` (a tensor made only of const
    axes, such as a 151936 x 1024 lm_head weight, is as large as it must be)."""
    for spec in (*definition.inputs.values(), *definition.outputs.values()):
        if spec.shape is None:
            continue
        size = math.prod(binding[a] for a in spec.shape)
        fixed = math.prod(binding[a] for a in spec.shape if definition.axes[a].kind == "const")
        if size > max(max_elements, fixed):
            return True
    return False


def shape_of(spec_shape: tuple[str, ...] | None, binding: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(binding[a] for a in spec_shape) if spec_shape is not None else ()


def make_inputs(definition: Definition, binding: Mapping[str, int], device, generator) -> dict:
    """Fresh random inputs: floats ~ N(0, 1), integers in [0, 16) or, with ``index_of``, in
    [0, size of that axis) (indices the reference uses must be in range), booleans fair coins."""
    import torch

    inputs: dict[str, Any] = {}
    for name, spec in definition.inputs.items():
        dtype = torch_dtype(spec.dtype)
        shape = shape_of(spec.shape, binding)
        if dtype is None:
            raise _Unsupported(f"input {name!r}: dtype {spec.dtype} is not supported by parity")
        if spec.index_of is not None:
            if spec.index_of not in binding or dtype.is_floating_point or dtype == torch.bool:
                raise _Unsupported(
                    f"input {name!r}: index_of {spec.index_of!r} needs a declared axis and an "
                    f"integer dtype ({spec.dtype})"
                )
            high = binding[spec.index_of]
            values = torch.randint(0, high, shape, generator=generator)
            inputs[name] = (
                values.item() if spec.shape is None else values.to(device=device, dtype=dtype)
            )
        elif spec.shape is None:
            inputs[name] = _scalar(spec.dtype, generator)
        elif dtype.is_floating_point:
            values = torch.randn(shape, generator=generator, dtype=torch.float32)
            inputs[name] = values.to(device=device, dtype=dtype)
        elif dtype == torch.bool:
            values = torch.randint(0, 2, shape, generator=generator)
            inputs[name] = values.to(device=device, dtype=torch.bool)
        else:
            values = torch.randint(0, INT_HIGH, shape, generator=generator)
            inputs[name] = values.to(device=device, dtype=dtype)
    return inputs


def _scalar(dtype_name: str, generator) -> float | int | bool:
    import torch

    draw = torch.rand((), generator=generator).item()
    if dtype_name == "bool":
        return draw < 0.5
    if dtype_name.startswith("int"):
        return 1 + int(draw * (INT_HIGH - 1))
    return 0.5 + draw


class _Unsupported(Exception):
    pass


def load_reference(definition: Definition) -> Callable:
    """Execute the reference text in a fresh namespace and return its ``run``."""
    namespace: dict[str, Any] = {"__name__": f"tilegym_reference_{definition.name}"}
    exec(compile(definition.reference, f"<reference {definition.name}>", "exec"), namespace)  # noqa: S102
    run = namespace.get("run")
    if not callable(run):
        raise TypeError("reference defines no callable run")
    return run


def _upcast(value, ref_dtype):
    import torch

    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(ref_dtype, copy=True)  # a reference that updates a cache keeps it its own
    if isinstance(value, torch.Tensor):
        return value.clone()
    return value


def _as_outputs(result, names: list[str]) -> list | str:
    """Normalize a returned tensor / tuple / dict into the output order, or say why not."""
    import torch

    if isinstance(result, Mapping):
        missing = [n for n in names if n not in result]
        if missing:
            return f"returned dict lacks output(s) {', '.join(missing)}"
        return [result[n] for n in names]
    if isinstance(result, torch.Tensor):
        result = [result]
    if not isinstance(result, list | tuple):
        return f"returned {type(result).__name__}, expected {len(names)} tensor(s)"
    if len(result) != len(names):
        return f"returned {len(result)} value(s), expected {len(names)} ({', '.join(names)})"
    if not all(isinstance(t, torch.Tensor) for t in result):
        return "returned a non-tensor output"
    return list(result)


def _poisoned(shape, dtype, device):
    import torch

    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    if dtype == torch.bool:
        return torch.zeros(shape, dtype=dtype, device=device)
    return torch.full(shape, torch.iinfo(dtype).min, dtype=dtype, device=device)


def check_parity(
    definition: Definition,
    solution_fn: Callable,
    *,
    device: Any = "cpu",
    destination_passing_style: bool = False,
    seed: int = 0,
    n_shapes: int = 4,
    tolerances: Mapping[str, float] | None = None,
    ref_dtype: Any = None,
) -> list[ParityIssue]:
    """Every way ``solution_fn`` departs from the reference; empty when it matches."""
    import torch

    tolerances = {**TOLERANCES, **(tolerances or {})}
    device = torch.device(device)
    if ref_dtype is None:
        ref_dtype = torch.float64 if device.type == "cpu" else torch.float32
    for spec in definition.outputs.values():
        if torch_dtype(spec.dtype) is None:
            return [
                ParityIssue(codes.PARITY_UNSUPPORTED, f"output dtype {spec.dtype} is not supported")
            ]
    try:
        reference = load_reference(definition)
    except Exception as exc:
        return [
            ParityIssue(
                codes.PARITY_REFERENCE_FAILED, f"reference does not load: {first_line(exc)}"
            )
        ]

    rng = random.Random(seed)
    shapes = sample_shapes(definition, n_shapes, rng)
    if not shapes:
        return [
            ParityIssue(
                codes.PARITY_NO_SHAPE,
                f"no var axis values satisfy the constraints within {MAX_ELEMENTS} elements",
            )
        ]
    mutated = set(definition.tag_values("mutates"))
    names = list(definition.outputs)
    issues: list[ParityIssue] = []
    for binding in shapes:
        where = ", ".join(f"{k}={v}" for k, v in binding.items())
        generator = torch.Generator().manual_seed(rng.randrange(1 << 31))
        try:
            inputs = make_inputs(definition, binding, device, generator)
        except _Unsupported as exc:
            return [ParityIssue(codes.PARITY_UNSUPPORTED, str(exc))]
        except Exception as exc:
            return [
                ParityIssue(
                    codes.PARITY_UNSUPPORTED, f"cannot create inputs on {device}: {first_line(exc)}"
                )
            ]
        snapshots = {
            n: v.clone()
            for n, v in inputs.items()
            if isinstance(v, torch.Tensor) and n not in mutated
        }
        try:
            with torch.no_grad():
                expected = reference(*(_upcast(v, ref_dtype) for v in inputs.values()))
        except Exception as exc:
            issues.append(
                ParityIssue(
                    codes.PARITY_REFERENCE_FAILED, f"[{where}] reference raised {first_line(exc)}"
                )
            )
            continue
        expected = _as_outputs(expected, names)
        if isinstance(expected, str):
            issues.append(
                ParityIssue(codes.PARITY_REFERENCE_FAILED, f"[{where}] reference {expected}")
            )
            continue

        expected_shapes = {n: shape_of(s.shape, binding) for n, s in definition.outputs.items()}
        try:
            with torch.no_grad():
                if destination_passing_style:
                    outputs = [
                        _poisoned(
                            expected_shapes[n], torch_dtype(definition.outputs[n].dtype), device
                        )
                        for n in names
                    ]
                    solution_fn(*inputs.values(), *outputs)
                else:
                    outputs = _as_outputs(solution_fn(*inputs.values()), names)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as exc:
            issues.append(
                ParityIssue(codes.PARITY_LOAD, f"[{where}] solution raised {first_line(exc)}")
            )
            continue
        if isinstance(outputs, str):
            issues.append(ParityIssue(codes.PARITY_OUTPUT_FORM, f"[{where}] solution {outputs}"))
            continue

        for name, snapshot in snapshots.items():
            if not torch.equal(inputs[name], snapshot):
                issues.append(
                    ParityIssue(
                        codes.PARITY_INPUT_MODIFIED,
                        f"[{where}] input {name!r} was modified "
                        f"(declare a 'mutates:{name}' tag if intended)",
                    )
                )
        for name, out, ref in zip(names, outputs, expected, strict=True):
            spec = definition.outputs[name]
            bar = tolerances if spec.tolerance is None else {spec.dtype: spec.tolerance}
            issue = compare_output(name, out, ref, spec.dtype, expected_shapes[name], bar)
            if issue is not None:
                issues.append(ParityIssue(issue.code, f"[{where}] {issue.message}"))
    return issues


def compare_output(name: str, out, ref, dtype_name: str, shape, tolerances) -> ParityIssue | None:
    """One output against the reference: form, finiteness, then relative error."""
    import torch

    dtype = torch_dtype(dtype_name)
    if tuple(out.shape) != tuple(shape):
        return ParityIssue(
            codes.PARITY_OUTPUT_FORM,
            f"output {name!r} has shape {tuple(out.shape)}, expected {tuple(shape)}",
        )
    if out.dtype != dtype:
        return ParityIssue(
            codes.PARITY_OUTPUT_FORM, f"output {name!r} has dtype {out.dtype}, expected {dtype}"
        )
    if tuple(ref.shape) != tuple(shape):
        return ParityIssue(
            codes.PARITY_REFERENCE_FAILED,
            f"reference output {name!r} has shape {tuple(ref.shape)}, expected {tuple(shape)}",
        )
    out64 = out.detach().to("cpu", torch.float64)
    ref64 = ref.detach().to("cpu", torch.float64)
    if not dtype.is_floating_point:
        wrong = int((out64 != ref64).sum())
        if wrong:
            return ParityIssue(
                codes.PARITY_MISMATCH,
                f"output {name!r}: {wrong} of {out64.numel()} elements differ "
                f"(exact dtype {dtype_name})",
            )
        return None
    ref_finite = torch.isfinite(ref64)
    bad = int((~torch.isfinite(out64) & ref_finite).sum())
    if bad:
        return ParityIssue(
            codes.PARITY_NONFINITE,
            f"output {name!r}: {bad} of {out64.numel()} elements are NaN/Inf "
            "where the reference is finite",
        )
    both = ref_finite & torch.isfinite(out64)
    diff = torch.linalg.vector_norm((out64 - ref64)[both])
    scale = torch.linalg.vector_norm(ref64[both])
    error = float(diff / scale) if float(scale) > 0 else float(diff)
    tolerance = tolerances.get(dtype_name, 0.0)
    if not error <= tolerance:
        return ParityIssue(
            codes.PARITY_MISMATCH,
            f"output {name!r}: relative error {error:.3g} exceeds "
            f"the {dtype_name} tolerance {tolerance:g}",
        )
    return None


def load_entry_function(solution: Solution, repo_root: Path) -> Callable:
    """The entry point with the Solution's ``entry_kwargs`` bound (a shared entry point's
    constants for this family: eps, softmax scale, ...)."""
    module = import_entry_module(repo_root / solution.spec.entry_file, repo_root)
    function = getattr(module, solution.spec.entry_function, None)
    if not callable(function):
        raise AttributeError(f"{solution.spec.entry_point} is not a callable")
    if solution.spec.entry_kwargs:
        return functools.partial(function, **solution.spec.entry_kwargs)
    return function


def device_hardware(device: Any) -> str | None:
    """``SM<NN>`` of a CUDA device (None for other devices)."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return f"SM{major}{minor}"


def targets_device(solution: Solution, device: Any) -> bool:
    """Whether the Solution claims the device's architecture (any non-CUDA device counts)."""
    hardware = device_hardware(device)
    return hardware is None or hardware in solution.spec.target_hardware


def parity_paths(
    paths: Iterable[Path],
    repo_root: Path,
    *,
    device: Any = "cuda",
    seed: int = 0,
    n_shapes: int = 4,
) -> list[Finding]:
    """Parity findings for the Solutions selected like ``compile`` selects them."""
    findings: list[Finding] = []
    for path in select_solutions(paths, repo_root):
        loaded = load(path, repo_root)
        if not isinstance(loaded.model, Solution):
            findings.extend(loaded.findings)
            continue
        solution = loaded.model
        if not targets_device(solution, device):
            continue  # SM<NN> promises parity only on the architectures it lists
        line = loaded.doc.line_of(("spec", "entry_point")) if loaded.doc else 1
        definition_path = pair_of(path)
        definition = load(definition_path, repo_root) if definition_path is not None else None
        if definition is None or not isinstance(definition.model, Definition):
            findings.extend(definition.findings if definition is not None else [])
            findings.append(
                finding(
                    loaded.shown,
                    1,
                    codes.SOLUTION_UNPAIRED,
                    "no valid Definition to compare against",
                )
            )
            continue
        try:
            function = load_entry_function(solution, repo_root)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            findings.append(
                finding(
                    loaded.shown,
                    line,
                    codes.PARITY_LOAD,
                    f"cannot load {solution.spec.entry_point}: {first_line(exc)}",
                )
            )
            continue
        issues = check_parity(
            definition.model,
            function,
            device=device,
            destination_passing_style=solution.spec.destination_passing_style,
            seed=seed,
            n_shapes=n_shapes,
        )
        shown = shown_path(path, repo_root)
        findings.extend(finding(shown, line, issue.code, issue.message) for issue in issues)
    return findings
