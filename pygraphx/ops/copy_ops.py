"""Copy operators, which always produce new packed data: `concat`, `reverse`, `pad`, `dynamic_pad`.

Unlike the views of `layout.py` (whose axis helpers they use), these never alias their input:
`concat` joins inputs along an axis, `reverse` flips axes and `pad` / `dynamic_pad` pad with a
constant, by reflection, by repeating the edge or periodically (`pad_array`, ONNX Pad's
semantics). `dynamic_pad` takes its pads and constant as run-time inputs, one of the ops for
shape-deciding inputs known only at run time (see the run-time section of `layout.py`).

In the pipeline: the ONNX handlers (`onnx/handlers/layout.py` and others) build them, passes may
fold a zero `pad` into a convolution (`eliminate_pad`), and the numpy `compute()`s here are the
reference semantics.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pygraphx.ir.shape import Shape
from pygraphx.ops.base import OneInputOp, Op, ShapeError, check_arity, check_same_type, register_op
from pygraphx.ops.layout import _axes, _axis, _ints


@register_op
class Reverse(OneInputOp):
    """Reverse the order of the elements along `axes` (a packed copy)."""

    name = "reverse"
    axes: tuple[int, ...] = ()

    def shape_for(self, s: Shape) -> Shape:
        _axes(self, self.axes, s.ndim())
        return Shape(s.type(), s.lens())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        return np.asarray(np.flip(x, tuple(_axes(self, self.axes, x.ndim))), order="C")


@register_op
class Concat(Op):
    """Join the inputs along `axis`; every other dimension must agree (a packed copy)."""

    name = "concat"
    axis: int = 0

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        if not inputs:
            raise ShapeError("concat: expected at least 1 input, got 0")
        check_same_type(self, inputs)
        first = inputs[0]
        axis = _axis(self, self.axis, first.ndim())
        lens = first.lens()
        total = 0
        for s in inputs:
            other = s.lens()
            if len(other) != len(lens) or any(
                a != b for k, (a, b) in enumerate(zip(lens, other, strict=True)) if k != axis
            ):
                raise ShapeError(
                    f"concat: input lens {[x.lens() for x in inputs]} differ outside axis {axis}"
                )
            total += other[axis]
        lens[axis] = total
        return Shape(first.type(), lens)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        axis = self.axis + args[0].ndim if self.axis < 0 else self.axis
        return np.concatenate(args, axis=axis)


PAD_MODES = ("constant", "reflect", "edge", "wrap")


@register_op
class Pad(OneInputOp):
    """Pad with `pads` = [begin_0, ..., begin_n, end_0, ..., end_n] (non-negative).

    `mode` is constant (with `value`), reflect (mirror without the edge), edge (repeat the edge)
    or wrap (continue periodically).
    """

    name = "pad"
    pads: tuple[int, ...] = ()
    mode: str = "constant"
    value: float = 0.0

    def _widths(self, s: Shape) -> list[tuple[int, int]]:
        rank = s.ndim()
        if len(self.pads) != 2 * rank:
            raise ShapeError(
                f"pad: pads {list(self.pads)} must have 2 * rank = {2 * rank} values for "
                f"input lens {s.lens()}"
            )
        if any(p < 0 for p in self.pads):
            raise ShapeError(f"pad: pads {list(self.pads)} must be non-negative (slice to crop)")
        if self.mode not in PAD_MODES:
            raise ShapeError(f"pad: unknown mode {self.mode!r}; known: {', '.join(PAD_MODES)}")
        widths = [(int(self.pads[k]), int(self.pads[k + rank])) for k in range(rank)]
        if self.mode != "constant":
            for n, (b, e) in zip(s.lens(), widths, strict=True):
                if (b or e) and n == 0:
                    raise ShapeError(f"pad: {self.mode} padding of an empty dimension")
        return widths

    def shape_for(self, s: Shape) -> Shape:
        widths = self._widths(s)
        return Shape(s.type(), [n + b + e for n, (b, e) in zip(s.lens(), widths, strict=True)])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        return pad_array(args[0], self.pads, self.mode, self.value)


def _reflect_pad(x: np.ndarray, widths: Sequence[tuple[int, int]]) -> np.ndarray:
    """Mirror padding without repeating the edge; a length-1 dimension repeats its value."""
    for axis, (b, e) in enumerate(widths):
        if not (b or e):
            continue
        if x.shape[axis] == 1:
            x = np.pad(x, [(0, 0)] * axis + [(b, e)] + [(0, 0)] * (x.ndim - axis - 1), "edge")
        else:
            pw = [(0, 0)] * x.ndim
            pw[axis] = (b, e)
            x = np.pad(x, pw, mode="reflect")
    return np.asarray(x, order="C")


def pad_array(x: np.ndarray, pads: Sequence[int], mode: str, value: object = 0) -> np.ndarray:
    """ONNX Pad of an array: pads = begins then ends; negative pads crop (before padding)."""
    rank = x.ndim
    if len(pads) != 2 * rank:
        raise ValueError(f"pads {list(pads)} must have 2 * rank = {2 * rank} values")
    begins, ends = [int(p) for p in pads[:rank]], [int(p) for p in pads[rank:]]
    crop = tuple(
        slice(max(-b, 0), n - max(-e, 0)) for n, b, e in zip(x.shape, begins, ends, strict=True)
    )
    if any(c.start > c.stop for c in crop):
        raise ValueError(f"negative pads {list(pads)} remove more than lens {list(x.shape)}")
    x = x[crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in zip(begins, ends, strict=True)]
    if mode == "constant":
        return np.pad(x, widths, mode="constant", constant_values=np.asarray(value, x.dtype))
    if mode not in PAD_MODES:
        raise ValueError(f"unknown pad mode {mode!r}; known: {', '.join(PAD_MODES)}")
    for n, (b, e) in zip(x.shape, widths, strict=True):
        if (b or e) and n == 0:
            raise ValueError(f"{mode} padding of an empty dimension")
    if mode == "reflect":
        return _reflect_pad(x, widths)
    return np.asarray(np.pad(x, widths, mode=mode), order="C")


@register_op
class DynamicPad(Op):
    """ONNX Pad with run-time pads (input 1, begins then ends) and constant (input 2).

    Negative pads crop; the output lens are static (`out_lens`) and checked at run time.
    """

    name = "dynamic_pad"
    mode: str = "constant"
    out_lens: tuple[int, ...] = ()

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 3)
        s, pads, value = inputs
        if self.mode not in PAD_MODES:
            raise ShapeError(f"dynamic_pad: unknown mode {self.mode!r}")
        if pads.type() not in ("int32_type", "int64_type") or pads.lens() != [2 * s.ndim()]:
            raise ShapeError(f"dynamic_pad: pads must be {2 * s.ndim()} integers, got {pads}")
        if value.elements() != 1:
            raise ShapeError(f"dynamic_pad: the constant must be one value, got {value.lens()}")
        if len(self.out_lens) != s.ndim():
            raise ShapeError(f"dynamic_pad: out_lens {list(self.out_lens)} for input {s.lens()}")
        return Shape(s.type(), self.out_lens)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x, pads, value = args
        return pad_array(x, _ints(pads), self.mode, np.asarray(value).reshape(-1)[0])
