"""quantize_fp16 / quantize_bf16 (truncate_float): printed programs, numerics, save/load, errors.

Small programs check the rewrite by its printed form (half instructions, half literals, converts
only after float parameters and before @return, float32 outputs); the built-in ResNet-50,
BERT-base and GPT-2 check the numerics on `ref` against their own float32 outputs (relative RMS
error, printed; run with `-s` to see the figures).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import pygraphx
from pygraphx.ir.program import Program
from pygraphx.ir.shape import Shape
from pygraphx.models import get_model, model_inputs
from pygraphx.ops.base import make_op
from pygraphx.passes.pipeline import optimize
from pygraphx.quantize import QuantizeError, quantize_bf16, quantize_fp16, truncate_float
from tests.helpers import make_model

RNG = np.random.default_rng(0)
#: every instruction converted (`quantize_bf16`'s default policy, "products", has its own
#: tests in test_bf16_products.py)
QUANTIZE = {"half_type": quantize_fp16, "bf16_type": lambda p: quantize_bf16(p, ("all",))}


# --- helpers --------------------------------------------------------------------------------
def rel_rms(got: np.ndarray, want: np.ndarray) -> float:
    """rms(got - want) / rms(want), in float64."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want**2)))


def run(prog: Program, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    if not prog.is_compiled():
        prog.compile(pygraphx.get_target("ref"))
    return [np.array(r) for r in prog.run(feeds)]


def parse(model) -> Program:
    return pygraphx.parse_onnx_buffer(model.SerializeToString())


def lines(prog: Program) -> list[str]:
    return [ln for ln in str(prog).splitlines() if " = " in ln]


def check_boundaries(prog: Program, low: str = "half_type") -> None:
    """Float32 only at the parameters and the converts feeding @return; converts to `low` only
    of parameters; no float literal left."""
    main = prog.get_main_module()
    ret = main.instructions[-1]
    assert ret.is_return()
    for ins in main.instructions:
        t = ins.shape.type()
        if ins.is_literal():
            assert t != "float_type", f"float literal left: {ins}"
        elif ins.is_param() or ins.is_return():
            continue
        elif t == "float_type":
            assert ins.op.name == "convert" and ins.outputs == [ret], f"float32 work: {ins}"
        if ins.op.name == "convert" and t == low and ins.inputs[0].shape.type() == "float_type":
            assert ins.inputs[0].is_param(), f"runtime convert of a non-parameter: {ins}"


# --- small programs -------------------------------------------------------------------------
def _mlp():
    """x[3,4] + emb[ids] -> MatMul -> Add -> Relu -> Softmax; ArgMax and a Greater mask too."""
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["e"], axis=0),
        helper.make_node("Add", ["x", "e"], ["h"]),
        helper.make_node("MatMul", ["h", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["mb"]),
        helper.make_node("Relu", ["mb"], ["r"]),
        helper.make_node("Softmax", ["r"], ["y"], axis=-1),
        helper.make_node("ArgMax", ["r"], ["idx"], axis=1, keepdims=0),
        helper.make_node("Greater", ["r", "zero"], ["pos"]),
    ]
    inputs = {
        "x": RNG.standard_normal((3, 4)).astype(np.float32),
        "ids": np.array([0, 7, 2], np.int64),
    }
    inits = {
        "emb": RNG.standard_normal((8, 4)).astype(np.float32),
        "w": RNG.standard_normal((4, 5)).astype(np.float32),
        "b": RNG.standard_normal(5).astype(np.float32),
        "zero": np.zeros(5, np.float32),
    }
    return make_model(nodes, inputs, ["y", "idx", "pos"], inits), inputs


