"""Convolution operators on NCHW tensors: `convolution`, `deconvolution`, `deform_convolution`,
`quant_convolution`.

`convolution` is N-d grouped convolution, `deconvolution` its transpose (ONNX ConvTranspose) and
`deform_convolution` ONNX DeformConv (learned per-tap offsets and an optional mask). They work on
`N x C x D1 x ... x Dn` inputs with any number (>= 1) of spatial dimensions; `padding`, `stride`
and `dilation` follow the rules in `spatial.py`, which holds the spatial helpers (`windows`,
`pad`, `split_padding`, `same_padding`, ...) shared with `pooling.py`.

In the pipeline: the ONNX handlers (`onnx/handlers/conv.py`) build these ops with `auto_pad`
already resolved into explicit padding; passes (`eliminate_pad`) may fold a zero `pad` into
`padding`; targets lower them (`targets/torch_lowering/lower_nn.py`) or fall back to the numpy
`compute()`s here, which are the reference semantics: im2col (a strided window view copied
once) followed by one batched `np.matmul` over all groups, with a direct tap-by-tap path for
depthwise convolution. Floating point accumulates in float32 (float64 for double), as ONNX
Runtime does; half, bf16 and fp8 are computed in float32 and rounded once.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from math import prod

import numpy as np

from pygraphx.ir.shape import Shape
from pygraphx.ops import spatial
from pygraphx.ops.base import Op, ShapeError, check_arity, register_op
from pygraphx.ops.quant import FP8_TYPES

# convolution padding_mode values (MIGraphX's padding_mode_t)
PADDING_DEFAULT, SAME_LOWER, SAME_UPPER = 0, 1, 2


# --- convolution -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _ConvOp(Op):
    """The attributes `convolution` and `deconvolution` share (MIGraphX's names and order)."""

    padding: tuple[int, ...] = (0, 0)
    stride: tuple[int, ...] = (1, 1)
    dilation: tuple[int, ...] = (1, 1)
    group: int = 1
    padding_mode: int = PADDING_DEFAULT


def _check_input_weights(op: _ConvOp, inputs: Sequence[Shape]) -> int:
    """Checks a (de)convolution's input and weights; returns the number of spatial dims."""
    check_arity(op, inputs, 2)
    x, w = inputs
    nd = spatial.check_input(op, x)
    if w.ndim() != x.ndim():
        raise ShapeError(
            f"{op.name}: weights lens {w.lens()} must have the input's rank {x.ndim()}"
        )
    if x.type() != w.type():
        raise ShapeError(f"{op.name}: input {x.type()} and weights {w.type()} differ")
    spatial.check_spatial(op, nd, stride=op.stride, dilation=op.dilation)
    return nd


@register_op
class Convolution(_ConvOp):
    """N-d convolution: input (N, C, *in), weights (M, C / group, *k) -> (N, M, *out).

    `padding_mode` 1 / 2 (same_lower / same_upper) ignores `padding` and pads so that
    out = ceil(in / stride). Integer inputs accumulate in int64 and wrap to the input type.
    """

    name = "convolution"

    def pads(self, x: Sequence[int], w: Sequence[int]) -> tuple[list[int], list[int]]:
        """Effective (begin, end) padding for input lens `x` and weight lens `w`."""
        nd = len(x) - 2
        if self.padding_mode in (SAME_LOWER, SAME_UPPER):
            spans = [spatial.dilated(k, d) for k, d in zip(w[2:], self.dilation, strict=True)]
            return spatial.same_padding(x[2:], spans, self.stride, self.padding_mode == SAME_LOWER)
        if self.padding_mode != PADDING_DEFAULT:
            raise ShapeError(f"{self.name}: unknown padding_mode {self.padding_mode}")
        begin, end = spatial.split_padding(self, self.padding, nd)
        if any(p < 0 for p in begin + end):
            raise ShapeError(f"{self.name}: padding {list(self.padding)} must not be negative")
        return begin, end

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        x, w = inputs
        _check_input_weights(self, inputs)
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
            span = n + b + e - spatial.dilated(k, d)
            if span < 0:
                raise ShapeError(
                    f"{self.name}: kernel {wl[2:]} (dilation {list(self.dilation)}) is larger "
                    f"than the padded input {xl[2:]}"
                )
            out.append(span // s + 1)
        return Shape(x.type(), [xl[0], wl[0], *out])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x, w = args
        acc = spatial.work_dtype(output_shape.type())
        begin, end = self.pads(x.shape, w.shape)
        xp = spatial.pad(x.astype(acc, copy=False), begin, end, 0)
        out = output_shape.lens()[2:]
        y = conv_nd(xp, w.astype(acc, copy=False), self.stride, self.dilation, self.group, out)
        return y.astype(output_shape.dtype(), copy=False)


@register_op
class QuantConvolution(Convolution):
    """`convolution` of int8/uint8 input and weights, accumulated exactly into int32.

    MIGraphX's `quant_convolution`: the result is the integer sum of products (wrapped to int32
    on overflow, as two's-complement accumulation would). The scales of a quantised layer are
    applied afterwards by a `dequantizelinear` of this result (`passes/fold_qdq.py`). An
    optional third input, one value of the input's type, is the input's zero point (ONNX QDQ
    models' asymmetric activations): the sums are of `(x - zero_point) * w`, the padding being
    zero in that shifted domain (as oneDNN's and ONNX Runtime's integer convolutions do).
    Two inputs of one fp8 type (`passes/fold_fp8.py`) give the float32 sums of their exact
    products instead (as `quant_dot` of fp8 does).
    """

    name = "quant_convolution"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        types = [s.type() for s in inputs]
        float_shapes = [Shape("float_type", s.lens()) for s in inputs[:2]]
        if len(inputs) == 2 and types[0] == types[1] and types[0] in FP8_TYPES:
            return super().compute_shape(float_shapes)
        if len(inputs) not in (2, 3) or any(t not in ("int8_type", "uint8_type") for t in types):
            raise ShapeError(f"{self.name}: needs int8/uint8 input and weights, got {types}")
        if len(inputs) == 3 and (types[2] != types[0] or inputs[2].elements() != 1):
            raise ShapeError(
                f"{self.name}: the zero point must be one value of the input's type "
                f"{types[0]}, got {types[2]} {inputs[2].lens()}"
            )
        return Shape("int32_type", super().compute_shape(float_shapes).lens())

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x, w = args[:2]
        if output_shape.type() == "float_type":  # fp8: float32 sums of exact products
            return super().compute(output_shape, [x.astype(np.float32), w.astype(np.float32)])
        shifted = x.astype(np.float64)
        if len(args) == 3:
            shifted -= float(np.asarray(args[2]).reshape(-1)[0])
        begin, end = self.pads(x.shape, w.shape)
        xp = spatial.pad(shifted, begin, end, 0)
        out = output_shape.lens()[2:]
        # products of 8-bit values: every partial sum stays an integer below 2**53 (exact)
        y = conv_nd(xp, w.astype(np.float64), self.stride, self.dilation, self.group, out)
        return np.rint(y).astype(np.int64).astype(np.int32)


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
    win = spatial.windows(xp, k, stride, dilation, out)  # (N, C, *out, *k)
    if cg == 1 and group > 1:
        # depthwise: a multiply-add per kernel tap over the whole output, no tiny GEMMs
        wt = w.reshape(group, mg, kk)
        y = np.zeros((n, group, mg, *out), dtype=xp.dtype)
        tmp = np.empty_like(y)
        ones = (1,) * nd
        for t, tap in enumerate(spatial.taps(k)):
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
class Deconvolution(_ConvOp):
    """N-d transposed convolution (ONNX ConvTranspose): (N, C, *in), (C, M / group, *k).

    The full result has length (in - 1) * stride + dilated(k); `padding` crops `begin` values
    in front and `end` at the back. A negative value pads with zeros instead (how ONNX's
    output_padding / output_shape can ask for more than the full result).
    """

    name = "deconvolution"

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        x, w = inputs
        nd = _check_input_weights(self, inputs)
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
        begin, end = spatial.split_padding(self, self.padding, nd)
        out = []
        for n, k, b, e, s, d in zip(
            xl[2:], wl[2:], begin, end, self.stride, self.dilation, strict=True
        ):
            size = (n - 1) * s + spatial.dilated(k, d) - b - e
            if size < 1:
                raise ShapeError(
                    f"{self.name}: padding {list(self.padding)} leaves no output for input "
                    f"{xl[2:]} and kernel {wl[2:]}"
                )
            out.append(size)
        return Shape(x.type(), [xl[0], wl[1] * self.group, *out])

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x, w = args
        acc = spatial.work_dtype(output_shape.type())
        x, w = x.astype(acc, copy=False), w.astype(acc, copy=False)
        n, c, *size = x.shape
        _, mg, *k = w.shape
        g, m, nd = self.group, mg * self.group, len(k)
        cg = c // g
        # one GEMM per group gives every tap's contribution: (N, G, M/G * K, prod(in))
        wt = w.reshape(g, cg, mg * prod(k)).transpose(0, 2, 1)
        cols = np.matmul(wt, x.reshape(n, g, cg, prod(size))).reshape(n, m, *k, *size)
        spans = [
            (i - 1) * s + spatial.dilated(kk, d)
            for i, kk, s, d in zip(size, k, self.stride, self.dilation, strict=True)
        ]
        full = np.zeros((n, m, *spans), dtype=acc)
        for tap in spatial.taps(k):
            dst = tuple(
                slice(t * d, t * d + (i - 1) * s + 1, s)
                for t, d, i, s in zip(tap, self.dilation, size, self.stride, strict=True)
            )
            full[(slice(None), slice(None), *dst)] += cols[(slice(None), slice(None), *tap)]
        begin, _ = spatial.split_padding(self, self.padding, nd)
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
        acc = spatial.work_dtype(output_shape.type())
        x, w, offset = (a.astype(acc, copy=False) for a in args[:3])
        n, c, *size = x.shape
        m, cg, *k = w.shape
        out = output_shape.lens()[2:]
        nd, og, kk, p, g = len(size), self.offset_group, prod(k), prod(out), self.group
        begin, _ = spatial.split_padding(self, self.padding, nd)
        off = offset.reshape(n, og, kk, nd, p)
        # sampling position of every (tap, output) pair along each spatial dim: (N, og, K, P)
        taps = np.array(list(spatial.taps(k)), dtype=acc).reshape(kk, nd)
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
