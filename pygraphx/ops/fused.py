"""Fused operators: one instruction in `main` whose body is a sub-module of the program.

`pointwise(x0, x1, ...), [main:pointwise3]` runs a module of element-wise instructions as one
step (one loop nest, one kernel on the GPU); `fused_reduce` does the same for a reduction with
the element-wise work around it. The reference semantics just evaluate the body.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pygraphx.ir.op import EvaluatorFactory
from pygraphx.ir.shape import Shape
from pygraphx.ops.base import Op, ShapeError, register_op


class _ModuleOp(Op):
    def compute_shape(self, inputs: Sequence[Shape], modules: Sequence[Any] = ()) -> Shape:
        if len(modules) != 1:
            raise ShapeError(f"{self.name}: needs exactly one sub-module, got {len(modules)}")
        body = modules[0]
        params = body.get_parameters()
        if len(params) != len(inputs):
            raise ShapeError(f"{self.name}: {len(inputs)} inputs for {len(params)} parameters")
        for p, s in zip(params, inputs, strict=True):
            if p.shape.lens() != s.lens() or p.shape.type() != s.type():
                raise ShapeError(f"{self.name}: input {s} does not fit parameter {p.shape}")
        outs = body.get_output_shapes()
        if len(outs) != 1:
            raise ShapeError(f"{self.name}: body must return one value, returns {len(outs)}")
        return outs[0].as_standard()

    def compute_with_modules(
        self,
        output_shape: Shape,
        args: Sequence[np.ndarray],
        modules: Sequence[Any],
        outer: Mapping[int, np.ndarray],
        evaluator: EvaluatorFactory,
    ) -> np.ndarray:
        body = modules[0]
        params = {p.op.parameter: a for p, a in zip(body.get_parameters(), args, strict=True)}
        return evaluator(body).run(params)[0]


@register_op
class PointwiseModule(_ModuleOp):
    name = "pointwise"


@register_op
class FusedReduce(_ModuleOp):
    name = "fused_reduce"
