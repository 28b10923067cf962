"""A CNN classifier's one-row product on more than one thread runs on oneDNN's matmul primitive
through its C API (`onednn_linear.Linear`, `gemm_kernels._classifier_kernel`), on one thread on
`addmm`. The primitive alone against numpy's float64 product; the models against ONNX Runtime.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import gemm_select, onednn_linear  # noqa: E402
from pygraphx.targets.torch_lowering.gemm_kernels import (  # noqa: E402
    CLASSIFIER_KERNEL,
    GEMM_KERNELS,
    MATMUL_KERNEL,
    cpu_has_bf16,
)
from pygraphx.targets.torch_lowering.onednn_capi import OneDnnError  # noqa: E402
from tests.helpers import make_model  # noqa: E402

pytestmark = pytest.mark.skipif(
    not onednn_linear.available(), reason="needs oneDNN's C API library (onednn-cpu-gomp)"
)
RNG = np.random.default_rng(23)


@pytest.fixture
def threads():
    """Set torch's thread count inside a test (restored after)."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize(("rows", "k", "n", "bias"), [(1, 64, 40, True), (1, 1280, 1000, True),
                                                      (3, 96, 17, False)])  # fmt: skip
def test_linear_matches_numpy(threads, n_threads: int, rows: int, k: int, n: int, bias: bool):
    threads(n_threads)
    x = RNG.standard_normal((rows, k)).astype(np.float32)
    w = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32) if bias else None
    lin = onednn_linear.Linear(
        torch.from_numpy(w), None if b is None else torch.from_numpy(b), rows
    )
    got = lin(torch.from_numpy(x))
    want = x.astype(np.float64) @ w + (0 if b is None else b)
    assert got.shape == (rows, n) and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    assert set(lin.made) == {n_threads}


def test_linear_per_thread_count_shares_the_packed_weight(threads):
    """A primitive per thread count, made at its first call; the packed weight shared when
    oneDNN picks the same layout."""
    threads(1)
    w, b = torch.randn(64, 48), torch.randn(48)
    lin = onednn_linear.Linear(w, b, 1, now=False)
    assert not lin.made
    x = torch.randn(1, 64)
    y1 = lin(x)
    threads(2)
    y2 = lin(x)
    assert set(lin.made) == {1, 2}
    p1, p2 = lin.made[1], lin.made[2]
    if p1.rt.lib.dnnl_memory_desc_equal(p1.w_md, p2.w_md):
        assert p1.weight is p2.weight
    want = x.double() @ w.double() + b.double()
    for y in (y1, y2):
        np.testing.assert_allclose(y.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not cpu_has_bf16(), reason="no native bf16 on this CPU")
def test_linear_bf16(threads):
    threads(1)
    x, w, b = torch.randn(1, 256).bfloat16(), torch.randn(256, 96).bfloat16(), torch.randn(96)
    got = onednn_linear.Linear(w, b, 1)(x)
    want = x.double() @ w.double() + b.double()
    assert got.dtype == torch.bfloat16
    np.testing.assert_allclose(got.double().numpy(), want.numpy(), rtol=2e-2, atol=5e-2)


def test_linear_refuses_a_non_matrix_weight():
    with pytest.raises(OneDnnError, match="2-D float32 or bf16"):
        onednn_linear.Linear(torch.randn(2, 3, 4), None, 1)
    with pytest.raises(OneDnnError, match="2-D float32 or bf16"):
        onednn_linear.Linear(torch.randn(3, 4).double(), None, 1)


def cnn(bias: bool = True, pool: bool = True, batch: int = 1) -> tuple:
    """Conv 3x3 + Relu -> GlobalAveragePool (or none: a 1x1-map convolution) -> Flatten ->
    Gemm (transB, bias): a CNN's classifier, its weight large enough for the per-step thread
    policy to give its step every thread."""
    x = RNG.standard_normal((batch, 3, 12, 12) if pool else (batch, 3, 3, 3)).astype(np.float32)
    inits = {
        "cw": (RNG.standard_normal((512, 3, 3, 3)) / 5).astype(np.float32),
        "fw": (RNG.standard_normal((300, 512)) / 22).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "cw"], ["c"], pads=[1, 1, 1, 1] if pool else [0] * 4),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]) if pool else None,
        helper.make_node("Flatten", ["p" if pool else "r"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", *(["fb"] if bias else [])], ["y"], transB=1),
    ]
    if bias:
        inits["fb"] = RNG.standard_normal(300).astype(np.float32)
    model = make_model([nd for nd in nodes if nd is not None], {"x": x}, ["y"], inits)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return model, x, sess.run(None, {"x": x})[0]


def run_counted(model, x, n_threads: int, monkeypatch) -> tuple[np.ndarray, list[str], int]:
    """`model` compiled for `n_threads` and run twice: its output, the recorded GEMM kernels,
    and how many times a oneDNN matmul primitive ran."""
    calls = []
    execute = onednn_linear._Primitive.execute
    monkeypatch.setattr(
        onednn_linear._Primitive,
        "execute",
        lambda self, a, b: (calls.append(1), execute(self, a, b)),
    )
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=n_threads))
    prog.run({"x": x})
    got = np.array(prog.run({"x": x})[0])
    return got, list(prog._executable.lowered.ctx.cache[GEMM_KERNELS].values()), len(calls)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("pool", [True, False])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_classifier_against_ort(monkeypatch, bias: bool, pool: bool, n_threads: int):
    """On two threads the classifier runs the C-API matmul primitive, on one `addmm`; both
    match ONNX Runtime."""
    monkeypatch.setenv("PGX_CPU_LOAD_ADAPT", "0")  # (a busy machine would take one thread)
    model, x, want = cnn(bias, pool)
    got, kernels, calls = run_counted(model, x, n_threads, monkeypatch)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert kernels == [CLASSIFIER_KERNEL]
    assert (calls > 0) == (n_threads > 1)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("batch", [2, 8])
def test_classifier_of_several_rows_on_the_matmul_primitive(monkeypatch, batch, n_threads):
    """From two rows the classifier runs the C-API matmul primitive on any thread count."""
    monkeypatch.setenv("PGX_CPU_LOAD_ADAPT", "0")
    model, x, want = cnn(batch=batch)
    got, kernels, calls = run_counted(model, x, n_threads, monkeypatch)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert kernels == [MATMUL_KERNEL] and calls == 2


def test_forced_kernel_keeps_addmm(monkeypatch):
    monkeypatch.setenv("PGX_CPU_LOAD_ADAPT", "0")
    monkeypatch.setenv(gemm_select.KERNEL_ENV, "addmm")
    model, x, want = cnn()
    got, kernels, calls = run_counted(model, x, 2, monkeypatch)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert kernels == ["addmm"] and calls == 0


@pytest.mark.parametrize(("rows", "n_threads", "kernel"), [(1, 2, "addmm"), (4, 1, "dnnl")])
def test_a_product_of_a_graph_input_keeps_its_kernel(monkeypatch, rows, n_threads, kernel):
    """Only a product reading a pooling's or convolution's result is a CNN classifier (the
    `dnnl` kernel of another runs oneDNN's matmul primitive too: `gemm_kernels.dnnl_kernel`)."""
    monkeypatch.setenv("PGX_CPU_LOAD_ADAPT", "0")
    x = RNG.standard_normal((rows, 64)).astype(np.float32)
    w = RNG.standard_normal((64, 40)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": x}, ["y"], {"w": w})
    got, kernels, calls = run_counted(model, x, n_threads, monkeypatch)
    np.testing.assert_allclose(got, x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)
    assert kernels == [kernel] and calls == (2 if kernel == "dnnl" else 0)
