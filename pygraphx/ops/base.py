"""Helpers for writing operators, and the operator protocol re-exported from the IR.

`Op`, `ShapeError`, `OPS`, `register_op` and `make_op` live in `pygraphx.ir.op` (instructions
hold operators, so the protocol belongs to the bottom layer); they are re-exported here so an
operator module imports everything it needs from one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pygraphx.ir.op import (
    OPS,
    EvaluatorFactory,
    Op,
    ShapeError,
    format_attribute,
    make_op,
    register_op,
)
from pygraphx.ir.shape import Shape

__all__ = [
    "OPS",
    "BodyCall",
    "ModuleOp",
    "OneInputOp",
    "Op",
    "ShapeError",
    "ViewOp",
    "check_arity",
    "check_same_type",
    "format_attribute",
    "make_op",
    "normalize_axis",
    "one_input",
    "register_op",
]


def check_arity(op: Op, inputs: Sequence[Shape], *counts: int) -> None:
    if len(inputs) not in counts:
        want = " or ".join(str(c) for c in counts)
        raise ShapeError(f"{op.name}: expected {want} inputs, got {len(inputs)}")


def one_input(op: Op, inputs: Sequence[Shape]) -> Shape:
    """The shape of a one-input operator's input (a ShapeError naming `op` otherwise)."""
    check_arity(op, inputs, 1)
    return inputs[0]


class OneInputOp(Op):
    """An operator of one input whose output shape follows from that input's: subclasses
    write `shape_for(s)`; `compute_shape` checks the arity first (an error naming the op)."""

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        return self.shape_for(one_input(self, inputs))

    def shape_for(self, s: Shape) -> Shape:
        """The output shape for input shape `s`."""
        raise NotImplementedError(f"{self.name}: shape_for")


class ViewOp(Op):
    """An operator whose output is a view of its input 0 (shares its memory)."""

    def output_alias(self, num_inputs: int) -> int:
        return 0


@dataclasses.dataclass(frozen=True)
class BodyCall:
    """One evaluation of an instruction that carries sub-modules: its argument arrays, its
    bodies, the values of the enclosing modules its bodies may read (`outer`) and the factory
    of sub-module evaluators (operators sit below the runtime, so they are handed it)."""

    args: Sequence[np.ndarray]
    modules: Sequence[Any]
    outer: Mapping[int, np.ndarray]
    evaluator: EvaluatorFactory

    def params(self, module: Any, args: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """`module`'s parameters bound in order to `args`."""
        return {p.op.parameter: a for p, a in zip(module.get_parameters(), args, strict=True)}

    def run(self, module: Any, args: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Evaluate `module` with its parameters bound in order to `args` (outer values seen)."""
        return self.evaluator(module).run(self.params(module, args), outer=self.outer)


class ModuleOp(Op):
    """An operator whose instruction carries sub-modules (`if`, `loop`, `scan`, `pointwise`,
    `fused_reduce`). The evaluators call `compute_with_modules`; subclasses write `evaluate`."""

    def compute_with_modules(
        self,
        output_shape: Shape,
        args: Sequence[np.ndarray],
        modules: Sequence[Any],
        outer: Mapping[int, np.ndarray],
        evaluator: EvaluatorFactory,
    ) -> np.ndarray:
        return self.evaluate(BodyCall(args, modules, outer, evaluator))

    def evaluate(self, call: BodyCall) -> np.ndarray:
        """This instruction's value, computed by running its bodies as `call` allows."""
        raise NotImplementedError(f"{self.name}: evaluate")


def check_same_type(op: Op, inputs: Sequence[Shape]) -> None:
    types = {s.type() for s in inputs}
    if len(types) > 1:
        raise ShapeError(f"{op.name}: inputs have different types {sorted(types)}")


def normalize_axis(op: Op, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"{op.name}: axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis
