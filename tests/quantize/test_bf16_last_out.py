"""`quantize_bf16`'s `WIDE_LAST_OUT` (`PGX_BF16_WIDE_LAST_OUT`): the last attention's output
projection stays float32 (helper acc16, issue 10).

The model is a MiniLM-like sentence encoder in miniature: two post-norm attention blocks
(layer norm, Q / K / V products, softmax attention, output projection, residual sum, layer
norm) and a mean over the tokens. Its value products have a large bias, so the attention's
context has a large mean, as MiniLM's last attention's has: the output projection's weight
rounding then makes an error that the mean over the tokens keeps. Checked by the rewritten
program's types and by its results against ONNX Runtime at float32 over several inputs, on
`ref` and `cpu`, with the switch on and off.
"""

from __future__ import annotations

import importlib

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import pygraphx
from pygraphx.quantize import quantize_bf16
from tests.helpers import make_model
from tests.quantize.test_truncate_float import rel_rms

#: the module (the package's `truncate_float` attribute is the function of that name)
TRUNCATE = importlib.import_module("pygraphx.quantize.truncate_float")
B, S, D, H = 4, 32, 64, 4
SEEDS = range(4)


def _ints(name: str, values: list[int]) -> helper.TensorProto:
    return helper.make_tensor(name, 7, [len(values)], values)  # int64


def _encoder() -> object:
    rng = np.random.default_rng(16)
    inits: dict[str, np.ndarray] = {
        "shape_heads": np.array([B, S, H, D // H], np.int64),
        "shape_model": np.array([B, S, D], np.int64),
        "scale": np.array(1.0 / np.sqrt(D // H), np.float32),
        "axes": np.array([1], np.int64),
    }
    nodes = []

    def weight(name: str, *shape: int, sd: float) -> str:
        inits[name] = (sd * rng.standard_normal(shape)).astype(np.float32)
        return name

    x = "x"
    for i in range(2):
        p = f"l{i}_"
        g, b = weight(p + "g", D, sd=0.3), weight(p + "b", D, sd=0.1)
        inits[g] += 1.0
        nodes.append(helper.make_node("LayerNormalization", [x, g, b], [p + "h"], axis=-1))
        for part, bias_sd in (("q", 0.1), ("k", 0.1), ("v", 2.0)):
            w = weight(p + "w" + part, D, D, sd=D**-0.5)
            bias = weight(p + "b" + part, D, sd=bias_sd)
            nodes += [
                helper.make_node("MatMul", [p + "h", w], [p + part + "m"]),
                helper.make_node("Add", [p + part + "m", bias], [p + part]),
                helper.make_node("Reshape", [p + part, "shape_heads"], [p + part + "r"]),
            ]
        nodes += [
            helper.make_node("Transpose", [p + "qr"], [p + "qt"], perm=[0, 2, 1, 3]),
            helper.make_node("Transpose", [p + "kr"], [p + "kt"], perm=[0, 2, 3, 1]),
            helper.make_node("Transpose", [p + "vr"], [p + "vt"], perm=[0, 2, 1, 3]),
            helper.make_node("MatMul", [p + "qt", p + "kt"], [p + "s"]),
            helper.make_node("Mul", [p + "s", "scale"], [p + "ss"]),
            helper.make_node("Softmax", [p + "ss"], [p + "p"], axis=-1),
            helper.make_node("MatMul", [p + "p", p + "vt"], [p + "c"]),
            helper.make_node("Transpose", [p + "c"], [p + "ct"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [p + "ct", "shape_model"], [p + "cr"]),
            helper.make_node("MatMul", [p + "cr", weight(p + "wo", D, D, sd=D**-0.5)], [p + "om"]),
            helper.make_node("Add", [p + "om", weight(p + "bo", D, sd=0.1)], [p + "o"]),
            helper.make_node("Add", [p + "o", p + "h"], [p + "r"]),
        ]
        g2, b2 = weight(p + "g2", D, sd=0.3), weight(p + "b2", D, sd=0.1)
        inits[g2] += 1.0
        nodes.append(helper.make_node("LayerNormalization", [p + "r", g2, b2], [p + "y"], axis=-1))
        x = p + "y"
    nodes.append(helper.make_node("ReduceMean", [x, "axes"], ["y"], keepdims=0))
    feeds = {"x": np.zeros((B, S, D), np.float32)}
    return make_model(nodes, feeds, ["y"], inits, opset=18)


def _inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(100 + seed)
    return {"x": rng.standard_normal((B, S, D)).astype(np.float32)}


def _program(model, wide: bool):
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    TRUNCATE.WIDE_LAST_OUT = wide
    try:
        quantize_bf16(prog)
    finally:
        TRUNCATE.WIDE_LAST_OUT = None
    return prog


def _dots(prog) -> list[tuple[str, bool]]:
    """(type, has a constant weight) of each dot of the main module, in program order."""
    from pygraphx.quantize.graph_tail import is_constant_view

    main = prog.get_main_module()
    return [
        (i.shape.type(), is_constant_view(i.inputs[1]))
        for i in main.instructions
        if i.op.name == "dot"
    ]


def test_only_the_last_attention_output_projection_stays_float32() -> None:
    model = _encoder()
    narrow, wide = _dots(_program(model, False)), _dots(_program(model, True))
    assert all(t == "bf16_type" for t, _ in narrow)
    assert len(wide) == len(narrow) and len(wide) >= 8
    kept = [k for k, (t, _) in enumerate(wide) if t == "float_type"]
    assert len(kept) == 1
    (k,) = kept
    assert wide[k][1]  # a product with a constant weight ...
    # ... after every other product (the second block's out-projection is the last one)
    assert k == len(wide) - 1


def test_switch_off_by_default(monkeypatch) -> None:
    monkeypatch.delenv(TRUNCATE.WIDE_LAST_OUT_ENV, raising=False)
    assert not TRUNCATE.wide_last_out()
    monkeypatch.setenv(TRUNCATE.WIDE_LAST_OUT_ENV, "1")
    assert TRUNCATE.wide_last_out()
    monkeypatch.setenv(TRUNCATE.WIDE_LAST_OUT_ENV, "0")
    assert not TRUNCATE.wide_last_out()


@pytest.mark.parametrize("target", ["ref", "cpu"])
def test_error_against_float32_with_and_without(target: str) -> None:
    """Over several inputs, the bf16 error against ORT float32 is lower with the last
    output projection kept float32, and both are bf16-sized (not float32-sized: the rest is
    rounded)."""
    model = _encoder()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    errors: dict[bool, list[float]] = {}
    for wide in (False, True):
        prog = _program(model, wide)
        prog.compile(pygraphx.get_target(target))
        errors[wide] = []
        for seed in SEEDS:
            feeds = _inputs(seed)
            (want,) = session.run(None, feeds)
            (got,) = prog.run(feeds)
            errors[wide].append(rel_rms(np.asarray(got), want))
    narrow, wide = np.mean(errors[False]), np.mean(errors[True])
    assert 1e-3 < narrow < 2e-2, errors
    assert 1e-4 < wide < 0.85 * narrow, errors
