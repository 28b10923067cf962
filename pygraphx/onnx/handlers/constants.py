"""Handlers of ONNX ops whose result is a compile-time constant: Constant, ConstantOfShape,
Range, EyeLike, Shape and Size.

Shapes are static in pygraphx, so Shape and Size are literals; Range and ConstantOfShape fold
their (compile-time) inputs into literals. These are what make exporters' shape-computing chains
(Shape -> Gather -> Unsqueeze -> Concat -> Reshape) foldable by `ctx.require_const`.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.shape import to_dtype
from pygraphx.onnx.context import NodeContext, onnx_type_to_shape_type
from pygraphx.onnx.handlers._runtime_shapes import guard, runtime_lens
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops import make_op
from pygraphx.ops.copy_ops import Concat
from pygraphx.ops.layout import Reshape

Args = list[Instruction | None]


def sparse_to_dense(ctx: NodeContext, sparse: onnx.SparseTensorProto) -> np.ndarray:
    """A dense array from an ONNX sparse tensor (indices flat [NNZ] or per-axis [NNZ, rank])."""
    values = ctx.parser.tensor_to_array(sparse.values).reshape(-1)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dims = [int(d) for d in sparse.dims]
    dense = np.zeros(dims, dtype=values.dtype)
    if values.size == 0:
        return dense
    if indices.ndim == 1:
        dense.reshape(-1)[indices] = values
    elif indices.ndim == 2 and indices.shape[1] == len(dims):
        dense[tuple(indices.T)] = values
    else:
        raise ctx.error(f"sparse tensor indices of shape {list(indices.shape)} do not fit {dims}")
    return dense


@onnx_op("Constant")
def parse_constant(ctx: NodeContext, args: Args) -> Instruction:
    node = ctx.node
    present = [a for a in node.attribute if a.name.startswith("value") or a.name == "sparse_value"]
    if len(present) != 1:
        raise ctx.error(
            f"Constant needs exactly one value attribute, got {[a.name for a in present]}"
        )
    a = present[0]
    name = a.name
    if name == "value":
        # the tensor's own dims: a 0-d constant (a scalar index, say) must stay 0-d
        value = np.asarray(ctx.attr("value")).reshape(tuple(a.t.dims))
    elif name == "sparse_value":
        value = sparse_to_dense(ctx, a.sparse_tensor)
    elif name == "value_float":
        value = np.asarray(ctx.attr(name), dtype=np.float32)
    elif name == "value_floats":
        value = np.asarray(ctx.attr(name), dtype=np.float32).reshape(-1)
    elif name == "value_int":
        value = np.asarray(ctx.attr(name), dtype=np.int64)
    elif name == "value_ints":
        value = np.asarray(ctx.attr(name), dtype=np.int64).reshape(-1)
    else:
        raise ctx.error(f"Constant attribute {name!r} is not supported (string constants)")
    return ctx.literal(value)


@onnx_op("ConstantOfShape", since=9)
def parse_constant_of_shape(ctx: NodeContext, args: Args) -> Instruction:
    shape = ctx.const(args[0])
    runtime = shape is None
    if runtime:
        lens = runtime_lens(ctx, args[0], "input")
    else:
        lens = [int(v) for v in np.asarray(shape).reshape(-1)]
    if any(n < 0 for n in lens):
        raise ctx.error(f"shape {lens} has negative lengths")
    value = ctx.attr("value", None)
    fill = np.zeros((), np.float32) if value is None else np.asarray(value).reshape(-1)[:1]
    if fill.size != 1:
        raise ctx.error("the 'value' attribute must hold one element")
    scalar = ctx.literal(fill.reshape(()))
    out = ctx.broadcast_to(scalar, lens) if lens else scalar
    return guard(ctx, out, args[0], "equal", lens) if runtime else out


@onnx_op("Range", since=11)
def parse_range(ctx: NodeContext, args: Args) -> Instruction:
    values = [ctx.const(a) for a in args[:3]]
    if any(v is None for v in values):
        return _runtime_range(ctx, args)
    start, limit, delta = (np.asarray(v).reshape(()) for v in values)
    if delta == 0:
        raise ctx.error("delta is 0")
    count = max(int(np.ceil((limit.item() - start.item()) / delta.item())), 0)
    return ctx.literal(_range_values(start, delta, count))


def _range_values(start: np.ndarray, delta: np.ndarray, count: int) -> np.ndarray:
    """start + i * delta for i < count, in start's type (integers computed exactly)."""
    dtype = start.dtype
    if np.issubdtype(dtype, np.integer):
        return (int(start) + np.arange(count, dtype=np.int64) * int(delta)).astype(dtype)
    return (start.astype(np.float64) + np.arange(count) * delta.astype(np.float64)).astype(dtype)


def _runtime_range(ctx: NodeContext, args: Args) -> Instruction:
    """Range of run-time scalars: the declared length, start + i * delta computed at run time."""
    dynamic = next(a for a in args[:3] if ctx.const(a) is None)
    (count,) = runtime_lens(ctx, dynamic, "start/limit/delta")
    start, limit, delta = (ctx.add(Reshape((1,)), a) for a in args[:3])
    index = ctx.literal(np.arange(count).astype(start.shape.dtype()))
    steps = ctx.add(make_op("mul"), index, ctx.broadcast_to(delta, [count]))
    out = ctx.add(make_op("add"), steps, ctx.broadcast_to(start, [count]))
    return guard(ctx, out, ctx.add(Concat(0), start, limit, delta), "range", [count])


@onnx_op("EyeLike", since=9)
def parse_eye_like(ctx: NodeContext, args: Args) -> Instruction:
    x = args[0]
    lens = x.shape.lens()
    if len(lens) != 2:
        raise ctx.error(f"input must be 2-D, got lens {lens}")
    to = ctx.attr("dtype", None)
    try:
        type_name = x.shape.type() if to is None else onnx_type_to_shape_type(to)
    except ValueError as exc:
        raise ctx.error(str(exc)) from None
    eye = np.eye(lens[0], lens[1], k=ctx.attr("k", 0), dtype=to_dtype(type_name))
    return ctx.literal(eye)


@onnx_op("Shape")
def parse_shape(ctx: NodeContext, args: Args) -> Instruction:
    lens = args[0].shape.lens()
    if ctx.opset >= 15:
        rank = len(lens)
        start = ctx.attr("start", 0)
        end = ctx.attr("end", rank)
        start = min(max(start + rank if start < 0 else start, 0), rank)
        end = min(max(end + rank if end < 0 else end, 0), rank)
        lens = lens[start:end] if end > start else []
    return ctx.literal(np.asarray(lens, dtype=np.int64).reshape(-1))


@onnx_op("Size")
def parse_size(ctx: NodeContext, args: Args) -> Instruction:
    return ctx.literal(np.asarray(args[0].shape.elements(), dtype=np.int64))
