"""The `cpu` target (torch on the CPU) against the `ref` target.

Every IR op family runs on small inputs through a one-node (or few-node) ONNX model compiled for
both targets; the lowering's fusions (convolution epilogues, GEMM bias, in-place pointwise code)
get models of their own; the four built-in models are compared end to end. Tolerances: float32
results agree to rtol = atol = 1e-5 for element-wise and data-movement ops (torch and numpy do
the same float32 arithmetic, with different but correctly rounded transcendental kernels), and
to 1e-4 for convolutions, GEMMs, reductions and the whole models, whose float32 sums are
accumulated in a different order by oneDNN / MKL than by numpy's BLAS (the errors grow with the
length of the dot products, about 1e-6 relative per term). Integer and bool results are exact.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.ir.program import Program  # noqa: E402
from pygraphx.ir.shape import Shape  # noqa: E402
from pygraphx.ops.handler import NumpyOps  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget, cpu_threads  # noqa: E402
from pygraphx.targets.torch_lowering.handler import TORCH, TorchOps  # noqa: E402
from tests.helpers import make_model  # noqa: E402

RNG = np.random.default_rng(0)


def f32(*shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return RNG.uniform(lo, hi, shape).astype(np.float32)


def ints(*shape: int, lo: int = -5, hi: int = 6, dtype: Any = np.int64) -> np.ndarray:
    return RNG.integers(lo, hi, shape).astype(dtype)


def compile_both(model: onnx.ModelProto) -> tuple[Program, Program]:
    data = model.SerializeToString()
    ref = pygraphx.parse_onnx_buffer(data)
    ref.compile(pygraphx.get_target("ref"))
    cpu = pygraphx.parse_onnx_buffer(data)
    cpu.compile(pygraphx.get_target("cpu"))
    return ref, cpu


def compare(
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray],
    rtol: float = 1e-5,
    atol: float = 1e-5,
) -> Program:
    """Run `model` on ref and cpu; every output must match in dtype, shape and value."""
    ref, cpu = compile_both(model)
    want = [np.array(a) for a in ref.run(dict(feeds))]
    got = [np.array(a) for a in cpu.run(dict(feeds))]
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.dtype == b.dtype, f"output {k}: dtype {a.dtype}, expected {b.dtype}"
        assert a.shape == b.shape, f"output {k}: shape {a.shape}, expected {b.shape}"
        if a.dtype.kind in "biu":
            np.testing.assert_array_equal(a, b, err_msg=f"output {k}")
        else:
            np.testing.assert_allclose(
                a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol,
                err_msg=f"output {k}",
            )  # fmt: skip
    return cpu


def node_model(
    op_type: str,
    inputs: Mapping[str, np.ndarray],
    attrs: Mapping[str, Any] | None = None,
    initializers: Mapping[str, np.ndarray] | None = None,
    num_outputs: int = 1,
    opset: int = 17,
) -> onnx.ModelProto:
    names = list(inputs) + list(initializers or {})
    outs = [f"out{k}" for k in range(num_outputs)]
    node = helper.make_node(op_type, names, outs, **(attrs or {}))
    return make_model([node], inputs, outs, initializers, opset)


def check(
    op_type: str,
    inputs: Mapping[str, np.ndarray],
    attrs: Mapping[str, Any] | None = None,
    initializers: Mapping[str, np.ndarray] | None = None,
    num_outputs: int = 1,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    opset: int = 17,
) -> Program:
    model = node_model(op_type, inputs, attrs, initializers, num_outputs, opset)
    return compare(model, inputs, rtol, atol)


# --- the ops handler -----------------------------------------------------------------------


def test_handler_has_every_numpy_method() -> None:
    want = {n for n in dir(NumpyOps) if not n.startswith("_")}
    have = {n for n in dir(TorchOps) if not n.startswith("_")}
    assert want <= have, f"TorchOps lacks {sorted(want - have)}"


_UNARY = ["neg", "abs", "sign", "floor", "ceil", "exp", "log", "sqrt", "rsqrt", "recip", "erf",
          "sigmoid", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
          "asinh", "acosh", "atanh", "round", "isnan", "isinf"]  # fmt: skip
_BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "fmax", "fmin", "fmod", "mod",
           "pow", "equal", "less", "greater", "less_equal", "greater_equal"]  # fmt: skip


@pytest.mark.parametrize("name", _UNARY)
def test_handler_unary_matches_numpy(name: str) -> None:
    x = np.array([-2.5, -1.5, -0.5, 0.0, 0.3, 0.5, 0.99, 1.5, 2.5, np.nan, np.inf], np.float32)
    with np.errstate(all="ignore"):
        want = np.asarray(getattr(NumpyOps, name)(x))
    got = getattr(TORCH, name)(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)
    out = torch.empty(x.shape, dtype=torch.from_numpy(want).dtype)
    getattr(TORCH, name)(torch.from_numpy(x), out=out)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("name", _BINARY)
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_handler_binary_matches_numpy(name: str, dtype: Any) -> None:
    if dtype == np.int32 and name == "pow":
        x, y = np.array([2, -3, 4], dtype), np.array([3, 2, 0], dtype)
    elif dtype == np.int32:
        x, y = np.array([7, -7, 7, -7, 5, 0], dtype), np.array([2, 2, -2, -2, 5, 3], dtype)
    else:
        x = np.array([7.5, -7.5, 7.5, -7.5, 0.5, 2.0], dtype)
        y = np.array([2.0, 2.0, -2.0, -2.0, 0.25, 3.0], dtype)
    with np.errstate(all="ignore"):
        want = np.asarray(getattr(NumpyOps, name)(x, y))
    got = getattr(TORCH, name)(torch.from_numpy(x), torch.from_numpy(y)).numpy()
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_handler_where_cast_constant_logic() -> None:
    c = torch.tensor([True, False, True])
    a, b = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([-1.0, -2.0, -3.0])
    assert TORCH.where(c, a, b).tolist() == [1.0, -2.0, 3.0]
    assert TORCH.cast(a, np.int32).dtype == torch.int32
    k = TORCH.constant(0.7, torch.tensor([1, 2], dtype=torch.int64))
    assert k.dtype == torch.int64 and k.item() == 0  # the constant takes the int type
    assert TORCH.logical_xor(c, ~c).tolist() == [True, True, True]
    assert TORCH.bitwise_not(torch.tensor([0], dtype=torch.int8)).item() == -1


# --- op families against ref -----------------------------------------------------------------

_ELEMENTWISE_UNARY = ["Abs", "Neg", "Exp", "Sqrt", "Sin", "Cos", "Tanh", "Sigmoid", "Erf",
                      "Floor", "Ceil", "Round", "Sign", "Reciprocal", "Relu", "Atan",
                      "Softsign", "Softplus", "HardSigmoid", "Selu", "Elu",
                      "LeakyRelu"]  # fmt: skip


@pytest.mark.parametrize("op", _ELEMENTWISE_UNARY)
def test_unary(op: str) -> None:
    x = f32(2, 3, 5)
    if op in ("Sqrt",):
        x = np.abs(x) + 0.1
    check(op, {"x": x})


def test_log_and_isnan_isinf() -> None:
    check("Log", {"x": np.abs(f32(3, 4)) + 0.1})
    x = np.array([1.0, np.nan, np.inf, -np.inf, 0.0], np.float32)
    check("IsNaN", {"x": x})
    check("IsInf", {"x": x})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"])
@pytest.mark.parametrize("dtype", ["float32", "int32", "int64"])
def test_binary_broadcast(op: str, dtype: str) -> None:
    if dtype == "float32":
        a, b = f32(2, 3, 4), f32(3, 1)
        if op == "Pow":
            a = np.abs(a) + 0.5
    else:
        a, b = ints(2, 3, 4, dtype=dtype), ints(3, 1, lo=1, hi=4, dtype=dtype)
        if op == "Pow":
            a = ints(2, 3, 4, lo=-3, hi=4, dtype=dtype)
    check(op, {"a": a, "b": b})


@pytest.mark.parametrize("fmod", [0, 1])
def test_mod(fmod: int) -> None:
    if fmod:
        check("Mod", {"a": f32(3, 4) * 3, "b": f32(3, 4) + 3}, {"fmod": 1})
    check("Mod", {"a": ints(3, 4, dtype=np.int32), "b": ints(3, 4, lo=1, hi=4, dtype=np.int32)},
          {"fmod": fmod})  # fmt: skip


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_compare(op: str) -> None:
    check(op, {"a": ints(4, 5, lo=0, hi=3).astype(np.float32), "b": ints(5, lo=0, hi=3)
               .astype(np.float32)})  # fmt: skip


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op: str) -> None:
    check(op, {"a": RNG.random((3, 4)) > 0.5, "b": RNG.random((3, 4)) > 0.5})


def test_not_bitwise_where_clip() -> None:
    check("Not", {"a": RNG.random((3, 4)) > 0.5})
    check("BitwiseAnd", {"a": ints(3, 4, dtype=np.int32), "b": ints(3, 4, dtype=np.int32)},
          opset=18)  # fmt: skip
    check("Where", {"c": RNG.random((3, 4)) > 0.5, "a": f32(3, 4), "b": f32(1, 4)})
    check("Clip", {"x": f32(3, 4)}, initializers={"lo": np.float32(-0.5), "hi": np.float32(0.7)})


@pytest.mark.parametrize(
    ("src", "to"),
    [(np.float32, TensorProto.INT32), (np.float32, TensorProto.BOOL),
     (np.int64, TensorProto.FLOAT), (np.float32, TensorProto.FLOAT16),
     (np.float16, TensorProto.FLOAT), (np.bool_, TensorProto.FLOAT)],
)  # fmt: skip
def test_cast(src: Any, to: int) -> None:
    x = (f32(3, 4) * 4).astype(src) if src != np.bool_ else RNG.random((3, 4)) > 0.5
    check("Cast", {"x": x}, {"to": to})


def test_float16_and_double_pointwise() -> None:
    check("Add", {"a": f32(3, 4).astype(np.float16), "b": f32(3, 4).astype(np.float16)})
    check("Tanh", {"a": f32(3, 4).astype(np.float64)}, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs"),
    [
        ((1, 3, 9, 9), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
        ((2, 4, 8, 8), (6, 2, 3, 3), {"group": 2, "strides": [2, 2]}),
        ((1, 4, 7, 7), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
        ((1, 3, 9, 9), (4, 3, 3, 3), {"pads": [0, 1, 2, 1]}),
        ((1, 3, 9, 9), (4, 3, 3, 3), {"dilations": [2, 2]}),
        ((1, 3, 10), (2, 3, 3), {"pads": [1, 1]}),
        ((1, 2, 5, 5, 5), (3, 2, 2, 2, 2), {}),
    ],
)
def test_convolution(x_shape: tuple, w_shape: tuple, attrs: dict) -> None:
    check("Conv", {"x": f32(*x_shape)}, attrs, {"w": f32(*w_shape)}, rtol=1e-4, atol=1e-4)


def test_convolution_runtime_weights_and_bias() -> None:
    check("Conv", {"x": f32(1, 3, 6, 6), "w": f32(2, 3, 3, 3), "b": f32(2)}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "attrs", [{}, {"strides": [2, 2]}, {"pads": [1, 0, 1, 0]}, {"output_padding": [1, 1],
                                                                  "strides": [2, 2]}]
)  # fmt: skip
def test_conv_transpose(attrs: dict) -> None:
    check("ConvTranspose", {"x": f32(1, 3, 5, 5)}, attrs, {"w": f32(3, 2, 3, 3)},
          rtol=1e-4, atol=1e-4)  # fmt: skip


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ("MaxPool", {"kernel_shape": [2, 2], "ceil_mode": 1, "strides": [2, 2]}),
        ("MaxPool", {"kernel_shape": [3, 3], "pads": [0, 0, 1, 1]}),
        ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
        ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
        ("AveragePool", {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
        ("LpPool", {"kernel_shape": [2, 2]}),
        ("GlobalAveragePool", {}),
        ("GlobalMaxPool", {}),
    ],
)
def test_pooling(op: str, attrs: dict) -> None:
    check(op, {"x": f32(2, 3, 9, 9)}, attrs, rtol=1e-5, atol=1e-5)


def test_normalisation() -> None:
    x = f32(2, 3, 5, 5)
    ch = {"s": f32(3), "b": f32(3), "m": f32(3), "v": np.abs(f32(3)) + 0.5}
    check("BatchNormalization", {"x": x}, {"epsilon": 1e-3}, ch, rtol=1e-5, atol=1e-5)
    check("InstanceNormalization", {"x": x}, initializers={"s": f32(3), "b": f32(3)},
          rtol=1e-4, atol=1e-4)  # fmt: skip
    check("LRN", {"x": x}, {"size": 3, "alpha": 1e-3}, rtol=1e-5, atol=1e-5)
    check("LRN", {"x": x}, {"size": 2}, rtol=1e-5, atol=1e-5)
    check("LayerNormalization", {"x": f32(2, 4, 8)}, {"axis": -1},
          {"s": f32(8), "b": f32(8)}, rtol=1e-4, atol=1e-4)  # fmt: skip


@pytest.mark.parametrize(
    ("a", "b"), [((4, 5), (5, 3)), ((2, 4, 5), (2, 5, 3)), ((2, 3, 4, 5), (5, 6)), ((5,), (5, 2))]
)
def test_matmul(a: tuple, b: tuple) -> None:
    check("MatMul", {"a": f32(*a), "b": f32(*b)}, rtol=1e-4, atol=1e-4)
    check("MatMul", {"a": f32(*a)}, initializers={"b": f32(*b)}, rtol=1e-4, atol=1e-4)


def test_matmul_integer_and_half_and_gemm() -> None:
    check("MatMul", {"a": ints(3, 4, dtype=np.int32), "b": ints(4, 2, dtype=np.int32)})
    check("MatMul", {"a": f32(3, 4).astype(np.float16), "b": f32(4, 2).astype(np.float16)},
          rtol=1e-3, atol=1e-3)  # fmt: skip
    check("Gemm", {"a": f32(3, 4)}, {"transB": 1, "alpha": 0.5, "beta": 2.0},
          {"b": f32(5, 4), "c": f32(5)}, rtol=1e-4, atol=1e-4)  # fmt: skip


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax(op: str, axis: int) -> None:
    check(op, {"x": f32(2, 3, 4) * 5}, {"axis": axis})


@pytest.mark.parametrize(
    "op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2",
           "ReduceLogSumExp", "ReduceSumSquare"]
)  # fmt: skip
@pytest.mark.parametrize(("axes", "keepdims"), [([1], 1), ([0, 2], 0), (None, 1)])
def test_reductions(op: str, axes: list | None, keepdims: int) -> None:
    x = f32(3, 4, 5, lo=0.5, hi=1.5)
    inits = {} if axes is None else {"axes": np.array(axes, np.int64)}
    opset = 18
    check(op, {"x": x}, {"keepdims": keepdims}, inits, rtol=1e-4, atol=1e-4, opset=opset)


def test_integer_reductions_and_arg() -> None:
    x = ints(3, 4, 5, dtype=np.int32)
    check("ReduceSum", {"x": x}, {"keepdims": 1}, {"axes": np.array([1], np.int64)})
    check("ReduceMean", {"x": x}, {"keepdims": 1}, {"axes": np.array([1], np.int64)}, opset=18)
    for op in ("ArgMax", "ArgMin"):
        check(op, {"x": f32(3, 4, 5)}, {"axis": 1, "keepdims": 0})
        check(op, {"x": f32(3, 4, 5)}, {"axis": 2, "select_last_index": 1})


def test_layout_ops() -> None:
    x = f32(2, 3, 4, 5)
    check("Transpose", {"x": x}, {"perm": [0, 2, 3, 1]})
    check("Reshape", {"x": x}, initializers={"s": np.array([6, -1], np.int64)})
    check("Flatten", {"x": x}, {"axis": 2})
    check("Squeeze", {"x": f32(2, 1, 3)}, initializers={"a": np.array([1], np.int64)})
    check("Unsqueeze", {"x": f32(2, 3)}, initializers={"a": np.array([0, 3], np.int64)})
    check("Expand", {"x": f32(3, 1)}, initializers={"s": np.array([2, 3, 4], np.int64)})
    check("Concat", {"a": f32(2, 3), "b": f32(2, 5)}, {"axis": 1})
    check("Identity", {"x": x})
    check("Tile", {"x": f32(2, 3)}, initializers={"r": np.array([2, 1], np.int64)})


@pytest.mark.parametrize(
    ("starts", "ends", "axes", "steps"),
    [([1], [3], [1], [1]), ([0, 1], [2, 5], [0, 2], [1, 2]), ([-1], [-4], [2], [-1])],
)
def test_slice(starts: list, ends: list, axes: list, steps: list) -> None:
    inits = {k: np.array(v, np.int64) for k, v in
             {"s": starts, "e": ends, "a": axes, "t": steps}.items()}  # fmt: skip
    check("Slice", {"x": f32(3, 4, 6)}, initializers=inits)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad(mode: str) -> None:
    inits = {"p": np.array([0, 1, 2, 0, 2, 1], np.int64), "v": np.float32(1.5)}
    if mode != "constant":
        inits.pop("v")
    check("Pad", {"x": f32(2, 3, 4)}, {"mode": mode}, inits)


def test_gathers_and_indexing() -> None:
    data = f32(5, 4, 3)
    check("Gather", {"x": data, "i": np.array([[0, -1], [2, 4]], np.int64)}, {"axis": 0})
    check("Gather", {"x": data}, {"axis": 1}, {"i": np.array([3, -4, 1], np.int32)})
    idx = RNG.integers(-4, 4, (5, 2, 3)).astype(np.int64)
    check("GatherElements", {"x": data, "i": idx}, {"axis": 1})
    check("GatherND", {"x": data, "i": np.array([[0, 1], [4, 3]], np.int64)})
    check("ScatterElements", {"x": data, "i": np.zeros((1, 4, 3), np.int64), "u": f32(1, 4, 3)},
          {"axis": 0})  # fmt: skip
    check("TopK", {"x": f32(3, 6)}, {"axis": 1}, {"k": np.array([2], np.int64)}, num_outputs=2)
    check("CumSum", {"x": f32(3, 4)}, initializers={"a": np.array(1, np.int64)})
    check("Einsum", {"a": f32(2, 3), "b": f32(3, 4)}, {"equation": "ij,jk->ik"},
          rtol=1e-4, atol=1e-4)  # fmt: skip


def test_resize() -> None:
    check("Resize", {"x": f32(1, 2, 3, 4)}, {"mode": "linear"},
          {"roi": np.array([], np.float32), "scales": np.array([1, 1, 2, 2], np.float32)},
          rtol=1e-5, atol=1e-5)  # fmt: skip


def test_fallback_ops_are_counted() -> None:
    cpu = check("TopK", {"x": f32(3, 6)}, {"axis": 1}, {"k": np.array([2], np.int64)}, 2)
    assert cpu._executable.fallbacks.get("topk") == 2
    cpu = check("Relu", {"x": f32(3, 6)})
    assert cpu._executable.fallbacks == {}


def test_fallback_is_announced_once_per_compile() -> None:
    with pytest.warns(RuntimeWarning, match=r"numpy fallback.*topk x2.*perf") as caught:
        check("TopK", {"x": f32(3, 6)}, {"axis": 1}, {"k": np.array([2], np.int64)}, 2)
    assert len([w for w in caught if "run through the numpy fallback" in str(w.message)]) == 1


# --- fusions ---------------------------------------------------------------------------------


def _conv_net(act: str, residual: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """conv(+bias) -> [add residual] -> act, the shapes a CNN block has."""
    c = 8
    inits = {"w1": f32(c, 4, 3, 3), "b1": f32(c), "w2": f32(c, c, 1, 1), "b2": f32(c),
             "w3": f32(c, 4, 1, 1), "b3": f32(c), "lo": np.float32(0.0),
             "hi": np.float32(0.5)}  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"]),
    ]
    last = "c2"
    if residual == "identity":
        nodes.append(helper.make_node("Add", ["c2", "r1"], ["s"]))
        last = "s"
    elif residual == "conv":
        nodes.append(helper.make_node("Conv", ["x", "w3", "b3"], ["c3"]))
        nodes.append(helper.make_node("Add", ["c2", "c3"], ["s"]))
        last = "s"
    if act == "relu":
        nodes.append(helper.make_node("Relu", [last], ["y"]))
    elif act == "clip":
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    feeds = {"x": f32(2, 4, 6, 6)}
    return make_model(nodes, feeds, ["y"], inits), feeds


@pytest.mark.parametrize("act", ["none", "relu", "clip"])
@pytest.mark.parametrize("residual", ["none", "identity", "conv"])
def test_conv_epilogue_fusion(act: str, residual: str) -> None:
    model, feeds = _conv_net(act, residual)
    cpu = compare(model, feeds, rtol=1e-4, atol=1e-4)
    fused = [s for s in cpu._executable.lowered.steps if len(s.instructions) > 1]
    assert fused, "the convolution epilogue was not fused"
    assert_profile_matches(cpu, feeds)


@pytest.mark.parametrize("conv_output", ["torch", "arena"])
def test_conv_output_settings(conv_output: str) -> None:
    model, feeds = _conv_net("relu", "identity")
    ref, _ = compile_both(model)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(conv_output=conv_output))
    np.testing.assert_allclose(np.array(prog.run(feeds)[0]), np.array(ref.run(feeds)[0]),
                               rtol=1e-4, atol=1e-4)  # fmt: skip


def test_unknown_cpu_setting() -> None:
    with pytest.raises(ValueError, match="unknown cpu target settings"):
        CpuTarget(bogus=1)


def _mlp(gelu: bool) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    inits = {"w": f32(16, 32), "b": f32(32), "w2": f32(32, 16), "b2": f32(16),
             "half": np.float32(0.5), "one": np.float32(1.0),
             "r2": np.float32(0.70710677)}  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["h"]),
    ]
    if gelu:
        nodes += [
            helper.make_node("Mul", ["h", "r2"], ["t"]),
            helper.make_node("Erf", ["t"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["e1"]),
            helper.make_node("Mul", ["h", "e1"], ["g"]),
            helper.make_node("Mul", ["g", "half"], ["a"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["h"], ["a"]))
    nodes += [
        helper.make_node("MatMul", ["a", "w2"], ["m2"]),
        helper.make_node("Add", ["b2", "m2"], ["h2"]),
        helper.make_node("Add", ["h2", "x"], ["y"]),
    ]
    feeds = {"x": f32(2, 5, 16)}
    return make_model(nodes, feeds, ["y"], inits), feeds


@pytest.mark.parametrize("gelu", [False, True])
def test_gemm_epilogue_fusion(gelu: bool) -> None:
    model, feeds = _mlp(gelu)
    cpu = compare(model, feeds, rtol=1e-4, atol=1e-4)
    fused = [s for s in cpu._executable.lowered.steps if len(s.instructions) > 1]
    assert len(fused) == 2
    assert_profile_matches(cpu, feeds)


def test_pointwise_group_in_place_code() -> None:
    """A long element-wise chain with branches, mixed types and constants in one step."""
    x, y = f32(3, 7), f32(3, 7)
    nodes = [
        helper.make_node("Mul", ["x", "y"], ["a"]),
        helper.make_node("Exp", ["a"], ["b"]),
        helper.make_node("Greater", ["b", "x"], ["c"]),
        helper.make_node("Where", ["c", "a", "y"], ["d"]),
        helper.make_node("Cast", ["c"], ["ci"], to=TensorProto.INT32),
        helper.make_node("Cast", ["ci"], ["cf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["d", "cf"], ["e"]),
        helper.make_node("Sub", ["e", "b"], ["f"]),
        helper.make_node("Tanh", ["f"], ["z"]),
    ]
    model = make_model(nodes, {"x": x, "y": y}, ["z"])
    cpu = compare(model, {"x": x, "y": y})
    groups = [s for s in cpu._executable.lowered.steps if s.instructions[0].op.name == "pointwise"]
    assert len(groups) == 1


# --- built-in models ------------------------------------------------------------------------


@pytest.mark.slow  # builds and runs whole networks on ref and cpu (2-25 s each)
@pytest.mark.parametrize("name", ["resnet50", "mobilenetv2", "bert_base", "gpt2"])
def test_builtin_models_match_ref(name: str) -> None:
    from pygraphx.models import get_model, model_inputs

    model = get_model(name, batch=1, seq_len=32)
    feeds = model_inputs(name, model)
    cpu = compare(model, feeds, rtol=1e-4, atol=1e-4)
    assert cpu._executable.fallbacks == {}, "built-in models run without numpy fallbacks"


# --- runtime behaviour ----------------------------------------------------------------------


def _small_cnn() -> tuple[Program, dict[str, np.ndarray]]:
    model, feeds = _conv_net("relu", "conv")
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("cpu"))
    return prog, feeds


def test_arena_runs_are_repeatable_and_outputs_survive() -> None:
    prog, feeds = _small_cnn()
    first = [np.array(a) for a in prog.run(feeds)]
    kept = [a.copy() for a in first]
    second = [np.array(a) for a in prog.run(feeds)]
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)
    other = {k: v * 2 + 1 for k, v in feeds.items()}
    third = [np.array(a) for a in prog.run(other)]
    for a, k in zip(first, kept, strict=True):
        np.testing.assert_array_equal(a, k)  # run 3 did not overwrite run 1's outputs
    assert not all(np.array_equal(a, b) for a, b in zip(first, third, strict=True))


def test_outputs_are_independent_of_the_arena_for_every_op() -> None:
    """Outputs that are arena slots, views of literals, or parameters are all copied out."""
    x = f32(3, 4)
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
        helper.make_node("Identity", ["x"], ["i"]),
    ]
    model = make_model(nodes, {"x": x}, ["r", "t", "i"])
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("cpu"))
    out = [np.array(a) for a in prog.run({"x": x})]
    saved = [a.copy() for a in out]
    prog.run({"x": -x})
    for a, b in zip(out, saved, strict=True):
        np.testing.assert_array_equal(a, b)


def assert_profile_matches(prog: Program, feeds: Mapping[str, np.ndarray]) -> None:
    """The profiled (unfused) run reports every instruction and gives the same outputs."""
    seen: list[Any] = []
    fast = [np.array(a) for a in prog.run(dict(feeds))]
    slow = [np.array(a) for a in prog.run(dict(feeds), observer=lambda i, v, t: seen.append(
        (i, v, t)))]  # fmt: skip
    main = prog.get_main_module()
    assert [i for i, _, _ in seen] == [i for i in main.instructions if not i.is_return()]
    assert all(t >= 0 for _, _, t in seen)
    for a, b in zip(fast, slow, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    for ins, value, _ in seen:
        assert value is not None and list(np.shape(value)) == ins.shape.lens()


def test_observer_sees_every_instruction_with_values() -> None:
    prog, feeds = _small_cnn()
    assert_profile_matches(prog, feeds)


def test_save_load_reprepares_the_cpu_target(tmp_path: Any) -> None:
    prog, feeds = _small_cnn()
    want = [np.array(a) for a in prog.run(feeds)]
    path = tmp_path / "net.pgx"
    pygraphx.save(prog, path)
    loaded = pygraphx.load(path)
    assert loaded.is_compiled() and loaded.target.name == "cpu"
    got = [np.array(a) for a in loaded.run(feeds)]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_get_target_and_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(pygraphx.get_target("cpu"), CpuTarget)
    monkeypatch.setenv("PGX_CPU_THREADS", "3")
    assert cpu_threads() == 3
    monkeypatch.setenv("PGX_CPU_THREADS", "many")
    with pytest.raises(ValueError, match="PGX_CPU_THREADS"):
        cpu_threads()
    monkeypatch.setenv("PGX_CPU_THREADS", "0")
    with pytest.raises(ValueError, match="at least 1"):
        cpu_threads()
    monkeypatch.delenv("PGX_CPU_THREADS")
    assert cpu_threads() >= 1


def test_missing_torch_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from pygraphx.targets import cpu

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match="needs PyTorch"):
        cpu.make_target()


def _chain_program(n: int) -> Program:
    prog = Program()
    main = prog.get_main_module()
    y = main.add_parameter("x", Shape("float_type", [2, 2]))
    for k in range(n):
        y = main.add_instruction(pygraphx.make_op(("relu", "neg", "abs", "exp")[k % 4]), [y])
    main.add_return([y])
    return prog


def test_per_instruction_overhead(record_property: Any) -> None:
    """200 tiny instructions: the runtime's cost per instruction (torch's dispatch included).
    Reported, with a generous bound (CI machines vary); the benchmark prints the figure."""
    n = 200
    exe = CpuTarget().prepare(_chain_program(n), {})
    feeds = {"x": np.full((2, 2), 0.5, np.float32)}
    for _ in range(10):
        exe.run(feeds)
    times = []
    for _ in range(50):
        start = time.perf_counter()
        exe.run(feeds)
        times.append(time.perf_counter() - start)
    per = float(np.median(times)) / n * 1e6
    record_property("us_per_instruction", per)
    print(f"\ncpu target: {per:.2f} us per instruction ({n} tiny instructions)")
    assert per < 50.0


def test_run_checks_names_before_touching_tensors() -> None:
    prog, feeds = _small_cnn()
    with pytest.raises(pygraphx.ProgramError, match="missing parameter"):
        prog.run({})


@pytest.mark.skipif(os.cpu_count() is None, reason="needs a CPU count")
def test_prepare_takes_threads_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """`PGX_CPU_THREADS` sets the program's threads; the caller's torch count is left alone
    (runs set their own count and restore the caller's: tests/targets/test_cpu_threads.py)."""
    before = torch.get_num_threads()
    monkeypatch.setenv("PGX_CPU_THREADS", "1")
    exe = CpuTarget().prepare(_chain_program(3), {})
    assert exe.threads == 1
    assert torch.get_num_threads() == before


def test_computed_operands_are_not_taken_for_constants() -> None:
    """Weights, indices and biases that are computed at run time (arena slots) must be read at
    run time, never packed or folded at prepare."""
    x, w, i = f32(2, 3, 6, 6), f32(4, 3, 3, 3), np.array([[2, 0], [1, 1]], np.int64)
    one = {"one": np.array(1, np.int64)}
    nodes = [
        helper.make_node("Relu", ["w"], ["wr"]),
        helper.make_node("Conv", ["x", "wr"], ["c"]),
        helper.make_node("Add", ["i", "one"], ["ii"]),
        helper.make_node("Gather", ["c", "ii"], ["g"], axis=1),
        helper.make_node("Abs", ["m"], ["ma"]),
        helper.make_node("MatMul", ["g", "ma"], ["y"]),
    ]
    feeds = {"x": x, "w": w, "i": i, "m": f32(4, 5)}
    model = make_model(nodes, feeds, ["y"], one)
    compare(model, feeds, rtol=1e-4, atol=1e-4)
    compare(model, {k: v if v.dtype.kind == "i" else -v for k, v in feeds.items()},
            rtol=1e-4, atol=1e-4)  # fmt: skip


def _activation_model(kind: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    c = {"half": np.float32(0.5), "one": np.float32(1.0), "r2": np.float32(0.70710677),
         "s2": np.float32(1.4142135), "k": np.float32(0.044715), "three": np.float32(3.0),
         "c": np.float32(0.7978846), "near": np.float32(0.7)}  # fmt: skip
    mk = helper.make_node
    if kind == "gelu_erf":
        nodes = [mk("Div", ["x", "s2"], ["t"]), mk("Erf", ["t"], ["e"]),
                 mk("Add", ["e", "one"], ["e1"]), mk("Mul", ["x", "e1"], ["g"]),
                 mk("Mul", ["g", "half"], ["y"])]  # fmt: skip
    elif kind == "gelu_tanh":
        nodes = [mk("Pow", ["x", "three"], ["p"]), mk("Mul", ["k", "p"], ["kp"]),
                 mk("Add", ["x", "kp"], ["i"]), mk("Mul", ["i", "c"], ["ic"]),
                 mk("Tanh", ["ic"], ["t"]), mk("Add", ["one", "t"], ["t1"]),
                 mk("Mul", ["half", "x"], ["hx"]), mk("Mul", ["hx", "t1"], ["y"])]  # fmt: skip
    elif kind == "silu":
        nodes = [mk("Sigmoid", ["x"], ["s"]), mk("Mul", ["x", "s"], ["m"]),
                 mk("Mul", ["m", "one"], ["y"])]  # fmt: skip
    else:  # a near miss: erf(x * 0.7) instead of erf(x / sqrt 2)
        nodes = [mk("Mul", ["x", "near"], ["t"]), mk("Erf", ["t"], ["e"]),
                 mk("Add", ["e", "one"], ["e1"]), mk("Mul", ["x", "e1"], ["g"]),
                 mk("Mul", ["g", "half"], ["y"])]  # fmt: skip
    nodes = [mk("Add", ["a", "b"], ["x"])] + nodes + [mk("Add", ["y", "a"], ["z"])]
    feeds = {"a": f32(4, 6) * 3, "b": f32(4, 6)}
    return make_model(nodes, feeds, ["z"], c), feeds


@pytest.mark.parametrize(
    ("kind", "primitive"),
    [("gelu_erf", "gelu("), ("gelu_tanh", "gelu_tanh("), ("silu", "silu("), ("near", None)],
)
def test_activation_sub_graphs_become_one_kernel(kind: str, primitive: str | None) -> None:
    model, feeds = _activation_model(kind)
    cpu = compare(model, feeds, rtol=1e-5, atol=1e-5)
    code = "\n".join(cpu._executable.lowered.ctx.sources)
    if primitive is None:
        assert "_f_gelu" not in code and "_f_erf" in code
    else:
        assert f"_f_{primitive}" in code and "_f_tanh(" not in code and "_f_erf(" not in code


def test_scalar_constants_are_folded_into_the_code() -> None:
    x = f32(3, 5)
    nodes = [
        helper.make_node("Pow", ["x", "three"], ["p"]),
        helper.make_node("Mul", ["two", "p"], ["y"]),
    ]
    model = make_model(nodes, {"x": x}, ["y"], {"three": np.float32(3), "two": np.float32(2)})
    cpu = compare(model, {"x": x})
    code = "\n".join(cpu._executable.lowered.ctx.sources)
    assert "_f_pow(_env[" in code and ", 3.0, out=" in code and ", 2.0, out=" in code


def test_generated_group_writes_its_output_in_place() -> None:
    """The first primitive writes the slot with out=, later ones update it in place; only a
    value needed next to the running result takes a scratch buffer."""
    model, feeds = _activation_model("near")
    cpu = compare(model, feeds)
    code = [s for s in cpu._executable.lowered.ctx.sources if "_f_erf" in s][0]
    body = [line.strip() for line in code.splitlines() if "out=" in line]
    assert body[0].endswith("out=_out)")
    assert body[-1].endswith("out=_out)")
    assert sum("out=_s" in line for line in body) <= 3


def test_openmp_spin_is_bounded_only_when_it_can_still_act(monkeypatch: pytest.MonkeyPatch) -> None:
    from pygraphx.targets import cpu

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    cpu.configure_openmp()  # torch is imported already: too late, nothing set
    assert "GOMP_SPINCOUNT" not in os.environ
    monkeypatch.delitem(sys.modules, "torch")
    cpu.configure_openmp()
    assert os.environ["GOMP_SPINCOUNT"] == cpu.SPINCOUNT
    monkeypatch.setenv("GOMP_SPINCOUNT", "5")
    cpu.configure_openmp()  # the user's choice stays
    assert os.environ["GOMP_SPINCOUNT"] == "5"
