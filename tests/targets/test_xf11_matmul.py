"""Transformer GEMMs on oneDNN's matmul primitive through its C API (`gemm_kernels.dnnl_kernel`,
`onednn_linear.Linear` with an activation post-op), against torch / numpy float64 and ONNX
Runtime; `PGX_CPU_DNNL_GEMM=torch` keeps torch's oneDNN linear."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import gemm_kernels, native_gelu, onednn_linear  # noqa: E402
from pygraphx.targets.torch_lowering.onednn_capi import OneDnnError  # noqa: E402
from tests.helpers import make_model  # noqa: E402

pytestmark = pytest.mark.skipif(
    not onednn_linear.available(), reason="needs oneDNN's C API library (onednn-cpu-gomp)"
)
RNG = np.random.default_rng(1111)
ACTS = {
    "gelu": lambda t: torch.nn.functional.gelu(t),
    "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
    "silu": torch.nn.functional.silu,
}


def dtypes() -> list[torch.dtype]:
    return [torch.float32] + ([torch.bfloat16] if gemm_kernels.cpu_has_bf16() else [])


@pytest.mark.parametrize("dtype", dtypes())
@pytest.mark.parametrize("epilogue", [None, *ACTS])
def test_linear_epilogue_against_torch(dtype: torch.dtype, epilogue: str | None) -> None:
    """The activation is applied inside the product, before its one rounding to `dtype`."""
    torch.manual_seed(3)
    w, b, x = torch.randn(96, 80) / 10, torch.randn(80), torch.randn(16, 96)
    lin = onednn_linear.Linear(w.to(dtype), b.to(dtype), 16, epilogue=epilogue)
    got = lin(x.to(dtype))
    ref = x.to(dtype).double() @ w.to(dtype).double() + b.to(dtype).double()
    if epilogue is not None:
        ref = ACTS[epilogue](ref)
    tol = 1e-4 if dtype == torch.float32 else 1e-2
    assert got.dtype == dtype and got.shape == (16, 80)
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol)


def test_linear_second_thread_count_from_the_packed_weight(monkeypatch) -> None:
    """The plain weight is dropped once packed; a primitive for another thread count is made
    from the packed one and computes the same product."""
    w, x = torch.randn(64, 48), torch.randn(8, 64)
    lin = onednn_linear.Linear(w, None, 8, now=False)
    assert lin.weight is not None and not lin.made
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    one = lin(x)
    assert lin.weight is None
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    two = lin(x)
    assert set(lin.made) == {1, 2}
    torch.testing.assert_close(one, x @ w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(two, one, rtol=1e-6, atol=1e-6)


def test_linear_unknown_epilogue() -> None:
    with pytest.raises(OneDnnError, match="epilogue 'relu6'"):
        onednn_linear.Linear(torch.randn(4, 4), None, 2, epilogue="relu6")


def block_model() -> tuple:
    """MatMul + Add + Gelu (the FFN's first product) then a Q / K / V-like product cut into
    three column parts of 256 by Split (`lower_gemm._column_parts`: one product each), each
    then squared."""
    x = RNG.standard_normal((1, 16, 64)).astype(np.float32)
    inits = {
        "w1": (RNG.standard_normal((64, 64)) / 8).astype(np.float32),
        "b1": RNG.standard_normal(64).astype(np.float32),
        "w2": (RNG.standard_normal((64, 3 * 256)) / 8).astype(np.float32),
        "b2": RNG.standard_normal(3 * 256).astype(np.float32),
        "split": np.array([256, 256, 256], np.int64),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["a1"]),
        helper.make_node("Gelu", ["a1"], ["g"]),
        helper.make_node("MatMul", ["g", "w2"], ["m2"]),
        helper.make_node("Add", ["m2", "b2"], ["a2"]),
        helper.make_node("Split", ["a2", "split"], ["q", "k", "v"], axis=-1),
        *[helper.make_node("Mul", [p, p], [f"y{p}"]) for p in "qkv"],
    ]
    model = make_model(nodes, {"x": x}, ["yq", "yk", "yv"], inits, opset=20)
    return model, x


@pytest.mark.parametrize("setting", ["matmul", "torch"])
def test_model_against_ort(monkeypatch, setting: str) -> None:
    """Both settings match ONNX Runtime; `matmul` packs every product in a `Linear` (the GELU
    inside it: the erf GELU's native pass, gelu16's, is switched off here), `torch` in torch's
    oneDNN weights."""
    monkeypatch.setenv(gemm_kernels.DNNL_GEMM_ENV, setting)
    monkeypatch.setenv(native_gelu.ERF_ENV, "0")
    model, x = block_model()
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=1))
    for got, w in zip(prog.run({"x": x}), want, strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-4)
    packed = prog._executable.lowered.ctx.packed_weights
    kinds = {key[0] for key in packed}
    if setting == "torch":
        assert kinds == {"dnnl_weight"}
        return
    assert kinds == {"onednn_linear"}
    assert "gelu" in {v.epilogue for v in packed.values()}
    assert all(v.weight is None for v in packed.values())  # no plain copy kept
    n = torch.get_num_threads()
    buffers = {v.primitive().weight.data_ptr() for v in packed.values()}
    assert len(buffers) == 2 and all(n in v.made for v in packed.values())  # 2 weights
    assert sorted(v.parts for v in packed.values())[-1] == 3  # Q / K / V: one batched product


def test_model_bf16_against_ort() -> None:
    """The bf16 program's products on the matmul primitive stay within bf16's error."""
    if not gemm_kernels.cpu_has_bf16():
        pytest.skip("no native bf16 here")
    model, x = block_model()
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_bf16(prog)
    prog.compile(CpuTarget(threads=1))
    for got, w in zip(prog.run({"x": x}), want, strict=True):
        rel = np.sqrt(np.mean((got - w) ** 2) / np.mean(w**2))
        assert 1e-5 < rel < 2e-2, rel
    packed = prog._executable.lowered.ctx.packed_weights
    assert torch.bfloat16 in {v.dtype for v in packed.values() if v.made}


def test_bad_setting(monkeypatch) -> None:
    monkeypatch.setenv(gemm_kernels.DNNL_GEMM_ENV, "blas")
    with pytest.raises(ValueError, match="PGX_CPU_DNNL_GEMM='blas'"):
        gemm_kernels.dnnl_gemm_setting()


def test_gelu_erf_is_not_tanh() -> None:
    """The two GELUs differ by more than the tolerance used above (the test can tell them)."""
    t = torch.linspace(-3, 3, 61, dtype=torch.float64)
    assert float((ACTS["gelu"](t) - ACTS["gelu_tanh"](t)).abs().max()) > 1e-4 > 0
    assert math.isclose(float(ACTS["gelu"](torch.tensor(1.0))), 0.8413447, rel_tol=1e-6)


def test_twin_shares_the_packed_weight() -> None:
    """A twin (another bias / activation on the same weight) packs nothing of its own, and
    computes its own product; a twin of another shape is refused."""
    w, b, x = torch.randn(64, 48), torch.randn(48), torch.randn(8, 64)
    first = onednn_linear.Linear(w, None, 8)
    second = onednn_linear.Linear(w, b, 8, epilogue="silu", twin=first)
    assert second.weight is None
    n = torch.get_num_threads()
    assert second.made[n].weight.data_ptr() == first.made[n].weight.data_ptr()
    torch.testing.assert_close(first(x), x @ w, rtol=1e-5, atol=1e-5)
    want = torch.nn.functional.silu(x @ w + b)
    torch.testing.assert_close(second(x), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(OneDnnError, match="twin"):
        onednn_linear.Linear(torch.randn(64, 40), None, 8, twin=first)


@pytest.mark.parametrize("dtype", dtypes())
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_in_parts_against_torch(dtype: torch.dtype, with_bias: bool) -> None:
    """Three column parts as one batched product: part p is columns p * 64 ... (p + 1) * 64 of
    the product (+ bias, added before the one rounding, as a binary post-op), each dense; the
    batched primitive is oneDNN's brgemm, not its reference."""
    torch.manual_seed(5)
    w, b, x = torch.randn(96, 192) / 10, torch.randn(192), torch.randn(32, 96)
    w, b, x = w.to(dtype), b.to(dtype), x.to(dtype)
    lin = onednn_linear.Linear(w, b if with_bias else None, 32, parts=3)
    got = lin(x)
    assert got.shape == (3, 32, 64) and got.is_contiguous() and lin.parts == 3
    assert lin.primitive().impl.startswith("brg")
    ref = x.double() @ w.double() + (b.double() if with_bias else 0)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for p in range(3):
        torch.testing.assert_close(
            got[p].double(), ref[:, 64 * p : 64 * (p + 1)], rtol=tol, atol=tol
        )
    with pytest.raises(OneDnnError, match="not 5 parts"):
        onednn_linear.Linear(w, None, 32, parts=5)


def logits_model() -> tuple:
    """An LM head: layer norm's affine part then a fixed-weight product whose float32 result
    is the model's output (in a bf16 program: a bf16 product widened to float32, returned; the
    weight above `truncate_float.HEAD_WEIGHTS`, so the product is not kept float32)."""
    x = RNG.standard_normal((1, 16, 64)).astype(np.float32)
    inits = {
        "g": RNG.standard_normal(64).astype(np.float32),
        "w": (RNG.standard_normal((64, 17000)) / 8).astype(np.float32),
    }
    nodes = [
        helper.make_node("Mul", ["x", "g"], ["h"]),
        helper.make_node("MatMul", ["h", "w"], ["logits"]),
    ]
    return make_model(nodes, {"x": x}, ["logits"], inits, opset=20), x


@pytest.mark.parametrize("fresh", ["1", "0"])
def test_returned_widening_writes_a_new_tensor(monkeypatch, fresh: str) -> None:
    """gpt12: a bf16 product's float32 group that the program returns is written into a new
    tensor each run (no copy out of the arena: `lower_gemm._returned_fresh`); `0` keeps it in
    its slot. Either way: within bf16's error of ONNX Runtime, the same numbers as the other
    setting and as a profiled run, and an earlier run's output is not overwritten."""
    if not gemm_kernels.cpu_has_bf16():
        pytest.skip("no native bf16 here")
    from pygraphx.targets.torch_lowering import lower_gemm

    monkeypatch.setenv(lower_gemm.FRESH_ENV, fresh)
    model, x = logits_model()
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_bf16(prog)
    prog.compile(CpuTarget(threads=1))
    lowered = prog._executable.lowered
    (out_idx,) = lowered.outputs
    assert [[i.op.name for i in s.instructions] for s in lowered.steps][-1] == ["dot", "pointwise"]
    assert (out_idx in lowered.ctx.fresh) == (fresh == "1")
    first = np.array(prog.run({"x": x})[0])
    held = prog.run({"x": x})[0]
    again = prog.run({"x": 2 * x})[0]  # a later run must not write into `held`
    np.testing.assert_array_equal(np.array(held), first)
    assert not np.shares_memory(np.asarray(held), np.asarray(again))
    rel = np.sqrt(np.mean((first - want) ** 2) / np.mean(want**2))
    assert 1e-5 < rel < 2e-2, rel  # bf16's error, not float32's
    profiled = prog.run({"x": x}, observer=lambda *_: None)[0]
    np.testing.assert_array_equal(np.array(profiled), first)
    monkeypatch.setenv(lower_gemm.FRESH_ENV, "0" if fresh == "1" else "1")
    other = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_bf16(other)
    other.compile(CpuTarget(threads=1))
    np.testing.assert_array_equal(np.array(other.run({"x": x})[0]), first)
