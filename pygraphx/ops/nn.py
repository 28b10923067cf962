"""Neural-network operators on NCHW tensors: convolution, deconvolution, pooling, normalisation.

Ops: `convolution`, `deconvolution` (ONNX ConvTranspose), `deform_convolution`, `pooling`
(average / max / lpnorm, global), `pooling_indices` (MaxPool's argmax), `max_unpool`,
`batch_norm_inference`, `instance_norm` and `lrn`. They work on `N x C x D1 x ... x Dn` inputs
with any number (>= 1) of spatial dimensions. Spatial attributes (`padding`, `stride`,
`dilation`, `lengths`) have one value per spatial dimension; `padding` may also have two (all
begin values, then all end values), as in MIGraphX. The ONNX handlers (`onnx/handlers/conv.py`,
`pooling.py`, `normalization_nn.py`) resolve `auto_pad` into explicit padding, so the IR always
sees static numbers.

The numpy `compute()`s are the reference semantics, written to be fast enough to run whole
networks: convolution is im2col (a strided window view copied once) followed by one batched
`np.matmul` over all groups, with a direct tap-by-tap path for depthwise convolution; pooling
reduces tap by tap over strided views. Floating point accumulates in float32 (float64 for
double), as ONNX Runtime does; half, bf16 and fp8 are computed in float32 and rounded once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from math import ceil, prod

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from pygraphx.ir.shape import FLOAT_TYPES, Shape
from pygraphx.ops.base import Op, ShapeError, check_arity, register_op

# convolution padding_mode values (MIGraphX's padding_mode_t)
PADDING_DEFAULT, SAME_LOWER, SAME_UPPER = 0, 1, 2
POOLING_MODES = ("average", "max", "lpnorm")


# --- shared helpers --------------------------------------------------------------------------
def work_dtype(type_name: str) -> np.dtype:
    """The dtype a result of `type_name` is accumulated in (float32 for reduced floats)."""
    if type_name == "double_type":
        return np.dtype(np.float64)
    if type_name in FLOAT_TYPES:
        return np.dtype(np.float32)
    return np.dtype(np.int64)


def dilated(k: int, d: int) -> int:
    """Extent of a kernel of `k` taps spaced `d` apart."""
    return (k - 1) * d + 1


def split_padding(op: Op, padding: Sequence[int], nd: int) -> tuple[list[int], list[int]]:
    """(begin, end) padding lists from `nd` symmetric values or `2 * nd` begin+end values."""
    if len(padding) == nd:
        return list(padding), list(padding)
    if len(padding) == 2 * nd:
        return list(padding[:nd]), list(padding[nd:])
    raise ShapeError(
        f"{op.name}: padding {list(padding)} needs {nd} or {2 * nd} values for {nd} spatial dims"
    )


def same_padding(
    lens: Sequence[int], spans: Sequence[int], stride: Sequence[int], lower: bool
) -> tuple[list[int], list[int]]:
    """SAME padding: output = ceil(in / stride); the odd element goes last (upper) or first."""
    begin, end = [], []
    for n, span, s in zip(lens, spans, stride, strict=True):
        total = max((ceil(n / s) - 1) * s + span - n, 0)
        small = total // 2
        begin.append(total - small if lower else small)
        end.append(small if lower else total - small)
    return begin, end


def _check_spatial(op: Op, nd: int, **attrs: Sequence[int]) -> None:
    for name, values in attrs.items():
        if len(values) != nd:
            raise ShapeError(
                f"{op.name}: {name} {list(values)} needs {nd} values for {nd} spatial dims"
            )
        if any(v < 1 for v in values):
            raise ShapeError(f"{op.name}: {name} {list(values)} must be positive")


def _check_input(op: Op, x: Shape, what: str = "input") -> int:
    if x.ndim() < 3:
        raise ShapeError(
            f"{op.name}: {what} must be N x C x spatial... (rank >= 3), got lens {x.lens()}"
        )
    if x.type() == "bool_type":
        raise ShapeError(f"{op.name}: {what} of bool_type is not supported")
    return x.ndim() - 2


def _windows(
    xp: np.ndarray,
    k: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    out: Sequence[int],
) -> np.ndarray:
    """Strided view (N, C, *out, *k) of every kernel placement on the padded input `xp`."""
    nd = len(k)
    spans = [dilated(kk, d) for kk, d in zip(k, dilation, strict=True)]
    win = sliding_window_view(xp, spans, axis=tuple(range(2, 2 + nd)))
    place = tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(out, stride, strict=True))
    taps = tuple(slice(None, None, d) for d in dilation)
    return win[(slice(None), slice(None), *place, *taps)]


def _taps(k: Sequence[int]) -> Iterator[tuple[int, ...]]:
    return itertools.product(*(range(kk) for kk in k))


def _pad(x: np.ndarray, begin: Sequence[int], end: Sequence[int], value: float) -> np.ndarray:
    """`x` padded on its spatial dims with `value` (no copy when there is no padding)."""
    if not any(begin) and not any(end):
        return x
    lens = [n + b + e for n, b, e in zip(x.shape[2:], begin, end, strict=True)]
    out = np.full((*x.shape[:2], *lens), value, dtype=x.dtype)
    inner = tuple(slice(b, b + n) for b, n in zip(begin, x.shape[2:], strict=True))
    out[(slice(None), slice(None), *inner)] = x
    return out


# --- convolution -----------------------------------------------------------------------------
@register_op
class Convolution(Op):
    """N-d convolution: input (N, C, *in), weights (M, C / group, *k) -> (N, M, *out).

    `padding_mode` 1 / 2 (same_lower / same_upper) ignores `padding` and pads so that
    out = ceil(in / stride). Integer inputs accumulate in int64 and wrap to the input type.
    """

    name = "convolution"
    padding: tuple[int, ...] = (0, 0)
    stride: tuple[int, ...] = (1, 1)
    dilation: tuple[int, ...] = (1, 1)
    group: int = 1
    padding_mode: int = PADDING_DEFAULT

    def pads(self, x: Sequence[int], w: Sequence[int]) -> tuple[list[int], list[int]]:
        """Effective (begin, end) padding for input lens `x` and weight lens `w`."""
        nd = len(x) - 2
        if self.padding_mode in (SAME_LOWER, SAME_UPPER):
            spans = [dilated(k, d) for k, d in zip(w[2:], self.dilation, strict=True)]
            return same_padding(x[2:], spans, self.stride, self.padding_mode == SAME_LOWER)
        if self.padding_mode != PADDING_DEFAULT:
            raise ShapeError(f"{self.name}: unknown padding_mode {self.padding_mode}")
        begin, end = split_padding(self, self.padding, nd)
        if any(p < 0 for p in begin + end):
            raise ShapeError(f"{self.name}: padding {list(self.padding)} must not be negative")
        return begin, end

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 2)
        x, w = inputs
        nd = _check_input(self, x)
        if w.ndim() != x.ndim():
            raise ShapeError(
                f"{self.name}: weights lens {w.lens()} must have the input's rank {x.ndim()}"
            )
        if x.type() != w.type():
            raise ShapeError(f"{self.name}: input {x.type()} and weights {w.type()} differ")
        _check_spatial(self, nd, stride=self.stride, dilation=self.dilation)
        if self.group < 1:
            raise ShapeError(f"{self.name}: group {self.group} must be positive")
        xl, wl = x.lens(), w.lens()
        if xl[1] % self.group or wl[0] % self.group or wl[1] * self.group != xl[1]:
            raise ShapeError(
                f"{self.name}: input channels {xl[1]}, weights {wl} and group {self.group} do "
                f"not fit (need weights[1] * group == channels and group | weights[0])"
            )
        begin, end = self.pads(xl, wl)
        out = []
        for n, k, b, e, s, d in zip(
            xl[2:], wl[2:], begin, end, self.stride, self.dilation, strict=True
        ):
            span = n + b + e - dilated(k, d)
            if span < 0:
                raise ShapeError(
                    f"{self.name}: kernel {wl[2:]} (dilation {list(self.dilation)}) is larger "
                    f"than the padded input {xl[2:]}"
                )
            out.append(span // s + 1)
        return Shape(x.type(), [xl[0], wl[0], *out])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x, w = args
        acc = work_dtype(output_shape.type())
        begin, end = self.pads(x.shape, w.shape)
        xp = _pad(x.astype(acc, copy=False), begin, end, 0)
        out = output_shape.lens()[2:]
        y = conv_nd(xp, w.astype(acc, copy=False), self.stride, self.dilation, self.group, out)
        return y.astype(output_shape.dtype(), copy=False)


def conv_nd(
    xp: np.ndarray,
    w: np.ndarray,
    stride: Sequence[int],
    dilation: Sequence[int],
    group: int,
    out: Sequence[int],
) -> np.ndarray:
    """Convolution of the already padded input `xp` (N, C, *) with `w` (M, C/group, *k)."""
    n, c = xp.shape[:2]
    m, cg, *k = w.shape
    nd, mg, kk, p = len(k), m // group, prod(k), prod(out)
    win = _windows(xp, k, stride, dilation, out)  # (N, C, *out, *k)
    if cg == 1 and group > 1:
        # depthwise: a multiply-add per kernel tap over the whole output, no tiny GEMMs
        wt = w.reshape(group, mg, kk)
        y = np.zeros((n, group, mg, *out), dtype=xp.dtype)
        tmp = np.empty_like(y)
        ones = (1,) * nd
        for t, tap in enumerate(_taps(k)):
            src = win[(..., *tap)][:, :, None]
            np.multiply(src, wt[:, :, t].reshape(group, mg, *ones), out=tmp)
            y += tmp
        return y.reshape(n, m, *out)
    if all(v == 1 for v in k):
        cols = win[(..., *([0] * nd))].reshape(n, group, cg, p)
    else:
        perm = (0, 1, *range(2 + nd, 2 + 2 * nd), *range(2, 2 + nd))
        cols = np.ascontiguousarray(win.transpose(perm)).reshape(n, group, cg * kk, p)
    y = np.matmul(w.reshape(group, mg, cg * kk), cols)  # (N, G, M/G, P)
    return y.reshape(n, m, *out)


@register_op
class Deconvolution(Op):
    """N-d transposed convolution (ONNX ConvTranspose): (N, C, *in), (C, M / group, *k).

    The full result has length (in - 1) * stride + dilated(k); `padding` crops `begin` values
    in front and `end` at the back. A negative value pads with zeros instead (how ONNX's
    output_padding / output_shape can ask for more than the full result).
    """

    name = "deconvolution"
    padding: tuple[int, ...] = (0, 0)
    stride: tuple[int, ...] = (1, 1)
    dilation: tuple[int, ...] = (1, 1)
    group: int = 1
    padding_mode: int = PADDING_DEFAULT

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 2)
        x, w = inputs
        nd = _check_input(self, x)
        if w.ndim() != x.ndim():
            raise ShapeError(
                f"{self.name}: weights lens {w.lens()} must have the input's rank {x.ndim()}"
            )
        if x.type() != w.type():
            raise ShapeError(f"{self.name}: input {x.type()} and weights {w.type()} differ")
        _check_spatial(self, nd, stride=self.stride, dilation=self.dilation)
        if self.padding_mode != PADDING_DEFAULT:
            raise ShapeError(f"{self.name}: only padding_mode 0 (explicit padding) is supported")
        if self.group < 1:
            raise ShapeError(f"{self.name}: group {self.group} must be positive")
        xl, wl = x.lens(), w.lens()
        if wl[0] != xl[1] or xl[1] % self.group:
            raise ShapeError(
                f"{self.name}: weights {wl} need weights[0] == input channels {xl[1]}, "
                f"divisible by group {self.group}"
            )
        begin, end = split_padding(self, self.padding, nd)
        out = []
        for n, k, b, e, s, d in zip(
            xl[2:], wl[2:], begin, end, self.stride, self.dilation, strict=True
        ):
            size = (n - 1) * s + dilated(k, d) - b - e
            if size < 1:
                raise ShapeError(
                    f"{self.name}: padding {list(self.padding)} leaves no output for input "
                    f"{xl[2:]} and kernel {wl[2:]}"
                )
            out.append(size)
        return Shape(x.type(), [xl[0], wl[1] * self.group, *out])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x, w = args
        acc = work_dtype(output_shape.type())
        x, w = x.astype(acc, copy=False), w.astype(acc, copy=False)
        n, c, *size = x.shape
        _, mg, *k = w.shape
        g, m, nd = self.group, mg * self.group, len(k)
        cg = c // g
        # one GEMM per group gives every tap's contribution: (N, G, M/G * K, prod(in))
        wt = w.reshape(g, cg, mg * prod(k)).transpose(0, 2, 1)
        cols = np.matmul(wt, x.reshape(n, g, cg, prod(size))).reshape(n, m, *k, *size)
        spans = [
            (i - 1) * s + dilated(kk, d)
            for i, kk, s, d in zip(size, k, self.stride, self.dilation, strict=True)
        ]
        full = np.zeros((n, m, *spans), dtype=acc)
        for tap in _taps(k):
            dst = tuple(
                slice(t * d, t * d + (i - 1) * s + 1, s)
                for t, d, i, s in zip(tap, self.dilation, size, self.stride, strict=True)
            )
            full[(slice(None), slice(None), *dst)] += cols[(slice(None), slice(None), *tap)]
        begin, _ = split_padding(self, self.padding, nd)
        out = output_shape.lens()
        y = np.zeros(out, dtype=acc)
        src, dst = [], []
        for b, o, span in zip(begin, out[2:], spans, strict=True):
            lo, hi = max(b, 0), min(b + o, span)
            src.append(slice(lo, hi))
            dst.append(slice(lo - b, hi - b))
        y[(slice(None), slice(None), *dst)] = full[(slice(None), slice(None), *src)]
        return y.astype(output_shape.dtype(), copy=False)


@register_op
class DeformConvolution(Op):
    """Deformable convolution (ONNX DeformConv): inputs x (N, C, *in), w (M, C / group, *k),
    offset (N, offset_group * K * nd, *out) and optionally mask (N, offset_group * K, *out).

    Kernel tap t of output position o reads the input at o * stride - pad_begin + t * dilation
    plus its learned offset, interpolated (bi)linearly with zeros outside the input, and scaled
    by its mask value; then the taps are contracted with the weights as in a convolution.
    """

    name = "deform_convolution"
    padding: tuple[int, ...] = (0, 0)
    stride: tuple[int, ...] = (1, 1)
    dilation: tuple[int, ...] = (1, 1)
    group: int = 1
    offset_group: int = 1

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 3, 4)
        x, w, offset = inputs[:3]
        conv = Convolution(self.padding, self.stride, self.dilation, self.group)
        out = conv.compute_shape([x, w])
        nd, kk, og = x.ndim() - 2, prod(w.lens()[2:]), self.offset_group
        if og < 1 or x.lens()[1] % og:
            raise ShapeError(
                f"{self.name}: offset_group {og} must divide the input channels {x.lens()[1]}"
            )
        want = [x.lens()[0], og * kk * nd, *out.lens()[2:]]
        if offset.lens() != want:
            raise ShapeError(f"{self.name}: offset lens {offset.lens()} should be {want}")
        if len(inputs) == 4 and inputs[3].lens() != [want[0], og * kk, *want[2:]]:
            raise ShapeError(
                f"{self.name}: mask lens {inputs[3].lens()} should be "
                f"{[want[0], og * kk, *want[2:]]}"
            )
        if any(s.type() != x.type() for s in inputs[2:]):
            raise ShapeError(f"{self.name}: offset and mask must have the input's type")
        return out

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        acc = work_dtype(output_shape.type())
        x, w, offset = (a.astype(acc, copy=False) for a in args[:3])
        n, c, *size = x.shape
        m, cg, *k = w.shape
        out = output_shape.lens()[2:]
        nd, og, kk, p, g = len(size), self.offset_group, prod(k), prod(out), self.group
        begin, _ = split_padding(self, self.padding, nd)
        off = offset.reshape(n, og, kk, nd, p)
        # sampling position of every (tap, output) pair along each spatial dim: (N, og, K, P)
        taps = np.array(list(_taps(k)), dtype=acc).reshape(kk, nd)
        grid = np.stack(np.meshgrid(*(np.arange(o, dtype=acc) for o in out), indexing="ij"))
        grid = grid.reshape(nd, p)
        pos = [
            grid[j] * self.stride[j]
            - begin[j]
            + (taps[:, j] * self.dilation[j])[:, None]
            + off[:, :, :, j]
            for j in range(nd)
        ]
        lo = [np.floor(q) for q in pos]
        frac = [q - f for q, f in zip(pos, lo, strict=True)]
        xt = x.reshape(n, og, c // og, prod(size)).transpose(0, 1, 3, 2)  # (N, og, S, C/og)
        sampled = np.zeros((n, og, kk * p, c // og), dtype=acc)
        for corner in itertools.product((0, 1), repeat=nd):
            weight = np.ones_like(pos[0])
            flat = np.zeros(pos[0].shape, dtype=np.int64)
            for j, bit in enumerate(corner):
                idx = lo[j] + bit
                weight = weight * (frac[j] if bit else 1 - frac[j]) * ((idx >= 0) & (idx < size[j]))
                flat = flat * size[j] + np.clip(idx, 0, size[j] - 1).astype(np.int64)
            vals = np.take_along_axis(xt, flat.reshape(n, og, kk * p, 1), axis=2)
            sampled += vals * weight.reshape(n, og, kk * p, 1)
        if len(args) == 4:
            sampled *= args[3].astype(acc, copy=False).reshape(n, og, kk * p, 1)
        cols = sampled.reshape(n, og, kk, p, c // og).transpose(0, 1, 4, 2, 3)
        cols = cols.reshape(n, g, cg * kk, p)
        y = np.matmul(w.reshape(g, m // g, cg * kk), cols).reshape(n, m, *out)
        return y.astype(output_shape.dtype(), copy=False)


# --- pooling ---------------------------------------------------------------------------------
class _PoolGeometry(Op):
    """Output size rules shared by `pooling` and `pooling_indices` (ONNX / PyTorch rules)."""

    padding: tuple[int, ...]
    stride: tuple[int, ...]
    lengths: tuple[int, ...]
    dilations: tuple[int, ...]
    ceil_mode: bool

    def geometry(self, lens: Sequence[int]) -> tuple[list[int], list[int], list[int]]:
        """(begin padding, end padding, output spatial lens) for input lens `lens`."""
        padding, stride, lengths = self.padding, self.stride, self.lengths
        dilations, ceil_mode = self.dilations, self.ceil_mode
        nd = len(lens) - 2
        _check_spatial(self, nd, stride=stride, lengths=lengths, dilations=dilations)
        begin, end = split_padding(self, padding, nd)
        if any(p < 0 for p in begin + end):
            raise ShapeError(f"{self.name}: padding {list(padding)} must not be negative")
        out = []
        for n, b, e, s, k, d in zip(lens[2:], begin, end, stride, lengths, dilations, strict=True):
            span = n + b + e - dilated(k, d)
            if span < 0:
                raise ShapeError(
                    f"{self.name}: window {list(lengths)} (dilations {list(dilations)}) is "
                    f"larger than the padded input {list(lens[2:])}"
                )
            o = -(-span // s) + 1 if ceil_mode else span // s + 1
            if ceil_mode and (o - 1) * s >= n + b:
                o -= 1  # the last window would start in the end padding: dropped
            out.append(o)
        return begin, end, out

    def padded_windows(
        self, x: np.ndarray, fill: float, begin: list[int], end: list[int], out: list[int]
    ) -> np.ndarray:
        """Window view (N, C, *out, *k) of `x` padded with `fill`, incl. ceil_mode's overhang."""
        stride, lengths, dilations = self.stride, self.lengths, self.dilations
        ends = [
            max(e, (o - 1) * s + dilated(k, d) - n - b)
            for n, b, e, o, s, k, d in zip(
                x.shape[2:], begin, end, out, stride, lengths, dilations, strict=True
            )
        ]
        return _windows(_pad(x, begin, ends, fill), lengths, stride, dilations, out)


