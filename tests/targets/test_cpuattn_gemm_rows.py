"""The kernel of a constant-weight float32 GEMM by its row count (`gemm_select.preferred`): a
one-row product (a classifier at batch 1, a decoder's token step) runs on `addmm` with its
activation after it, two rows and more on oneDNN with the activation inside, `PGX_CPU_GEMM`
still forces a kernel; every result against numpy's float64 product."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper

torch = pytest.importorskip("torch")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import gemm_select  # noqa: E402
from pygraphx.targets.torch_lowering.gemm_kernels import GEMM_KERNELS  # noqa: E402
from tests.helpers import make_model  # noqa: E402

RNG = np.random.default_rng(31)

needs_dnnl = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="torch has no oneDNN here"
)


def linear(rows: int, k: int, n: int, act: str | None = None) -> tuple:
    """`x @ w + b` (then `act`), its input and the float64 result."""
    x = RNG.standard_normal((rows, k)).astype(np.float32)
    w = (RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["y" if act is None else "h"]),
    ]
    want = x.astype(np.float64) @ w + b
    if act == "Gelu":
        nodes.append(helper.make_node("Gelu", ["h"], ["y"]))
        want = 0.5 * want * (1 + np.vectorize(math.erf)(want / math.sqrt(2)))
    return make_model(nodes, {"x": x}, ["y"], {"w": w, "b": b}, opset=20), x, want


def kernels(model, x: np.ndarray, want: np.ndarray, threads: int = 1) -> list[str]:
    """The kernels chosen for `model`'s products, after checking its result."""
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=threads))
    np.testing.assert_allclose(np.array(prog.run({"x": x})[0]), want, rtol=1e-4, atol=1e-4)
    return list(prog._executable.lowered.ctx.cache[GEMM_KERNELS].values())


def test_preferred_order(monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["dnnl", "mkl", "addmm"]
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert gemm_select.preferred(1, 768, 50257, names) == ["addmm", "dnnl", "mkl"]
    assert gemm_select.preferred(2, 768, 768, names) == names
    assert gemm_select.preferred(1, 768, 768, ["dnnl"]) == ["dnnl"]
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert gemm_select.preferred(1, 768, 3072, names) == ["addmm", "dnnl", "mkl"]
    assert gemm_select.preferred(1, 768, 50257, names) == names  # oneDNN spreads it


@needs_dnnl
@pytest.mark.parametrize(("rows", "kernel"), [(1, "addmm"), (2, "dnnl"), (16, "dnnl")])
def test_one_row_products_run_on_addmm(rows: int, kernel: str) -> None:
    assert kernels(*linear(rows, 96, 80)) == [kernel]


@needs_dnnl
def test_env_still_forces_the_kernel_of_one_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gemm_select.KERNEL_ENV, "dnnl")
    assert kernels(*linear(1, 96, 80)) == ["dnnl"]


@needs_dnnl
@pytest.mark.parametrize(("rows", "kernel"), [(1, "addmm"), (4, "dnnl")])
def test_activation_inside_the_gemm_from_two_rows(rows: int, kernel: str) -> None:
    """oneDNN applies the GELU inside the GEMM; a one-row product runs on `addmm` and the
    GELU after it."""
    assert kernels(*linear(rows, 96, 80, "Gelu")) == [kernel]


@needs_dnnl
@pytest.mark.parametrize("act", [None, "Gelu"])
def test_large_one_row_product_on_several_threads_keeps_onednn(
    act: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On two threads a one-row product with a weight of `ONE_ROW_PARALLEL` values or more
    runs on oneDNN (with its activation inside), a smaller one on `addmm`."""
    from pygraphx.targets.cpu.threads import LOAD_ADAPT_ENV

    monkeypatch.setenv(LOAD_ADAPT_ENV, "0")
    monkeypatch.setattr(gemm_select, "ONE_ROW_PARALLEL", 96 * 80)
    assert kernels(*linear(1, 96, 80, act), threads=2) == ["dnnl"]
    assert kernels(*linear(1, 96, 79, act), threads=2) == ["addmm"]
