"""The native wide product kernel's K-blocked form with a residual sum
(`gemm_wide_f32_kb`) and its column-parts form (`gemm_wide_f32_parts`, `WideLinear(parts=)`,
helper gemm18b): each against numpy's float64 product (K not a multiple of the K block, rows
not of the 8-row block, N not of the 48-column panel, 1 and 2 threads), and a Q / K / V
projection (MatMul + Add -> three column Slices) through the cpu target against ONNX Runtime,
on the kernel, its weight held once, `PGX_CPU_GEMM_WIDE_QKV=0` giving oneDNN's batched matmul
back.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

from pygraphx.targets.torch_lowering import native_gemm, onednn_linear  # noqa: E402
from pygraphx.targets.torch_lowering.gemm_kernels import WIDE_KERNEL  # noqa: E402
from tests.helpers import make_model  # noqa: E402
from tests.targets.test_gemm18_wide import REASON, compiled, needs_kernel  # noqa: E402

RNG = np.random.default_rng(1818)


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@needs_kernel
@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize(
    ("rows", "k", "n", "kc"),
    [(13, 77, 97, 32), (16, 1000, 50, 384), (130, 3072 + 5, 768, 768), (9, 40, 48, 0),
     (300, 257, 200, 64)],
)  # fmt: skip
def test_k_blocked_matches_float64(threads, n_threads, residual, rows, k, n, kc):
    """C (+)= A @ B + bias in K blocks of `kc` (0: one block): the first block stores (or adds
    to the residual), the later ones add; a last block shorter than `kc`."""
    threads(n_threads)
    lib = native_gemm._BOUND.get()
    x = RNG.standard_normal((rows, k)).astype(np.float32)
    w = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    r = RNG.standard_normal((rows, n)).astype(np.float32)
    lin = native_gemm.WideLinear(torch.from_numpy(w), torch.from_numpy(b), rows)
    scratch = torch.empty(lib.gemm_wide_scratch_kb(rows, k, kc))
    want = x.astype(np.float64) @ w + b + (r if residual else 0)
    xt = torch.from_numpy(x)
    for _ in range(2):
        y = torch.from_numpy(r.copy()) if residual else torch.full((rows, n), np.nan)
        status = lib.gemm_wide_f32_kb(xt.data_ptr(), rows, k, k, lin.packed.data_ptr(),
                                      lin.bias.data_ptr(), n, y.data_ptr(), n,
                                      scratch.data_ptr(), n_threads, kc, int(residual))  # fmt: skip
        assert status == 0
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=3e-5)


@needs_kernel
@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize(("rows", "k", "width", "bias"), [(13, 37, 96, True), (16, 100, 48, False),
                                                           (128, 768, 768, True)])  # fmt: skip
def test_parts_match_float64(threads, n_threads, rows, k, width, bias):
    """Three column parts, each a dense (rows, width) block of the result."""
    threads(n_threads)
    n = 3 * width
    x = RNG.standard_normal((rows, k)).astype(np.float32)
    w = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32) if bias else None
    lin = native_gemm.WideLinear(torch.from_numpy(w), None if b is None else torch.from_numpy(b),
                                 rows, parts=3)  # fmt: skip
    full = x.astype(np.float64) @ w + (0 if b is None else b)
    want = full.reshape(rows, 3, width).transpose(1, 0, 2)
    for _ in range(2):
        got = lin(torch.from_numpy(x))
        assert got.shape == (3, rows, width) and got.is_contiguous()
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=3e-5)


@needs_kernel
def test_parts_refused_off_the_panel():
    with pytest.raises(ValueError, match="in 3 parts of a multiple of 48"):
        native_gemm.WideLinear(torch.randn(8, 3 * 40), None, 8, parts=3)
    lib = native_gemm._BOUND.get()
    assert lib.gemm_wide_f32_parts(None, 8, 8, 8, None, None, 120, None, 40, None, 1, 40,
                                   320) == -2  # fmt: skip


def test_available_parts_rule(monkeypatch):
    w, rows = torch.empty(768, 2304), 128
    assert native_gemm.available_parts(w, rows, 3) == (REASON is None)
    assert not native_gemm.available_parts(torch.empty(768, 3 * 280), rows, 3)  # (280 % 48)
    assert not native_gemm.available_parts(w, 124, 3)
    assert not native_gemm.available_parts(w, native_gemm.PARTS_MAX_ROWS + 8, 3)
    assert not native_gemm.available_parts(torch.empty(native_gemm.PARTS_MAX_DEPTH + 1, 2304),
                                           rows, 3)  # fmt: skip
    assert not native_gemm.available_parts(w.bfloat16(), rows, 3)
    for env in (native_gemm.PARTS_ENV, native_gemm.ENV):
        monkeypatch.setenv(env, "0")
        assert not native_gemm.available_parts(w, rows, 3)
        monkeypatch.delenv(env)


def qkv(rows: int, k: int, width: int) -> tuple:
    """MatMul + Add (bias) -> Split into three equal column parts (Q / K / V), each part then
    scaled (a user of each part, as attention's)."""
    x = RNG.standard_normal((1, rows, k)).astype(np.float32)
    inits = {
        "w": (RNG.standard_normal((k, 3 * width)) / np.sqrt(k)).astype(np.float32),
        "b": (RNG.standard_normal(3 * width) / 4).astype(np.float32),
        "split": np.array([width] * 3, dtype=np.int64),
        "two": np.array(2.0, dtype=np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["h"]),
        helper.make_node("Split", ["h", "split"], ["q", "k", "v"], axis=-1),
        *[helper.make_node("Mul", [p, "two"], [f"{p}2"]) for p in "qkv"],
    ]
    model = make_model(nodes, {"x": x}, ["q2", "k2", "v2"], inits, opset=18)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return model, x, sess.run(None, {"x": x})


@needs_kernel
@pytest.mark.skipif(not onednn_linear.available(), reason="needs oneDNN's C API library")
@pytest.mark.parametrize("n_threads", [1, 2])
def test_qkv_against_ort(monkeypatch, n_threads: int):
    """Q / K / V on the kernel (recorded `WIDE_KERNEL`, no oneDNN copy of the weight kept, the
    kernel called once a run), against ORT, the profiling path too; `PGX_CPU_GEMM_WIDE_QKV=0`
    gives oneDNN's batched product back (no `WIDE_KERNEL`), against ORT too; 20 rows (not a
    multiple of 8) stay on oneDNN."""
    model, x, want = qkv(24, 40, 288)
    calls = []
    call = native_gemm.WideLinear.__call__
    monkeypatch.setattr(native_gemm.WideLinear, "__call__",
                        lambda self, a: (calls.append(1), call(self, a))[1])  # fmt: skip
    prog, kernels = compiled(model, n_threads)
    assert kernels == [WIDE_KERNEL]
    packed = prog._executable.lowered.ctx.packed_weights
    assert not [key for key in packed if key[0] == "onednn_linear"], list(packed)
    for _ in range(2):
        for got, w in zip(prog.run({"x": x}), want, strict=True):
            np.testing.assert_allclose(np.array(got), w, rtol=1e-4, atol=1e-4)
    assert len(calls) == 2
    seen = []
    got = prog.run({"x": x}, observer=lambda ins, v, s: seen.append(ins.name()))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.array(g), w, rtol=1e-4, atol=1e-4)
    assert seen
    monkeypatch.setenv(native_gemm.PARTS_ENV, "0")
    prog, kernels = compiled(model, n_threads)
    assert WIDE_KERNEL not in kernels
    for got, w in zip(prog.run({"x": x}), want, strict=True):
        np.testing.assert_allclose(np.array(got), w, rtol=1e-4, atol=1e-4)
    monkeypatch.delenv(native_gemm.PARTS_ENV)
    model, x, want = qkv(20, 40, 288)
    prog, kernels = compiled(model, n_threads)
    assert WIDE_KERNEL not in kernels
    for got, w in zip(prog.run({"x": x}), want, strict=True):
        np.testing.assert_allclose(np.array(got), w, rtol=1e-4, atol=1e-4)