@register_op
class Pooling(_PoolGeometry):
    """Average, max or Lp-norm pooling over spatial windows of (N, C, *in).

    Padding never wins a max and adds nothing to a sum; an average divides by the number of
    input elements in the window, or with `count_include_pad` by the elements inside the padded
    input (not the ceil_mode overhang). `global` pools each whole channel to one value.
    """

    name = "pooling"
    mode: str = "average"
    padding: tuple[int, ...] = (0, 0)
    stride: tuple[int, ...] = (1, 1)
    lengths: tuple[int, ...] = (1, 1)
    ceil_mode: bool = False
    lp_order: int = 2
    global_: bool = False
    dilations: tuple[int, ...] = (1, 1)
    count_include_pad: bool = False

    def attributes(self) -> dict[str, object]:
        attrs = super().attributes()
        return {("global" if k == "global_" else k): v for k, v in attrs.items()}

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 1)
        x = inputs[0]
        nd = _check_input(self, x)
        if self.mode not in POOLING_MODES:
            raise ShapeError(f"{self.name}: mode {self.mode!r} is not one of {POOLING_MODES}")
        if self.mode != "max" and x.type() not in FLOAT_TYPES:
            raise ShapeError(
                f"{self.name}: {self.mode} pooling needs a float input, not {x.type()}"
            )
        if self.mode == "lpnorm" and self.lp_order < 1:
            raise ShapeError(f"{self.name}: lp_order {self.lp_order} must be positive")
        if self.global_:
            return Shape(x.type(), [*x.lens()[:2], *([1] * nd)])
        _, _, out = self.geometry(x.lens())
        return Shape(x.type(), [*x.lens()[:2], *out])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        nd = x.ndim - 2
        axes = tuple(range(2, 2 + nd))
        acc = x.dtype if self.mode == "max" else work_dtype(output_shape.type())
        x = x.astype(acc, copy=False)
        if self.global_ or (
            list(self.lengths) == list(x.shape[2:])
            and not any(self.padding)
            and output_shape.lens()[2:] == [1] * nd
        ):
            y = self._reduce_all(x, axes)
        else:
            y = self._pool(x, output_shape.lens()[2:])
        return y.astype(output_shape.dtype(), copy=False)

    def _reduce_all(self, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        if self.mode == "max":
            return x.max(axis=axes, keepdims=True)
        if self.mode == "average":
            return x.mean(axis=axes, keepdims=True, dtype=x.dtype)
        p = self.lp_order
        s = np.sum(np.abs(x) ** p, axis=axes, keepdims=True, dtype=x.dtype)
        return np.sqrt(s) if p == 2 else s ** (1.0 / p)

    def _pool(self, x: np.ndarray, out: list[int]) -> np.ndarray:
        begin, end, _ = self.geometry(x.shape)
        if self.mode == "max":
            fill = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf
            win = self.padded_windows(x, fill, begin, end, out)
            y = win[(..., *([0] * len(out)))].copy()
            for tap in _taps(self.lengths):
                np.maximum(y, win[(..., *tap)], out=y)
            return y
        src = np.abs(x) ** self.lp_order if self.mode == "lpnorm" else x
        win = self.padded_windows(src, 0, begin, end, out)
        y = np.zeros(win.shape[: 2 + len(out)], dtype=x.dtype)
        for tap in _taps(self.lengths):
            y += win[(..., *tap)]
        if self.mode == "lpnorm":
            return np.sqrt(y) if self.lp_order == 2 else y ** (1.0 / self.lp_order)
        # divisor per output position: window taps inside the input (or the padded input)
        mask = np.zeros(
            (1, 1, *(n + b + e for n, b, e in zip(x.shape[2:], begin, end, strict=True))), x.dtype
        )
        inner = tuple(slice(b, b + n) for b, n in zip(begin, x.shape[2:], strict=True))
        mask[(0, 0, *inner) if not self.count_include_pad else (0, 0)] = 1
        mwin = self.padded_windows(mask, 0, [0] * len(out), [0] * len(out), out)
        count = np.zeros(mwin.shape[: 2 + len(out)], dtype=x.dtype)
        for tap in _taps(self.lengths):
            count += mwin[(..., *tap)]
        return y / np.maximum(count, 1)


@register_op
class PoolingIndices(_PoolGeometry):
    """Where max pooling found each maximum: flat int64 indices into the input (ONNX MaxPool's
    `Indices`), row-major, or with `storage_order=1` column-major within each (n, c) image.
    """

    name = "pooling_indices"
    padding: tuple[int, ...] = (0, 0)
    stride: tuple[int, ...] = (1, 1)
    lengths: tuple[int, ...] = (1, 1)
    ceil_mode: bool = False
    dilations: tuple[int, ...] = (1, 1)
    storage_order: int = 0

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 1)
        x = inputs[0]
        _check_input(self, x)
        if self.storage_order not in (0, 1):
            raise ShapeError(f"{self.name}: storage_order {self.storage_order} must be 0 or 1")
        _, _, out = self.geometry(x.lens())
        return Shape("int64_type", [*x.lens()[:2], *out])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        n, c, *size = x.shape
        begin, end, out = self.geometry(x.shape)
        fill = np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf
        win = self.padded_windows(x, fill, begin, end, out)
        # flat index of every padded position (row- or column-major in the image), -1 in pads
        if self.storage_order:
            steps = [prod(size[:i]) for i in range(len(size))]
        else:
            steps = [prod(size[i + 1 :]) for i in range(len(size))]
        grids = np.meshgrid(*(np.arange(v, dtype=np.int64) for v in size), indexing="ij")
        flat = sum((g * st for g, st in zip(grids, steps, strict=True)), np.int64(0))
        iwin = self.padded_windows(flat[None, None], -1, begin, end, out)
        best = win[(..., *([0] * len(out)))].copy()
        idx = np.broadcast_to(iwin[(..., *([0] * len(out)))], best.shape).copy()
        for tap in _taps(self.lengths):
            v = win[(..., *tap)]
            better = v > best
            best = np.where(better, v, best)
            idx = np.where(better, iwin[(..., *tap)], idx)
        base = (np.arange(n * c, dtype=np.int64) * prod(size)).reshape(n, c, *([1] * len(out)))
        return idx + base


