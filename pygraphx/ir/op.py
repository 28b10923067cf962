"""The operator protocol of the IR, and the registry of every operator by name.

It lives in the IR (the bottom layer) because instructions hold operators; the operators
themselves are in `pygraphx.ops`, which registers every one of them here on import.

An operator is a small frozen dataclass: its fields are its attributes, `compute_shape()` derives
the output shape from the input shapes (and raises `ShapeError` with a clear message when the
inputs do not fit), and `compute()` is the reference semantics in numpy that the `ref` target runs.
View operators (broadcast, slice, transpose, reshape of a standard input) return numpy views that
share memory with their input and say so through `output_alias()`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

import numpy as np

from pygraphx.ir.shape import Shape


class ShapeError(ValueError):
    """The inputs of an operator do not fit together; the message says how."""


OPS: dict[str, type[Op]] = {}


def register_op(cls: type[Op]) -> type[Op]:
    """Class decorator: make `cls` a frozen dataclass and register it under `cls.name`."""
    if not dataclasses.is_dataclass(cls) or "__dataclass_fields__" not in cls.__dict__:
        cls = dataclasses.dataclass(frozen=True)(cls)
    if cls.name in OPS and OPS[cls.name] is not cls:
        raise RuntimeError(f"operator {cls.name!r} registered twice")
    OPS[cls.name] = cls
    return cls


def make_op(name: str, **attributes: Any) -> Op:
    """An operator by name, as `migraphx.op("convolution", padding=[1, 1])` makes one."""
    try:
        cls = OPS[name]
    except KeyError:
        raise ValueError(f"unknown operator {name!r}") from None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in attributes.items():
        if key not in fields and f"{key}_" in fields:  # python keywords: global -> global_
            key = f"{key}_"
        if key not in fields:
            raise ValueError(f"operator {name!r} has no attribute {key!r}; it has {list(fields)}")
        kwargs[key] = tuple(value) if isinstance(value, list) else value
    return cls(**kwargs)


class ModuleEvaluator(Protocol):
    """Runs one sub-module with numpy (the runtime's `Evaluator`)."""

    def run(
        self, params: Mapping[str, np.ndarray], outer: Mapping[int, np.ndarray] | None = None
    ) -> list[np.ndarray]: ...


#: what an operator with sub-modules (`if`, `loop`, `scan`, `pointwise`, `fused_reduce`) gets
#: as the last argument of `compute_with_modules(output_shape, args, modules, outer, evaluator)`:
#: it makes the evaluator of a sub-module. Operators sit below the runtime, so they are handed
#: it rather than importing it.
EvaluatorFactory = Callable[[Any], ModuleEvaluator]


@dataclasses.dataclass(frozen=True)
class Op:
    """Base of every IR operator. Subclasses set `name` and define their attributes as fields."""

    name: ClassVar[str] = ""
    #: the output's lens depend on input values (NonZero, Unique, NonMaxSuppression): the
    #: shape is an upper bound, and the ref evaluator accepts any lens within it here and in
    #: every instruction computed from this one
    data_dependent: ClassVar[bool] = False

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        raise NotImplementedError(f"{self.name}: compute_shape")

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        raise NotImplementedError(f"{self.name}: compute")

    def output_alias(self, num_inputs: int) -> int:
        """Index of the input whose memory the output shares (a view), or -1."""
        return -1

    def attributes(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def __str__(self) -> str:
        attrs = self.attributes()
        if not attrs:
            return self.name
        body = ",".join(f"{k}={format_attribute(v)}" for k, v in attrs.items())
        return f"{self.name}[{body}]"


def format_attribute(value: Any) -> str:
    """An attribute value as MIGraphX prints it: lists as `{1, 2}`, bools as 0/1."""
    if isinstance(value, bool | np.bool_):
        return "1" if value else "0"
    if isinstance(value, tuple | list):
        return "{" + ", ".join(format_attribute(v) for v in value) + "}"
    if isinstance(value, float | np.floating):
        return f"{float(value):g}"
    if isinstance(value, Shape):
        return str(value)
    if value is None:
        return "{}"
    return str(value)
