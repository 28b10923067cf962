"""`quantize_bf16`'s graph tail (`truncate_float.WIDE_TAIL`, `quantize/graph_tail.py`): the
arithmetic after the last products on the way to an output stays float32, as OpenVINO's bf16
keeps it; a product's own bias and activation stay bf16 with it; a small product whose values
reach the outputs through concatenations stays float32 (a detector's DFL product).

Each model here is a detector's box decoding in miniature, checked by the rewritten program's
types and by its results against ONNX Runtime at float32 on `ref` and `cpu`, under the tail rule
and under the earlier rule (which these tests show failing the same bounds).
"""

from __future__ import annotations

import importlib

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import pygraphx
from pygraphx.quantize import quantize_bf16
from pygraphx.quantize.graph_tail import graph_tail
from tests.helpers import make_model
from tests.quantize.test_truncate_float import rel_rms

#: the module (the package's `truncate_float` attribute is the function of that name)
TRUNCATE = importlib.import_module("pygraphx.quantize.truncate_float")
RNG = np.random.default_rng(13)
#: feature map side: SIDE * SIDE anchors, so that the box and class products (4 values an
#: anchor each) are above `HEAD_ELEMENTS` (65536), no small heads, as in a real detector
SIDE = 132


def _ints(name: str, values: list[int]) -> helper.TensorProto:
    return helper.make_tensor(name, 7, [len(values)], values)  # int64


