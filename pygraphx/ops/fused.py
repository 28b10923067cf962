"""Fused operators: one instruction in `main` whose body is a sub-module of the program.

`pointwise(x0, x1, ...), [main:pointwise3]` runs a module of element-wise instructions as one
step (one loop nest, one kernel on the GPU); `fused_reduce` does the same for a reduction with
the element-wise work around it. The reference semantics just evaluate the body.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pygraphx.ir.shape import Shape
from pygraphx.ops.base import BodyCall, ModuleOp, ShapeError, register_op


class _FusedOp(ModuleOp):
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

    def evaluate(self, call: BodyCall) -> np.ndarray:
        body = call.modules[0]
        # a fused body reads only its parameters: no outer values to copy in
        return call.evaluator(body).run(call.params(body, call.args))[0]


@register_op
class PointwiseModule(_FusedOp):
    name = "pointwise"


@register_op
class FusedReduce(_FusedOp):
    name = "fused_reduce"
