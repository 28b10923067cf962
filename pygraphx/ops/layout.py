"""Layout operators: views that re-describe a buffer, and the run-time shape checks.

Views (`transpose`, `slice`, `step`, `squeeze`, `unsqueeze`, and `reshape` / `flatten` of a
standard input) return numpy views sharing memory with their input; their `compute_shape` gives
the view's strides and `output_alias()` is 0, as in MIGraphX. `reshape` and `flatten` of a
non-standard input (a transpose, a broadcast) still compute the right values: they copy first,
and their shape is then standard. The ops that always produce new packed data (`concat`,
`reverse`, `pad`, `dynamic_pad`) are in `copy_ops.py`. `shape_guard` and `dynamic_slice` serve
ONNX inputs that decide a shape but are only known at run time (see the section below); the
shape rules here (`reshape_lens`, `slice_ranges`, ...) are shared with the ONNX handlers.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np

from pygraphx.ir.shape import MAX_RANK, Shape
from pygraphx.ops.base import OneInputOp, Op, ShapeError, ViewOp, check_arity, register_op
from pygraphx.ops.broadcast import broadcast_lens


def _axis(op: Op, axis: int, rank: int) -> int:
    """`axis` in [-rank, rank) made non-negative; ShapeError naming the op otherwise."""
    if not -rank <= axis < rank:
        raise ShapeError(f"{op.name}: axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _axes(op: Op, axes: Sequence[int], rank: int) -> list[int]:
    """Normalised axes; repeated axes are an error."""
    out = [_axis(op, a, rank) for a in axes]
    if len(set(out)) != len(out):
        raise ShapeError(f"{op.name}: repeated axes {list(axes)}")
    return out


def reshape_lens(lens: Sequence[int], dims: Sequence[int], allowzero: bool = False) -> list[int]:
    """Resolve reshape dims (ONNX/MIGraphX rules): 0 copies the input dimension unless
    `allowzero`, one -1 is inferred. Raises ValueError when the dims do not fit `lens`."""
    if len(dims) > MAX_RANK:
        raise ValueError(f"{len(dims)} target dimensions: at most {MAX_RANK} are supported")
    out = []
    infer = -1
    for k, d in enumerate(dims):
        d = int(d)
        if d == 0 and not allowzero:
            if k >= len(lens):
                raise ValueError(f"dims {list(dims)}: the 0 at {k} has no input dimension")
            out.append(int(lens[k]))
        elif d == -1:
            if infer >= 0:
                raise ValueError(f"dims {list(dims)} have more than one -1")
            infer = k
            out.append(1)
        elif d < 0:
            raise ValueError(f"dims {list(dims)} contain the negative {d}")
        else:
            out.append(d)
    total = prod(lens)
    if infer >= 0:
        rest = prod(out)
        if rest == 0 or total % rest:
            raise ValueError(f"cannot infer the -1 in dims {list(dims)} for lens {list(lens)}")
        out[infer] = total // rest
    if prod(out) != total:
        raise ValueError(
            f"dims {list(dims)} ({prod(out)} elements) do not fit lens {list(lens)} "
            f"({total} elements)"
        )
    return out


def squeeze_lens(lens: Sequence[int], axes: Sequence[int] | None) -> list[int]:
    """ONNX Squeeze: drop `axes` (all length-1 axes when None); ValueError if one is not 1."""
    rank = len(lens)
    if axes is None:
        return [n for n in lens if n != 1]
    norm = normalize_axes(axes, rank)
    for a in norm:
        if lens[a] != 1:
            raise ValueError(f"cannot squeeze axis {a} of lens {list(lens)}: it is not 1")
    return [n for k, n in enumerate(lens) if k not in norm]


def unsqueeze_lens(lens: Sequence[int], axes: Sequence[int]) -> list[int]:
    """ONNX Unsqueeze: insert 1s at `axes` (positions in the output)."""
    rank = len(lens) + len(axes)
    norm = normalize_axes(axes, rank)
    src = iter(lens)
    return [1 if k in norm else next(src) for k in range(rank)]


def normalize_axes(axes: Sequence[int], rank: int) -> list[int]:
    """Axes in [-rank, rank) made non-negative; ValueError when out of range or repeated."""
    out = []
    for a in axes:
        a = int(a)
        if not -rank <= a < rank:
            raise ValueError(f"axis {a} is out of range for rank {rank}")
        out.append(a + rank if a < 0 else a)
    if len(set(out)) != len(out):
        raise ValueError(f"axes {list(axes)} repeat an axis")
    return out


def slice_ranges(
    lens: Sequence[int],
    starts: Sequence[int],
    ends: Sequence[int],
    axes: Sequence[int] | None = None,
    steps: Sequence[int] | None = None,
) -> list[tuple[int, int, int]]:
    """ONNX Slice as one normalised (start, stop, step) per dimension.

    Negative starts/ends count from the end; then, for a positive step, both clamp to [0, n];
    for a negative step the start clamps to [0, n-1] and the end to [-1, n-1] (-1 meaning
    "past the first element"). The result indexes like Python's range(start, stop, step).
    """
    rank = len(lens)
    axes = list(range(len(starts))) if axes is None else list(axes)
    steps = [1] * len(starts) if steps is None else list(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ValueError(
            f"starts {list(starts)}, ends {list(ends)}, axes {axes} and steps {steps} differ "
            "in length"
        )
    out = [(0, int(n), 1) for n in lens]
    for a, b, e, st in zip(normalize_axes(axes, rank), starts, ends, steps, strict=True):
        n, b, e, st = int(lens[a]), int(b), int(e), int(st)
        if st == 0:
            raise ValueError(f"slice step along axis {a} is 0")
        b = b + n if b < 0 else b
        e = e + n if e < 0 else e
        if st > 0:
            b, e = min(max(b, 0), n), min(max(e, 0), n)
        else:
            b, e = min(max(b, 0), n - 1), min(max(e, -1), n - 1)
        out[a] = (b, e, st)
    return out


def _reshape_lens(op: Op, lens: Sequence[int], dims: Sequence[int]) -> list[int]:
    try:
        return reshape_lens(lens, dims)
    except ValueError as exc:
        raise ShapeError(f"{op.name}: {exc}") from None


def _reshape_array(x: np.ndarray, lens: Sequence[int]) -> np.ndarray:
    """A view when `x` is row-major contiguous, else a packed copy reshaped."""
    if x.flags.c_contiguous:
        return x.reshape(lens)
    return np.asarray(x, order="C").reshape(lens)


class _Reshaping(OneInputOp, ViewOp):
    """The same elements in row-major order with the output's lens (a view of a standard
    input, a packed copy of any other)."""

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        return _reshape_array(args[0], output_shape.lens())


@register_op
class Transpose(OneInputOp, ViewOp):
    """Permute the dimensions: output dimension k is input dimension `permutation[k]` (a view)."""

    name = "transpose"
    permutation: tuple[int, ...] = ()

    def shape_for(self, s: Shape) -> Shape:
        perm = list(self.permutation)
        if sorted(perm) != list(range(s.ndim())):
            raise ShapeError(
                f"transpose: permutation {perm} is not a permutation of the {s.ndim()} "
                f"dimensions of {s.lens()}"
            )
        lens, strides = s.lens(), s.strides()
        return Shape(s.type(), [lens[p] for p in perm], [strides[p] for p in perm])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        return np.transpose(args[0], self.permutation)


@register_op
class Reshape(_Reshaping):
    """New lens with the same elements in row-major order; `dims` may hold one -1 and 0s.

    A view of a standard input; a non-standard input (transposed, broadcast, strided) is copied
    first, so the output is always standard.
    """

    name = "reshape"
    dims: tuple[int, ...] = ()

    def shape_for(self, s: Shape) -> Shape:
        return Shape(s.type(), _reshape_lens(self, s.lens(), self.dims))


@register_op
class Flatten(_Reshaping):
    """Reshape to 2-D: [prod(lens[:axis]), prod(lens[axis:])] (a view of a standard input)."""

    name = "flatten"
    axis: int = 1

    def shape_for(self, s: Shape) -> Shape:
        rank = s.ndim()
        if not -rank <= self.axis <= rank:
            raise ShapeError(f"flatten: axis {self.axis} is out of range for rank {rank}")
        axis = self.axis + rank if self.axis < 0 else self.axis
        lens = s.lens()
        return Shape(s.type(), [prod(lens[:axis]), prod(lens[axis:])])


@register_op
class Squeeze(OneInputOp, ViewOp):
    """Remove dimensions of length 1: those in `axes`, or every one when `axes` is empty."""

    name = "squeeze"
    axes: tuple[int, ...] = ()

    def _kept(self, s: Shape) -> list[int]:
        lens = s.lens()
        if not self.axes:
            return [k for k, n in enumerate(lens) if n != 1]
        axes = _axes(self, self.axes, s.ndim())
        for a in axes:
            if lens[a] != 1:
                raise ShapeError(
                    f"squeeze: axis {a} of input lens {lens} has length {lens[a]}, not 1"
                )
        return [k for k in range(len(lens)) if k not in axes]

    def shape_for(self, s: Shape) -> Shape:
        kept = self._kept(s)
        lens, strides = s.lens(), s.strides()
        return Shape(s.type(), [lens[k] for k in kept], [strides[k] for k in kept])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        drop = tuple(k for k in range(x.ndim) if k not in self._kept(Shape(x.dtype, x.shape)))
        return np.squeeze(x, axis=drop) if drop else x[...]


@register_op
class Unsqueeze(OneInputOp, ViewOp):
    """Insert dimensions of length 1 at `axes` (positions in the output) (a view)."""

    name = "unsqueeze"
    axes: tuple[int, ...] = ()

    def shape_for(self, s: Shape) -> Shape:
        rank = s.ndim() + len(self.axes)
        axes = _axes(self, self.axes, rank)
        lens: list[int] = []
        strides: list[int] = []
        src = iter(zip(s.lens(), s.strides(), strict=True))
        for k in range(rank):
            if k in axes:
                lens.append(1)
                strides.append(-1)  # filled below
            else:
                n, st = next(src)
                lens.append(n)
                strides.append(st)
        # a new axis gets the stride that steps over the dimension to its right (MIGraphX's)
        for k in range(rank - 1, -1, -1):
            if strides[k] == -1:
                strides[k] = 1 if k == rank - 1 else max(lens[k + 1] * strides[k + 1], 1)
        return Shape(s.type(), lens, strides)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        rank = x.ndim + len(self.axes)
        return np.expand_dims(x, tuple(_axes(self, self.axes, rank)))


def _clamp_bounds(n: int, start: int, end: int) -> tuple[int, int]:
    """Slice bounds for step 1: negatives count from the end, then clamp to [0, n]."""
    if start < 0:
        start += n
    if end < 0:
        end += n
    start = min(max(start, 0), n)
    end = min(max(end, 0), n)
    return start, max(end, start)


@register_op
class Slice(OneInputOp, ViewOp):
    """`x[starts:ends]` along `axes` with step 1 (a view); bounds follow numpy's clamping."""

    name = "slice"
    axes: tuple[int, ...] = ()
    starts: tuple[int, ...] = ()
    ends: tuple[int, ...] = ()

    def _bounds(self, s: Shape) -> list[tuple[int, int]]:
        if not len(self.axes) == len(self.starts) == len(self.ends):
            raise ShapeError(
                f"slice: axes {list(self.axes)}, starts {list(self.starts)} and ends "
                f"{list(self.ends)} differ in length"
            )
        lens = s.lens()
        bounds = [(0, n) for n in lens]
        for a, b, e in zip(_axes(self, self.axes, s.ndim()), self.starts, self.ends, strict=True):
            bounds[a] = _clamp_bounds(lens[a], int(b), int(e))
        return bounds

    def shape_for(self, s: Shape) -> Shape:
        lens = [e - b for b, e in self._bounds(s)]
        return Shape(s.type(), lens, s.strides())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        bounds = self._bounds(Shape(x.dtype, x.shape))
        return x[tuple(slice(b, e) for b, e in bounds)]