def _box_decoder() -> tuple:
    """Conv + bias + Relu, a 1x1 conv to 4 distances per anchor (0..4), decoded around anchor
    points at pixel coordinates 100-500 as YOLOv8 does (x1y1 = a - lt, x2y2 = a + rb, centre
    and size, times the stride), concatenated with the sigmoid of a class conv."""
    a = SIDE * SIDE
    x = RNG.standard_normal((1, 8, SIDE, SIDE)).astype(np.float32)
    inits = {
        "w1": (RNG.standard_normal((16, 8, 3, 3)) / 8.5).astype(np.float32),
        "b1": (0.1 * RNG.standard_normal(16)).astype(np.float32),
        "w2": (RNG.standard_normal((4, 16, 1, 1)) / 4).astype(np.float32),
        "b2": np.full(4, 1.0, np.float32),
        "wc": (RNG.standard_normal((4, 16, 1, 1)) / 4).astype(np.float32),
        "anchors": RNG.uniform(100.0, 500.0, (1, 2, a)).astype(np.float32),
        "stride": np.full((1, 1, a), 1.0, np.float32),
        "half": np.array(0.5, np.float32),
        "shape": np.array([1, 4, a], np.int64),
        "cshape": np.array([1, 4, a], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"]),
        helper.make_node("Relu", ["c2"], ["d"]),
        helper.make_node("Reshape", ["d", "shape"], ["dist"]),
        helper.make_node("Split", ["dist"], ["lt", "rb"], axis=1, num_outputs=2),
        helper.make_node("Sub", ["anchors", "lt"], ["x1y1"]),
        helper.make_node("Add", ["anchors", "rb"], ["x2y2"]),
        helper.make_node("Add", ["x1y1", "x2y2"], ["xy2"]),
        helper.make_node("Mul", ["xy2", "half"], ["xy"]),
        helper.make_node("Sub", ["x2y2", "x1y1"], ["wh"]),
        helper.make_node("Concat", ["xy", "wh"], ["xywh"], axis=1),
        helper.make_node("Mul", ["xywh", "stride"], ["box"]),
        helper.make_node("Conv", ["r1", "wc"], ["c3"]),
        helper.make_node("Reshape", ["c3", "cshape"], ["logits"]),
        helper.make_node("Sigmoid", ["logits"], ["scores"]),
        helper.make_node("Concat", ["box", "scores"], ["y"], axis=1),
    ]
    return make_model(nodes, {"x": x}, ["y"], inits, opset=18), {"x": x}


def _dfl_head() -> tuple:
    """A DFL product: softmax over 16 bins, their expectation as a 16 -> 1 1x1 conv (33 * 4
    values, 16 weights), concatenated with a second output branch."""
    x = RNG.standard_normal((1, 16, 4, 33)).astype(np.float32) * 3
    z = RNG.standard_normal((1, 1, 4, 33)).astype(np.float32)
    inits = {"bins": np.arange(16, dtype=np.float32).reshape(1, 16, 1, 1)}
    nodes = [
        helper.make_node("Softmax", ["x"], ["p"], axis=1),
        helper.make_node("Conv", ["p", "bins"], ["dist"]),
        helper.make_node("Concat", ["dist", "z"], ["y"], axis=1),
    ]
    return make_model(nodes, {"x": x, "z": z}, ["y"], inits), {"x": x, "z": z}


def _quantized(model, monkeypatch, wide_tail: bool) -> pygraphx.Program:
    monkeypatch.setattr(TRUNCATE, "WIDE_TAIL", wide_tail)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    quantize_bf16(prog)
    return prog


def _error(model, feeds, prog: pygraphx.Program, target: str) -> float:
    (want,) = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    prog.compile(pygraphx.get_target(target))
    (got,) = [np.array(r) for r in prog.run(feeds)]
    assert got.dtype == want.dtype == np.float32
    return rel_rms(got, want)


def _types(prog: pygraphx.Program, name: str) -> list[str]:
    return [i.shape.type() for i in prog.get_main_module().instructions if i.op.name == name]


def test_box_decoding_computes_in_float32(monkeypatch) -> None:
    """The anchor arithmetic (sub, add, mul) and the sigmoid stay float32; the convolutions,
    their bias adds and ReLUs (their epilogues) stay bf16."""
    prog = _quantized(_box_decoder()[0], monkeypatch, True)
    assert set(_types(prog, "convolution")) == {"bf16_type"}
    assert set(_types(prog, "relu")) == {"bf16_type"}
    assert set(_types(prog, "sub")) == {"float_type"}
    assert set(_types(prog, "mul")) == {"float_type"}
    assert _types(prog, "sigmoid") == ["float_type"]
    adds = [i for i in prog.get_main_module().instructions if i.op.name == "add"]
    biases = [i for i in adds if any(x.op.name == "convolution" for x in i.inputs)]
    assert len(biases) == 2 and all(i.shape.type() == "bf16_type" for i in biases)
    assert all(i.shape.type() == "float_type" for i in adds if i not in biases)
    old = _quantized(_box_decoder()[0], monkeypatch, False)
    assert set(_types(old, "sub")) == {"bf16_type"}  # the earlier rule


@pytest.mark.parametrize("target", ["ref", "cpu"])
def test_box_decoding_error_against_float32(target: str, monkeypatch) -> None:
    """Against ORT float32: pixel coordinates of 100-500 rounded to bf16 (ulp 0.5-2) give a
    relative error ~3e-3 under the earlier rule; kept float32, only the distances' rounding
    (values 0-4) is left, ~1.5e-5 (measured on both targets)."""
    model, feeds = _box_decoder()
    new = _error(model, feeds, _quantized(model, monkeypatch, True), target)
    old = _error(model, feeds, _quantized(model, monkeypatch, False), target)
    assert 1e-7 < new < 1e-4 < 5e-4 < old, (new, old)


@pytest.mark.parametrize("target", ["ref", "cpu"])
def test_small_product_through_concat_stays_float32(target: str, monkeypatch) -> None:
    model, feeds = _dfl_head()
    prog = _quantized(model, monkeypatch, True)
    assert _types(prog, "convolution") == ["float_type"]
    new = _error(model, feeds, prog, target)
    old_prog = _quantized(model, monkeypatch, False)
    assert _types(old_prog, "convolution") == ["bf16_type"]
    old = _error(model, feeds, old_prog, target)
    assert new < 1e-6 < 1e-4 < old, (new, old)


def test_graph_tail_stops_at_products_and_their_epilogues() -> None:
    model, _ = _box_decoder()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    main = prog.get_main_module()
    names = sorted(i.op.name for i in graph_tail(main, TRUNCATE.PRODUCT_OPS))
    # decoding: sub x2, add x2 (x2y2, xy2), mul x2 (half, stride), sigmoid; no view, concat,
    # convolution, bias add or relu
    assert names == ["add", "add", "mul", "mul", "sigmoid", "sub", "sub"], names


def test_all_policy_ignores_the_tail(monkeypatch) -> None:
    """`("all",)` converts every instruction, the tail too."""
    monkeypatch.setattr(TRUNCATE, "WIDE_TAIL", True)
    prog = pygraphx.parse_onnx_buffer(_box_decoder()[0].SerializeToString())
    quantize_bf16(prog, ("all",))
    assert set(_types(prog, "sub")) == {"bf16_type"}


def _tanh_chain(n: int) -> bytes:
    """MatMul (more values than a small head), then `n` Tanh (the product's epilogue), then an
    Add with the input and a Mul by 2 (the tail; the earlier rule keeps only the Mul, the last
    step before the output, in float32)."""
    rows, width = 512, 256
    w = helper.make_tensor("w", 1, [width, width], RNG.random(width * width).astype(np.float32))
    two = helper.make_tensor("two", 1, [], [2.0])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t0"])]
    nodes += [helper.make_node("Tanh", [f"t{i}"], [f"t{i + 1}"]) for i in range(n)]
    nodes.append(helper.make_node("Add", [f"t{n}", "x"], ["s"]))
    nodes.append(helper.make_node("Mul", ["s", "two"], ["y"]))
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", 1, [rows, width])],
        [helper.make_tensor_value_info("y", 1, [rows, width])], [w, two],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_long_epilogue_chain_needs_no_recursion(monkeypatch):
    """2,000 pointwise steps after a product (deeper than Python's recursion limit): the chain
    is the product's epilogue (bf16), the add after it is the tail (float32)."""
    monkeypatch.setattr(TRUNCATE, "WIDE_TAIL", True)
    prog = pygraphx.parse_onnx_buffer(_tanh_chain(2000))
    quantize_bf16(prog)
    main = prog.get_main_module()
    tanh = [i for i in main.instructions if i.op.name == "tanh"]
    add = [i for i in main.instructions if i.op.name == "add"]
    assert len(tanh) == 2000 and {i.shape.type() for i in tanh} == {"bf16_type"}
    assert [i.shape.type() for i in add] == ["float_type"]


@pytest.mark.parametrize("value, wide", [("0", False), ("off", False), ("no", False),
                                         ("1", True), ("", True)])
def test_the_switch_is_read_when_quantizing(monkeypatch, value, wide):
    """`PGX_BF16_WIDE_TAIL` set after import decides (0 / off / false / no: the earlier rule)."""
    monkeypatch.setattr(TRUNCATE, "WIDE_TAIL", None)
    monkeypatch.setenv(TRUNCATE.WIDE_TAIL_ENV, value)
    assert TRUNCATE.wide_tail() is wide
    prog = pygraphx.parse_onnx_buffer(_box_decoder()[0].SerializeToString())
    quantize_bf16(prog)
    assert set(_types(prog, "sub")) == {"float_type" if wide else "bf16_type"}
