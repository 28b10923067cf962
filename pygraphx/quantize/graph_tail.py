"""graph_tail: which instructions of a program are its "tail", the arithmetic after its last
matrix products on the way to an output (for `truncate_float`'s `"products"` policy).

OpenVINO's CPU plugin keeps the tail of a bf16 graph in float32 (`Graph::
EnforceInferencePrecision`: from each output it walks back through the producers, stopping at
the products - Convolution, FullyConnected, MatMul, ... - and every node it reaches keeps its
float32 precision, "necessary to maintain accuracy"). A detector's box decoding is such a tail:
distances from the DFL product, plus anchor points, times the stride, values up to the image
size (640), where bf16's 8-bit mantissa has an ulp of 4.

`graph_tail(module, products)` walks the same way from the module's `@return` (or its last
instruction), with two differences from OpenVINO, both so that the rule costs no time:

* a product's own epilogue - a pointwise instruction whose run-time inputs are all products or
  such epilogues (a bias add, an activation on the result) - belongs to the product: the walk
  stops there as at the product, so a convolution's or GEMM's fused epilogue stays whole (as
  OpenVINO's FullyConnected and most of its Convolution nodes carry their bias);
* data movement (views, `concat`, `contiguous`) is walked through but not returned: it changes
  no value, so it follows its inputs' type.

The instructions returned are the arithmetic of the tail; `truncate_float` keeps them in their
float type.
"""

from __future__ import annotations

from collections.abc import Collection

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ops.base import ViewOp
from pygraphx.ops.literal_views import view_source
from pygraphx.ops.pointwise import Pointwise

__all__ = ["MOVE_OPS", "graph_tail", "is_constant_view"]

#: operators that only move values (besides views): they follow their inputs' type
MOVE_OPS = frozenset({"concat", "contiguous"})


def is_constant_view(ins: Instruction) -> bool:
    """`ins` is a chain of one-input views (no module calls) ending at a literal."""
    return view_source(ins).is_literal()


def moves_only(ins: Instruction) -> bool:
    """`ins` only moves values (a view, a concatenation, a copy)."""
    return isinstance(ins.op, ViewOp) or ins.op.name in MOVE_OPS


def graph_tail(module: Module, products: Collection[str]) -> set[Instruction]:
    """The arithmetic instructions of `module` from which an output is reached without passing
    through an instruction named in `products` or a product's epilogue (module docstring)."""
    if not module.instructions:
        return set()
    last = module.instructions[-1]
    todo = list(last.inputs) if last.is_return() else [last]
    epilogues = _epilogues(module, products)
    tail: set[Instruction] = set()
    seen: set[Instruction] = set()
    while todo:
        ins = todo.pop()
        if ins in seen:
            continue
        seen.add(ins)
        if ins.op.name in products or ins.is_literal() or ins.is_param():
            continue
        if is_constant_view(ins) or ins in epilogues:
            continue
        if not moves_only(ins):
            tail.add(ins)
        todo.extend(ins.inputs)
    return tail


def _epilogues(module: Module, products: Collection[str]) -> set[Instruction]:
    """The instructions of `module` that are pointwise work on products' results and constants
    only (a bias, an activation, and such work on those): one pass in program order, so a chain
    of any length needs no recursion."""
    found: set[Instruction] = set()
    for ins in module.instructions:
        if not isinstance(ins.op, Pointwise) or ins.module_inputs:
            continue
        run = [x for x in ins.inputs if not is_constant_view(x)]
        if run and all(x.op.name in products or x in found for x in run):
            found.add(ins)
    return found