@register_op
class Step(OneInputOp, ViewOp):
    """Every `steps[k]`-th element along `axes[k]`, from the first (a view; steps > 0)."""

    name = "step"
    axes: tuple[int, ...] = ()
    steps: tuple[int, ...] = ()

    def _steps(self, s: Shape) -> list[int]:
        if len(self.axes) != len(self.steps):
            raise ShapeError(
                f"step: axes {list(self.axes)} and steps {list(self.steps)} differ in length"
            )
        steps = [1] * s.ndim()
        for a, st in zip(_axes(self, self.axes, s.ndim()), self.steps, strict=True):
            if st <= 0:
                raise ShapeError(f"step: steps must be positive, got {list(self.steps)}")
            steps[a] = int(st)
        return steps

    def shape_for(self, s: Shape) -> Shape:
        steps = self._steps(s)
        lens = [(n + st - 1) // st for n, st in zip(s.lens(), steps, strict=True)]
        strides = [x * st for x, st in zip(s.strides(), steps, strict=True)]
        return Shape(s.type(), lens, strides)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        return x[tuple(slice(None, None, st) for st in self._steps(Shape(x.dtype, x.shape)))]


# --- run-time shape parameters ----------------------------------------------------------
#
# pygraphx shapes are static, but ONNX lets Reshape's shape, Slice's starts, Pad's pads, ...
# be run-time tensors (graph inputs). When the model declares the node's output shape, the
# frontend builds static IR from that shape and checks the run-time values against it: the ops
# below (and `dynamic_pad` in copy_ops.py) take those tensors as extra inputs, compute from
# them, and raise when they disagree with the static output (the evaluator checks every result's
# lens as well).


def _ints(v: np.ndarray) -> list[int]:
    return [int(x) for x in np.asarray(v).reshape(-1)]


def _guard_range(lens: Sequence[int], v: np.ndarray) -> list[int]:
    start, limit, delta = (np.asarray(v).reshape(-1)[k].item() for k in range(3))
    if delta == 0:
        raise ValueError("range delta is 0")
    return [max(int(np.ceil((limit - start) / delta)), 0)]


GUARD_RULES = {
    "reshape": lambda lens, v: reshape_lens(lens, _ints(v)),
    "reshape_allowzero": lambda lens, v: reshape_lens(lens, _ints(v), allowzero=True),
    "squeeze": lambda lens, v: squeeze_lens(lens, _ints(v)),
    "unsqueeze": lambda lens, v: unsqueeze_lens(lens, _ints(v)),
    "expand": lambda lens, v: broadcast_lens(lens, _ints(v)),
    "tile": lambda lens, v: [n * r for n, r in zip(lens, _ints(v), strict=True)],
    "equal": lambda lens, v: _ints(v),
    "range": _guard_range,
}


@register_op
class ShapeGuard(ViewOp):
    """Input 0 unchanged (a view), once the run-time shape tensor (input 1) is checked.

    `rule` says how ONNX derives lens from the tensor and input 0's lens (reshape, squeeze,
    expand, tile, ...; `equal` compares the values themselves); the result must be `expected`.
    """

    name = "shape_guard"
    rule: str = "equal"
    expected: tuple[int, ...] = ()

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 2)
        if self.rule not in GUARD_RULES:
            raise ShapeError(f"shape_guard: unknown rule {self.rule!r}; known: {list(GUARD_RULES)}")
        return inputs[0]

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x, v = args
        try:
            got = GUARD_RULES[self.rule](list(x.shape), v)
        except (ValueError, IndexError) as exc:
            raise ValueError(
                f"shape_guard[{self.rule}]: run-time value {_ints(v)}: {exc}"
            ) from None
        if [int(n) for n in got] != list(self.expected):
            raise ValueError(
                f"shape_guard[{self.rule}]: the run-time value {np.asarray(v).tolist()} gives "
                f"{list(got)}, but the program was compiled for {list(self.expected)}"
            )
        return x


@register_op
class DynamicSlice(Op):
    """ONNX Slice with run-time starts, ends, axes and steps (inputs 1-4); a packed copy.

    The output lens are static (`out_lens`); run-time values that give other lens are an error.
    """

    name = "dynamic_slice"
    out_lens: tuple[int, ...] = ()

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 5)
        s = inputs[0]
        if len(self.out_lens) != s.ndim():
            raise ShapeError(f"dynamic_slice: out_lens {list(self.out_lens)} for input {s.lens()}")
        for k, p in enumerate(inputs[1:]):
            if p.type() not in ("int32_type", "int64_type") or p.ndim() != 1:
                raise ShapeError(f"dynamic_slice: parameter {k + 1} must be a 1-D integer tensor")
        return Shape(s.type(), self.out_lens)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x, starts, ends, axes, steps = args
        ranges = slice_ranges(x.shape, _ints(starts), _ints(ends), _ints(axes), _ints(steps))
        index = tuple(slice(b, e if e >= 0 else None, st) for b, e, st in ranges)
        return np.asarray(x[index], order="C")
