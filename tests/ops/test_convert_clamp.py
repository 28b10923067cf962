"""`convert(clamp=True)` to float16 / bfloat16 / float32 (the converts `quantize_fp16` and
`quantize_bf16` insert) clamps finite values to the target's finite range (MIGraphX's `convert`:
`min(max(as(x), as.min()), as.max())`) where a plain cast gives an infinity; the infinities and
NaN stay. ONNX Cast (`clamp=False`) keeps the IEEE overflow, as ONNX Runtime does.

The oracle is numpy: finite values beyond the bound replaced by the signed bound, then `astype`. The
one op description (`Convert.apply`) is checked through the numpy handler (`ref`), the torch
handler (`cpu`) and the Triton emitter (interpreted on the CPU), and end to end through ONNX
Cast on `ref` and `cpu`."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import pygraphx
from pygraphx.codegen.trace import evaluate, module_trace
from pygraphx.ir.module import Module
from pygraphx.ir.shape import Shape, from_dtype
from pygraphx.ops.base import make_op
from pygraphx.ops.handler import NUMPY
from pygraphx.ops.pointwise import overflow_bound
from pygraphx.targets.torch_lowering.handler import TORCH
from tests.codegen.conftest import interpret, needs_triton  # noqa: F401 (interpret: a fixture)
from tests.codegen.groupcheck import reference, run_three
from tests.codegen.test_triton_kernels import compile_ahead_of_time
from tests.helpers import make_model, run_pgx

BF16 = np.dtype(ml_dtypes.bfloat16)
F16_MAX = 65504.0

FLOATS = [
    0.0, -0.0, 1.5, -2.25, 1e-8, F16_MAX, -F16_MAX, 65519.0, 65520.0, -65520.0, 7e4, -1e6,
    3.0e38, -3.0e38, np.inf, -np.inf, np.nan,
]  # fmt: skip
WIDE = [*FLOATS, 1e300, -1e300, 3.5e38, -3.5e38]  # float64 beyond float32 and bfloat16
INTS = [0, 1, -1, 65504, 65505, 65535, -65536, 100000, -100000, 2**31 - 1, -(2**31)]


def expected(x: np.ndarray, dst: np.dtype) -> np.ndarray:
    """numpy: a finite value beyond dst's largest finite value becomes it, with its sign."""
    top = float(ml_dtypes.finfo(dst).max)
    wide = x.astype(np.float64)
    over = np.isfinite(wide) & (np.abs(wide) > top)  # float64 holds every input exactly
    return np.where(over, np.sign(wide) * top, wide).astype(dst)


def _same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    g, w = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(g, w, err_msg=what)  # NaN where NaN, inf where inf
    finite = np.isfinite(w) & (w != 0)
    np.testing.assert_array_equal(np.signbit(g[finite]), np.signbit(w[finite]), what)


CASES = [
    (np.float32, np.float16, FLOATS),
    (np.float32, BF16, FLOATS),
    (np.float64, np.float16, WIDE),
    (np.float64, BF16, WIDE),
    (np.float64, np.float32, WIDE),
    (BF16, np.float16, FLOATS),
    (np.int32, np.float16, INTS),
    (np.int64, np.float16, INTS),
    (np.uint16, np.float16, [0, 1, 65504, 65505, 65535]),
    # no NaN or infinity in: torch's cpu check (the cast's extremes) decides alone
    (np.float32, np.float16, [1.5, -2.25, 7e4, -1e6, 65519.0, 65520.0]),
    (np.float32, np.float16, [1.5, -2.25, 0.0, F16_MAX]),
]


@pytest.mark.usefixtures("interpret")
@pytest.mark.parametrize("src,dst,values", CASES, ids=lambda v: getattr(v, "__name__", None))
def test_convert_clamps_through_every_handler(src: type, dst: type, values: list) -> None:
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.array(values, dtype=np.int64 if np.dtype(src).kind in "iu" else np.float64)
        x = x.astype(src)
    dst = np.dtype(dst)
    body = Module("main:pointwise0")
    p = body.add_parameter("x0", Shape(from_dtype(x.dtype), [x.size]))
    body.add_return([body.add_instruction(make_op("convert", target_type=from_dtype(dst)), [p])])
    group = module_trace(body, [Shape(from_dtype(x.dtype), [x.size])], "pointwise")
    if x.dtype == BF16:  # torch.from_numpy takes no bfloat16: the same bits, viewed
        tensor = torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16)
        got = {
            "ref": reference(body, [x]),
            "numpy": np.asarray(evaluate(group, NUMPY, [x])),
            "torch": evaluate(group, TORCH, [tensor]).numpy(),
        }
    else:  # bfloat16 targets on Triton: see below
        got = run_three(group, body, np.random.default_rng(0), triton=dst != BF16, inputs=[x])
    want = expected(x, dst)
    for name, value in got.items():
        _same(value, want, f"{np.dtype(src)} -> {dst} on {name}")


