"""Element-wise ONNX handlers against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import check_node

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)
Y = RNG.standard_normal((3, 1)).astype(np.float32) + 2.0


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean"])
def test_broadcasting_binary(op: str) -> None:
    check_node(op, {"x": X, "y": Y})


@pytest.mark.parametrize(
    "op",
    ["Abs", "Neg", "Exp", "Tanh", "Sigmoid", "Erf", "Relu", "Sin", "Cos", "Floor", "Ceil",
     "Softsign", "Softplus", "HardSwish", "Sign", "Round"],
)  # fmt: skip
def test_unary(op: str) -> None:
    check_node(op, {"x": X})


@pytest.mark.parametrize(
    ("op", "attrs"),
    [("LeakyRelu", {"alpha": 0.3}), ("Elu", {"alpha": 0.7}), ("Selu", {}),
     ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("Celu", {"alpha": 2.0})],
)  # fmt: skip
def test_activations(op: str, attrs: dict) -> None:
    check_node(op, {"x": X}, attrs)


def test_integer_division_truncates() -> None:
    a = np.array([7, -7, 7, -7], np.int32)
    b = np.array([2, 2, -2, -2], np.int32)
    check_node("Div", {"a": a, "b": b})


def test_comparisons_and_where() -> None:
    check_node("Less", {"x": X, "y": Y})
    cond = X > 0
    check_node("Where", {"c": cond, "x": X, "y": np.zeros((4,), np.float32)})


def test_cast_and_clip() -> None:
    check_node("Cast", {"x": X * 10}, {"to": 6})  # int32
    lo = np.array(-0.5, np.float32)
    hi = np.array(0.5, np.float32)
    check_node("Clip", {"x": X}, initializers={"lo": lo, "hi": hi})


def test_prelu() -> None:
    slope = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    check_node("PRelu", {"x": X}, initializers={"slope": slope})