def test_small_program_printed() -> None:
    model, feeds = _mlp()
    want = run(parse(model), feeds)
    prog = parse(model)
    quantize_fp16(prog)
    text = str(prog)
    print(text)
    check_boundaries(prog)
    # the float parameter keeps its type and is converted once, right after itself
    assert re.search(r"x = @param:x -> float_type, \{3, 4\}", text)
    assert re.search(r"\n(\S+) = convert\[target_type=half_type\]\(x\) -> half_type", text)
    # token ids untouched; weights are half literals
    assert re.search(r"ids = @param:ids -> int64_type", text)
    assert re.search(r"@literal\{ \.\.\. \} -> half_type, \{8, 4\}", text)
    assert re.search(r"@literal\{ \.\.\. \} -> half_type, \{4, 5\}", text)
    assert re.search(r"dot\(\S+\) -> half_type, \{3, 5\}", text)
    assert re.search(r"softmax\[axis=1\]\(\S+\) -> half_type", text)
    # fixed output types survive: argmax -> int64, greater -> bool (both on half values)
    assert re.search(r"argmax\[axis=1,select_last_index=0\]\(\S+\) -> int64_type", text)
    assert re.search(r"greater\(\S+\) -> bool_type", text)
    # exactly two converts: the parameter's and the float output's
    converts = [ln for ln in lines(prog) if "convert[" in ln]
    assert len(converts) == 2, converts
    quantize_fp16(prog)  # a second time: nothing left to do
    assert str(prog) == text
    got = run(prog, feeds)
    assert [g.dtype for g in got] == [w.dtype for w in want] == [np.float32, np.int64, np.bool_]
    assert rel_rms(got[0], want[0]) < 1e-2
    np.testing.assert_array_equal(got[1], want[1])


def _ir_program(param_type: str = "float_type") -> Program:
    """Built with module methods: a mid-graph convert to float, a scalar mask literal."""
    p = Program()
    m = p.get_main_module()
    x = m.add_parameter("x", Shape(param_type, [2, 4]))
    keep = m.add_parameter("keep", Shape("bool_type", [2, 4]))
    dtype = Shape(param_type).dtype()
    w = m.add_literal(np.random.default_rng(1).standard_normal((4, 4)).astype(dtype))
    lowest = m.add_literal(np.array(np.finfo(np.float32).min).astype(dtype))
    d = m.add_instruction(make_op("dot"), [x, w])
    to_float = m.add_instruction(make_op("convert", target_type=param_type), [d])
    big = m.add_instruction(make_op("multibroadcast", out_lens=[2, 4]), [lowest])
    masked = m.add_instruction(make_op("where"), [keep, to_float, big])
    sm = m.add_instruction(make_op("softmax", axis=1), [masked])
    m.add_return([sm])
    return p


@pytest.mark.parametrize("param_type", ["float_type", "double_type"])
def test_mid_graph_convert_and_mask(param_type: str) -> None:
    feeds = {
        "x": RNG.standard_normal((2, 4)).astype(Shape(param_type).dtype()),
        "keep": np.array([[1, 1, 0, 1], [0, 1, 1, 0]], bool),
    }
    want = run(_ir_program(param_type), feeds)[0]
    prog = _ir_program(param_type)
    quantize_fp16(prog)
    text = str(prog)
    print(text)
    # the mid-graph convert to float became a no-op and went; float only at the boundaries
    assert text.count("convert[") == 2
    assert f"convert[target_type={param_type}]" in text.splitlines()[-2]
    # finfo(float32).min saturates to the lowest half, not -inf
    assert "@literal{-65504} -> half_type, {}, {}" in text
    assert f"x = @param:x -> {param_type}" in text
    got = run(prog, feeds)[0]
    assert got.dtype == want.dtype
    assert np.isfinite(got).all()
    assert rel_rms(got, want) < 1e-2


