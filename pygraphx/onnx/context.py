"""The per-node context a handler receives: attributes, IR building, constants, broadcasting.

A handler is `fn(ctx, args) -> Instruction | list[Instruction | None]` where `args` are the
node's inputs as instructions (`None` for omitted optional inputs). Through `ctx` it reads ONNX
attributes (`ctx.attr("axis", 0)`), adds IR (`ctx.add(op, x, y)`, `ctx.literal(array)`), asks for
compile-time values of inputs (`ctx.const(ins)`; shape-computing chains fold this way) and
raises errors that name the node (`raise ctx.error("...")`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import numpy_helper

from pygraphx.ir.argument import Literal
from pygraphx.ir.instruction import Instruction, reachable
from pygraphx.ir.shape import Shape, from_dtype
from pygraphx.onnx.errors import InputValueNeeded, OnnxParseError
from pygraphx.ops.base import Op
from pygraphx.ops.broadcast import Multibroadcast, broadcast_lens
from pygraphx.ops.pointwise import Convert

if TYPE_CHECKING:
    from pygraphx.ir.module import Module
    from pygraphx.onnx.parser import OnnxParser

_MISSING = object()


def _params_feeding(ins: Instruction | None) -> list[Instruction]:
    """The parameters `ins` is computed from."""
    if ins is None:
        return []
    return [x for x in reachable([ins], lambda x: x.inputs) if x.is_param()]


def _expected_types(default: Any) -> tuple[int, ...]:
    """The attribute types a handler's default implies (an int default: INT; a float: FLOAT,
    or INT which converts exactly; ...); () when the default says nothing (None, empty)."""
    t = onnx.AttributeProto
    if isinstance(default, bool):
        return (t.INT,)
    if isinstance(default, int):
        return (t.INT,)
    if isinstance(default, float):
        return (t.FLOAT, t.INT)
    if isinstance(default, str):
        return (t.STRING,)
    if isinstance(default, tuple | list) and default:
        if all(isinstance(v, int) for v in default):
            return (t.INTS,)
        if all(isinstance(v, float | int) for v in default):
            return (t.FLOATS, t.INTS)
    return ()


def onnx_type_to_shape_type(elem_type: int) -> str:
    """The shape type name of an ONNX TensorProto element type."""
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
        return from_dtype(dtype)
    except (KeyError, ValueError, TypeError):
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type else "UNDEFINED"
        raise ValueError(f"ONNX element type {name} is not supported") from None


class NodeContext:
    """What a handler needs to turn one ONNX node into IR instructions."""

    def __init__(
        self, parser: OnnxParser, node: onnx.NodeProto, module: Module, opset: int
    ) -> None:
        self.parser = parser
        self.node = node
        self.module = module
        self.opset = opset
        self.op_type = node.op_type
        self.domain = node.domain or "ai.onnx"
        self.name = node.name
        self._attrs = {a.name: a for a in node.attribute}

    # --- node facts -----------------------------------------------------------------------
    @property
    def num_outputs(self) -> int:
        """Number of outputs the node asks for (trailing omitted ones not counted)."""
        outs = list(self.node.output)
        while outs and not outs[-1]:
            outs.pop()
        return len(outs)

    def describe(self) -> str:
        first = repr(self.node.output[0]) if self.node.output else "none"
        label = repr(self.name) if self.name else f"(unnamed, output {first})"
        return f"node {label} ({self.domain}::{self.op_type}, opset {self.opset})"

    def error(self, message: str) -> OnnxParseError:
        return OnnxParseError(f"{self.parser.source}: {self.describe()}: {message}")

    # --- attributes -----------------------------------------------------------------------
    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    def attr(self, name: str, default: Any = _MISSING) -> Any:
        """The decoded attribute: ints/floats as tuples, strings as str, tensors as arrays."""
        a = self._attrs.get(name)
        if a is None:
            if default is _MISSING:
                raise self.error(f"required attribute {name!r} is missing")
            return default
        t = onnx.AttributeProto
        expected = _expected_types(default)
        if expected and a.type not in expected:
            want = " or ".join(t.AttributeType.Name(e) for e in expected)
            raise self.error(
                f"attribute {name!r} must be {want}, got {t.AttributeType.Name(a.type)}"
            )
        if a.type == t.INT:
            return int(a.i)
        if a.type == t.FLOAT:
            return float(a.f)
        if a.type == t.STRING:
            return a.s.decode("utf-8")
        if a.type == t.INTS:
            return tuple(int(x) for x in a.ints)
        if a.type == t.FLOATS:
            return tuple(float(x) for x in a.floats)
        if a.type == t.STRINGS:
            return tuple(s.decode("utf-8") for s in a.strings)
        if a.type == t.TENSOR:
            return self.parser.tensor_to_array(a.t)
        if a.type == t.GRAPH:
            return a.g
        if a.type == t.GRAPHS:
            return tuple(a.graphs)
        if a.type == t.SPARSE_TENSOR:
            return numpy_helper.to_array(a.sparse_tensor)
        raise self.error(f"attribute {name!r} has an unsupported type {a.type}")

    # --- building -------------------------------------------------------------------------
    def add(self, op: Op, *inputs: Instruction) -> Instruction:
        return self.module.add_instruction(op, list(inputs))

    def literal(self, value: Any, dtype: Any = None) -> Instruction:
        arr = np.asarray(value, dtype=dtype)
        return self.module.add_literal(Literal(arr))

    def convert(self, ins: Instruction, type_name: str) -> Instruction:
        if ins.shape.type() == type_name:
            return ins
        return self.add(Convert(type_name), ins)

    def broadcast_to(self, ins: Instruction, lens: Sequence[int]) -> Instruction:
        if ins.shape.lens() == list(lens):
            return ins
        return self.add(Multibroadcast(tuple(lens)), ins)

    def scalar(self, value: Any, like: Instruction) -> Instruction:
        """`value` in `like`'s type, broadcast to `like`'s lens (a constant operand)."""
        lit = self.literal(np.asarray(value, dtype=like.shape.dtype()))
        return self.broadcast_to(lit, like.shape.lens())

    def broadcast(self, *inputs: Instruction) -> list[Instruction]:
        """Multibroadcast inputs to their common lens (numpy rules), as MIGraphX does."""
        lens = broadcast_lens(*(i.shape.lens() for i in inputs))
        return [self.broadcast_to(i, lens) for i in inputs]

    def inline(self, graph: onnx.GraphProto, inputs: Sequence[Any], label: str) -> list[Any]:
        """Parse the sub-graph `graph` into this node's module with `inputs` as its inputs
        (one unrolled iteration or element); it sees every value in scope here."""
        parser = self.parser
        return parser.parse_subgraph(
            graph, self.module, parser.scope_values(), label=label, inputs=inputs
        )

    # --- compile-time values --------------------------------------------------------------
    def const(self, ins: Instruction | None) -> np.ndarray | None:
        """The value of `ins` if it depends on literals only, else None."""
        if ins is None:
            return None
        return self.parser.const_value(ins)

    def require_const(self, ins: Instruction | None, what: str) -> np.ndarray:
        value = self.const(ins)
        if value is None:
            params = _params_feeding(ins)
            message = (
                f"{self.parser.source}: {self.describe()}: input {what!r} must be known at "
                "compile time (a constant, or computed from static shapes); it depends on "
                "a runtime value"
            )
            if params and not any(p.module.parent is not None for p in params):
                names = sorted(p.op.parameter for p in params)
                raise InputValueNeeded(
                    f"{message} (graph input(s) {names}; parse with "
                    "specialize_on_input_values=True to compile per value at run time)",
                    set(names),
                )
            raise OnnxParseError(message)
        return value

    def shape_of(self, ins: Instruction) -> Shape:
        return ins.shape

    def declared_lens(self, k: int = 0) -> list[int] | None:
        """The static lens the model declares for output `k` (graph outputs and value_info,
        e.g. from ONNX shape inference), or None when it declares none or a symbolic one."""
        outputs = self.node.output
        if k >= len(outputs) or not outputs[k]:
            return None
        vi = self.parser.value_info(outputs[k])
        if vi is None or not vi.type.HasField("tensor_type"):
            return None
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            return None
        lens = []
        for d in tt.shape.dim:
            if not d.HasField("dim_value") or d.dim_value < 0:
                return None
            lens.append(int(d.dim_value))
        return lens
