"""The ops-handler protocol: numpy, torch and Triton provide every primitive, and each
primitive written by the Triton emitter computes what numpy computes (special values too)."""

from __future__ import annotations

import numpy as np
import pytest

from pygraphx.codegen.trace import module_trace
from pygraphx.codegen.triton.emitter import TritonOps
from pygraphx.ir.module import Module
from pygraphx.ir.shape import Shape
from pygraphx.ops.base import make_op
from pygraphx.ops.handler import NUMPY, PRIMITIVES, NumpyOps, OpsHandler, missing_primitives
from pygraphx.targets.torch_lowering.handler import TORCH
from tests.codegen.groupcheck import assert_close, run_three


@pytest.mark.parametrize("handler", [NUMPY, TORCH, TritonOps()], ids=["numpy", "torch", "triton"])
def test_handler_provides_every_primitive(handler: object) -> None:
    assert missing_primitives(handler) == []
    assert isinstance(handler, OpsHandler)


def test_missing_primitives_names_what_is_missing() -> None:
    class NoExp(NumpyOps):
        exp = None  # type: ignore[assignment]

    assert missing_primitives(NoExp()) == ["exp"]
    assert {"reduce_sum", "reduce_max", "where", "cast", "compute_dtype"} <= set(PRIMITIVES)


def test_compute_dtype_rule() -> None:
    import ml_dtypes

    assert NUMPY.compute_dtype(np.float16) == np.float32
    assert NUMPY.compute_dtype(ml_dtypes.bfloat16) == np.float32
    assert NUMPY.compute_dtype(ml_dtypes.float8_e4m3fn) == np.float32
    assert NUMPY.compute_dtype(np.float64) == np.float64
    assert NUMPY.compute_dtype(np.int8) == np.int8


SPECIAL = np.array([-2.5, -1.5, -0.5, -0.0, 0.0, 0.3, 0.5, 0.99, 1.5, 2.5, 3.7, 1e6, -1e6,
                    np.nan, np.inf, -np.inf], np.float32)  # fmt: skip
UNARY = ["neg", "abs", "sign", "floor", "ceil", "round", "exp", "log", "sqrt", "rsqrt", "recip",
         "erf", "sigmoid", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
         "asinh", "acosh", "atanh", "isnan", "relu"]  # fmt: skip
BINARY = ["add", "sub", "mul", "div", "max", "min", "fmod", "mod", "pow", "equal", "less",
          "greater", "less_or_equal", "greater_or_equal"]  # fmt: skip


def _one_op(op: str, arity: int, dtype: str, values: list[np.ndarray]) -> None:
    body = Module("main:op")
    lens = list(values[0].shape)
    params = [body.add_parameter(f"x{k}", Shape(dtype, lens)) for k in range(arity)]
    body.add_return([body.add_instruction(make_op(op), params)])
    group = module_trace(body, [p.shape for p in params], "pointwise")
    got = run_three(group, body, np.random.default_rng(0), inputs=values)
    # sin/cos/exp of 1e6 are computed by different libraries: compare in a loose band
    assert_close(got, rtol=2e-6, atol=1e-6, what=op)


@pytest.mark.parametrize("op", UNARY)
def test_unary_primitive(op: str, interpret: object) -> None:
    x = SPECIAL
    if op in ("sin", "cos", "tan"):
        x = x[np.abs(np.nan_to_num(x)) < 1e5]
    _one_op(op, 1, "float_type", [x])


@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize("dtype", ["float_type", "int32_type"])
def test_binary_primitive(op: str, dtype: str, interpret: object) -> None:
    if dtype == "int32_type":
        if op == "pow":
            pytest.skip("integer pow has no Triton form yet (UnsupportedGroup)")
        x = np.array([7, -7, 7, -7, 5, 0, 3, -1], np.int32)
        y = np.array([2, 2, -2, -2, 5, 3, 1, 4], np.int32)
    else:
        # the last five: ONNX's fmod edge cases (division by zero and by +-inf, inf dividends)
        x = np.array([7.5, -7.5, 7.5, -7.5, 0.5, 2.0, -2.0, 0.0, np.nan, 3.0,
                      3.0, -3.0, 3.0, np.inf, -np.inf], np.float32)  # fmt: skip
        y = np.array([2.0, 2.0, -2.0, -2.0, 0.25, 3.0, 3.0, 2.0, 1.0, -0.5,
                      0.0, np.inf, -np.inf, 2.0, 2.0], np.float32)  # fmt: skip
    _one_op(op, 2, dtype, [x, y])
