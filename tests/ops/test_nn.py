"""The nn operators (convolution, deconvolution, pooling, normalisation) against direct loops.

Each reference below is the textbook definition written as plain Python loops over output
positions, independent of the im2col / strided-window code in `pygraphx/ops/conv.py`,
`pooling.py` and `nn.py`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pytest

from pygraphx.ir.shape import Shape
from pygraphx.ops import ShapeError, make_op
from pygraphx.ops.base import Op

RNG = np.random.default_rng(0)


def run(op: Op, *args: np.ndarray) -> np.ndarray:
    shape = op.compute_shape([Shape(a.dtype, a.shape) for a in args])
    out = op.compute(shape, args)
    assert list(out.shape) == shape.lens() and out.dtype == shape.dtype()
    return out


def rand(*lens: int, dtype: type = np.float32) -> np.ndarray:
    return RNG.standard_normal(lens).astype(dtype)


def positions(lens: Sequence[int]):
    return itertools.product(*(range(n) for n in lens))


# --- references ------------------------------------------------------------------------------
def conv_ref(x, w, begin, end, stride, dilation, group):
    n, c, *size = x.shape
    m, cg, *k = w.shape
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), *zip(begin, end, strict=True)])
    out = [
        (s + b + e - (kk - 1) * d - 1) // st + 1
        for s, b, e, kk, d, st in zip(size, begin, end, k, dilation, stride, strict=True)
    ]
    y = np.zeros((n, m, *out))
    mg = m // group
    for b, o in itertools.product(range(n), range(m)):
        g = o // mg
        for pos in positions(out):
            acc = 0.0
            for ci in range(cg):
                for tap in positions(k):
                    idx = tuple(
                        p * st + t * d
                        for p, st, t, d in zip(pos, stride, tap, dilation, strict=True)
                    )
                    acc += xp[(b, g * cg + ci, *idx)] * w[(o, ci, *tap)]
            y[(b, o, *pos)] = acc
    return y


def deconv_ref(x, w, begin, end, stride, dilation, group):
    n, c, *size = x.shape
    _, mg, *k = w.shape
    cg = c // group
    full = [
        (s - 1) * st + (kk - 1) * d + 1
        for s, st, kk, d in zip(size, stride, k, dilation, strict=True)
    ]
    y = np.zeros((n, mg * group, *full))
    for b, ci in itertools.product(range(n), range(c)):
        g = ci // cg
        for pos in positions(size):
            for mo, tap in itertools.product(range(mg), positions(k)):
                idx = tuple(
                    p * st + t * d for p, st, t, d in zip(pos, stride, tap, dilation, strict=True)
                )
                y[(b, g * mg + mo, *idx)] += x[(b, ci, *pos)] * w[(ci, mo, *tap)]
    out = [f - bb - e for f, bb, e in zip(full, begin, end, strict=True)]
    res = np.zeros((n, mg * group, *out))
    for pos in positions(out):
        src = tuple(p + bb for p, bb in zip(pos, begin, strict=True))
        if all(0 <= s < f for s, f in zip(src, full, strict=True)):
            res[(..., *pos)] = y[(..., *src)]
    return res


def pool_ref(x, mode, begin, end, stride, k, dilation, out, include_pad=False, p=2):
    n, c, *size = x.shape
    y = np.zeros((n, c, *out))
    for b, ch in itertools.product(range(n), range(c)):
        for pos in positions(out):
            vals, count = [], 0
            for tap in positions(k):
                idx = [
                    q * st + t * d - bb
                    for q, st, t, d, bb in zip(pos, stride, tap, dilation, begin, strict=True)
                ]
                inside = all(0 <= i < s for i, s in zip(idx, size, strict=True))
                in_pad = all(
                    -bb <= i < s + e for i, s, bb, e in zip(idx, size, begin, end, strict=True)
                )
                if inside:
                    vals.append(float(x[(b, ch, *idx)]))
                count += inside or (include_pad and in_pad)
            if mode == "max":
                y[(b, ch, *pos)] = max(vals)
            elif mode == "average":
                y[(b, ch, *pos)] = sum(vals) / count
            else:
                y[(b, ch, *pos)] = sum(abs(v) ** p for v in vals) ** (1 / p)
    return y


# --- convolution -----------------------------------------------------------------------------
CONV_CASES = [
    # x lens, w lens, padding, stride, dilation, group
    ((2, 3, 7, 6), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((1, 4, 9, 8), (6, 2, 3, 2), (0, 1, 2, 0), (2, 1), (1, 2), 2),
    ((1, 6, 8, 8), (6, 1, 3, 3), (1, 1, 1, 1), (2, 2), (1, 1), 6),  # depthwise
    ((2, 4, 7, 7), (8, 1, 3, 3), (2, 2), (1, 2), (2, 1), 4),  # depthwise, multiplier 2
    ((1, 5, 6, 7), (3, 5, 1, 1), (0, 0), (2, 3), (1, 1), 1),  # 1x1 strided
    ((2, 3, 11), (4, 3, 4), (2, 1), (3,), (2,), 1),  # 1-D
    ((1, 4, 5, 6, 4), (4, 2, 2, 3, 2), (1, 0, 1, 0, 1, 0), (1, 2, 1), (2, 1, 1), 2),  # 3-D
]


@pytest.mark.parametrize(("xl", "wl", "padding", "stride", "dilation", "group"), CONV_CASES)
def test_convolution(xl, wl, padding, stride, dilation, group) -> None:
    x, w = rand(*xl), rand(*wl)
    op = make_op("convolution", padding=padding, stride=stride, dilation=dilation, group=group)
    nd = len(xl) - 2
    begin, end = (padding, padding) if len(padding) == nd else (padding[:nd], padding[nd:])
    ref = conv_ref(x, w, begin, end, stride, dilation, group)
    np.testing.assert_allclose(run(op, x, w), ref, rtol=1e-4, atol=1e-5)


def test_convolution_same_padding_modes() -> None:
    x, w = rand(1, 2, 7, 8), rand(3, 2, 4, 3)
    for mode, begin, end in [(1, (2, 1), (1, 0)), (2, (1, 0), (2, 1))]:
        op = make_op("convolution", stride=(2, 3), padding_mode=mode)
        y = run(op, x, w)
        assert y.shape == (1, 3, 4, 3)
        np.testing.assert_allclose(y, conv_ref(x, w, begin, end, (2, 3), (1, 1), 1), atol=1e-5)


def test_convolution_types() -> None:
    x, w = rand(1, 2, 5, 5), rand(3, 2, 3, 3)
    op = make_op("convolution", padding=(1, 1))
    ref = conv_ref(x, w, (1, 1), (1, 1), (1, 1), (1, 1), 1)
    y16 = run(op, x.astype(np.float16), w.astype(np.float16))
    np.testing.assert_allclose(y16.astype(np.float32), ref, rtol=1e-2, atol=1e-2)
    y64 = run(op, x.astype(np.float64), w.astype(np.float64))
    np.testing.assert_allclose(y64, ref, rtol=1e-12, atol=1e-12)
    xi, wi = (RNG.integers(-9, 9, a.shape).astype(np.int32) for a in (x, w))
    yi = run(op, xi, wi)
    np.testing.assert_array_equal(yi, conv_ref(xi, wi, (1, 1), (1, 1), (1, 1), (1, 1), 1))


def test_convolution_non_contiguous_input() -> None:
    x = rand(1, 3, 8, 10).transpose(0, 1, 3, 2)
    w = rand(2, 3, 3, 3)
    op = make_op("convolution", padding=(1, 1))
    np.testing.assert_allclose(
        run(op, x, w), conv_ref(x, w, (1, 1), (1, 1), (1, 1), (1, 1), 1), rtol=1e-4, atol=1e-5
    )


def test_convolution_printing() -> None:
    op = make_op("convolution", padding=(3, 3, 3, 3), stride=(2, 2))
    assert str(op) == (
        "convolution[padding={3, 3, 3, 3},stride={2, 2},dilation={1, 1},group=1,padding_mode=0]"
    )


@pytest.mark.parametrize(
    ("xl", "wl", "attrs", "message"),
    [
        ((1, 3, 5), (2, 3, 3, 3), {}, "rank"),
        ((1, 4, 5, 5), (2, 3, 3, 3), {}, "group"),
        ((1, 4, 5, 5), (3, 2, 3, 3), {"group": 2}, "group"),
        ((1, 3, 2, 2), (2, 3, 3, 3), {}, "larger than the padded input"),
        ((1, 3, 5, 5), (2, 3, 3, 3), {"stride": (1,)}, "stride"),
        ((1, 3, 5, 5), (2, 3, 3, 3), {"padding": (1, 1, 1)}, "padding"),
        ((1, 3, 5, 5), (2, 3, 3, 3), {"dilation": (0, 1)}, "positive"),
        ((3, 5), (2, 3), {}, "rank >= 3"),
    ],
)
def test_convolution_shape_errors(xl, wl, attrs, message) -> None:
    op = make_op("convolution", **attrs)
    with pytest.raises(ShapeError, match=message):
        op.compute_shape([Shape("float_type", xl), Shape("float_type", wl)])


def test_convolution_type_mismatch() -> None:
    with pytest.raises(ShapeError, match="differ"):
        make_op("convolution").compute_shape(
            [Shape("float_type", (1, 3, 5, 5)), Shape("half_type", (2, 3, 3, 3))]
        )


# --- deconvolution ---------------------------------------------------------------------------
DECONV_CASES = [
    ((1, 2, 3, 4), (2, 3, 3, 3), (0, 0), (1, 1), (1, 1), 1),
    ((2, 2, 3, 3), (2, 2, 3, 2), (1, 0, 0, 1), (2, 3), (1, 2), 1),
    ((1, 4, 3, 3), (4, 1, 2, 3), (0, 0, -1, -2), (3, 2), (1, 1), 2),  # negative: zeros added
    ((1, 4, 4), (4, 1, 3), (1, 1), (2,), (1,), 4),  # 1-D depthwise
    ((1, 2, 2, 3, 2), (2, 2, 2, 2, 2), (0, 1, 0, 0, 0, 1), (2, 1, 2), (1, 1, 2), 1),  # 3-D
]


@pytest.mark.parametrize(("xl", "wl", "padding", "stride", "dilation", "group"), DECONV_CASES)
def test_deconvolution(xl, wl, padding, stride, dilation, group) -> None:
    x, w = rand(*xl), rand(*wl)
    op = make_op("deconvolution", padding=padding, stride=stride, dilation=dilation, group=group)
    nd = len(xl) - 2
    begin, end = (padding, padding) if len(padding) == nd else (padding[:nd], padding[nd:])
    ref = deconv_ref(x, w, begin, end, stride, dilation, group)
    np.testing.assert_allclose(run(op, x, w), ref, rtol=1e-4, atol=1e-5)


def test_deconvolution_shape_errors() -> None:
    op = make_op("deconvolution")
    with pytest.raises(ShapeError, match="weights"):
        op.compute_shape([Shape("float_type", (1, 3, 4, 4)), Shape("float_type", (2, 3, 3, 3))])
    op = make_op("deconvolution", padding=(3, 3))
    with pytest.raises(ShapeError, match="leaves no output"):
        op.compute_shape([Shape("float_type", (1, 3, 2, 2)), Shape("float_type", (3, 1, 2, 2))])


# --- pooling ---------------------------------------------------------------------------------
POOL_CASES = [
    # x lens, lengths, stride, padding, dilations, ceil_mode
    ((1, 2, 7, 7), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),
    ((2, 3, 6, 7), (2, 3), (2, 2), (0, 1, 1, 0), (1, 1), True),
    ((1, 2, 8, 9), (3, 2), (1, 2), (1, 0), (2, 2), False),
    ((1, 2, 5, 5), (2, 2), (2, 2), (1, 1), (1, 1), True),
    ((1, 1, 10), (3,), (3,), (1, 2), (2,), True),  # 1-D
    ((1, 2, 5, 4, 6), (2, 2, 3), (2, 1, 2), (1, 0, 1, 0, 1, 1), (1, 2, 1), False),  # 3-D
]


def _pool_args(xl, lengths, stride, padding, dilations, ceil_mode):
    nd = len(xl) - 2
    begin, end = (padding, padding) if len(padding) == nd else (padding[:nd], padding[nd:])
    out = []
    for n, k, s, b, e, d in zip(xl[2:], lengths, stride, begin, end, dilations, strict=True):
        span = n + b + e - (k - 1) * d - 1
        o = -(-span // s) + 1 if ceil_mode else span // s + 1
        out.append(o - 1 if ceil_mode and (o - 1) * s >= n + b else o)
    return begin, end, out


@pytest.mark.parametrize("mode", ["max", "average", "average_pad", "lpnorm", "lpnorm3"])
@pytest.mark.parametrize(("xl", "lengths", "stride", "padding", "dilations", "ceil"), POOL_CASES)
def test_pooling(mode, xl, lengths, stride, padding, dilations, ceil) -> None:
    x = rand(*xl)
    base = mode.rstrip("3").removesuffix("_pad")
    p = 3 if mode.endswith("3") else 2
    include = mode.endswith("_pad")
    op = make_op(
        "pooling",
        mode=base,
        padding=padding,
        stride=stride,
        lengths=lengths,
        dilations=dilations,
        ceil_mode=ceil,
        count_include_pad=include,
        lp_order=p,
    )
    begin, end, out = _pool_args(xl, lengths, stride, padding, dilations, ceil)
    ref = pool_ref(x, base, begin, end, stride, lengths, dilations, out, include, p)
    np.testing.assert_allclose(run(op, x), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["max", "average", "lpnorm"])
def test_global_pooling(mode: str) -> None:
    x = rand(2, 3, 5, 4)
    y = run(make_op("pooling", mode=mode, global_=True), x)
    ref = pool_ref(x, mode, (0, 0), (0, 0), (1, 1), (5, 4), (1, 1), (1, 1))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    y2 = run(make_op("pooling", mode=mode, lengths=(5, 4)), x)
    np.testing.assert_allclose(y2, ref, rtol=1e-5, atol=1e-6)


def test_max_pooling_integers() -> None:
    x = RNG.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    op = make_op("pooling", mode="max", padding=(1, 1), stride=(2, 2), lengths=(3, 3))
    y = run(op, x)
    ref = pool_ref(x, "max", (1, 1), (1, 1), (2, 2), (3, 3), (1, 1), (3, 3))
    np.testing.assert_array_equal(y, ref.astype(np.uint8))


def test_pooling_printing() -> None:
    op = make_op("pooling", mode="max", padding=(1, 1, 1, 1), stride=(2, 2), lengths=(3, 3))
    assert str(op).startswith(
        "pooling[mode=max,padding={1, 1, 1, 1},stride={2, 2},lengths={3, 3},ceil_mode=0,"
        "lp_order=2,global=0,"
    )


@pytest.mark.parametrize("order", [0, 1])
def test_pooling_indices(order: int) -> None:
    x = rand(2, 2, 5, 6)
    attrs = {"padding": (1, 0), "stride": (2, 2), "lengths": (3, 2), "ceil_mode": True}
    idx = run(make_op("pooling_indices", storage_order=order, **attrs), x)
    y = run(make_op("pooling", mode="max", **attrs), x)
    assert idx.dtype == np.int64 and idx.shape == y.shape
    for b, c, i, j in positions(idx.shape):
        flat = idx[b, c, i, j] - (b * 2 + c) * 30
        h, w = (flat % 5, flat // 5) if order else divmod(flat, 6)
        assert x[b, c, h, w] == y[b, c, i, j]


@pytest.mark.parametrize(
    ("xl", "attrs", "message"),
    [
        ((1, 2, 4, 4), {"mode": "min"}, "mode"),
        ((1, 2, 4, 4), {"lengths": (5, 5)}, "larger than the padded input"),
        ((1, 2, 4, 4), {"lengths": (2,)}, "lengths"),
        ((1, 2, 4, 4), {"stride": (0, 1)}, "positive"),
        ((1, 2, 4, 4), {"padding": (-1, 0)}, "negative"),
        ((4, 4), {}, "rank >= 3"),
    ],
)
def test_pooling_shape_errors(xl, attrs, message) -> None:
    with pytest.raises(ShapeError, match=message):
        make_op("pooling", **attrs).compute_shape([Shape("float_type", xl)])


def test_average_pooling_of_integers_is_refused() -> None:
    with pytest.raises(ShapeError, match="float"):
        make_op("pooling").compute_shape([Shape("int32_type", (1, 1, 4, 4))])


# --- normalisation ---------------------------------------------------------------------------
def test_batch_norm_inference() -> None:
    x = rand(2, 3, 4, 5)
    scale, bias, mean = rand(3), rand(3), rand(3)
    var = np.abs(rand(3)) + 0.1
    op = make_op("batch_norm_inference", epsilon=1e-3)
    y = run(op, x, scale, bias, mean, var)
    ref = np.empty_like(x)
    for c in range(3):
        ref[:, c] = (x[:, c] - mean[c]) / np.sqrt(var[c] + 1e-3) * scale[c] + bias[c]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    assert str(op) == "batch_norm_inference[epsilon=0.001,momentum=0.9,bn_mode=1]"


def test_batch_norm_per_activation() -> None:
    x = rand(2, 3, 4)
    params = [rand(3, 4) for _ in range(3)] + [np.abs(rand(3, 4)) + 0.1]
    y = run(make_op("batch_norm_inference", bn_mode=0), x, *params)
    scale, bias, mean, var = params
    np.testing.assert_allclose(y, (x - mean) / np.sqrt(var + 1e-5) * scale + bias, rtol=1e-5)


def test_batch_norm_shape_errors() -> None:
    op = make_op("batch_norm_inference")
    x, c = Shape("float_type", (1, 3, 4, 4)), Shape("float_type", (3,))
    with pytest.raises(ShapeError, match="expected 5 inputs"):
        op.compute_shape([x, c, c, c])
    with pytest.raises(ShapeError, match=r"parameter 3 has lens \[4\]"):
        op.compute_shape([x, c, c, Shape("float_type", (4,)), c])


def test_instance_norm() -> None:
    x = rand(2, 3, 4, 5)
    scale, bias = rand(3), rand(3)
    y = run(make_op("instance_norm", epsilon=1e-4), x, scale, bias)
    ref = np.empty_like(x)
    for n, c in positions((2, 3)):
        v = x[n, c].astype(np.float64)
        ref[n, c] = (v - v.mean()) / np.sqrt(v.var() + 1e-4) * scale[c] + bias[c]
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ShapeError, match="parameter 1"):
        make_op("instance_norm").compute_shape(
            [Shape("float_type", (2, 3, 4)), Shape("float_type", (2,)), Shape("float_type", (3,))]
        )


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_lrn(size: int) -> None:
    x = rand(2, 6, 3, 2)
    op = make_op("lrn", alpha=0.01, beta=0.6, bias=1.5, size=size)
    y = run(op, x)
    ref = np.empty_like(x)
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    for c in range(6):
        sq = (x[:, max(0, c - lo) : min(6, c + hi + 1)] ** 2).sum(axis=1)
        ref[:, c] = x[:, c] / (1.5 + 0.01 / size * sq) ** 0.6
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


# --- deformable convolution, unpooling -------------------------------------------------------
def deform_ref(x, w, offset, mask, begin, stride, dilation, group, og):
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    oh, ow = offset.shape[2:]
    off = offset.reshape(n, og, kh, kw, 2, oh, ow)
    msk = mask.reshape(n, og, kh, kw, oh, ow)

    def sample(b, ch, py, px):
        y0, x0 = int(np.floor(py)), int(np.floor(px))
        total = 0.0
        for yy, xx in itertools.product((y0, y0 + 1), (x0, x0 + 1)):
            if 0 <= yy < h and 0 <= xx < wd:
                total += (1 - abs(py - yy)) * (1 - abs(px - xx)) * x[b, ch, yy, xx]
        return total

    y = np.zeros((n, m, oh, ow))
    for b, o, i, j in positions((n, m, oh, ow)):
        g = o // (m // group)
        for ci, ti, tj in positions((cg, kh, kw)):
            ch = g * cg + ci
            gi = ch // (c // og)
            py = i * stride[0] - begin[0] + ti * dilation[0] + off[b, gi, ti, tj, 0, i, j]
            px = j * stride[1] - begin[1] + tj * dilation[1] + off[b, gi, ti, tj, 1, i, j]
            v = sample(b, ch, py, px) * msk[b, gi, ti, tj, i, j]
            y[b, o, i, j] += v * w[o, ci, ti, tj]
    return y


@pytest.mark.parametrize(
    ("xl", "wl", "padding", "stride", "dilation", "group", "og"),
    [
        ((1, 2, 5, 5), (3, 2, 3, 3), (1, 1), (1, 1), (1, 1), 1, 1),
        ((2, 4, 6, 7), (4, 2, 2, 3), (0, 1, 1, 0), (2, 1), (1, 2), 2, 2),
    ],
)
def test_deform_convolution(xl, wl, padding, stride, dilation, group, og) -> None:
    x, w = rand(*xl), rand(*wl)
    op = make_op(
        "deform_convolution",
        padding=padding,
        stride=stride,
        dilation=dilation,
        group=group,
        offset_group=og,
    )
    out = make_op(
        "convolution", padding=padding, stride=stride, dilation=dilation, group=group
    ).compute_shape([Shape("float_type", xl), Shape("float_type", wl)])
    kk = wl[2] * wl[3]
    offset = rand(xl[0], og * kk * 2, *out.lens()[2:]) * 1.5
    mask = RNG.random((xl[0], og * kk, *out.lens()[2:])).astype(np.float32)
    begin = padding[:2] if len(padding) == 4 else padding
    ref = deform_ref(x, w, offset, mask, begin, stride, dilation, group, og)
    np.testing.assert_allclose(run(op, x, w, offset, mask), ref, rtol=1e-4, atol=1e-5)
    ones = np.ones_like(mask)
    ref1 = deform_ref(x, w, offset, ones, begin, stride, dilation, group, og)
    np.testing.assert_allclose(run(op, x, w, offset), ref1, rtol=1e-4, atol=1e-5)


def test_deform_convolution_with_zero_offsets_is_a_convolution() -> None:
    x, w = rand(1, 3, 6, 6), rand(2, 3, 3, 3)
    op = make_op("deform_convolution", padding=(1, 1), stride=(2, 2))
    y = run(op, x, w, np.zeros((1, 18, 3, 3), np.float32))
    np.testing.assert_allclose(y, conv_ref(x, w, (1, 1), (1, 1), (2, 2), (1, 1), 1), atol=1e-5)
    with pytest.raises(ShapeError, match="offset lens"):
        op.compute_shape(
            [Shape("float_type", s) for s in [(1, 3, 6, 6), (2, 3, 3, 3), (1, 9, 3, 3)]]
        )


def test_max_unpool() -> None:
    x = rand(1, 2, 6, 6)
    attrs = {"stride": (2, 2), "lengths": (2, 2)}
    y = run(make_op("pooling", mode="max", **attrs), x)
    idx = run(make_op("pooling_indices", **attrs), x)
    up = run(make_op("max_unpool", out_lens=(1, 2, 6, 6)), y, idx)
    assert up.shape == x.shape and np.count_nonzero(up) == y.size
    np.testing.assert_array_equal(up.reshape(-1)[idx.reshape(-1)], y.reshape(-1))
    with pytest.raises(ShapeError, match="out_lens"):
        make_op("max_unpool", out_lens=(1, 3, 6, 6)).compute_shape(
            [Shape("float_type", y.shape), Shape("int64_type", y.shape)]
        )