@register_op
class MaxUnpool(Op):
    """Inverse of max pooling (ONNX MaxUnpool): zeros of `out_lens` with every input value
    written at its flat index from `pooling_indices`. Inputs (x, indices) of equal lens.
    """

    name = "max_unpool"
    out_lens: tuple[int, ...] = ()

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 2)
        x, idx = inputs
        _check_input(self, x)
        if idx.lens() != x.lens() or idx.type() not in ("int64_type", "int32_type"):
            raise ShapeError(f"{self.name}: indices {idx} must be integers of the input's lens")
        if len(self.out_lens) != x.ndim() or list(self.out_lens[:2]) != x.lens()[:2]:
            raise ShapeError(
                f"{self.name}: out_lens {list(self.out_lens)} must keep the input's N, C "
                f"{x.lens()[:2]}"
            )
        return Shape(x.type(), self.out_lens)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x, idx = args
        y = np.zeros(output_shape.elements(), dtype=output_shape.dtype())
        flat = idx.reshape(-1)
        if flat.size and (flat.min() < 0 or flat.max() >= y.size):
            raise ValueError(
                f"{self.name}: index {int(flat.max()) if flat.max() >= y.size else int(flat.min())}"
                f" is outside the output of {y.size} elements {list(self.out_lens)}"
            )
        y[flat] = x.reshape(-1)
        return y.reshape(self.out_lens)