@pytest.mark.usefixtures("interpret")
def test_convert_to_bf16_clamps_on_triton() -> None:
    """Triton's interpreter rounds float32 -> bfloat16 toward zero (real Triton rounds to
    nearest even) and mangles float64 -> bfloat16 (so do plain casts before this change):
    float32 only, to one bfloat16 step, with the bounds and special values exact."""
    x = np.array(FLOATS, np.float32)
    body = Module("main:pointwise0")
    p = body.add_parameter("x0", Shape("float_type", [x.size]))
    body.add_return([body.add_instruction(make_op("convert", target_type="bf16_type"), [p])])
    group = module_trace(body, [Shape("float_type", [x.size])], "pointwise")
    got = run_three(group, body, np.random.default_rng(0), inputs=[x])["triton"]
    want = expected(x, BF16).astype(np.float64)
    g = got.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(want))
    np.testing.assert_array_equal(g[np.isinf(want)], want[np.isinf(want)])
    top = float(ml_dtypes.finfo(BF16).max)
    over = np.isfinite(x) & (np.abs(x) > top)
    np.testing.assert_array_equal(g[over], want[over])
    finite = np.isfinite(want)
    np.testing.assert_allclose(g[finite], want[finite], rtol=2.0**-7)


def test_no_clamp_where_nothing_can_overflow() -> None:
    assert overflow_bound(np.dtype(np.float16), np.dtype(np.float32)) is None
    assert overflow_bound(np.dtype(np.float16), BF16) is None
    assert overflow_bound(np.dtype(np.int16), np.dtype(np.float16)) is None
    assert overflow_bound(np.dtype(np.int64), BF16) is None
    assert overflow_bound(np.dtype(np.float32), np.dtype(np.int32)) is None  # truncation rules
    assert overflow_bound(np.dtype(np.float32), np.dtype(ml_dtypes.float8_e4m3fn)) is None
    assert overflow_bound(np.dtype(np.float32), np.dtype(np.float16)) == F16_MAX
    assert overflow_bound(np.dtype(np.uint16), np.dtype(np.float16)) == 65504


GPU = pytest.param(
    "gpu", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU here")
)


@pytest.mark.parametrize("target", ["ref", "cpu", GPU])
@pytest.mark.parametrize("to", ["FLOAT16", "BFLOAT16"])
def test_onnx_cast_keeps_ieee_overflow(target: str, to: str) -> None:
    """ONNX Cast is not clamped: beyond the range it gives an infinity, as numpy and ORT do."""
    x = np.array(FLOATS, np.float32).reshape(1, -1)
    dst = np.dtype(np.float16) if to == "FLOAT16" else BF16
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["x2"]),  # a run-time value: nothing folds
        helper.make_node("Cast", ["x2"], ["y"], to=getattr(TensorProto, to)),
        helper.make_node("Cast", ["y"], ["z"], to=TensorProto.FLOAT),  # ORT-free dtype out
    ]
    model = make_model(nodes, {"x": x}, ["z"], {"two": np.float32(2)}, opset=19)
    (got,) = run_pgx(model, {"x": x}, target=target)
    with np.errstate(over="ignore"):
        want = (x * np.float32(2)).astype(dst).astype(np.float32)
    _same(got, want, f"Cast to {to} on {target}")


@pytest.mark.parametrize("target", ["ref", "cpu", GPU])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_quantised_program_clamps_its_converts(target: str, precision: str) -> None:
    """The converts `quantize_fp16` / `quantize_bf16` insert clamp (MIGraphX's `convert`): an
    input beyond half's range reaches the output as the largest finite value, not inf."""
    x = np.array(FLOATS, np.float32).reshape(1, -1)
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], {}, opset=19)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    getattr(pygraphx, f"quantize_{precision}")(prog, ("all",))  # the relu too
    prog.compile(pygraphx.get_target(target))
    (got,) = [np.array(r) for r in prog.run({"x": x})]
    dst = np.dtype(np.float16) if precision == "fp16" else BF16
    want = np.maximum(expected(x, dst).astype(np.float32), np.float32(0))
    _same(got.astype(np.float32), want, f"quantize_{precision} relu on {target}")


def _convert_group(src: str, dst: str):
    body = Module("main:pointwise0")
    p = body.add_parameter("x0", Shape(src, [4, 300]))
    body.add_return([body.add_instruction(make_op("convert", target_type=dst), [p])])
    return module_trace(body, [Shape(src, [4, 300])], "pointwise")


@needs_triton
def test_convert_kernels_compile_ahead_of_time(tmp_path) -> None:
    """The clamping converts' Triton sources go through the real compiler (sm_90, gfx942)."""
    groups = [_convert_group("float_type", "half_type"), _convert_group("float_type", "bf16_type")]
    compile_ahead_of_time(groups, tmp_path)
