"""Typed Definition and Solution records (FlashInfer-Bench field set).

Built only from documents that already passed the JSON Schema, so construction cannot fail
on shape; the semantic rules live in ``semantics``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Axis:
    """A named dimension: ``const`` with a fixed ``value`` or ``var`` bound at run time."""

    name: str
    kind: str  # "const" or "var"
    value: int | None = None
    description: str | None = None


@dataclass(frozen=True)
class TensorSpec:
    """An input or output: axis names (None for a scalar) and a FlashInfer dtype name."""

    name: str
    shape: tuple[str, ...] | None
    dtype: str
    description: str | None = None
    # The axis an integer input's values index (expert ids index ``E``), so parity draws them
    # in [0, size of that axis). A project extension; outputs never carry it.
    index_of: str | None = None
    # An output's parity tolerance in place of its dtype's (an fp32 state that a Solution builds
    # from bf16 inputs with tf32 products). A project extension; inputs never carry it.
    tolerance: float | None = None


@dataclass(frozen=True)
class Definition:
    name: str
    op_type: str
    axes: dict[str, Axis]
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    reference: str
    tags: tuple[str, ...] = ()
    description: str | None = None
    constraints: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Definition:
        axes = {
            name: Axis(name, spec["type"], spec.get("value"), spec.get("description"))
            for name, spec in data["axes"].items()
        }
        return cls(
            name=data["name"],
            op_type=data["op_type"],
            axes=axes,
            inputs=_tensors(data["inputs"]),
            outputs=_tensors(data["outputs"]),
            reference=data["reference"],
            tags=tuple(data.get("tags", ())),
            description=data.get("description"),
            constraints=tuple(data.get("constraints", ())),
        )

    def tag_values(self, namespace: str) -> list[str]:
        """Values of the tags ``namespace:value`` (e.g. ``mutates`` -> input names)."""
        prefix = f"{namespace}:"
        return [tag[len(prefix) :] for tag in self.tags if tag.startswith(prefix)]


def _tensors(data: dict[str, Any]) -> dict[str, TensorSpec]:
    return {
        name: TensorSpec(
            name,
            tuple(spec["shape"]) if spec["shape"] is not None else None,
            spec["dtype"],
            spec.get("description"),
            spec.get("index_of"),
            spec.get("tolerance"),
        )
        for name, spec in data.items()
    }


@dataclass(frozen=True)
class BuildSpec:
    language: str
    target_hardware: tuple[str, ...]
    entry_point: str
    dependencies: tuple[str, ...] = ()
    destination_passing_style: bool = True  # FlashInfer-Bench's default
    # Keyword arguments bound to the entry point: the constants (eps, softmax scale, ...) that make
    # a shared entry point (``src/tilegym/ops/entry/``) this family's kernel. A project extension.
    entry_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def entry_file(self) -> str:
        return self.entry_point.split("::", 1)[0]

    @property
    def entry_function(self) -> str:
        return self.entry_point.split("::", 1)[1]


@dataclass(frozen=True)
class Solution:
    name: str
    definition: str
    author: str
    spec: BuildSpec
    sources: tuple[str, ...]
    description: str | None = None
    source_contents: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Solution:
        spec = data["spec"]
        return cls(
            name=data["name"],
            definition=data["definition"],
            author=data["author"],
            spec=BuildSpec(
                language=spec["language"],
                target_hardware=tuple(spec["target_hardware"]),
                entry_point=spec["entry_point"],
                dependencies=tuple(spec.get("dependencies", ())),
                destination_passing_style=spec.get("destination_passing_style", True),
                entry_kwargs=dict(spec.get("entry_kwargs", {})),
            ),
            sources=tuple(source["path"] for source in data["sources"]),
            description=data.get("description"),
            source_contents={
                source["path"]: source["content"]
                for source in data["sources"]
                if "content" in source
            },
        )

    def gpu_codes(self) -> list[str]:
        """``SM90`` -> ``sm_90``: the ``gpu_code`` names cuTile's compiler takes."""
        return [f"sm_{hw[2:]}" for hw in self.spec.target_hardware]