# --- normalisation ---------------------------------------------------------------------------
def _channel_params(op: Op, x: Shape, params: Sequence[Shape], lens: list[int]) -> None:
    for k, s in enumerate(params):
        if s.lens() != lens:
            raise ShapeError(
                f"{op.name}: parameter {k + 1} has lens {s.lens()}, expected {lens} for input "
                f"{x.lens()}"
            )
        if s.type() not in FLOAT_TYPES:
            raise ShapeError(f"{op.name}: parameter {k + 1} must be a float type, not {s.type()}")


def _per_channel(a: np.ndarray, nd: int, acc: np.dtype) -> np.ndarray:
    return a.astype(acc, copy=False).reshape(a.shape[0], *([1] * nd))


@register_op
class BatchNormInference(Op):
    """y = (x - mean) / sqrt(var + epsilon) * scale + bias, inputs (x, scale, bias, mean, var).

    `bn_mode` 1 (spatial): the parameters are per channel (C); 0 (per_activation): they have
    x's lens without the batch (C, D1, ..., Dn).
    """

    name = "batch_norm_inference"
    epsilon: float = 1e-5
    momentum: float = 0.9
    bn_mode: int = 1

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 5)
        x = inputs[0]
        if x.ndim() < 2 or x.type() not in FLOAT_TYPES:
            raise ShapeError(f"{self.name}: input must be a float N x C x ..., got {x}")
        if self.bn_mode not in (0, 1):
            raise ShapeError(f"{self.name}: bn_mode {self.bn_mode} must be 0 or 1")
        lens = x.lens()[1:2] if self.bn_mode == 1 else x.lens()[1:]
        _channel_params(self, x, inputs[1:], lens)
        return Shape(x.type(), x.lens())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x, scale, bias, mean, var = args
        acc = work_dtype(output_shape.type())
        if self.bn_mode == 1:
            scale, bias, mean, var = (_per_channel(a, x.ndim - 2, acc) for a in args[1:])
        else:
            scale, bias, mean, var = (a.astype(acc, copy=False) for a in args[1:])
        mul = scale / np.sqrt(var + acc.type(self.epsilon))
        y = x.astype(acc, copy=False) * mul
        y += bias - mean * mul
        return y.astype(output_shape.dtype(), copy=False)


