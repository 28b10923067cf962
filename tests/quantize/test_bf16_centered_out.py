"""`quantize_bf16`'s `CENTER_LAST_OUT` (`PGX_BF16_CENTER_LAST_OUT`, `quantize/centered_out.py`):
the last attention's output projection runs on its input's deviation from the mean over the
tokens, the mean's product in float32 (helper acc16, issue 10).

The model is a MiniLM-like sentence encoder in miniature: two post-norm attention blocks
(layer norm, Q / K / V products, softmax attention, output projection, residual sum, layer
norm) and a mean over the tokens. Its value products have a large bias, so the attention's
context has a large mean, as MiniLM's last attention's has: the output projection's weight
rounding then makes an error that the mean over the tokens keeps. Checked by the rewritten
program's types, by the rewrite's exactness in float32, and by the bf16 results against ONNX
Runtime at float32 over several inputs, on `ref` and `cpu`, with the switch on and off.
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


def _program(model, center: bool):
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    TRUNCATE.CENTER_LAST_OUT = center
    try:
        quantize_bf16(prog)
    finally:
        TRUNCATE.CENTER_LAST_OUT = None
    return prog


def _dots(prog) -> list[tuple[str, tuple[int, ...]]]:
    """(type, output lens) of each dot of the main module, in program order."""
    main = prog.get_main_module()
    dots = [i for i in main.instructions if i.op.name == "dot"]
    return [(i.shape.type(), tuple(i.shape.lens())) for i in dots]


def test_the_last_output_projection_is_centred() -> None:
    model = _encoder()
    off, on = _dots(_program(model, False)), _dots(_program(model, True))
    assert all(t == "bf16_type" for t, _ in off) and len(off) >= 8
    # one more product: the mean's (one row a sequence), float32; the others bf16 as before
    assert len(on) == len(off) + 1
    wide = [(t, lens) for t, lens in on if t == "float_type"]
    assert wide == [("float_type", (B, 1, D))]

    def token_means(prog) -> int:
        main = prog.get_main_module()
        return sum(i.op.name == "reduce_mean" and i.op.axes == (1,) for i in main.instructions)

    # one mean more (the pooling is one already): over the last attention's context only
    assert token_means(_program(model, True)) == token_means(_program(model, False)) + 1


def test_switch_on_by_default(monkeypatch) -> None:
    monkeypatch.delenv(TRUNCATE.CENTER_LAST_OUT_ENV, raising=False)
    assert TRUNCATE.center_last_out()
    monkeypatch.setenv(TRUNCATE.CENTER_LAST_OUT_ENV, "0")
    assert not TRUNCATE.center_last_out()


def test_the_rewrite_is_exact_in_float32() -> None:
    """`center_product` alone (no rounding) computes what ONNX Runtime does, to float32's
    precision."""
    from pygraphx.quantize.centered_out import center_product

    model = _encoder()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    main = prog.get_main_module()
    dots = sum(i.op.name == "dot" for i in main.instructions)
    last = TRUNCATE.last_attention_out(main)
    assert last is not None and center_product(main, last) is not None
    assert sum(i.op.name == "dot" for i in main.instructions) == dots + 1
    prog.compile(pygraphx.get_target("ref"))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in SEEDS:
        feeds = _inputs(seed)
        (want,) = session.run(None, feeds)
        (got,) = prog.run(feeds)
        assert rel_rms(np.asarray(got), want) < 2e-6


@pytest.mark.parametrize("target", ["ref", "cpu"])
def test_error_against_float32_with_and_without(target: str) -> None:
    """Over several inputs, the bf16 error against ORT float32 is lower with the last output
    projection centred, and both are bf16-sized (the rest is rounded as before)."""
    model = _encoder()
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    errors: dict[bool, list[float]] = {}
    for center in (False, True):
        prog = _program(model, center)
        prog.compile(pygraphx.get_target(target))
        errors[center] = []
        for seed in SEEDS:
            feeds = _inputs(seed)
            (want,) = session.run(None, feeds)
            (got,) = prog.run(feeds)
            errors[center].append(rel_rms(np.asarray(got), want))
    off, on = np.mean(errors[False]), np.mean(errors[True])
    assert 1e-3 < off < 2e-2, errors
    assert 1e-4 < on < 0.85 * off, errors


def _one_block(pair: bool = False) -> object:
    """One attention block `(2, 16, 32)`: Q / K / V products, scores plus a run-time mask,
    softmax, PV, the output projection + bias (or, with `pair`, the projection added to
    itself) + residual, then one more product (so that the projection is no small head)."""
    rng = np.random.default_rng(3)
    b, s, d = 2, 16, 32
    inits: dict[str, np.ndarray] = {}

    def w(name: str, *shape: int, sd: float = 1.0) -> str:
        inits[name] = (sd * rng.standard_normal(shape)).astype(np.float32)
        return name

    nodes = []
    for p in "qkv":
        nodes += [helper.make_node("MatMul", ["x", w("w" + p, d, d, sd=d**-0.5)], [p + "m"]),
                  helper.make_node("Add", [p + "m", w("b" + p, d, sd=0.1)], [p])]  # fmt: skip
    nodes += [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Add", ["s", "mask"], ["sm"]),
        helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["c"]),
        helper.make_node("MatMul", ["c", w("wo", d, d, sd=d**-0.5)], ["om"]),
        helper.make_node("Add", ["om", "om" if pair else w("bo", d, sd=0.1)], ["o"]),
        helper.make_node("Add", ["o", "x"], ["y0"]),
        helper.make_node("MatMul", ["y0", w("wf", d, d, sd=d**-0.5)], ["y"]),
    ]
    x = rng.standard_normal((b, s, d)).astype(np.float32)
    # causal, and sequence 0 left-padded by 3 tokens: its query rows 0-2 see no key (softmax of
    # a row of -inf: NaN in ONNX Runtime too)
    mask = np.triu(np.full((s, s), -np.inf, np.float32), 1)[None].repeat(b, 0)
    mask[0, :, :3] = -np.inf
    feeds = {"x": x, "mask": mask}
    return make_model(nodes, feeds, ["y"], inits, opset=18), feeds


@pytest.mark.parametrize("target", ["ref", "cpu"])
def test_a_nan_row_stays_in_its_row(target: str) -> None:
    """A query row that sees no key is NaN (as in ONNX Runtime); centring must not spread it to
    the sequence's other tokens through the mean (review16a)."""
    model, feeds = _one_block()
    (want,) = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, feeds)
    assert np.isnan(want[0]).any(1).nonzero()[0].tolist() == [0, 1, 2]
    prog = _program(model, True)
    assert ("float_type", (2, 1, 32)) in _dots(prog)  # (the rewrite was made)
    prog.compile(pygraphx.get_target(target))
    got = np.asarray(prog.run(feeds)[0])
    assert np.isnan(got).any(2).nonzero()[0].tolist() == [0, 0, 0]
    assert np.isnan(got[0]).any(1).nonzero()[0].tolist() == [0, 1, 2]
    assert rel_rms(got[0, 3:], want[0, 3:]) < 2e-2 and rel_rms(got[1], want[1]) < 2e-2


