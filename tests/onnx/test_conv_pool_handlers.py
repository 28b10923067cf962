"""Conv, ConvTranspose, pooling and CNN normalisation handlers against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from pygraphx.onnx.errors import OnnxParseError
from tests.helpers import check_node, make_model, run_pgx

RNG = np.random.default_rng(0)
TOL = {"rtol": 1e-4, "atol": 1e-5}


def rand(*lens: int) -> np.ndarray:
    return RNG.standard_normal(lens).astype(np.float32)


# --- Conv ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"pads": [1, 1, 1, 1]},
        {"strides": [2, 2], "pads": [1, 0, 2, 1]},
        {"dilations": [2, 1], "pads": [2, 1, 2, 1]},
        {"strides": [2, 3], "auto_pad": "SAME_UPPER"},
        {"strides": [2, 3], "auto_pad": "SAME_LOWER"},
        {"strides": [1, 1], "auto_pad": "SAME_UPPER"},
        {"auto_pad": "VALID", "strides": [2, 2]},
        {"kernel_shape": [3, 3], "strides": [3, 2]},
    ],
)
@pytest.mark.parametrize("bias", [False, True])
def test_conv(attrs: dict, bias: bool) -> None:
    inits = {"w": rand(4, 3, 3, 3)}
    if bias:
        inits["b"] = rand(4)
    check_node("Conv", {"x": rand(2, 3, 9, 10)}, attrs, initializers=inits, **TOL)


@pytest.mark.parametrize(
    ("x", "w", "attrs"),
    [
        ((1, 4, 8, 8), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
        ((2, 8, 9, 9), (8, 1, 3, 3), {"group": 8, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ((1, 4, 7, 7), (8, 1, 5, 5), {"group": 4, "auto_pad": "SAME_LOWER", "strides": [2, 2]}),
        ((2, 3, 12), (5, 3, 4), {"strides": [2], "pads": [1, 2], "dilations": [2]}),
        ((1, 2, 5, 6, 7), (4, 2, 2, 3, 3), {"strides": [1, 2, 2], "pads": [1, 1, 0, 0, 1, 1]}),
        ((1, 3, 9, 9), (4, 3, 1, 1), {"strides": [2, 2]}),
    ],
)
def test_conv_groups_and_ranks(x: tuple, w: tuple, attrs: dict) -> None:
    inits = {"w": rand(*w), "b": rand(w[0])}
    check_node("Conv", {"x": rand(*x)}, attrs, initializers=inits, **TOL)


def test_conv_weights_as_input_and_old_opset() -> None:
    check_node(
        "Conv",
        {"x": rand(1, 2, 6, 6), "w": rand(3, 2, 2, 2)},
        {"pads": [0, 1, 1, 0]},
        opset=7,
        **TOL,
    )


def test_conv_ir_form() -> None:
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[3, 3, 3, 3])
    inits = {"w": rand(8, 3, 7, 7), "b": rand(8)}
    model = make_model([node], {"x": rand(1, 3, 32, 32)}, ["y"], inits)
    import pygraphx

    text = str(pygraphx.parse_onnx_buffer(model.SerializeToString()))
    assert (
        "convolution[padding={3, 3, 3, 3},stride={2, 2},dilation={1, 1},group=1,padding_mode=0]"
        "(x,main:@0)" in text
    )
    assert "broadcast[axis=1,out_lens={1, 8, 16, 16}]" in text
    assert "add(" in text


def test_conv_kernel_shape_mismatch() -> None:
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[2, 2])
    model = make_model([node], {"x": rand(1, 2, 5, 5), "w": rand(3, 2, 3, 3)}, ["y"])
    with pytest.raises(OnnxParseError, match="kernel_shape"):
        run_pgx(model, {"x": rand(1, 2, 5, 5), "w": rand(3, 2, 3, 3)})


# --- ConvTranspose ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"strides": [2, 2]},
        {"strides": [3, 2], "pads": [1, 0, 2, 1]},
        {"strides": [2, 2], "output_padding": [1, 1]},
        {"strides": [3, 2], "pads": [1, 1, 1, 1], "output_padding": [2, 0]},
        {"dilations": [2, 2], "strides": [2, 1]},
        {"strides": [2, 2], "output_shape": [9, 10]},
        {"strides": [3, 2], "output_shape": [10, 8], "output_padding": [1, 1]},
        {"strides": [2, 2], "auto_pad": "VALID"},
        {"strides": [2, 2], "auto_pad": "SAME_LOWER"},
        {"strides": [2, 2], "auto_pad": "SAME_UPPER", "output_padding": [1, 1]},
        {"group": 2, "strides": [2, 1], "pads": [0, 1, 1, 0]},
    ],
)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_transpose(attrs: dict, bias: bool) -> None:
    inits = {"w": rand(4, 3, 3, 3)}
    if bias:
        inits["b"] = rand(3 * attrs.get("group", 1))
    check_node("ConvTranspose", {"x": rand(2, 4, 4, 5)}, attrs, initializers=inits, **TOL)


@pytest.mark.parametrize(
    ("x", "w", "attrs"),
    [
        ((1, 3, 6), (3, 2, 3), {"strides": [2], "pads": [1, 0]}),
        ((1, 2, 3, 3, 3), (2, 2, 2, 2, 2), {"strides": [2, 2, 1], "output_padding": [1, 0, 0]}),
        ((2, 6, 4, 4), (6, 1, 3, 3), {"group": 6, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ],
)
def test_conv_transpose_ranks_and_depthwise(x: tuple, w: tuple, attrs: dict) -> None:
    check_node("ConvTranspose", {"x": rand(*x)}, attrs, initializers={"w": rand(*w)}, **TOL)


# --- ConvInteger / QLinearConv ---------------------------------------------------------------
def test_conv_integer() -> None:
    x = RNG.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    w = RNG.integers(0, 255, (3, 2, 3, 3)).astype(np.uint8)
    inits = {"w": w, "xz": np.array(12, np.uint8), "wz": np.array(130, np.uint8)}
    check_node("ConvInteger", {"x": x}, {"pads": [1, 1, 1, 1]}, initializers=inits, opset=10)


def _qlinear_conv_oracle(x, w, b, xs, xz, ws, ys, yz, strides, pads):
    """QLinearConv written out in numpy (an oracle independent of both engines)."""
    xi = np.pad(
        x.astype(np.int64) - int(xz), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3]))
    )
    kh, kw = w.shape[2:]
    oh = (xi.shape[2] - kh) // strides[0] + 1
    ow = (xi.shape[3] - kw) // strides[1] + 1
    acc = np.zeros((x.shape[0], w.shape[0], oh, ow), np.float64)
    for i in range(oh):
        for j in range(ow):
            patch = xi[
                :, :, i * strides[0] : i * strides[0] + kh, j * strides[1] : j * strides[1] + kw
            ]
            acc[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w.astype(np.int64))
    acc += b[None, :, None, None]
    y = np.rint(acc * xs * ws[None, :, None, None] / ys) + int(yz)
    return np.clip(y, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("strides", [[1, 1], [2, 2], [2, 1]])
def test_qlinear_conv(strides: list[int]) -> None:
    x = RNG.integers(0, 255, (1, 2, 6, 6)).astype(np.uint8)
    w = RNG.integers(-100, 100, (4, 2, 3, 3)).astype(np.int8)
    inits = {
        "xs": np.array(0.05, np.float32),
        "xz": np.array(128, np.uint8),
        "w": w,
        "ws": np.array([0.01, 0.02, 0.015, 0.03], np.float32),
        "wz": np.zeros(4, np.int8),
        "ys": np.array(0.3, np.float32),
        "yz": np.array(100, np.uint8),
        "b": RNG.integers(-500, 500, 4).astype(np.int32),
    }
    attrs = {"strides": strides, "pads": [1, 1, 1, 1]}
    names = ["x", *inits]
    model = make_model(
        [helper.make_node("QLinearConv", names, ["y"], **attrs)], {"x": x}, ["y"], inits, 10
    )
    (ours,) = run_pgx(model, {"x": x})
    want = _qlinear_conv_oracle(
        x, w, inits["b"], 0.05, 128, inits["ws"].astype(np.float64), 0.3, 100, strides, [1, 1, 1, 1]
    )
    # the oracle, not ONNX Runtime: ORT 1.32 gets strides [2, 1] wrong by up to 28 steps
    np.testing.assert_allclose(ours.astype(np.int64), want.astype(np.int64), rtol=0, atol=1)


# --- pooling ---------------------------------------------------------------------------------
POOL_ATTRS = [
    {"kernel_shape": [3, 3]},
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [2, 3], "strides": [2, 2], "pads": [0, 1, 1, 0], "ceil_mode": 1},
    {"kernel_shape": [3, 2], "strides": [2, 3], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 1, 1, 1], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"kernel_shape": [4, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"},
    {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "VALID"},
]
DILATED = [
    {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 2], "dilations": [2, 3], "strides": [2, 1], "ceil_mode": 1},
]


@pytest.mark.parametrize("attrs", POOL_ATTRS + DILATED)
def test_max_pool(attrs: dict) -> None:
    check_node("MaxPool", {"x": rand(2, 3, 9, 10)}, attrs)


@pytest.mark.parametrize("attrs", POOL_ATTRS)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool(attrs: dict, include_pad: int) -> None:
    attrs = {**attrs, "count_include_pad": include_pad}
    check_node("AveragePool", {"x": rand(2, 3, 9, 10)}, attrs, **TOL)


@pytest.mark.parametrize("attrs", DILATED)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool_dilations_opset19(attrs: dict, include_pad: int) -> None:
    attrs = {**attrs, "count_include_pad": include_pad}
    check_node("AveragePool", {"x": rand(1, 2, 9, 10)}, attrs, opset=19, **TOL)


@pytest.mark.parametrize("attrs", POOL_ATTRS[:3] + POOL_ATTRS[5:])
@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(attrs: dict, p: int) -> None:
    check_node("LpPool", {"x": rand(2, 3, 9, 10)}, {**attrs, "p": p}, opset=18, **TOL)


@pytest.mark.parametrize(
    ("op", "x", "attrs"),
    [
        ("MaxPool", (1, 2, 11), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
        ("AveragePool", (1, 2, 11), {"kernel_shape": [4], "strides": [3], "ceil_mode": 1}),
        ("MaxPool", (1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2]}),
        ("AveragePool", (1, 2, 5, 6, 7), {"kernel_shape": [3, 3, 3], "pads": [1] * 6}),
    ],
)
def test_pool_ranks(op: str, x: tuple, attrs: dict) -> None:
    check_node(op, {"x": rand(*x)}, attrs, **TOL)


def test_max_pool_uint8_and_old_opsets() -> None:
    x = RNG.integers(0, 255, (1, 2, 6, 6)).astype(np.uint8)
    check_node("MaxPool", {"x": x}, {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]}, opset=12)
    check_node("MaxPool", {"x": rand(1, 2, 6, 6)}, {"kernel_shape": [3, 3]}, opset=7)
    check_node(
        "AveragePool",
        {"x": rand(1, 2, 6, 6)},
        {"kernel_shape": [3, 3], "pads": [1] * 4},
        opset=7,
        **TOL,
    )


@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1, "storage_order": 1},
        {"kernel_shape": [2, 2], "dilations": [2, 2], "storage_order": 0},
    ],
)
def test_max_pool_indices(attrs: dict) -> None:
    check_node("MaxPool", {"x": rand(2, 3, 7, 8)}, attrs, num_outputs=2)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
@pytest.mark.parametrize("lens", [(2, 3, 7, 7), (1, 4, 9), (1, 2, 3, 4, 5)])
def test_global_pool(op: str, lens: tuple) -> None:
    check_node(op, {"x": rand(*lens)}, **TOL)


def test_global_lp_pool_p3() -> None:
    check_node("GlobalLpPool", {"x": rand(2, 3, 5, 5)}, {"p": 3}, **TOL)


# --- normalisation ---------------------------------------------------------------------------
def _bn_inits(c: int) -> dict[str, np.ndarray]:
    return {"s": rand(c), "b": rand(c), "m": rand(c), "v": np.abs(rand(c)) + 0.5}


@pytest.mark.parametrize("opset", [7, 9, 14, 15, 17])
@pytest.mark.parametrize("lens", [(2, 3, 4, 5), (2, 3), (1, 3, 6), (1, 3, 2, 3, 4)])
def test_batch_norm(opset: int, lens: tuple) -> None:
    check_node(
        "BatchNormalization",
        {"x": rand(*lens)},
        {"epsilon": 1e-3},
        initializers=_bn_inits(3),
        opset=opset,
        **TOL,
    )


def test_batch_norm_mixed_types_opset15() -> None:
    inits = _bn_inits(3)
    inits = {k: v.astype(np.float16) if k in "sb" else v for k, v in inits.items()}
    check_node("BatchNormalization", {"x": rand(2, 3, 4, 4)}, initializers=inits, opset=15, **TOL)


def test_batch_norm_ir_form() -> None:
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"])
    model = make_model([node], {"x": rand(1, 3, 4, 4)}, ["y"], _bn_inits(3))
    import pygraphx

    text = str(pygraphx.parse_onnx_buffer(model.SerializeToString()))
    assert "batch_norm_inference[epsilon=1e-05,momentum=0.9,bn_mode=1](x," in text


def test_batch_norm_training_mode_is_refused() -> None:
    outs = ["y", "rm", "rv"]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], outs, training_mode=1)
    model = make_model([node], {"x": rand(2, 3, 4, 4)}, outs, _bn_inits(3), opset=15)
    with pytest.raises(OnnxParseError, match="training_mode=1"):
        run_pgx(model, {"x": rand(2, 3, 4, 4)})


def test_batch_norm_running_stat_outputs_pass_through() -> None:
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"])
    inits = _bn_inits(3)
    graph = helper.make_graph(
        [node],
        "bn",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 4])],
        [onnx.ValueInfoProto(name=n) for n in ("y", "rm", "rv")],
        [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    _, rm, rv = run_pgx(model, {"x": rand(2, 3, 4)})
    np.testing.assert_array_equal(rm, inits["m"])
    np.testing.assert_array_equal(rv, inits["v"])


@pytest.mark.parametrize("lens", [(2, 3, 5, 6), (1, 3, 7), (2, 3, 2, 3, 4)])
def test_instance_norm(lens: tuple) -> None:
    check_node(
        "InstanceNormalization",
        {"x": rand(*lens) * 3 + 1},
        {"epsilon": 1e-3},
        initializers={"s": rand(3), "b": rand(3)},
        **TOL,
    )


@pytest.mark.parametrize("size", [1, 3, 5])  # ONNX Runtime takes odd sizes only
@pytest.mark.parametrize("opset", [1, 13])
def test_lrn(size: int, opset: int) -> None:
    attrs = {"size": size, "alpha": 0.002, "beta": 0.7, "bias": 1.3}
    check_node("LRN", {"x": rand(2, 7, 4, 3)}, attrs, opset=max(opset, 7), **TOL)


# --- DeformConv, MaxUnpool, CausalConvWithState ----------------------------------------------
@pytest.mark.parametrize(
    ("x", "w", "attrs", "with_mask"),
    [
        ((1, 2, 5, 5), (3, 2, 3, 3), {"pads": [1, 1, 1, 1]}, False),
        ((2, 4, 6, 7), (4, 2, 2, 3), {"group": 2, "offset_group": 2, "strides": [2, 1]}, True),
        ((1, 2, 7, 6), (2, 2, 2, 2), {"dilations": [2, 1], "pads": [0, 1, 1, 0]}, True),
    ],
)
def test_deform_conv(x: tuple, w: tuple, attrs: dict, with_mask: bool) -> None:
    nd, og = len(x) - 2, attrs.get("offset_group", 1)
    pads = attrs.get("pads", [0] * 4)
    strides, dil = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    out = [
        (x[i + 2] + pads[i] + pads[i + nd] - (w[i + 2] - 1) * dil[i] - 1) // strides[i] + 1
        for i in range(nd)
    ]
    kk = w[2] * w[3]
    inits = {"w": rand(*w), "off": rand(x[0], og * kk * 2, *out) * 2, "b": rand(w[0])}
    if with_mask:
        inits["m"] = RNG.random((x[0], og * kk, *out)).astype(np.float32)
    check_node("DeformConv", {"x": rand(*x)}, attrs, initializers=inits, opset=19, **TOL)


@pytest.mark.parametrize("with_shape", [False, True])
def test_max_unpool(with_shape: bool) -> None:
    x = rand(1, 2, 7, 7) if with_shape else rand(1, 2, 6, 6)
    pool = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], strides=[2, 2])
    inputs = ["y", "i"] + (["s"] if with_shape else [])
    unpool = helper.make_node("MaxUnpool", inputs, ["z"], kernel_shape=[2, 2], strides=[2, 2])
    inits = {"s": np.array([1, 2, 7, 7], np.int64)} if with_shape else {}
    model = make_model([pool, unpool], {"x": x}, ["z"], inits, opset=11)
    from tests.helpers import assert_outputs_match, run_ort

    assert_outputs_match(run_pgx(model, {"x": x}), run_ort(model, {"x": x}), 0, 0)


def causal_conv_ref(x, w, bias, past, activation):
    k = w.shape[2]
    state = past if past is not None else np.zeros((*x.shape[:2], k - 1), x.dtype)
    padded = np.concatenate([state, x], axis=2)
    y = np.zeros(x.shape, np.float64)
    for t in range(x.shape[2]):
        y[:, :, t] = (padded[:, :, t : t + k] * w[:, 0]).sum(axis=2)
    if bias is not None:
        y += bias[:, None]
    if activation != "none":
        y = y / (1 + np.exp(-y))
    return y.astype(x.dtype), padded[:, :, padded.shape[2] - (k - 1) :]


@pytest.mark.parametrize("activation", ["none", "silu"])
@pytest.mark.parametrize(
    ("k", "with_bias", "with_past"), [(4, True, True), (3, False, False), (1, True, False)]
)
def test_causal_conv_with_state(activation: str, k: int, with_bias: bool, with_past: bool) -> None:
    x, w, b, past = rand(2, 5, 6), rand(5, 1, k), rand(5), rand(2, 5, k - 1)
    names = ["x", "w", "b" if with_bias else "", "past" if with_past else ""]
    node = helper.make_node("CausalConvWithState", names, ["y", "state"], activation=activation)
    feeds = {"x": x, **({"past": past} if with_past else {})}
    graph = helper.make_graph(
        [node],
        "causal",
        [
            helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, list(v.shape))
            for n, v in feeds.items()
        ],
        [onnx.ValueInfoProto(name="y"), onnx.ValueInfoProto(name="state")],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 27)])
    y, state = run_pgx(model, feeds)
    ref_y, ref_state = causal_conv_ref(
        x, w, b if with_bias else None, past if with_past else None, activation
    )
    np.testing.assert_allclose(y, ref_y, **TOL)
    np.testing.assert_array_equal(state, ref_state)
