"""A weight product whose group adds a residual it may overwrite accumulates into it
(`gemm_residual.residual_sum`: oneDNN's matmul with a sum post-op, `onednn_linear.Linear(
residual="sum")`), against float64 torch and ONNX Runtime; `PGX_CPU_GEMM_RESIDUAL=off` keeps
the separate add. Shapes with N and K not multiples of 16, batch 1 and 3."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import gemm_kernels, gemm_residual, onednn_linear  # noqa: E402
from pygraphx.targets.torch_lowering.onednn_capi import OneDnnError  # noqa: E402
from tests.helpers import make_model  # noqa: E402

pytestmark = pytest.mark.skipif(
    not onednn_linear.available(), reason="needs oneDNN's C API library (onednn-cpu-gomp)"
)
RNG = np.random.default_rng(1414)
D, F = 45, 83  # the model width and the FFN's: not multiples of 16


def dtypes() -> list[torch.dtype]:
    return [torch.float32] + ([torch.bfloat16] if gemm_kernels.cpu_has_bf16() else [])


@pytest.mark.parametrize("dtype", dtypes())
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_linear_residual_against_float64(
    monkeypatch, dtype: torch.dtype, with_bias: bool, threads: int
) -> None:
    """`into` adds the product (+ bias) to the residual in place; `add` (binary post-op)
    returns the same in a new tensor, the residual untouched."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    torch.manual_seed(14)
    rows, k, n = 37, F, D
    w, x, r = torch.randn(k, n) / 8, torch.randn(rows, k), torch.randn(rows, n)
    b = torch.randn(n) if with_bias else None
    w, x, r = w.to(dtype), x.to(dtype), r.to(dtype)
    b = None if b is None else b.to(dtype)
    ref = x.double() @ w.double() + r.double() + (0 if b is None else b.double())
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    acc = onednn_linear.Linear(w, b, rows, residual="sum")
    r_in = r.clone()
    got = acc.into(x, r_in)
    assert got.data_ptr() == r_in.data_ptr() and got.dtype == dtype
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol)
    add = onednn_linear.Linear(w, b, rows, residual="add")
    kept = r.clone()
    got = add(x, kept)
    torch.testing.assert_close(kept, r)
    torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol)


def test_linear_residual_errors() -> None:
    w = torch.randn(8, 6)
    with pytest.raises(OneDnnError, match="residual 'mul'"):
        onednn_linear.Linear(w, None, 4, residual="mul")
    with pytest.raises(OneDnnError, match="in parts takes none"):
        onednn_linear.Linear(w, None, 4, residual="sum", parts=2)
    with pytest.raises(OneDnnError, match="residual: expected"):
        onednn_linear.Linear(w, None, 4, residual="add")(torch.randn(4, 8))
    acc = onednn_linear.Linear(w, None, 4, residual="sum")
    with pytest.raises(OneDnnError, match="call `into"):
        acc(torch.randn(4, 8))  # (would add the product into uninitialised memory)
    for bad in (torch.randn(4, 5), torch.randn(4, 6, dtype=torch.float64), torch.randn(6, 4).t()):
        with pytest.raises(OneDnnError, match="sum into: expected a dense"):
            acc.into(torch.randn(4, 8), bad)


def block(batch: int, expose: str = "") -> tuple:
    """A post-norm block: y = LN(x); s = tanh(y) @ w1 + b1 + y; z = LN(s); u = gelu(z @ w2 +
    b2); out = LN(u @ w3 + b3 + z). `expose="y"` also returns y (so no product may overwrite
    it); `expose="late"` adds y again after the last norm (a later reader); `expose="self"`:
    s = y @ w1 + b1 + y (the product reads the residual it would overwrite)."""
    x = RNG.standard_normal((batch, 7, D)).astype(np.float32)
    inits = {
        "g": (1 + RNG.standard_normal(D) / 4).astype(np.float32),
        "be": RNG.standard_normal(D).astype(np.float32),
        "w1": (RNG.standard_normal((D, D)) / 6).astype(np.float32),
        "b1": RNG.standard_normal(D).astype(np.float32),
        "w2": (RNG.standard_normal((D, F)) / 6).astype(np.float32),
        "b2": RNG.standard_normal(F).astype(np.float32),
        "w3": (RNG.standard_normal((F, D)) / 9).astype(np.float32),
        "b3": RNG.standard_normal(D).astype(np.float32),
    }
    ln = "LayerNormalization"
    nodes = [
        helper.make_node(ln, ["x", "g", "be"], ["y"], axis=-1, epsilon=1e-5),
        helper.make_node("Tanh", ["y"], ["t"]),
        helper.make_node("MatMul", ["y" if expose == "self" else "t", "w1"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["a1"]),
        helper.make_node("Add", ["a1", "y"], ["s1"]),
        helper.make_node(ln, ["s1", "g", "be"], ["z"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["z", "w2"], ["m2"]),
        helper.make_node("Add", ["m2", "b2"], ["a2"]),
        helper.make_node("Gelu", ["a2"], ["u"]),
        helper.make_node("MatMul", ["u", "w3"], ["m3"]),
        helper.make_node("Add", ["m3", "b3"], ["a3"]),
        helper.make_node("Add", ["z", "a3"], ["s2"]),  # the residual first this time
        helper.make_node(ln, ["s2", "g", "be"], ["out"], axis=-1, epsilon=1e-5),
    ]
    outputs = ["out"]
    if expose == "y":
        outputs.append("y")
    if expose == "late":
        nodes.append(helper.make_node("Add", ["out", "y"], ["late"]))
        outputs = ["late"]
    return make_model(nodes, {"x": x}, outputs, inits, opset=20), x


def run_counting(monkeypatch, model, x, threads: int = 1) -> tuple[list, list, int]:
    calls = []
    into = onednn_linear.Linear.into

    def counting(self, a, r):
        calls.append(tuple(a.shape))
        return into(self, a, r)

    monkeypatch.setattr(onednn_linear.Linear, "into", counting)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=threads))
    calls.clear()
    got = prog.run({"x": x})
    per_run = len(calls)
    got2 = prog.run({"x": x})  # a second run: nothing kept from the first
    for g in (got, got2):
        for a, b in zip(g, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
    return got, want, per_run


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("threads", [1, 2])
def test_block_accumulates_into_the_residual(monkeypatch, batch: int, threads: int) -> None:
    """Both residual sums (the residual second or first in the Add) take the sum post-op."""
    model, x = block(batch)
    _, _, calls = run_counting(monkeypatch, model, x, threads)
    assert calls == 2


def test_block_off(monkeypatch) -> None:
    monkeypatch.setenv(gemm_residual.RESIDUAL_ENV, "off")
    model, x = block(3)
    _, _, calls = run_counting(monkeypatch, model, x)
    assert calls == 0


@pytest.mark.parametrize("expose", ["y", "late", "self"])
def test_residual_read_later_is_not_overwritten(monkeypatch, expose: str) -> None:
    """y returned, read after the product, or the product's own input: that product keeps
    the separate add (the other one still accumulates into z), and y comes out right
    (checked against ORT)."""
    model, x = block(3, expose)
    _, _, calls = run_counting(monkeypatch, model, x)
    assert calls == 1


def test_bad_setting(monkeypatch) -> None:
    monkeypatch.setenv(gemm_residual.RESIDUAL_ENV, "maybe")
    model, x = block(1)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    with pytest.raises(ValueError, match="PGX_CPU_GEMM_RESIDUAL"):
        prog.compile(CpuTarget(threads=1))