def test_integer_work_untouched() -> None:
    """Shape/index math stays int64; a Cast of a mask to float becomes a cast to half."""
    nodes = [
        helper.make_node("Add", ["ids", "one"], ["ids1"]),
        helper.make_node("Gather", ["emb", "ids1"], ["e"], axis=0),
        helper.make_node("Cast", ["mask"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["onef", "mf"], ["inv"]),
        helper.make_node("Mul", ["inv", "lowest"], ["bias"]),
        helper.make_node("Unsqueeze", ["bias", "axis1"], ["bias2"]),
        helper.make_node("Add", ["e", "bias2"], ["s"]),
        helper.make_node("Softmax", ["s"], ["y"], axis=-1),
    ]
    inputs = {
        "ids": np.array([0, 2, 4], np.int64),
        "mask": np.array([1, 1, 0], np.int64),
    }
    inits = {
        "one": np.array(1, np.int64),
        "emb": RNG.standard_normal((6, 3)).astype(np.float32),
        "onef": np.array(1, np.float32),
        "lowest": np.array(np.finfo(np.float32).min, np.float32),
        "axis1": np.array([0], np.int64),
    }
    model = make_model(nodes, inputs, ["y"], inits)
    want = run(parse(model), feeds := dict(inputs))[0]
    before = parse(model)
    prog = parse(model)
    quantize_fp16(prog)
    print(prog)
    int_before = [str(i.op) for i in before.get_main_module() if i.shape.type() == "int64_type"]
    int_after = [str(i.op) for i in prog.get_main_module() if i.shape.type() == "int64_type"]
    assert int_after == int_before
    assert "convert[target_type=half_type](mask)" in str(prog)
    check_boundaries(prog)
    got = run(prog, feeds)[0]
    assert np.isfinite(got).all()
    assert rel_rms(got, want) < 1e-2


def test_optimized_program_with_fused_bodies() -> None:
    model, feeds = _mlp()
    want = run(parse(model), feeds)
    prog = optimize(parse(model))
    bodies = [m for name, m in prog.modules.items() if name != "main"]
    assert bodies, "expected fused sub-modules"
    quantize_fp16(prog)
    print(prog)
    for body in bodies:
        assert all(p.shape.type() != "float_type" for p in body.get_parameters()), body
        assert all(i.shape.type() != "float_type" for i in body if not i.is_return()), body
    check_boundaries(prog)
    got = run(prog, feeds)
    assert rel_rms(got[0], want[0]) < 1e-2
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("optimized", [False, True])
def test_ins_names_selects_operators(optimized: bool) -> None:
    model, feeds = _mlp()
    want = run(parse(model), feeds)
    prog = optimize(parse(model)) if optimized else parse(model)
    quantize_fp16(prog, ins_names=["dot"])
    text = str(prog)
    print(text)
    half = [ln for ln in lines(prog) if "-> half_type" in ln]
    assert any(re.search(r"= dot\(", ln) for ln in half)
    assert all(re.search(r"= (dot|convert\[|@literal)", ln) for ln in half), half
    assert re.search(r"softmax\[axis=1\]\(\S+\) -> float_type", text)
    got = run(prog, feeds)
    assert rel_rms(got[0], want[0]) < 1e-2


def test_module_without_return() -> None:
    """The last instruction is the output: it is converted back to its type."""
    prog = Program()
    m = prog.get_main_module()
    m.add_instruction(make_op("exp"), [m.add_parameter("x", Shape("float_type", [2, 3]))])
    quantize_fp16(prog)
    assert [str(i.op) for i in m] == [
        "@param[parameter=x,shape=float_type, {2, 3}, {3, 1}]",
        "convert[target_type=half_type]",
        "exp",
        "convert[target_type=float_type]",
    ]
    got = run(prog, {"x": np.ones((2, 3), np.float32)})[0]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.e, rtol=1e-3)


def _convnet():
    """Conv -> BatchNorm -> Relu -> AveragePool -> Flatten -> Gemm (no download)."""
    nodes = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "bb", "mu", "var"], ["n"]),
        helper.make_node("Relu", ["n"], ["r"]),
        helper.make_node("AveragePool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "gw", "gb"], ["y"], transB=1),
    ]
    inputs = {"x": RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)}
    inits = {
        "cw": (RNG.standard_normal((8, 3, 3, 3)) / 5).astype(np.float32),
        "cb": RNG.standard_normal(8).astype(np.float32),
        "s": RNG.uniform(0.5, 1.5, 8).astype(np.float32),
        "bb": RNG.standard_normal(8).astype(np.float32),
        "mu": RNG.standard_normal(8).astype(np.float32),
        "var": RNG.uniform(0.5, 1.5, 8).astype(np.float32),
        "gw": (RNG.standard_normal((10, 128)) / 11).astype(np.float32),
        "gb": RNG.standard_normal(10).astype(np.float32),
    }
    return make_model(nodes, inputs, ["y"], inits), inputs


