"""The `cpu` target (torch on the CPU) against the `ref` target: the ops handler, and every IR
op family on small inputs through a one-node (or few-node) ONNX model compiled for both
targets. Tolerances: float32
results agree to rtol = atol = 1e-5 for element-wise and data-movement ops (torch and numpy do
the same float32 arithmetic, with different but correctly rounded transcendental kernels), and
to 1e-4 for convolutions, GEMMs, reductions and the whole models, whose float32 sums are
accumulated in a different order by oneDNN / MKL than by numpy's BLAS (the errors grow with the
length of the dot products, about 1e-6 relative per term). Integer and bool results are exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from onnx import TensorProto  # noqa: E402

from pygraphx.ops.handler import NumpyOps  # noqa: E402
from pygraphx.targets.torch_lowering.handler import TORCH, TorchOps  # noqa: E402
from tests.targets.cpu_compare import (  # noqa: E402
    RNG,
    check,
    f32,
    ints,
)

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