@register_op
class InstanceNorm(Op):
    """y = (x - mean) / sqrt(var + epsilon) * scale[c] + bias[c], statistics per (n, c) image.

    Inputs (x, scale, bias) with x of N x C x D1... and scale, bias of (C).
    """

    name = "instance_norm"
    epsilon: float = 1e-5

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 3)
        x = inputs[0]
        if x.ndim() < 3 or x.type() not in FLOAT_TYPES:
            raise ShapeError(f"{self.name}: input must be a float N x C x D1..., got {x}")
        _channel_params(self, x, inputs[1:], x.lens()[1:2])
        return Shape(x.type(), x.lens())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        acc = work_dtype(output_shape.type())
        x = args[0].astype(acc, copy=False)
        nd = x.ndim - 2
        scale, bias = (_per_channel(a, nd, acc) for a in args[1:])
        axes = tuple(range(2, x.ndim))
        mean = x.mean(axis=axes, keepdims=True, dtype=acc)
        centered = x - mean
        var = np.mean(centered * centered, axis=axes, keepdims=True, dtype=acc)
        y = centered * (scale / np.sqrt(var + acc.type(self.epsilon))) + bias
        return y.astype(output_shape.dtype(), copy=False)


@register_op
class Lrn(Op):
    """Local response normalisation across channels (ONNX LRN).

    y = x / (bias + alpha / size * sum(x[c']^2))^beta over the channels
    c - floor((size - 1) / 2) ... c + ceil((size - 1) / 2).
    """

    name = "lrn"
    alpha: float = 0.0001
    beta: float = 0.75
    bias: float = 1.0
    size: int = 1

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 1)
        x = inputs[0]
        if x.ndim() < 2 or x.type() not in FLOAT_TYPES:
            raise ShapeError(f"{self.name}: input must be a float N x C x ..., got {x}")
        if self.size < 1:
            raise ShapeError(f"{self.name}: size {self.size} must be positive")
        return Shape(x.type(), x.lens())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        acc = work_dtype(output_shape.type())
        x = args[0].astype(acc, copy=False)
        c = x.shape[1]
        lo = (self.size - 1) // 2
        hi = self.size - 1 - lo
        # window sums over channels as differences of a zero-prefixed cumulative sum
        csum = np.zeros((x.shape[0], c + 1, *x.shape[2:]), dtype=acc)
        np.cumsum(x * x, axis=1, out=csum[:, 1:])
        top = np.minimum(np.arange(c) + hi + 1, c)
        bottom = np.maximum(np.arange(c) - lo, 0)
        square_sum = csum[:, top] - csum[:, bottom]
        denom = (acc.type(self.bias) + acc.type(self.alpha / self.size) * square_sum) ** acc.type(
            self.beta
        )
        return (x / denom).astype(output_shape.dtype(), copy=False)
