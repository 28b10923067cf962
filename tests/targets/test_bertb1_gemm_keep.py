"""A constant-weight product lowered on the CPU keeps freed memory for the next run
(`malloc_keep.keep_freed_memory`, as the convolutions do): a large product's fresh result then
reuses the last run's block instead of faulting in new pages; results match numpy."""

from __future__ import annotations

import platform
import resource

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

torch = pytest.importorskip("torch")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import malloc_keep  # noqa: E402


def logits_model(rows: int, k: int, n: int) -> tuple[onnx.ModelProto, np.ndarray]:
    """x (1, rows, k) @ W (k, n): a language model's head, its weight fixed."""
    w = np.random.default_rng(0).standard_normal((k, n), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, rows, n])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w


def test_weight_product_keeps_freed_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    if not malloc_keep.enabled():
        pytest.skip("PGX_CPU_KEEP_FREED=0 in this environment")
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc: malloc's thresholds cannot be set")
    monkeypatch.setattr(malloc_keep, "_state", {})  # as if nothing had set it yet
    model, w = logits_model(64, 32, 40_000)  # a 10 MB result
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=1))
    assert malloc_keep._state.get("done"), "lowering the product kept freed memory"
    x = np.random.default_rng(1).standard_normal((1, 64, 32), dtype=np.float32)
    want = x @ w
    for _ in range(2):
        (y,) = prog.run({"x": x})
        del y
    faults = []
    for _ in range(6):  # the heap settles after a few runs (where earlier blocks lie)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        (y,) = prog.run({"x": x})
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-3)
        del y
        if faults[-1] < 500:
            break
    # a fresh 10 MB block faults in ~2,500 pages every run; a reused one none (a few elsewhere)
    assert min(faults) < 500, faults
