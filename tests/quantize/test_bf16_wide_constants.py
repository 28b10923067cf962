"""`quantize_bf16` keeps the float32 value of the small constants it rounds
(`quantize/wide_constants.py`): a product's bias (after batch normalisation is folded into the
convolution, a vector that nearly cancels the product) becomes a `RoundedLiteral`, the bf16
value the program computes with plus the float32 one a kernel can add in its float32
accumulator, as OpenVINO's bf16 convolutions and fully connected layers take their bias.

Which constants: float vectors (one axis of more than one value) of at most `WIDE_ELEMENTS`
values, never a product's weights; `PGX_BF16_WIDE_BIAS=0` (or `KEEP_WIDE = False`) keeps none.
The program's meaning is unchanged: the same printed program and the same `ref` results.
"""

from __future__ import annotations

import importlib

import ml_dtypes
import numpy as np
import pytest
from onnx import helper

import pygraphx
from pygraphx.quantize import quantize_bf16
from tests.helpers import make_model

WIDE = importlib.import_module("pygraphx.quantize.wide_constants")
RNG = np.random.default_rng(14)


def _conv_bn_gemm() -> tuple:
    """Conv + BatchNormalization (mean near the products: a folded bias that cancels them) +
    Relu, global average pool, a Gemm with a bias and Relu, then a small Gemm head: the biases
    are vectors, the weights not."""
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    inits = {
        "w": (RNG.standard_normal((16, 8, 3, 3)) / 8.5).astype(np.float32),
        "scale": RNG.uniform(0.5, 2.0, 16).astype(np.float32),
        "beta": RNG.standard_normal(16).astype(np.float32),
        "mean": (3.0 * RNG.standard_normal(16)).astype(np.float32),
        "var": RNG.uniform(0.5, 2.0, 16).astype(np.float32),
        "fw": (RNG.standard_normal((10, 16)) / 4).astype(np.float32),
        "fb": RNG.standard_normal(10).astype(np.float32),
        "ow": (RNG.standard_normal((3, 10)) / 3).astype(np.float32),
        "ob": RNG.standard_normal(3).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["hr"]),
        # the last product is a small head (float32, `HEAD_ELEMENTS`): nothing rounded there
        helper.make_node("Gemm", ["hr", "ow", "ob"], ["y"], transB=1),
    ]
    return make_model(nodes, {"x": x}, ["y"], inits), {"x": x}


def _quantized(model, monkeypatch, keep: bool | None) -> pygraphx.Program:
    monkeypatch.setattr(WIDE, "KEEP_WIDE", keep)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    quantize_bf16(prog)
    return prog


def _rounded(prog: pygraphx.Program) -> list:
    return [
        ins
        for ins in prog.get_main_module().instructions
        if ins.is_literal() and isinstance(ins.get_literal(), WIDE.RoundedLiteral)
    ]


def test_biases_keep_their_float32_value(monkeypatch) -> None:
    model, _ = _conv_bn_gemm()
    prog = _quantized(model, monkeypatch, True)
    kept = _rounded(prog)
    # the convolution's folded bias (16) and the first Gemm's (10), nothing else
    assert sorted(ins.shape.elements() for ins in kept) == [10, 16]
    for ins in kept:
        lit = ins.get_literal()
        assert lit.array.dtype == ml_dtypes.bfloat16 and lit.wide.dtype == np.float32
        assert np.array_equal(lit.wide.astype(ml_dtypes.bfloat16), lit.array)
        assert not np.array_equal(lit.wide, lit.array.astype(np.float32))  # something was lost
        assert not lit.wide.flags.writeable
        assert all(u.op.name not in ("convolution", "dot") for u in ins.outputs)
    # the Gemm's bias is exactly the model's
    fb = next(ins for ins in kept if ins.shape.elements() == 10).get_literal().wide
    want = next(t for t in model.graph.initializer if t.name == "fb")
    assert np.array_equal(fb.reshape(-1), np.frombuffer(want.raw_data, np.float32))


def test_wide_vector_reads_through_the_broadcast(monkeypatch) -> None:
    prog = _quantized(_conv_bn_gemm()[0], monkeypatch, True)
    conv_bias = next(ins for ins in _rounded(prog) if ins.shape.elements() == 16)
    views = [u for u in conv_bias.outputs if u.op.name == "multibroadcast"]
    assert views, "the conv bias is broadcast to the product's shape"
    vec = WIDE.wide_vector(views[0], 16)
    assert vec is not None and vec.shape == (16,)
    assert np.array_equal(vec, conv_bias.get_literal().wide.reshape(16))
    assert WIDE.wide_vector(views[0], 15) is None  # another size: not that vector
    weights = [
        x
        for ins in prog.get_main_module().instructions
        if ins.op.name == "convolution"
        for x in ins.inputs[1:]
    ]
    assert weights and all(WIDE.wide_vector(w, w.shape.elements()) is None for w in weights)


def test_the_switch_keeps_nothing(monkeypatch) -> None:
    prog = _quantized(_conv_bn_gemm()[0], monkeypatch, False)
    assert not _rounded(prog)


@pytest.mark.parametrize(("value", "kept"), [("0", False), ("off", False), ("1", True), ("", True)])
def test_the_variable_is_read_when_quantizing(monkeypatch, value: str, kept: bool) -> None:
    monkeypatch.setenv(WIDE.KEEP_WIDE_ENV, value)
    prog = _quantized(_conv_bn_gemm()[0], monkeypatch, None)
    assert bool(_rounded(prog)) is kept


def test_the_program_means_the_same(monkeypatch) -> None:
    model, feeds = _conv_bn_gemm()
    on, off = (_quantized(model, monkeypatch, keep) for keep in (True, False))
    assert str(on) == str(off)
    results = []
    for prog in (on, off):
        prog.compile(pygraphx.get_target("ref"))
        results.append(np.asarray(prog.run(feeds)[0]))
    assert np.array_equal(results[0], results[1])


def test_only_small_float_vectors() -> None:
    low = np.zeros(4, ml_dtypes.bfloat16)
    assert isinstance(WIDE.rounded(low, np.ones(4, np.float32)), WIDE.RoundedLiteral)
    square = np.zeros((4, 4), ml_dtypes.bfloat16)
    assert not isinstance(WIDE.rounded(square, np.ones((4, 4), np.float32)), WIDE.RoundedLiteral)
    n = WIDE.WIDE_ELEMENTS + 1
    big = WIDE.rounded(np.zeros(n, ml_dtypes.bfloat16), np.ones(n, np.float32))
    assert not isinstance(big, WIDE.RoundedLiteral)
    with pytest.raises(ValueError, match="shape"):
        WIDE.RoundedLiteral(low, np.ones(5, np.float32))
