"""A float32 product with a very wide fixed weight (a language model's head) on the native kernel
(`native_gemm.WideLinear`, `native/kernels/gemm_wide.c`): the kernel against numpy's float64
product (odd sizes: rows not a multiple of the 8-row block, columns not of the 48-column panel
nor of 16, a strided source, 1 and 2 threads), and a model's head through the cpu target
against ONNX Runtime, with the switch `PGX_CPU_GEMM_WIDE=0` giving oneDNN's matmul back.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import native_gemm, onednn_linear  # noqa: E402
from pygraphx.targets.torch_lowering.gemm_kernels import GEMM_KERNELS, WIDE_KERNEL  # noqa: E402
from tests.helpers import make_model  # noqa: E402


def _kernel_reason() -> str | None:
    try:
        native_gemm._BOUND.get()
    except native.NativeUnavailable as exc:
        return str(exc)
    return None


REASON = _kernel_reason()
needs_kernel = pytest.mark.skipif(REASON is not None, reason=f"no native gemm_wide: {REASON}")
RNG = np.random.default_rng(18)


@pytest.fixture
def threads():
    """Set torch's thread count inside a test (restored after)."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@needs_kernel
@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize(
    ("rows", "k", "n", "bias"),
    [(1, 5, 1, False), (7, 77, 47, True), (13, 130, 97, False), (130, 768, 1000, True),
     (9, 31, 16391, False), (300, 40, 200, True)],
)  # fmt: skip
def test_kernel_matches_float64(threads, n_threads: int, rows: int, k: int, n: int, bias: bool):
    threads(n_threads)
    x = RNG.standard_normal((rows, k)).astype(np.float32)
    w = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32) if bias else None
    lin = native_gemm.WideLinear(torch.from_numpy(w), None if b is None else torch.from_numpy(b),
                                 rows)  # fmt: skip
    want = x.astype(np.float64) @ w + (0 if b is None else b)
    for _ in range(2):  # (the second call on the same scratch)
        got = lin(torch.from_numpy(x))
        assert got.shape == (rows, n) and got.dtype == torch.float32
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=2e-5)


@needs_kernel
@pytest.mark.parametrize("n_threads", [1, 2])
def test_kernel_strided_source_and_weight(threads, n_threads: int):
    """A source whose rows are a slice of wider rows, and a weight that is a transposed view
    (a tied embedding's `E.T`)."""
    threads(n_threads)
    rows, k, n = 21, 64, 333
    wide = torch.randn(rows, k + 9)
    x = wide[:, 3 : 3 + k]
    emb = torch.randn(n, k) / 8
    lin = native_gemm.WideLinear(emb.t(), None, rows)
    want = x.double() @ emb.double().t()
    np.testing.assert_allclose(lin(x).numpy(), want.numpy(), rtol=1e-5, atol=2e-5)


@needs_kernel
def test_kernel_refuses_wrong_inputs():
    lin = native_gemm.WideLinear(torch.randn(8, 20), None, 3)
    with pytest.raises(ValueError, match=r"\(3, 8\) float32 source"):
        lin(torch.randn(4, 8))
    with pytest.raises(ValueError, match=r"\(3, 8\) float32 source"):
        lin(torch.randn(3, 8).double())
    with pytest.raises(ValueError, match="2-D float32 weight"):
        native_gemm.WideLinear(torch.randn(8, 20).double(), None, 3)
    with pytest.raises(ValueError, match="bias of 20 float32"):
        native_gemm.WideLinear(torch.randn(8, 20), torch.randn(19), 3)


def test_available_rule(monkeypatch):
    """Only float32, no activation, at least `MIN_COLUMNS` columns and `MIN_ROWS` rows, at most
    `MAX_DEPTH` weight rows, switch on."""
    wide, rows = torch.empty(4, native_gemm.MIN_COLUMNS), native_gemm.MIN_ROWS
    assert not native_gemm.available(torch.empty(4, native_gemm.MIN_COLUMNS - 1), rows)
    assert not native_gemm.available(wide, rows - 1)
    assert not native_gemm.available(torch.empty(native_gemm.MAX_DEPTH + 1, 16384), rows)
    assert not native_gemm.available(wide.bfloat16(), rows)
    assert not native_gemm.available(wide, rows, "gelu")
    monkeypatch.setenv(native_gemm.ENV, "0")
    assert not native_gemm.available(wide, rows)
    monkeypatch.setenv(native_gemm.ENV, "1")
    assert native_gemm.available(wide, rows) == (REASON is None)
    assert native_gemm.available(torch.empty(native_gemm.MAX_DEPTH, 16384), rows) == (
        REASON is None
    )


def head(rows: int, k: int, n: int, bias: bool) -> tuple:
    """LayerNorm -> MatMul with a (k, n) weight (+ Add of a bias): a language model's head."""
    x = RNG.standard_normal((1, rows, k)).astype(np.float32)
    inits = {
        "g": (1 + RNG.standard_normal(k) / 10).astype(np.float32),
        "be": (RNG.standard_normal(k) / 10).astype(np.float32),
        "w": (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32),
    }
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "be"], ["h"], axis=-1),
        helper.make_node("MatMul", ["h", "w"], ["y" if not bias else "m"]),
    ]
    if bias:
        inits["b"] = RNG.standard_normal(n).astype(np.float32)
        nodes.append(helper.make_node("Add", ["m", "b"], ["y"]))
    model = make_model(nodes, {"x": x}, ["y"], inits)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return model, x, sess.run(None, {"x": x})[0]


def compiled(model, n_threads: int) -> tuple:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=n_threads))
    kernels = list(prog._executable.lowered.ctx.cache.get(GEMM_KERNELS, {}).values())
    return prog, kernels


