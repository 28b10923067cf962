"""Broadcast views: `multibroadcast` (numpy rules) and `broadcast` (one input axis placement).

Both return views with stride 0 along the broadcast dimensions, sharing memory with the input,
as MIGraphX's broadcast operators do. The frontend inserts `multibroadcast` in front of every
element-wise operator whose inputs differ in shape.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pygraphx.ir.shape import MAX_RANK, Shape
from pygraphx.ops.base import OneInputOp, ShapeError, ViewOp, register_op


def broadcast_lens(*lens: Sequence[int]) -> list[int]:
    """The numpy-broadcast result of several lens; raises ShapeError when they clash."""
    rank = max((len(x) for x in lens), default=0)
    if rank > MAX_RANK:
        raise ShapeError(f"a broadcast to rank {rank}: at most {MAX_RANK} dimensions are supported")
    out = [1] * rank
    for x in lens:
        padded = [1] * (rank - len(x)) + list(x)
        for k, (a, b) in enumerate(zip(out, padded, strict=True)):
            if a == b or b == 1:
                continue
            if a == 1:
                out[k] = b
            else:
                raise ShapeError(f"lens {[list(v) for v in lens]} cannot be broadcast together")
    return out


@register_op
class Multibroadcast(OneInputOp, ViewOp):
    """Broadcast the input to `out_lens` with numpy's rules (a view)."""

    name = "multibroadcast"
    out_lens: tuple[int, ...] = ()

    def shape_for(self, s: Shape) -> Shape:
        lens, strides, out = s.lens(), s.strides(), list(self.out_lens)
        if len(lens) > len(out):
            raise ShapeError(f"multibroadcast: input rank {len(lens)} > output rank {len(out)}")
        offset = len(out) - len(lens)
        new_strides = [0] * len(out)
        for k, (n, st) in enumerate(zip(lens, strides, strict=True)):
            if n == out[offset + k]:
                new_strides[offset + k] = st if n != 1 else st
            elif n == 1:
                new_strides[offset + k] = 0
            else:
                raise ShapeError(f"multibroadcast: cannot broadcast {lens} to {out}")
        return Shape(s.type(), out, new_strides)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        return np.broadcast_to(args[0], self.out_lens)


@register_op
class Broadcast(OneInputOp, ViewOp):
    """Place the input's dimensions at `axis` of `out_lens`, broadcasting the rest (a view)."""

    name = "broadcast"
    axis: int = 0
    out_lens: tuple[int, ...] = ()

    def shape_for(self, s: Shape) -> Shape:
        out = list(self.out_lens)
        if self.axis + s.ndim() > len(out):
            raise ShapeError(f"broadcast: input {s.lens()} at axis {self.axis} exceeds {out}")
        strides = [0] * len(out)
        for k, (n, st) in enumerate(zip(s.lens(), s.strides(), strict=True)):
            if n != out[self.axis + k]:
                raise ShapeError(f"broadcast: input {s.lens()} does not fit {out} at {self.axis}")
            strides[self.axis + k] = st
        return Shape(s.type(), out, strides)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        trailing = len(self.out_lens) - self.axis - x.ndim
        x = x.reshape(list(x.shape) + [1] * trailing) if trailing else x
        return np.broadcast_to(x, self.out_lens)
