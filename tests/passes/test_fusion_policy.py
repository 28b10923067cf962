"""Fusion policies: every refusal reason on a small graph, RowFusion's whole rows on BERT, and
DefaultFusion's groups unchanged on the built-in models.

Values are checked against numpy (small graphs) and ONNX Runtime (BERT); group structure by the
op names inside each `pointwise`/`fused_reduce` body; refusals through `PGX_TRACE_FUSION=1`.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
from onnx import TensorProto, helper

import pygraphx
from pygraphx.ir.program import Program
from pygraphx.passes.fusion_policy import (
    REASON_CODES,
    DefaultFusion,
    FusionPolicy,
    Reason,
    RowFusion,
)
from pygraphx.passes.manager import run_passes
from pygraphx.passes.pipeline import optimize_passes
from tests.helpers import make_model

RNG = np.random.default_rng(7)
X = RNG.standard_normal((4, 8)).astype(np.float32)
W = RNG.standard_normal((8, 8)).astype(np.float32)
REFUSAL = re.compile(r"^(fuse_\w+): refused (\S+) \((\S+)\) into the group of .*?: (\w+): (.*)$")


def _fuse(
    nodes, outputs, policy: FusionPolicy, monkeypatch, capsys, inits=None, inputs=None
) -> tuple[Program, list[tuple[str, str]], list[str]]:
    """Optimise with `policy`, tracing; returns the program, (candidate op, reason code) per
    refusal and the 'formed' lines."""
    model = make_model(nodes, inputs or {"x": X}, outputs, inits)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    monkeypatch.setenv("PGX_TRACE_FUSION", "1")
    capsys.readouterr()
    run_passes(prog, optimize_passes(policy=policy, plan_memory=False))
    err = capsys.readouterr().err.splitlines()
    refusals = []
    for line in err:
        m = REFUSAL.match(line)
        if m:
            assert m.group(4) in REASON_CODES
            refusals.append((m.group(3), m.group(4)))
    return prog, refusals, [ln for ln in err if ": formed " in ln]


def _run(prog: Program, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    prog.compile(pygraphx.get_target("ref"))
    return [np.array(r) for r in prog.run(feeds)]


def _bodies(prog: Program, kind: str) -> list[list[str]]:
    out = []
    for ins in prog.get_main_module().instructions:
        if ins.op.name == kind:
            body = ins.module_inputs[0].instructions
            out.append([i.op.name for i in body if not (i.is_param() or i.is_return())])
    return out


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm(x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + eps)


def test_reason_codes_are_checked() -> None:
    assert str(Reason("too_large", "64 instructions")) == "too_large: 64 instructions"
    with pytest.raises(ValueError, match="unknown fusion reason"):
        Reason("because", "no")


def test_multiple_users(monkeypatch, capsys) -> None:
    """s = x + 1 feeds two groups (mul and relu), so it stays alone."""
    nodes = [
        helper.make_node("Add", ["x", "one"], ["s"]),
        helper.make_node("Mul", ["s", "s"], ["y"]),
        helper.make_node("Relu", ["s"], ["z"]),
    ]
    one = {"one": np.ones((4, 8), np.float32)}
    prog, refusals, _ = _fuse(nodes, ["y", "z"], DefaultFusion(), monkeypatch, capsys, one)
    assert ("add", "multiple_users") in refusals
    assert sorted(_bodies(prog, "pointwise")) == [["add"], ["mul"], ["relu"]]
    y, z = _run(prog, {"x": X})
    np.testing.assert_allclose(y, (X + 1) ** 2, rtol=1e-6)
    np.testing.assert_allclose(z, np.maximum(X + 1, 0), rtol=1e-6)


def test_is_output(monkeypatch, capsys) -> None:
    nodes = [helper.make_node("Exp", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"])]
    prog, refusals, _ = _fuse(nodes, ["a", "b"], DefaultFusion(), monkeypatch, capsys)
    assert ("exp", "is_output") in refusals
    assert sorted(_bodies(prog, "pointwise")) == [["exp"], ["relu"]]


def test_too_large_and_target_refuses(monkeypatch, capsys) -> None:
    nodes = [
        helper.make_node("Exp", ["x"], ["a"]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Tanh", ["b"], ["c"]),
        helper.make_node("Neg", ["c"], ["y"]),
    ]
    small = DefaultFusion(max_group_size=2)
    prog, refusals, _ = _fuse(nodes, ["y"], small, monkeypatch, capsys)
    assert ("relu", "too_large") in refusals
    assert _bodies(prog, "pointwise") == [["exp", "relu"], ["tanh", "neg"]]
    (y,) = _run(prog, {"x": X})
    np.testing.assert_allclose(y, -np.tanh(np.maximum(np.exp(X), 0)), rtol=1e-6)
    no_tanh = DefaultFusion(refuse_ops={"tanh"})
    prog, refusals, _ = _fuse(nodes, ["y"], no_tanh, monkeypatch, capsys)
    assert ("tanh", "target_refuses") in refusals and ("relu", "target_refuses") in refusals
    assert _bodies(prog, "pointwise") == [["exp", "relu"], ["tanh"], ["neg"]]


def test_reduce_not_last_axis(monkeypatch, capsys) -> None:
    nodes = [
        helper.make_node("Exp", ["x"], ["e"]),
        helper.make_node("ReduceSum", ["e", "axes"], ["y"], keepdims=1),
    ]
    axes = {"axes": np.array([0], np.int64)}
    prog, refusals, _ = _fuse(nodes, ["y"], RowFusion(), monkeypatch, capsys, axes)
    assert refusals == [("reduce_sum", "reduce_not_last_axis")]
    assert _bodies(prog, "fused_reduce") == []
    prog, refusals, _ = _fuse(nodes, ["y"], DefaultFusion(), monkeypatch, capsys, axes)
    assert _bodies(prog, "fused_reduce") == [["exp", "reduce_sum"]]  # the CPU fuses it
    (y,) = _run(prog, {"x": X})
    np.testing.assert_allclose(y, np.exp(X).sum(0, keepdims=True), rtol=1e-5)


def test_shape_mismatch_between_two_rows(monkeypatch, capsys) -> None:
    """The second reduction works on rows of [4, 1], not of the [4, 8] row."""
    nodes = [
        helper.make_node("Exp", ["x"], ["e"]),
        helper.make_node("ReduceSum", ["e", "axes"], ["r"], keepdims=1),
        helper.make_node("ReduceMax", ["r"], ["y"], axes=[1], keepdims=1),  # opset 17: attribute
    ]
    axes = {"axes": np.array([1], np.int64)}
    prog, refusals, _ = _fuse(nodes, ["y"], RowFusion(), monkeypatch, capsys, axes)
    assert ("reduce_max", "shape_mismatch") in refusals
    assert _bodies(prog, "fused_reduce") == [["exp", "reduce_sum"]]
    (y,) = _run(prog, {"x": X})
    np.testing.assert_allclose(y, np.exp(X).sum(1, keepdims=True), rtol=1e-5)  # max of 1


def test_dtype_mismatch_keeps_a_cast_out_of_the_row(monkeypatch, capsys) -> None:
    nodes = [
        helper.make_node("Softmax", ["x"], ["s"], axis=-1),
        helper.make_node("Cast", ["s"], ["h"], to=TensorProto.FLOAT16),
        helper.make_node("Neg", ["x"], ["n"]),
        helper.make_node("Softmax", ["n"], ["y"], axis=-1),
    ]
    prog, refusals, _ = _fuse(nodes, ["h", "y"], RowFusion(), monkeypatch, capsys)
    assert ("pointwise", "dtype_mismatch") in refusals
    assert _bodies(prog, "fused_reduce") == [["neg", "softmax"]]
    h, y = _run(prog, {"x": X})
    assert h.dtype == np.float16
    np.testing.assert_allclose(h, _softmax(X), rtol=2e-3, atol=1e-4)
    np.testing.assert_allclose(y, _softmax(-X), rtol=1e-5, atol=1e-7)


def test_cycle_and_not_fusible(monkeypatch, capsys) -> None:
    """z = s + s @ W: joining z would make the group feed its own input through the dot."""
    nodes = [
        helper.make_node("Softmax", ["x"], ["s"], axis=-1),
        helper.make_node("MatMul", ["s", "w"], ["d"]),
        helper.make_node("Add", ["s", "d"], ["y"]),
    ]
    prog, refusals, _ = _fuse(nodes, ["y"], RowFusion(), monkeypatch, capsys, {"w": W})
    assert ("pointwise", "cycle") in refusals and ("dot", "not_fusible") in refusals
    assert _bodies(prog, "fused_reduce") == []
    (y,) = _run(prog, {"x": X})
    s = _softmax(X)
    np.testing.assert_allclose(y, s + s @ W, rtol=1e-5, atol=1e-6)


def test_multiple_outputs_cuts_the_group_back(monkeypatch, capsys) -> None:
    """The mean is returned, so the centred x would be a second value leaving the row."""
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=1),
        helper.make_node("Sub", ["x", "m"], ["y"]),
    ]
    prog, refusals, _ = _fuse(nodes, ["m", "y"], RowFusion(), monkeypatch, capsys)
    assert ("pointwise", "multiple_outputs") in refusals
    assert _bodies(prog, "fused_reduce") == []
    m, y = _run(prog, {"x": X})
    np.testing.assert_allclose(y, X - X.mean(1, keepdims=True), rtol=1e-5, atol=1e-6)


def _layer_norm_nodes() -> list:
    """An exported LayerNorm, decomposed, with a residual add before it and a ReLU after."""
    return [
        helper.make_node("Add", ["x", "r"], ["h"]),
        helper.make_node("ReduceMean", ["h"], ["m"], axes=[-1], keepdims=1),
        helper.make_node("Sub", ["h", "m"], ["c"]),
        helper.make_node("Mul", ["c", "c"], ["c2"]),
        helper.make_node("ReduceMean", ["c2"], ["v"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["v", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["c", "sd"], ["n"]),
        helper.make_node("Relu", ["n"], ["y"]),
    ]


LN_INITS = {"eps": np.array(1e-5, np.float32)}
R = RNG.standard_normal((4, 8)).astype(np.float32)


def test_row_fusion_makes_one_group_of_a_layer_norm(monkeypatch, capsys) -> None:
    feeds = {"x": X, "r": R}
    nodes = _layer_norm_nodes()
    prog, _, formed = _fuse(nodes, ["y"], RowFusion(), monkeypatch, capsys, LN_INITS, feeds)
    (body,) = _bodies(prog, "fused_reduce")
    assert Counter(body)["reduce_mean"] == 2 and body[0] == "add" and body[-1] == "relu"
    assert _bodies(prog, "pointwise") == []
    assert any("fuse_reduce: formed main:fused_reduce0" in ln for ln in formed)
    (y,) = _run(prog, feeds)
    np.testing.assert_allclose(y, np.maximum(_layer_norm(X + R), 0), rtol=1e-5, atol=1e-6)
    prog, _, _ = _fuse(nodes, ["y"], DefaultFusion(), monkeypatch, capsys, LN_INITS, feeds)
    assert _bodies(prog, "fused_reduce") == [["mul", "reduce_mean"]]
    too_small = RowFusion(max_group_size=3)
    prog, refusals, _ = _fuse(nodes, ["y"], too_small, monkeypatch, capsys, LN_INITS, feeds)
    assert ("pointwise", "too_large") in refusals
    assert all(len(b) <= 6 for b in _bodies(prog, "fused_reduce"))
    (y,) = _run(prog, feeds)
    np.testing.assert_allclose(y, np.maximum(_layer_norm(X + R), 0), rtol=1e-5, atol=1e-6)


def test_a_target_chooses_the_policy(monkeypatch) -> None:
    """The cpu target compiles with its `fusion_policy()`: DefaultFusion, or a subclass's."""
    pytest.importorskip("torch")
    from pygraphx.targets.cpu.target import CpuTarget

    assert isinstance(pygraphx.get_target("cpu").fusion_policy(), DefaultFusion)
    assert isinstance(pygraphx.get_target("ref").fusion_policy(), DefaultFusion)

    class RowCpu(CpuTarget):
        def fusion_policy(self) -> FusionPolicy:
            return RowFusion()

    model = make_model(_layer_norm_nodes(), {"x": X, "r": R}, ["y"], LN_INITS)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(RowCpu())
    assert len(_bodies(prog, "fused_reduce")) == 1 and _bodies(prog, "pointwise") == []
    (y,) = [np.array(r) for r in prog.run({"x": X, "r": R})]
    np.testing.assert_allclose(y, np.maximum(_layer_norm(X + R), 0), rtol=1e-5, atol=1e-6)


