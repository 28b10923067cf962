"""IEEE special values (NaN, +Inf, -Inf, signed zeros) give the same outputs on `ref` and `cpu`,
and ONNX Runtime's (the oracle) on the common pointwise, reduce and softmax ops (issue 16).

Each op sees every special value next to ordinary ones; binary ops see every pair. Outputs are
compared with NaN in the same places (`assert_allclose` treats NaN as equal to NaN only).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import helper

from tests.helpers import make_model, run_ort, run_pgx

pytest.importorskip("torch")

INF, NAN = np.inf, np.nan
SPECIALS = np.array([NAN, INF, -INF, 0.0, -0.0, 1.5, -2.0, 3e38], np.float32)
#: rows holding specials among ordinary values (softmax and reductions work along a row)
ROWS = np.array(
    [
        [INF, 1, 2, 3],
        [INF, INF, 0, 0],
        [-INF, -INF, -INF, -INF],
        [-INF, 0, 1, 2],
        [NAN, 1, 2, 3],
        [INF, -INF, 0, 0],
        [1, 2, 3, 4],
        [-INF, INF, INF, -INF],
        [3e38, 3e38, -1, 0],
        [0.0, -0.0, 0.0, -0.0],
    ],
    np.float32,
)

UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Abs", "Neg", "Floor", "Ceil", "Erf",
         "Reciprocal", "Sin", "Cos", "Softplus", "Sign", "IsNaN", "IsInf", "Round"]  # fmt: skip
BINARY = ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Greater", "Less", "Equal"]
ALONG_ROWS = [
    ("Softmax", {"axis": -1}),
    ("LogSoftmax", {"axis": -1}),
    ("ReduceSum", {"keepdims": 0}),
    ("ReduceMean", {"keepdims": 0}),
    ("ReduceMax", {"keepdims": 0}),
    ("ReduceMin", {"keepdims": 0}),
    ("ReduceProd", {"keepdims": 0}),
    ("ReduceSumSquare", {"keepdims": 0}),
    ("ReduceL2", {"keepdims": 0}),
    ("ReduceLogSumExp", {"keepdims": 0}),
]


def _all_agree(model, feeds: dict[str, np.ndarray]) -> None:
    (want,) = run_ort(model, feeds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's overflow/invalid notes
        for target in ("ref", "cpu"):
            (got,) = run_pgx(model, feeds, target)
            assert got.dtype == want.dtype and got.shape == want.shape, target
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=0, err_msg=target)


@pytest.mark.parametrize("op", UNARY)
def test_unary_special_values(op: str) -> None:
    x = np.tile(SPECIALS, (2, 1))
    model = make_model([helper.make_node(op, ["x"], ["y"])], {"x": x}, ["y"])
    _all_agree(model, {"x": x})


@pytest.mark.parametrize("op", BINARY)
def test_binary_special_values(op: str) -> None:
    a = np.repeat(SPECIALS, len(SPECIALS)).reshape(len(SPECIALS), -1)
    b = np.tile(SPECIALS, (len(SPECIALS), 1))
    model = make_model([helper.make_node(op, ["a", "b"], ["y"])], {"a": a, "b": b}, ["y"])
    _all_agree(model, {"a": a, "b": b})


@pytest.mark.parametrize(("op", "attrs"), ALONG_ROWS, ids=[op for op, _ in ALONG_ROWS])
def test_softmax_and_reductions_over_special_rows(op: str, attrs: dict) -> None:
    if op.startswith("Reduce"):
        axes = np.array([1], np.int64)
        nodes = [helper.make_node(op, ["x", "axes"], ["y"], **attrs)]
        model = make_model(nodes, {"x": ROWS}, ["y"], {"axes": axes}, opset=18)
    else:
        model = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": ROWS}, ["y"])
    _all_agree(model, {"x": ROWS})


def test_softmax_with_inf_is_all_nan_like_onnxruntime() -> None:
    """The issue's case: a row holding +Inf was [nan, 0, 0, 0] on ref, all-NaN elsewhere."""
    x = np.array([[INF, 1, 2, 3]], np.float32)
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {"x": x}, ["y"])
    (want,) = run_ort(model, {"x": x})
    assert np.isnan(want).all()  # the oracle's answer, which both targets must give
    for target in ("ref", "cpu"):
        assert np.isnan(run_pgx(model, {"x": x}, target)[0]).all(), target
