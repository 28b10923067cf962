"""Activation operators (ops/activation.py) against independent numpy/scipy formulas, through the
numpy handler (decomposition), the torch handler (native kernels) and the ONNX frontend (ORT)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special
from onnx import helper

import pygraphx
from pygraphx.ir.shape import Shape
from pygraphx.ops import make_op
from pygraphx.ops.base import ShapeError
from tests.helpers import check_node, make_model

torch = pytest.importorskip("torch")

X = np.concatenate([np.linspace(-12, 12, 241), [0.0, -0.0, 1e-3, -1e-3, 40.0, -40.0]])


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(x, 0.0)


# op (and attributes) -> float64 oracle written from the defining formulas
ORACLES = {
    "gelu": ({}, lambda x: 0.5 * x * (1 + scipy.special.erf(x / np.sqrt(2)))),
    "gelu_tanh": (
        {},
        lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    ),
    "silu": ({}, lambda x: x * scipy.special.expit(x)),
    "hardswish": ({}, lambda x: x * np.clip(x / 6 + 0.5, 0, 1)),
    "hardsigmoid": ({"alpha": 0.3, "beta": 0.4}, lambda x: np.clip(0.3 * x + 0.4, 0, 1)),
    "mish": ({}, lambda x: x * np.tanh(_softplus(x))),
    "softplus": ({}, _softplus),
}


@pytest.mark.parametrize("name", sorted(ORACLES))
def test_numpy_decomposition_matches_formula(name: str) -> None:
    attrs, oracle = ORACLES[name]
    op = make_op(name, **attrs)
    got = op.compute(Shape("float_type", list(X.shape)), [X.astype(np.float32)])
    want = oracle(X)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("name", sorted(ORACLES))
def test_torch_handler_matches_formula(name: str) -> None:
    from pygraphx.targets.torch_lowering.handler import TORCH

    attrs, oracle = ORACLES[name]
    op = make_op(name, **attrs)
    got = op.apply(TORCH, torch.from_numpy(X.astype(np.float32))).numpy()
    np.testing.assert_allclose(got, oracle(X), rtol=2e-6, atol=1e-6)


def test_torch_handler_uses_native_kernels_where_it_has_them() -> None:
    from pygraphx.ops.activation import native
    from pygraphx.ops.handler import NUMPY
    from pygraphx.targets.torch_lowering.handler import TORCH

    for name in ("gelu", "gelu_tanh", "silu", "hardswish", "mish", "softplus"):
        assert native(TORCH, name) is not None
        assert native(NUMPY, name) is None
    assert not make_op("hardsigmoid").uses_native()  # torch's fixes alpha = 1/6


def test_integer_input_is_an_error() -> None:
    with pytest.raises(ShapeError, match="gelu: input must be a float type"):
        make_op("gelu").compute_shape([Shape("int32_type", [3])])


def test_bf16_computes_in_float32() -> None:
    import ml_dtypes

    x = X.astype(ml_dtypes.bfloat16)
    got = make_op("gelu").compute(Shape("bf16_type", list(X.shape)), [x])
    want = ORACLES["gelu"][1](x.astype(np.float64)).astype(ml_dtypes.bfloat16)
    # one rounding to bf16 at the end: at most one bf16 ulp from the rounded exact value
    got32, want32 = got.astype(np.float32), want.astype(np.float32)
    np.testing.assert_allclose(got32, want32, rtol=2**-7, atol=1e-6)


# --- the ONNX frontend emits the operators (values checked against ONNX Runtime) ---------------
FRONTEND = [
    ("Gelu", {}, 20, "gelu"),
    ("Gelu", {"approximate": "tanh"}, 20, "gelu_tanh"),
    ("HardSwish", {}, 17, "hardswish"),
    ("HardSigmoid", {"alpha": 0.25, "beta": 0.6}, 17, "hardsigmoid"),
    ("Mish", {}, 18, "mish"),
    ("Softplus", {}, 17, "softplus"),
]


@pytest.mark.parametrize(("onnx_op", "attrs", "opset", "ir_op"), FRONTEND)
def test_frontend_emits_the_operator(onnx_op: str, attrs: dict, opset: int, ir_op: str) -> None:
    x = (X[:240].reshape(4, 60) / 2).astype(np.float32)
    check_node(onnx_op, {"x": x}, attrs, opset=opset, rtol=1e-5, atol=1e-6)
    node = helper.make_node(onnx_op, ["x"], ["y"], **attrs)
    model = make_model([node], {"x": x}, ["y"], opset=opset)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    ops = [i.op.name for i in prog.get_main_module().instructions]
    assert ops == ["@param", ir_op, "@return"]