# --- the built-in models --------------------------------------------------------------------
def _optimized(name: str, policy: FusionPolicy, seq_len: int = 8) -> tuple[Program, object]:
    from pygraphx.models import get_model

    model = get_model(name, batch=1, seq_len=seq_len)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    run_passes(prog, optimize_passes(policy=policy))
    return prog, model


@pytest.mark.slow  # BERT-base built, parsed and fused
def test_row_fusion_on_bert_fuses_every_layer_norm_and_softmax() -> None:
    """BERT-base: 25 LayerNorms (embeddings + 2 per layer x 12) and 12 softmaxes, each one
    fused_reduce group; outputs match ONNX Runtime."""
    ort = pytest.importorskip("onnxruntime")
    from pygraphx.models import model_inputs

    prog, model = _optimized("bert_base", RowFusion())
    main_ops = Counter(i.op.name for i in prog.get_main_module().instructions)
    assert main_ops["fused_reduce"] == 37
    assert main_ops["reduce_mean"] == 0 and main_ops["softmax"] == 0
    bodies = [Counter(b) for b in _bodies(prog, "fused_reduce")]
    layer_norms = [b for b in bodies if b["reduce_mean"] == 2 and b["sqrt"] == 1]
    softmaxes = [b for b in bodies if b["softmax"] == 1 and b["reduce_mean"] == 0]
    assert len(layer_norms) == 25 and len(softmaxes) == 12
    assert all(b["div"] == 1 and b["sub"] == 1 for b in layer_norms)  # normalise inside
    feeds = model_inputs("bert_base", model, seed=3)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = sess.run(None, feeds)
    got = _run(prog, feeds)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-4)


@pytest.mark.slow  # whole networks built and fused
@pytest.mark.parametrize(
    ("name", "pointwise", "fused_reduce"),
    # Measured on main before fusion policies existed (commit 3725a0c, fuse_pointwise /
    # fuse_reduce deciding alone): the printed optimised programs of all four built-in models
    # were also byte-identical before and after the change.
    [("resnet50", 50, 0), ("mobilenetv2", 52, 0), ("bert_base", 126, 37)],
)
def test_default_fusion_keeps_the_groups_of_before(
    name: str, pointwise: int, fused_reduce: int
) -> None:
    prog, _ = _optimized(name, DefaultFusion())
    ops = Counter(i.op.name for i in prog.get_main_module().instructions)
    assert ops["pointwise"] == pointwise and ops["fused_reduce"] == fused_reduce
    if name == "bert_base":  # the variance's square + mean, and scale + mask + softmax
        shapes = Counter(tuple(b) for b in _bodies(prog, "fused_reduce"))
        assert shapes == {("mul", "reduce_mean"): 25, ("mul", "add", "softmax"): 12}
