"""The native kernels' packed weights under a float64 default dtype (helper tidy17b).

`torch.set_default_dtype(torch.float64)` in the caller's process used to make the packed weights
and biases of `native_mbconv` (`pack_1x1`, `pad_vector`, `pack_dw`; the head's too, through
them) float64 tensors, which the float32 kernels then read as float32: garbage results. Here
a MobileNet-style network (stem, blocks, head) is compiled and run under a float64 default and
compared with ONNX Runtime; the default is restored after each test (a fixture).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pygraphx  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import (  # noqa: E402
    native_mbconv,
    native_mbhead,
)
from tests.helpers import run_ort  # noqa: E402
from tests.targets import test_native_mbconv as mbconv_tests  # noqa: E402
from tests.targets import test_native_mbhead as mbhead_tests  # noqa: E402


def _why(library) -> str | None:  # noqa: ANN001
    try:
        library()
    except native.NativeUnavailable as exc:
        return str(exc)
    return None


_MB = _why(native_mbconv.library)
needs_mbconv = pytest.mark.skipif(_MB is not None, reason=f"native mbconv unavailable: {_MB}")


@pytest.fixture
def float64_default():  # noqa: ANN201
    """A float64 default dtype for the test, the one before restored after it."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def test_packers_make_float32(float64_default) -> None:  # noqa: ANN001
    """Every packer gives float32 (bf16 for the bf16 one) whatever the default dtype, and the
    values of its float32 input."""
    assert torch.get_default_dtype() == torch.float64
    w = torch.randn(20, 7, 1, 1, dtype=torch.float32)
    packed = native_mbconv.pack_1x1(w)
    assert packed.dtype == torch.float32
    block = packed.view(7, 32)  # (N padded to 32: one block of 64 channels, (K, 32))
    assert torch.equal(block[:, :20], w.view(20, 7).t()) and not block[:, 20:].any()
    assert native_mbconv.pack_1x1(w, pad_k=True).dtype == torch.float32
    assert native_mbconv.pack_1x1_bf16(w).dtype == torch.bfloat16
    b = torch.randn(5, dtype=torch.float32)
    padded = native_mbconv.pad_vector(b, 5)
    assert padded.dtype == torch.float32 and torch.equal(padded[:5], b)
    assert native_mbconv.pad_vector(None, 5).dtype == torch.float32
    wd = torch.randn(5, 1, 3, 3, dtype=torch.float32)
    dw = native_mbconv.pack_dw(wd)
    assert dw.dtype == torch.float32 and torch.equal(dw[:, :5], wd.view(5, 9).t())


@needs_mbconv
@pytest.mark.parametrize("stem", ["0", "1"])
def test_blocks_against_ort(
    stem: str, float64_default, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    """`test_native_mbconv`'s five-block network, every block on the kernel, compiled and run
    under a float64 default: ONNX Runtime's result."""
    monkeypatch.setenv(native_mbconv.STEM_ENV, stem)
    model, feeds = mbconv_tests._net(1, 17, mbconv_tests.NET)
    want = run_ort(model, feeds)[0]
    prog = mbconv_tests._compile(model, "all", monkeypatch, 1)
    for _ in range(2):
        np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
    assert prog._executable.lowered.ctx.cache.get("native_mbconv", 0) == len(mbconv_tests.NET)


@needs_mbconv
@pytest.mark.parametrize("nthreads", [1, 2])
def test_stem_blocks_and_head_against_ort(
    nthreads: int, float64_default, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    """`test_native_mbhead`'s network (a stem that is the first block's expansion, a block, the
    head with its classifier and bias) under a float64 default: ONNX Runtime's result, the head
    on the kernel."""
    monkeypatch.delenv(native_mbhead.ENV, raising=False)
    monkeypatch.delenv(native_mbconv.STEM_ENV, raising=False)
    model, feeds = mbhead_tests._net(1, 23)
    want = run_ort(model, feeds)[0]
    prog = mbhead_tests._compile(model, nthreads)
    for _ in range(2):
        np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
    lowered = prog._executable.lowered
    assert lowered.ctx.cache.get("native_mbhead", 0) == 1
    assert lowered.ctx.cache.get("native_mbconv", 0) == 2