def test_a_projection_added_to_itself_is_left_alone() -> None:
    """`add(om, om)` lists its one user once: not a bias add (the rewrite would drop one
    `m @ W`); the program is rounded as without centring, and right."""
    model, feeds = _one_block(pair=True)
    on, off = _program(model, True), _program(model, False)
    assert _dots(on) == _dots(off)
    causal = np.triu(np.full((16, 16), -1e9, np.float32), 1)[None].repeat(2, 0)
    feeds = {"x": feeds["x"], "mask": causal}
    (want,) = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, feeds)
    on.compile(pygraphx.get_target("ref"))
    assert rel_rms(np.asarray(on.run(feeds)[0]), want) < 2e-2


def test_the_switch_is_read_once_when_quantizing() -> None:
    """Specializations of a program with a dynamic batch keep the choice made when it was
    quantized (the switch is reset before they are made)."""
    model = _encoder()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    TRUNCATE.CENTER_LAST_OUT = False
    try:
        quantize_bf16(prog)
    finally:
        TRUNCATE.CENTER_LAST_OUT = None
    again = pygraphx.parse_onnx_buffer(model.SerializeToString())
    for transform in prog.transforms:  # what a specialization applies to its re-parsed program
        transform(again)
    assert _dots(again) == _dots(prog) and all(t == "bf16_type" for t, _ in _dots(again))
