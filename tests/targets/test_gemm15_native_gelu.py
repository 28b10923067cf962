"""GELU's tanh approximation as a native pass over a float32 product (`native_gelu.py`,
`native/kernels/gelu.c`; helper gemm15): the kernel against float64 torch on odd sizes (tails
that are not a multiple of 16), large and NaN / inf inputs, 1 and 2 threads; a model's
`gelu_tanh(x @ w + b)` against ONNX Runtime, batch 1 and 3, with the kernel taken and with
`PGX_CPU_GELU_NATIVE=0` (oneDNN's post-op)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import native_gelu, onednn_linear  # noqa: E402
from tests.helpers import make_model  # noqa: E402


def have_kernel() -> bool:
    try:
        native_gelu._BOUND.get()
    except native.NativeUnavailable:
        return False
    return True


pytestmark = pytest.mark.skipif(
    not have_kernel(), reason="needs a C compiler and AVX-512F (the native gelu kernel)"
)


def reference(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return 0.5 * x * (1 + torch.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


@pytest.mark.parametrize("n", [1, 15, 17, 4096, 4097, 3 * 4096 + 5, 128 * 3072])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_against_float64(monkeypatch, n: int, threads: int) -> None:
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    torch.manual_seed(n)
    x = torch.randn(n) * 4
    x[: min(n, 4)] = torch.tensor([-30.0, 30.0, 0.0, -1e-8])[: min(n, 4)]
    want = reference(x)
    got = native_gelu.GeluTanh()(x.clone())
    assert got.dtype == torch.float32
    # within a few float32 roundings, relative where the value is not tiny
    err = (got.double() - want).abs()
    assert float((err / want.abs().clamp_min(1e-3)).max()) < 3e-6
    # also torch's own float32 gelu(tanh) within float32 roundings
    torch.testing.assert_close(got, torch.nn.functional.gelu(x, approximate="tanh"),
                               rtol=3e-6, atol=1e-6)  # fmt: skip


def test_kernel_in_place_and_special_values() -> None:
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 100.0, -100.0] + [1.0] * 12)
    fn = native_gelu.GeluTanh()
    y = fn(x)
    assert y.data_ptr() == x.data_ptr()
    # as torch's float32 gelu(tanh): nan, inf, nan, 100, -0
    assert torch.isnan(y[0]) and y[1] == float("inf") and torch.isnan(y[2]) and y[3] == 100.0
    assert y[4] == 0 and torch.signbit(y[4])
    with pytest.raises(ValueError, match="dense float32"):
        fn(torch.randn(4, 6).t())
    with pytest.raises(ValueError, match="dense float32"):
        fn(torch.randn(8, dtype=torch.float64))


def ffn(batch: int, k: int = 45, n: int = 83) -> tuple:
    rng = np.random.default_rng(15)
    x = rng.standard_normal((batch, 7, k)).astype(np.float32)
    inits = {
        "w": (rng.standard_normal((k, n)) / 3).astype(np.float32),
        "b": rng.standard_normal(n).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Gelu", ["a"], ["y"], approximate="tanh"),
    ]
    return make_model(nodes, {"x": x}, ["y"], inits, opset=20), x


@pytest.mark.skipif(not onednn_linear.available(), reason="needs oneDNN's C API library")
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("on", [True, False])
def test_model_against_ort(monkeypatch, batch: int, on: bool) -> None:
    if not on:
        monkeypatch.setenv(native_gelu.ENV, "0")
    calls = []
    init = native_gelu.GeluTanh.__call__

    def counting(self, t):
        calls.append(t.shape)
        return init(self, t)

    monkeypatch.setattr(native_gelu.GeluTanh, "__call__", counting)
    model, x = ffn(batch)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=2))
    calls.clear()
    for _ in range(2):
        got = prog.run({"x": x})
        np.testing.assert_allclose(got[0], want[0], rtol=2e-5, atol=2e-5)
    assert len(calls) == (2 if on else 0)