@needs_kernel
@pytest.mark.skipif(not onednn_linear.available(), reason="needs oneDNN's C API library")
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_head_against_ort(monkeypatch, n_threads: int, bias: bool):
    """The head runs on the native kernel (recorded `WIDE_KERNEL`), against ORT; with the switch
    off on oneDNN's matmul (`dnnl`), against ORT too."""
    model, x, want = head(19, 48, native_gemm.MIN_COLUMNS + 5, bias)
    calls = []
    call = native_gemm.WideLinear.__call__
    monkeypatch.setattr(native_gemm.WideLinear, "__call__",
                        lambda self, a: (calls.append(1), call(self, a))[1])  # fmt: skip
    prog, kernels = compiled(model, n_threads)
    assert kernels == [WIDE_KERNEL]
    for _ in range(2):
        got = np.array(prog.run({"x": x})[0])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert len(calls) == 2
    monkeypatch.setenv(native_gemm.ENV, "0")
    prog, kernels = compiled(model, n_threads)
    assert kernels == ["dnnl"]
    np.testing.assert_allclose(np.array(prog.run({"x": x})[0]), want, rtol=1e-4, atol=1e-4)
    assert len(calls) == 2


@pytest.mark.skipif(not onednn_linear.available(), reason="needs oneDNN's C API library")
@pytest.mark.parametrize(("rows", "n"), [(5, 300), (4, native_gemm.MIN_COLUMNS)])
def test_narrow_or_short_product_stays_on_onednn(rows: int, n: int):
    model, x, want = head(rows, 32, n, False)
    prog, kernels = compiled(model, 1)
    assert kernels == ["dnnl"]
    np.testing.assert_allclose(np.array(prog.run({"x": x})[0]), want, rtol=1e-4, atol=1e-4)


def ffn_up(rows: int, k: int, n: int, tanh: bool) -> tuple:
    """MatMul + Add (bias) -> Gelu (tanh approximation or erf): a transformer's FFN-up."""
    x = RNG.standard_normal((1, rows, k)).astype(np.float32)
    inits = {
        "w": (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32),
        "b": (RNG.standard_normal(n) / 4).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["h"]),
        helper.make_node("Gelu", ["h"], ["y"], approximate="tanh" if tanh else "none"),
    ]
    model = make_model(nodes, {"x": x}, ["y"], inits, opset=20)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return model, x, sess.run(None, {"x": x})[0]


@needs_kernel
@pytest.mark.skipif(not onednn_linear.available(), reason="needs oneDNN's C API library")
@pytest.mark.parametrize("tanh", [True, False])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_ffn_up_against_ort(monkeypatch, n_threads: int, tanh: bool):
    """A product whose GELU runs as the native pass takes the kernel from `GELU_MIN_COLUMNS`
    columns and rows a multiple of 8 (N not a multiple of 48); `PGX_CPU_GEMM_WIDE_GELU=0` gives
    oneDNN back, and a narrower one, or one of 19 rows, stays there."""
    model, x, want = ffn_up(24, 40, native_gemm.GELU_MIN_COLUMNS + 7, tanh)
    prog, kernels = compiled(model, n_threads)
    assert kernels == [WIDE_KERNEL]
    for _ in range(2):
        np.testing.assert_allclose(np.array(prog.run({"x": x})[0]), want, rtol=1e-4, atol=1e-4)
    monkeypatch.setenv(native_gemm.GELU_ENV, "0")
    prog, kernels = compiled(model, n_threads)
    assert kernels == ["dnnl"]
    np.testing.assert_allclose(np.array(prog.run({"x": x})[0]), want, rtol=1e-4, atol=1e-4)
    monkeypatch.delenv(native_gemm.GELU_ENV)
    for rows, n in ((24, native_gemm.GELU_MIN_COLUMNS - 1), (19, native_gemm.GELU_MIN_COLUMNS)):
        model, x, want = ffn_up(rows, 40, n, tanh)
        prog, kernels = compiled(model, n_threads)
        assert kernels == ["dnnl"]
        got = np.array(prog.run({"x": x})[0])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@needs_kernel
@pytest.mark.skipif(not onednn_linear.available(), reason="needs oneDNN's C API library")
@pytest.mark.parametrize("n_threads", [1, 2])
def test_ffn_up_weight_held_once(n_threads: int):
    """On the kernel, an FFN-up weight is held once: no oneDNN packed copy of it stays in the
    compile's packed weights (they were +9.4 MB a GPT-2 layer), and the profiling steps (an
    observer's run: the product alone, then bias + GELU) run on the kernel's packed weight
    without its bias: every value they show matches ORT's, the product alone included."""
    model, x, want = ffn_up(16, 40, native_gemm.GELU_MIN_COLUMNS + 5, tanh=False)
    prog, kernels = compiled(model, n_threads)
    assert kernels == [WIDE_KERNEL]
    packed = prog._executable.lowered.ctx.packed_weights
    assert not [key for key in packed if key[0] == "onednn_linear"], list(packed)
    assert [key for key in packed if key[0] == "native_wide"]
    seen: dict[str, np.ndarray] = {}
    got = prog.run({"x": x}, observer=lambda ins, v, s: seen.__setitem__(ins.name(), np.array(v)))
    np.testing.assert_allclose(np.array(got[0]), want, rtol=1e-4, atol=1e-4)
    dots = [v for name, v in seen.items() if name == "dot"]
    assert len(dots) == 1
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    product = x.astype(np.float64).reshape(-1, 40) @ inits["w"].astype(np.float64)
    np.testing.assert_allclose(dots[0].reshape(product.shape), product, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.array(prog.run({"x": x})[0]), want, rtol=1e-4, atol=1e-4)
