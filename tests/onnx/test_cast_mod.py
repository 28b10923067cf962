"""Cast / CastLike to the fp8 types (saturate), Mod with fmod=0 on floats, Celu in half and bf16.

ONNX Runtime is the oracle where it implements the case. It cannot hand fp8 tensors to numpy, so
fp8 results are cast back to float32 (exactly) inside the model and compared bit for bit, the
sign of zero included. Where ONNX Runtime declines (Mod with fmod=0 on floats, bf16 / fp8
inputs, Celu in half / bf16) the oracle is ONNX's reference evaluator or the numpy definition
the ONNX node tests are generated from.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from pygraphx.ir.shape import Shape
from pygraphx.ops import make_op
from pygraphx.ops.base import ShapeError
from pygraphx.ops.pointwise import Convert, ConvertSaturate
from tests.helpers import check_node, make_model, run_ort, run_pgx

LOW_FLOATS = [ml_dtypes.bfloat16, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fn]
FP8 = {
    "FLOAT8E4M3FN": ml_dtypes.float8_e4m3fn,
    "FLOAT8E4M3FNUZ": ml_dtypes.float8_e4m3fnuz,
    "FLOAT8E5M2": ml_dtypes.float8_e5m2,
    "FLOAT8E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
}
# around every fp8 maximum (448, 240, 57344), ties, tiny values, signed zeros, inf and NaN
VALUES = np.array(
    [0.47, 0.48, 0.5, 1e6, -1e6, 1e-7, -1e-7, np.nan, np.inf, -np.inf, 0.0, -0.0, 448, 449, 464,
     465, -465, 240, 247, 248, 250, 57344, 61439, 65000, -70000, 300, -300, 2.0**-10, 2.0**-11,
     3e-3, 2.0**-7 * 1.0625, 2.0**-7 * 1.1875, 2.0**-9 * 1.5],
    np.float32,
)  # fmt: skip
# saturate=0 sends values past 57344 to inf in e5m2 (the spec, ml_dtypes); ONNX Runtime gives NaN
# for the halfway value 61440 (and 61439 rounded to float16): left out of the saturate=0 checks
NO_SATURATE_VALUES = VALUES[(np.abs(VALUES) < 57344) | (np.abs(VALUES) > 1e5)]


def _same_bits(ours: np.ndarray, ref: np.ndarray) -> None:
    assert ours.dtype == ref.dtype, f"dtype {ours.dtype}, expected {ref.dtype}"
    ours, ref = ours.astype(np.float64), ref.astype(np.float64)  # exact; NaN tests need numpy's
    np.testing.assert_array_equal(ours, ref)  # NaN where NaN
    numbers = ~np.isnan(ref)
    np.testing.assert_array_equal(np.signbit(ours[numbers]), np.signbit(ref[numbers]), "signs")


def _via_float(cast: helper.NodeProto) -> helper.NodeProto:
    return helper.make_node("Cast", [cast.output[0]], ["z"], to=TensorProto.FLOAT)


@pytest.mark.parametrize("to", list(FP8))
@pytest.mark.parametrize("saturate", [None, 1, 0])
@pytest.mark.parametrize("src", [np.float32, np.float16, np.float64])
def test_cast_float_to_fp8(to: str, saturate: int | None, src: type) -> None:
    with np.errstate(over="ignore"):  # 1e6 is inf in float16
        x = (VALUES if saturate != 0 else NO_SATURATE_VALUES).astype(src)
    attrs = {} if saturate is None else {"saturate": saturate}
    cast = helper.make_node("Cast", ["x"], ["y"], to=getattr(TensorProto, to), **attrs)
    model = make_model([cast, _via_float(cast)], {"x": x}, ["z"], opset=19)
    _same_bits(run_pgx(model, {"x": x})[0], run_ort(model, {"x": x})[0])


@pytest.mark.parametrize("to", list(FP8))
@pytest.mark.parametrize("src", [np.int64, np.int32, np.int16, np.int8, np.uint8])
def test_cast_int_to_fp8_saturates(to: str, src: type) -> None:
    x = np.array(
        [0, 1, -1, 17, -17, 239, 240, 241, 247, 248, 255, 300, 448, 449, 1000, -1000, 57344,
         61439, 70000, 2**31 - 1, -(2**31)],
        np.int64,
    ).astype(src)  # fmt: skip
    cast = helper.make_node("Cast", ["x"], ["y"], to=getattr(TensorProto, to))
    model = make_model([cast, _via_float(cast)], {"x": x}, ["z"], opset=19)
    _same_bits(run_pgx(model, {"x": x})[0], run_ort(model, {"x": x})[0])


@pytest.mark.parametrize("to", list(FP8))
@pytest.mark.parametrize("src", LOW_FLOATS)
@pytest.mark.parametrize("saturate", [1, 0])
def test_cast_bf16_and_fp8_to_fp8_match_reference(to: str, src: type, saturate: int) -> None:
    if np.dtype(src) == np.dtype(FP8[to]):
        pytest.skip("a cast to the input's own type is the identity (as in ONNX Runtime)")
    x = VALUES.astype(src)
    cast = helper.make_node("Cast", ["x"], ["y"], to=getattr(TensorProto, to), saturate=saturate)
    model = make_model([cast], {"x": x}, ["y"], opset=19)
    ours = run_pgx(model, {"x": x})[0]
    _same_bits(ours, ReferenceEvaluator(model).run(None, {"x": x})[0])


@pytest.mark.parametrize("to", list(FP8))
@pytest.mark.parametrize("saturate", [None, 0])
def test_cast_like_to_fp8(to: str, saturate: int | None) -> None:
    x = VALUES if saturate is None else NO_SATURATE_VALUES
    attrs = {} if saturate is None else {"saturate": saturate}
    cast = helper.make_node("CastLike", ["x", "like"], ["y"], **attrs)
    like = {"like": np.zeros(1, FP8[to])}
    model = make_model([cast, _via_float(cast)], {"x": x}, ["z"], like, opset=19)
    _same_bits(run_pgx(model, {"x": x})[0], run_ort(model, {"x": x})[0])


def test_cast_to_other_types_unchanged() -> None:
    x = np.array([1.5, -2.5, 1e6, -0.0], np.float32)
    check_node("Cast", {"x": x}, {"to": TensorProto.INT32, "saturate": 1}, opset=19)
    check_node("Cast", {"x": x}, {"to": TensorProto.FLOAT16}, opset=19)
    check_node("CastLike", {"x": x}, initializers={"l": np.zeros(1, np.float64)}, opset=19)


def test_convert_saturate_op() -> None:
    op = ConvertSaturate("fp8e4m3fnuz_type")
    assert str(op) == "convert_saturate[target_type=fp8e4m3fnuz_type]"
    made = make_op("convert_saturate", target_type="fp8e5m2_type")
    assert made == ConvertSaturate("fp8e5m2_type")
    assert str(Convert("fp8e4m3fn_type")) == "convert[target_type=fp8e4m3fn_type]"
    x = np.array([1e6, -np.inf, np.nan, 0.3], np.float32)
    shape = op.compute_shape([Shape("float_type", [4])])
    assert shape == Shape("fp8e4m3fnuz_type", [4])
    out = op.compute(shape, [x])
    assert out.dtype == ml_dtypes.float8_e4m3fnuz
    np.testing.assert_array_equal(out.astype(np.float32), [240, -240, np.nan, 0.3125])
    # bf16, int and fp8 inputs; `convert` keeps ml_dtypes' overflow
    for src in [ml_dtypes.bfloat16, np.int32, ml_dtypes.float8_e5m2]:
        y = np.array([1000, -1000, 2], src)
        got = op.compute(shape, [y]).astype(np.float32)
        np.testing.assert_array_equal(got, [240, -240, 2])
    assert np.isnan(Convert("fp8e4m3fnuz_type").compute(shape, [x])[0].astype(np.float32))
    with pytest.raises(ShapeError, match="must be an fp8 type"):
        ConvertSaturate("half_type").compute_shape([Shape("float_type", [4])])


# --- Mod ----------------------------------------------------------------------------------
MOD_A = [0.0, -0.0, 0.0, -0.0, -3.0, 3.0, -1.0, 1.0, np.inf, -np.inf, 1.0, 1.0, np.nan, 1.0,
         -4.3, 7.2, 5.0, 4.3, -7.2, 8.0]  # fmt: skip
MOD_B = [-2.0, 2.0, 2.0, -2.0, np.inf, np.inf, -np.inf, -np.inf, 2.0, 2.0, 0.0, -0.0, 2.0, np.nan,
         2.1, -3.4, 8.0, -2.1, 3.4, 5.0]  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
def test_mod_fmod_0_on_floats_takes_the_divisors_sign(dtype: type) -> None:
    a = np.array(MOD_A, dtype)
    b = np.array(MOD_B, dtype)
    model = make_model([helper.make_node("Mod", ["a", "b"], ["c"])], {"a": a, "b": b}, ["c"])
    ours = run_pgx(model, {"a": a, "b": b})[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        want = np.mod(a.astype(np.float64), b.astype(np.float64)).astype(dtype)
    assert ours.dtype == np.dtype(dtype)
    _same_bits(ours[:14], want[:14])  # the edge cases: exact, signed zeros included
    np.testing.assert_allclose(ours.astype(np.float32), want.astype(np.float32), rtol=1e-2)
    if dtype != ml_dtypes.bfloat16:
        with np.errstate(invalid="ignore"):
            ref = ReferenceEvaluator(model).run(None, {"a": a, "b": b})[0]
        _same_bits(ours, ref)


def test_mod_broadcasts() -> None:
    a = np.array([[-4.3, 7.2, 5.0], [4.3, -7.2, 8.0]], np.float32)
    b = np.array([-2.0, 3.0, 0.5], np.float32)
    model = make_model([helper.make_node("Mod", ["a", "b"], ["c"])], {"a": a, "b": b}, ["c"])
    np.testing.assert_array_equal(run_pgx(model, {"a": a, "b": b})[0], np.mod(a, b))


def test_mod_integers_and_fmod_1_unchanged() -> None:
    a = np.array([-7, 7, -7, 7, 0, 5], np.int32)
    b = np.array([2, -2, -2, 2, 3, -5], np.int32)
    check_node("Mod", {"a": a, "b": b})
    check_node("Mod", {"a": a, "b": b}, {"fmod": 1})
    fa = np.array(MOD_A, np.float32)
    fb = np.array(MOD_B, np.float32)
    check_node("Mod", {"a": fa, "b": fb}, {"fmod": 1})


# --- Celu ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_celu_low_precision_rounds_once(dtype: type) -> None:
    x = np.array([-3.0, -0.5, -0.01, 0.0, 0.5, 3.0, -20.0, 7.3], np.float32).astype(dtype)
    alpha = 2.0
    model = make_model([helper.make_node("Celu", ["x"], ["y"], alpha=alpha)], {"x": x}, ["y"])
    ours = run_pgx(model, {"x": x})[0]
    xf = x.astype(np.float32)
    want = (np.maximum(0, xf) + np.minimum(0, alpha * np.expm1(xf / alpha))).astype(dtype)
    assert ours.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(ours, want)


def test_celu_float32() -> None:
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32) * 3
    check_node("Celu", {"x": x}, {"alpha": 0.7})
