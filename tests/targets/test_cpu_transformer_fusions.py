"""The cpu target's transformer fusions: attention blocks as one
`scaled_dot_product_attention` step, layer normalisation as one `F.layer_norm` step, GEMMs
through oneDNN with their bias and activation inside; checked against numpy / torch on small
models and against ONNX Runtime on exported BERT-base and GPT-2 (real architectures, random
weights)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from tests.helpers import make_model  # noqa: E402
from tests.targets.gpu.test_gpu_target import attention_model  # noqa: E402

RNG = np.random.default_rng(11)

ExportedModel = Callable[[str], tuple[Path, dict[str, np.ndarray]]]


def compile_cpu(model, **settings) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(**settings))
    return prog


def check_fused_and_not(model, feeds, want, setting: str) -> None:
    """One block fused by default, none with `setting=False`; both match `want`."""
    counter = f"{setting}_blocks"
    for on in (True, False):
        prog = compile_cpu(model, **({} if on else {setting: False}))
        assert getattr(prog._executable, counter) == int(on)
        got = np.array(prog.run(feeds)[0])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{setting}={on}")


@pytest.mark.parametrize("kind", ["mask", "causal"])
def test_attention_runs_fused_and_exact(kind: str) -> None:
    check_fused_and_not(*attention_model(kind), "attention")


def test_other_prologues_are_not_attention() -> None:
    model, feeds, want = attention_model("exp")
    prog = compile_cpu(model)
    assert prog._executable.attention_blocks == 0
    np.testing.assert_allclose(np.array(prog.run(feeds)[0]), want, rtol=1e-4, atol=1e-5)


def test_fused_attention_profiles_every_instruction() -> None:
    """A profiled run (observer) still reports the three instructions of the block."""
    model, feeds, want = attention_model("mask")
    prog = compile_cpu(model)
    seen: list[str] = []
    got = prog.run(feeds, observer=lambda ins, value, seconds: seen.append(ins.op.name))
    np.testing.assert_allclose(np.array(got[0]), want, rtol=1e-5, atol=1e-5)
    assert seen.count("dot") == 2 and "fused_reduce" in seen


def layernorm_model(affine: bool, residual: bool):
    """LayerNormalization (opset 17) over the last axis, with or without scale and bias,
    after a residual add or straight on the input; the model, its feeds and float64 result."""
    x = RNG.standard_normal((2, 7, 32)).astype(np.float32) * 3 + 1
    r = RNG.standard_normal((2, 7, 32)).astype(np.float32)
    w = RNG.standard_normal(32).astype(np.float32)
    b = RNG.standard_normal(32).astype(np.float32)
    inits = {"w": w, "b": b} if affine else {"w": np.ones(32, np.float32)}
    src = "x"
    nodes = []
    if residual:
        nodes.append(helper.make_node("Add", ["x", "r"], ["xr"]))
        src = "xr"
    ins = [src, "w", "b"] if affine else [src, "w"]
    nodes.append(helper.make_node("LayerNormalization", ins, ["y"], axis=-1, epsilon=1e-6))
    feeds = {"x": x, "r": r} if residual else {"x": x}
    model = make_model(nodes, feeds, ["y"], inits)
    z = (x + r if residual else x).astype(np.float64)
    mu = z.mean(-1, keepdims=True)
    want = (z - mu) / np.sqrt(((z - mu) ** 2).mean(-1, keepdims=True) + 1e-6)
    return model, feeds, want * w + b if affine else want


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("residual", [True, False], ids=["residual", "input"])
def test_layernorm_runs_as_one_step(affine: bool, residual: bool) -> None:
    check_fused_and_not(*layernorm_model(affine, residual), "layernorm")


def test_layernorm_with_an_outside_use_is_not_fused() -> None:
    """An exporter's chain (ReduceMean, Sub, Pow 2, ReduceMean, Add, Sqrt, Div) is fused; with
    the deviation x - mean also an output, the pattern must not swallow it."""
    x = RNG.standard_normal((3, 16)).astype(np.float32)
    chain = [("ReduceMean", ["x"], "m"), ("Sub", ["x", "m"], "d"), ("Pow", ["d", "two"], "d2"),
             ("ReduceMean", ["d2"], "v"), ("Add", ["v", "eps"], "ve"), ("Sqrt", ["ve"], "s"),
             ("Div", ["d", "s"], "y")]  # fmt: skip
    nodes = [
        helper.make_node(op, ins, [out], **({"axes": [-1]} if op == "ReduceMean" else {}))
        for op, ins, out in chain
    ]
    consts = {"eps": np.array(1e-5, np.float32), "two": np.array(2.0, np.float32)}
    model = make_model(nodes, {"x": x}, ["y", "d"], consts)
    chain = make_model(nodes, {"x": x}, ["y"], consts)
    d = x - x.mean(-1, keepdims=True)
    want = d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)
    assert compile_cpu(chain)._executable.layernorm_blocks == 1
    prog = compile_cpu(model)
    assert prog._executable.layernorm_blocks == 0
    y, dev = prog.run({"x": x})
    np.testing.assert_allclose(np.array(y), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.array(dev), d, rtol=1e-5, atol=1e-6)


def _erf_gelu(a: np.ndarray) -> np.ndarray:
    return 0.5 * a * (1 + np.vectorize(math.erf)(a / np.sqrt(2)))


@pytest.mark.parametrize("act", ["Gelu", "Relu", "Sigmoid", None])
def test_gemm_with_bias_and_activation_matches_numpy(act: str | None) -> None:
    """MatMul + Add (+ activation): bias and GELU inside oneDNN's GEMM, others after it; and
    the MKL path (`mkldnn=False`) gives the same numbers."""
    x = RNG.standard_normal((2, 5, 48)).astype(np.float32)
    w = RNG.standard_normal((48, 40)).astype(np.float32)
    b = RNG.standard_normal(40).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
    ]
    nodes.append(helper.make_node(act or "Identity", ["a"], ["y"]))
    model = make_model(nodes, {"x": x}, ["y"], {"w": w, "b": b}, opset=20)
    a = x.astype(np.float64) @ w + b
    funcs = {"Gelu": _erf_gelu, "Relu": lambda v: np.maximum(v, 0),
             "Sigmoid": lambda v: 1 / (1 + np.exp(-v)), None: lambda v: v}  # fmt: skip
    want = funcs[act](a)
    for settings in ({}, {"mkldnn": False}):
        got = np.array(compile_cpu(model, **settings).run({"x": x})[0])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(settings))


def _ort(path: Path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert_base", "gpt2"])
def test_exported_transformers_match_ort(name: str, exported_model: ExportedModel) -> None:
    """Every attention block of the export is fused, and the outputs match ONNX Runtime."""
    path, inputs = exported_model(name)
    want = _ort(path, inputs)
    prog = pygraphx.parse_onnx(str(path))
    prog.compile(CpuTarget(threads=2))
    assert prog._executable.attention_blocks == 12
    assert prog._executable.layernorm_blocks == 25  # 12 layers x 2 + embeddings or final
    got = prog.run({k: v.copy() for k, v in inputs.items()})
    for ours, theirs in zip(got, want, strict=True):
        assert np.std(theirs) > 1e-3
        np.testing.assert_allclose(np.array(ours), theirs, rtol=1e-4, atol=2e-5)


def test_perf_reports_fused_steps_as_they_run() -> None:
    """`perf --cpu` lists the attention block as one step of the fast path, and its overhead
    line is never negative."""
    from pygraphx.driver.perf import perf_report

    model, feeds, _ = attention_model("mask")
    report = perf_report(compile_cpu(model), feeds, 3)
    kinds = {kind: count for kind, _, count in report.step_summary()}
    assert kinds.get("dot+fused_reduce+dot") == 1
    assert report.overhead_ms >= 0
    text = "\n".join(report.lines())
    assert "Steps as they run (cpu):" in text and "dot+fused_reduce+dot: " in text
    assert report.to_json()["steps"]


def _linear_model(rows: int, k: int, n: int) -> tuple:
    x = RNG.standard_normal((rows, k)).astype(np.float32)
    w = RNG.standard_normal((k, n)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["y"]),
    ]
    model = make_model(nodes, {"x": x}, ["y"], {"w": w, "b": b})
    return model, x, x.astype(np.float64) @ w + b


@pytest.mark.parametrize("kernel", ["dnnl", "mkl", "addmm"])
def test_every_gemm_kernel_matches_numpy(kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`PGX_CPU_GEMM` forces each candidate kernel of a constant-weight product with a bias;
    each runs (it is the one recorded) and matches numpy's float64 product."""
    from pygraphx.targets.torch_lowering.gemm_kernels import GEMM_KERNELS
    from pygraphx.targets.torch_lowering.gemm_select import KERNEL_ENV

    monkeypatch.setenv(KERNEL_ENV, kernel)
    model, x, want = _linear_model(24, 40, 56)
    prog = compile_cpu(model, threads=1)
    assert set(prog._executable.lowered.ctx.cache[GEMM_KERNELS].values()) == {kernel}
    got = np.array(prog.run({"x": x})[0])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_gemm_kernel_measured_on_request_once_and_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `PGX_CPU_GEMM=measure` the kernel is the fastest measured one and a second compile
    of the same shape reuses the choice without measuring; by default nothing is measured and
    oneDNN runs; an unknown `PGX_CPU_GEMM` is an error."""
    from pygraphx.targets.torch_lowering import gemm_select
    from pygraphx.targets.torch_lowering.gemm_kernels import GEMM_KERNELS

    monkeypatch.setenv(gemm_select.KERNEL_ENV, "measure")
    gemm_select.clear_cache()
    measured: list[dict[str, float]] = []
    real = gemm_select.measure

    def spy(kernels, x):  # noqa: ANN001, ANN202
        measured.append(real(kernels, x))
        return measured[-1]

    monkeypatch.setattr(gemm_select, "measure", spy)
    model, x, want = _linear_model(32, 48, 64)
    prog = compile_cpu(model, threads=1)
    assert len(measured) == 1 and set(measured[0]) == {"dnnl", "mkl", "addmm"}
    times = measured[0]
    (chosen,) = prog._executable.lowered.ctx.cache[GEMM_KERNELS].values()
    assert times[chosen] == min(times.values())
    np.testing.assert_allclose(np.array(prog.run({"x": x})[0]), want, rtol=1e-4, atol=1e-4)
    compile_cpu(model, threads=1)
    assert len(measured) == 1
    gemm_select.clear_cache()
    monkeypatch.delenv(gemm_select.KERNEL_ENV)
    prog = compile_cpu(model, threads=1)
    assert len(measured) == 1
    assert list(prog._executable.lowered.ctx.cache[GEMM_KERNELS].values()) == ["dnnl"]
    monkeypatch.setenv(gemm_select.KERNEL_ENV, "blas")
    with pytest.raises(ValueError, match="PGX_CPU_GEMM='blas'"):
        compile_cpu(model, threads=1)