@pytest.mark.parametrize("low, tol", [("half_type", 1e-2), ("bf16_type", 5e-2)])
def test_small_convnet(low: str, tol: float) -> None:
    model, feeds = _convnet()
    want = run(parse(model), feeds)[0]
    prog = parse(model)
    QUANTIZE[low](prog)
    check_boundaries(prog, low)
    assert re.search(rf"= convolution\[padding=\{{1, 1, 1, 1\}}.* -> {low}", str(prog))
    assert sum(1 for i in prog.get_main_module() if i.shape.type() == low) > 5
    got = run(prog, feeds)[0]
    err = rel_rms(got, want)
    print(f"small convnet {low}: relative RMS error {err:.3e}")
    assert got.dtype == np.float32
    assert err < tol


def test_round_trip_save_load(tmp_path: Path) -> None:
    model, feeds = _mlp()
    prog = parse(model)
    quantize_bf16(prog)
    path = tmp_path / "mlp_bf16.pgx"
    pygraphx.save(prog, path)
    loaded = pygraphx.load(path)
    assert str(loaded) == str(prog)
    assert "bf16_type" in str(loaded)
    for a, b in zip(run(loaded, feeds), run(prog, feeds), strict=True):
        np.testing.assert_array_equal(a, b)


def test_compiled_program_is_refused(tmp_path: Path) -> None:
    model, _ = _mlp()
    prog = parse(model)
    prog.compile(pygraphx.get_target("ref"))
    with pytest.raises(QuantizeError, match=r"already compiled.*before prog\.compile"):
        quantize_fp16(prog)
    path = tmp_path / "compiled.pgx"
    pygraphx.save(prog, path)
    with pytest.raises(QuantizeError, match="already compiled"):
        quantize_bf16(pygraphx.load(path))


def test_bad_arguments() -> None:
    model, _ = _mlp()
    with pytest.raises(QuantizeError, match="cannot truncate floats to 'int8_type'"):
        truncate_float(parse(model), "int8_type")
    with pytest.raises(QuantizeError, match="ins_names"):
        quantize_fp16(parse(model), ins_names=[])
    with pytest.raises(QuantizeError, match="Program"):
        quantize_fp16(model)  # type: ignore[arg-type]


# --- built-in models ------------------------------------------------------------------------
def _compare(name: str, low: str, tol: float, mask_tail: int = 0) -> None:
    model = get_model(name, seq_len=128)
    feeds = model_inputs(name, model)
    if mask_tail and "attention_mask" in feeds:
        feeds["attention_mask"][:, -mask_tail:] = 0  # padding: masked positions in softmax
    start = time.perf_counter()
    want = run(parse(model), feeds)
    t32 = time.perf_counter() - start
    prog = parse(model)
    start = time.perf_counter()
    QUANTIZE[low](prog)
    tq = time.perf_counter() - start
    check_boundaries(prog, low)
    start = time.perf_counter()
    got = run(prog, feeds)
    tlow = time.perf_counter() - start
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert np.isfinite(g).all(), f"{name} {low} output {k} is not finite"
        err = rel_rms(g, w)
        print(
            f"{name} {low} output {k} {list(g.shape)}: relative RMS error {err:.3e} "
            f"(fp32 parse+run {t32:.1f}s, quantize {tq:.2f}s, {low} run {tlow:.1f}s)"
        )
        assert err < tol, f"{name} {low} output {k}: relative RMS error {err:.3e} >= {tol}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "bert_base"])
def test_builtin_model_fp16(name: str) -> None:
    _compare(name, "half_type", 1e-2)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert_base", "gpt2"])
def test_attention_mask_padding_fp16(name: str) -> None:
    """finfo(float32).min masks stay finite in half: softmax over padded positions works."""
    _compare(name, "half_type", 1e-2, mask_tail=28)


@pytest.mark.slow
def test_resnet50_bf16() -> None:
    _compare("resnet50", "bf16_type", 5e-2)
