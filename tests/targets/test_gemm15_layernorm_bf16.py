"""A float32 layer norm whose result is only rounded to bf16 (a pre-norm transformer's in a bf16
program, GPT-2's) on the native kernel's bf16-only pass (`native_layernorm.LayerNorm(only_copy=
True)`, helper gemm15): against the same kernel's float32 + copy pass (bitwise), torch, and in a
block against ONNX Runtime float32 as closely as oneDNN's primitive (`PGX_CPU_LAYERNORM_NATIVE_BF16
=0`). Odd widths (tails), 1 and 2 threads, batch 1 and 4."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import native_layernorm, onednn_layernorm  # noqa: E402
from tests.targets.test_bf16ln_layernorm import _bf16_block  # noqa: E402

pytestmark = pytest.mark.skipif(
    not native_layernorm.available(True), reason="needs the native layer norm with AVX-512 BF16"
)


@pytest.fixture(params=[1, 2])
def threads(request: pytest.FixtureRequest):
    """The thread count the kernels see (torch's, which they read when built and run)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("dims", [(1, 7, 45), (3, 128, 768), (5, 33)])
@pytest.mark.parametrize("affine", [True, False])
def test_bf16_only_matches_the_copy_pass(dims, affine: bool, threads: int) -> None:
    torch.manual_seed(len(dims) + dims[-1])
    n = dims[-1]
    x = torch.randn(dims) * 3 + 1
    w, b = (torch.randn(n), torch.randn(n)) if affine else (None, None)
    only = native_layernorm.LayerNorm(tuple(dims), w, b, 1e-5, True, False, only_copy=True)
    both = native_layernorm.LayerNorm(tuple(dims), w, b, 1e-5, True)
    x_in = x.clone()
    got = only(x_in)
    torch.testing.assert_close(x_in, x, rtol=0, atol=0)  # the input is not written
    assert got.dtype == torch.bfloat16 and tuple(got.shape) == tuple(dims)
    y, yb = both(x.clone())
    assert torch.equal(got, yb)
    want = torch.layer_norm(x.double(), (n,), None if w is None else w.double(),
                            None if b is None else b.double(), 1e-5)  # fmt: skip
    torch.testing.assert_close(got.double(), want, rtol=8e-3, atol=8e-3)


def test_only_copy_needs_copy() -> None:
    with pytest.raises(ValueError, match="only_copy"):
        native_layernorm.LayerNorm((2, 16), None, None, 1e-5, False, only_copy=True)


@pytest.mark.skipif(not onednn_layernorm.wanted(), reason="needs oneDNN's C API library")
def test_pre_norm_block_against_ort(monkeypatch) -> None:
    """The pre-norm block's norm takes the native pass (oneDNN's primitive does not run), and
    its error against ORT is no larger than with the primitive."""
    model, feeds = _bf16_block(post_norm=False)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0].astype(np.float64)
    runs: list = []
    real = onednn_layernorm.Primitive.run
    monkeypatch.setattr(onednn_layernorm.Primitive, "run", lambda *a: runs.append(1) or real(*a))
    errors = {}
    for setting in ("1", "0"):
        monkeypatch.setenv(native_layernorm.BF16_ENV, setting)
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        pygraphx.quantize_bf16(prog)
        prog.compile(CpuTarget(threads=2))
        before = len(runs)
        got = np.array(prog.run(feeds)[0]).astype(np.float64)
        again = np.array(prog.run(feeds)[0]).astype(np.float64)
        np.testing.assert_array_equal(got, again)
        assert (len(runs) - before > 0) == (setting == "0")
        errors[setting] = np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2))
    assert errors["1"] < 1e-2
    assert errors["1"] <= errors["0"] * 1.05 + 1e-6, errors
