"""bf16 on the `cpu` target (`quantize_bf16`, the driver's `--bf16`): the results against
ONNX Runtime at float32 within bf16's tolerance, and, on a processor with bf16 instructions,
the heavy steps (GEMMs, convolutions, layer normalisation) running natively in bf16 with their
weights packed once in bf16, so that no run converts a weight."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import helper

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import onednn_conv, onednn_linear  # noqa: E402
from tests.helpers import make_model  # noqa: E402

RNG = np.random.default_rng(23)
#: relative RMS error a bf16 network may show against float32 (compare.py's bf16 tolerance)
BF16_RMS = 3e-2

native = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="this processor has no bf16 instructions (oneDNN runs bf16 by conversion)",
)


def _w(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale / np.sqrt(shape[-2 if len(shape) > 1 else 0]))\
        .astype(np.float32)  # fmt: skip


def encoder_model() -> tuple:
    """A transformer encoder layer's heavy parts: MatMul + bias + GELU, a second MatMul with a
    residual add, LayerNormalization, and a MatMul of two activations (scores)."""
    x = RNG.standard_normal((1, 16, 64)).astype(np.float32)
    inits = {
        "w1": _w(64, 128), "b1": _w(128) * 0.1, "w2": _w(128, 64), "b2": _w(64) * 0.1,
        "g": (1 + 0.1 * RNG.standard_normal(64)).astype(np.float32),
        "beta": (0.1 * RNG.standard_normal(64)).astype(np.float32),
    }  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Gelu", ["hb"], ["a"]),
        helper.make_node("MatMul", ["a", "w2"], ["o"]),
        helper.make_node("Add", ["o", "b2"], ["ob"]),
        helper.make_node("Add", ["ob", "x"], ["r"]),
        helper.make_node("LayerNormalization", ["r", "g", "beta"], ["y"], axis=-1, epsilon=1e-5),
        helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["y", "yt"], ["s"]),
    ]
    return make_model(nodes, {"x": x}, ["y", "s"], inits, opset=20), {"x": x}


def cnn_model() -> tuple:
    """Conv + bias + ReLU, a second Conv whose output adds a residual before a ReLU, a 1x1
    Conv with Clip(0, 6) (ReLU6), global pooling and a Gemm classifier."""
    x = RNG.standard_normal((1, 8, 12, 12)).astype(np.float32)
    inits = {
        "w1": (RNG.standard_normal((8, 8, 3, 3)) / 8.5).astype(np.float32),
        "b1": (0.1 * RNG.standard_normal(8)).astype(np.float32),
        "w2": (RNG.standard_normal((8, 8, 3, 3)) / 8.5).astype(np.float32),
        "w3": (RNG.standard_normal((16, 8, 1, 1)) / 2.8).astype(np.float32),
        "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32),
        "fw": _w(16, 10), "fb": (0.1 * RNG.standard_normal(10)).astype(np.float32),
    }  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "x"], ["s2"]),
        helper.make_node("Relu", ["s2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3"], ["c3"]),
        helper.make_node("Clip", ["c3", "lo", "hi"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"]),
    ]
    return make_model(nodes, {"x": x}, ["y", "r3"], inits), {"x": x}


MODELS = {"encoder": encoder_model, "cnn": cnn_model}


def compile_bf16(model, ins_names: tuple[str, ...] = ("products",)) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_bf16(prog, ins_names)
    prog.compile(CpuTarget(threads=1))
    return prog


def relative_rms(got: np.ndarray, want: np.ndarray) -> float:
    diff = np.asarray(got, np.float64) - np.asarray(want, np.float64)
    return float(np.sqrt(np.mean(diff**2)) / np.sqrt(np.mean(np.square(want, dtype=np.float64))))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_bf16_on_cpu_matches_ort_float32_within_bf16_error(name: str) -> None:
    """Outputs keep float32 (converts at the edges) and stay within bf16's error of ONNX
    Runtime's float32 results; a bf16 error well above bf16's rounding would fail."""
    model, feeds = MODELS[name]()
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    got = compile_bf16(model).run(feeds)
    for g, w in zip(got, want, strict=True):
        assert np.asarray(g).dtype == np.float32 and np.asarray(g).shape == w.shape
        err = relative_rms(g, w)
        assert err < BF16_RMS, err
        assert err > 1e-5, "the bf16 program computed in float32"


@native
@pytest.mark.parametrize("name", sorted(MODELS))
def test_bf16_weights_are_packed_once_in_bf16(name: str) -> None:
    """Every weight oneDNN packed at prepare is bf16 (GEMMs and convolutions), and in the
    all-bf16 program the only conversions left in the run are those of the inputs and outputs
    (no weight converted per run, no GEMM through float32)."""
    model, _ = MODELS[name]()
    prog = compile_bf16(model, ("all",))
    ctx = prog._executable.lowered.ctx
    packed = {key[0]: value for key, value in ctx.packed_weights.items()}
    assert packed, "no weight was packed for oneDNN"
    assert {k for k in packed} <= {"dnnl_weight", "mkldnn_weight", "onednn_linear"}
    # (a matmul primitive's `Linear` packs its weight in the type it was given)
    assert all(t.dtype == torch.bfloat16 for t in packed.values())
    # convolutions on the `dnnl` kernel (oneDNN's C API library) pack their own weights in
    # their primitives (bf16: tests/targets/test_dnnl2_bf16.py), not in this cache; GEMMs run
    # oneDNN's matmul primitive through it too (`gemm_kernels.dnnl_kernel`)
    conv_kind = set() if onednn_conv.available() else {"mkldnn_weight"}
    gemm_kind = {"onednn_linear"} if onednn_linear.available() else {"dnnl_weight"}
    want_kinds = {"encoder": gemm_kind, "cnn": gemm_kind | conv_kind}[name]
    assert set(packed) == want_kinds
    converts = [ins for step in ctx.steps for ins in step.instructions if "convert" in _ops(ins)]
    # the float32 input, and each float32 output
    assert len(converts) == 1 + len(model.graph.output), [c.op.name for c in converts]


@native
def test_bf16_layernorm_is_one_step() -> None:
    model, _ = encoder_model()
    assert compile_bf16(model)._executable.layernorm_blocks == 1


def _ops(ins) -> set[str]:
    """The operator names an instruction computes (a fused group's body ops too)."""
    names = {ins.op.name}
    for body in ins.module_inputs:
        names |= {i.op.name for i in body.instructions}
    return names


@pytest.mark.parametrize("name", sorted(MODELS))
def test_without_bf16_instructions_compile_warns_once_and_stays_correct(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a processor oneDNN cannot run bf16 on, compiling warns once, the products run by
    conversion (nothing packed in bf16), and the results are still right."""
    from pygraphx.targets.torch_lowering import gemm_kernels

    monkeypatch.setattr(gemm_kernels, "cpu_has_bf16", lambda: False)
    model, feeds = MODELS[name]()
    with pytest.warns(RuntimeWarning, match="no bf16 instructions") as record:
        prog = compile_bf16(model)
    assert sum("no bf16 instructions" in str(w.message) for w in record) == 1
    ctx = prog._executable.lowered.ctx
    assert not any(t.dtype == torch.bfloat16 for t in ctx.packed_weights.values())
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for g, w in zip(prog.run(feeds), want, strict=True):
        assert relative_rms(g, w) < BF16_RMS


def test_float32_programs_do_not_warn(monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    from pygraphx.targets.torch_lowering import gemm_kernels

    monkeypatch.setattr(gemm_kernels, "cpu_has_bf16", lambda: False)
    model, _ = encoder_model()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        prog.compile(CpuTarget(threads=1))
    assert not [w for w in record if "bf16" in str(w.message)]


def test_driver_verify_bf16_reports_error_against_float32(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`verify --cpu --bf16`: the bf16 program on cpu against the float32 reference, each
    output's relative RMS error printed and judged with bf16's tolerance."""
    import onnx

    from pygraphx.driver.main import main

    model, _ = encoder_model()
    path = tmp_path / "encoder.onnx"
    onnx.save(model, str(path))
    rc = main(["verify", "--onnx", str(path), "--cpu", "--bf16"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "Target: cpu (bf16)" in out and "Precision: bf16_type" in out
    errors = [float(e) for e in re.findall(r"rms error: ([0-9.e+-]+) \(relative\)", out)]
    assert len(errors) == 2 and all(1e-5 < e < BF16_RMS for e in errors), out


@native
def test_bf16_products_only_keep_the_rest_in_float32(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--precision-ops dot` (ins_names=("dot",)): the GEMMs run in bf16 with packed bf16
    weights, the layer norm stays one float32 step, and the error stays within bf16's."""
    import onnx

    from pygraphx.driver.main import main

    model, feeds = encoder_model()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_bf16(prog, ("dot",))
    prog.compile(CpuTarget(threads=1))
    packed = prog._executable.lowered.ctx.packed_weights.values()
    assert packed and all(t.dtype == torch.bfloat16 for t in packed)
    assert prog._executable.layernorm_blocks == 1
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for g, w in zip(prog.run(feeds), want, strict=True):
        assert 1e-5 < relative_rms(g, w) < BF16_RMS
    path = tmp_path / "encoder.onnx"
    onnx.save(model, str(path))
    assert main(["verify", "--onnx", str(path), "--cpu", "--bf16", "--precision-ops", "dot"]) == 0
    assert main(["verify", "--onnx", str(path), "--cpu", "--precision-ops", "dot"]) != 0
    assert "--precision-ops applies to --fp16 or --bf16" in capsys.readouterr().err


@native
def test_bf16_product_into_a_float32_sum_is_one_step() -> None:
    """`quantize_bf16`'s default keeps the residual sum in float32: the bf16 GEMM (its bias
    inside, rounded once) and the float32 group that adds it to the residual run as one step,
    and the result stays within bf16's error of ORT's float32."""
    model, feeds = encoder_model()
    prog = compile_bf16(model)
    steps = prog._executable.lowered.ctx.steps
    widening = [
        step
        for step in steps
        if [i.op.name for i in step.instructions] == ["dot", "pointwise"]
        and step.instructions[0].shape.type() == "bf16_type"
        and step.instructions[1].shape.type() == "float_type"
    ]
    # the residual sum (the scores' product, a small output head, stays float32)
    lens = [tuple(step.instructions[1].shape.lens()) for step in widening]
    assert lens == [(1, 16, 64)], [[i.op.name for i in s.instructions] for s in steps]
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for g, w in zip(prog.run(feeds), want, strict=True):
        assert 1e-5 < relative_rms(g, w) < BF16_RMS


def prenorm_model() -> tuple:
    """A pre-norm block (GPT-2's): LayerNormalization feeding only a MatMul, whose result is
    added to the block's input; then an output MatMul."""
    x = RNG.standard_normal((1, 16, 64)).astype(np.float32)
    inits = {
        "g": (1 + 0.1 * RNG.standard_normal(64)).astype(np.float32),
        "beta": (0.1 * RNG.standard_normal(64)).astype(np.float32),
        "w": _w(64, 64), "b": _w(64) * 0.1, "w2": _w(64, 64),
    }  # fmt: skip
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "beta"], ["n"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["n", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["hb"]),
        helper.make_node("Add", ["hb", "x"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),  # (a small head: float32)
    ]
    return make_model(nodes, {"x": x}, ["y"], inits, opset=20), {"x": x}


@native
def test_bf16_float32_layernorm_rounded_for_its_product_is_one_step() -> None:
    """With the default policy a pre-norm block's layer norm stays float32 and only its output
    is rounded to bf16 for the product: still one normalisation step, within bf16's error."""
    model, feeds = prenorm_model()
    prog = compile_bf16(model)
    assert prog._executable.layernorm_blocks == 1
    (want,) = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    (got,) = prog.run(feeds)
    assert 1e-5 < relative_rms(got, want) < BF16_RMS


@native
def test_bf16_bert_layers_fuse_their_roundings() -> None:
    """BERT (post-norm) with the default policy: each layer norm is one step that also makes
    the bf16 copy its products read, each attention block one step whose float32 softmax's
    rounding is inside it, so no step is a lone convert; within bf16's error of ORT."""
    from pygraphx.models.bert import BertConfig, build_bert

    config = BertConfig(hidden=64, layers=2, heads=2, intermediate=128, vocab_size=100)
    model = build_bert(batch=1, seq_len=16, seed=5, config=config)
    ids = np.random.default_rng(6).integers(0, 100, (1, 16)).astype(np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": ids * 0}
    prog = compile_bf16(model)
    exe = prog._executable
    assert exe.layernorm_blocks == 2 * config.layers + 1
    assert exe.attention_blocks == config.layers
    lone = [s for s in exe.lowered.ctx.steps if [_ops(i) for i in s.instructions] == [
        {"pointwise", "convert"}]]  # fmt: skip
    assert not lone, len(lone)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for g, w in zip(prog.run(feeds), want, strict=True):
        assert 1e-5 < relative_rms(g, w) < BF16_RMS


@native
def test_bf16_large_product_converted_to_float32_runs_in_column_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A large bf16 product whose only user converts it to float32 (an output: a language
    model's logits) runs in column blocks, each with its own packed bf16 weight, written into
    the float32 result; the last block is narrower. The thresholds are lowered so that a small
    product takes the path."""
    from pygraphx.targets.torch_lowering import lower_gemm

    monkeypatch.setattr(lower_gemm, "WIDEN_MIN", 1)
    monkeypatch.setattr(lower_gemm, "WIDEN_BLOCK", 48)
    x = RNG.standard_normal((1, 700, 16)).astype(np.float32)  # 70000 values: no small head
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": x}, ["y"],
                       {"w": _w(16, 100)})  # fmt: skip
    prog = compile_bf16(model)
    ctx = prog._executable.lowered.ctx
    starts = sorted(key[3] for key in ctx.packed_weights if len(key) == 4)
    assert starts == [0, 48, 96] and len(ctx.packed_weights) == 3  # not the whole weight too
    assert all(t.dtype == torch.bfloat16 for t in ctx.packed_weights.values())
    (want,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    (got,) = prog.run({"x": x})
    assert np.asarray(got).dtype == np.float32
    assert 1e-5 < relative_rms(got, want) < BF16_RMS
