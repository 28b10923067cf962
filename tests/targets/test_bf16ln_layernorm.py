"""oneDNN's layer-normalisation primitive for the cpu target's fused norms
(`onednn_layernorm.py`): float32 and directly-bf16 outputs against torch's `F.layer_norm`, the
fallback for inputs it does not take, and the fused step in float32 and bf16 programs against
numpy / ONNX Runtime, with `PGX_CPU_LAYERNORM=torch` as the other kernel."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from onnx import helper

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import onednn_layernorm  # noqa: E402
from pygraphx.targets.torch_lowering.onednn_layernorm import KERNEL_ENV, LayerNorm  # noqa: E402
from tests.helpers import make_model  # noqa: E402
from tests.targets.test_cpu_transformer_fusions import layernorm_model  # noqa: E402

needs_onednn = pytest.mark.skipif(
    not onednn_layernorm.wanted(), reason="oneDNN's C API library is not loaded"
)
GEN = torch.Generator().manual_seed(5)


def _data(dims: tuple[int, ...], affine: tuple[bool, bool]):
    x = torch.randn(dims, generator=GEN) * 3 + 1
    n = dims[-1]
    w = torch.randn(n, generator=GEN) if affine[0] else None
    b = torch.randn(n, generator=GEN) if affine[1] else None
    return x, w, b


@needs_onednn
@pytest.mark.parametrize("dims", [(2, 7, 32), (128, 768), (1, 3, 5, 48)])
@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_primitive_matches_torch(dims, affine, out) -> None:
    x, w, b = _data(dims, affine)
    norm = LayerNorm({}, dims, w, b, 1e-5, out)
    got = norm(x)
    want = torch.nn.functional.layer_norm(x.double(), (dims[-1],), *(
        None if t is None else t.double() for t in (w, b)), eps=1e-5)  # fmt: skip
    assert got.dtype == out and got.shape == dims and got.is_contiguous()
    if out == torch.float32:
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    else:  # one rounding of the float32 result: within half a bf16 step (+ float32 error)
        err = (got.double() - want).abs()
        assert bool((err <= want.abs() * 2.0**-8 + 1e-5).all()), float(err.max())
        assert not bool(torch.equal(got.double(), torch.zeros_like(want)))


@needs_onednn
def test_primitives_are_shared_and_inputs_it_does_not_take_fall_back(caplog) -> None:
    dims = (4, 6, 40)
    x, w, b = _data(dims, (True, True))
    table: dict = {}
    first, second = LayerNorm(table, dims, w, b, 1e-6, torch.float32), LayerNorm(
        table, dims, w * 2, b, 1e-6, torch.float32)  # fmt: skip
    want = torch.nn.functional.layer_norm(x, (40,), w, b, 1e-6)
    torch.testing.assert_close(first(x), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(second(x), torch.nn.functional.layer_norm(x, (40,), w * 2, b,
                               1e-6), rtol=1e-5, atol=1e-5)  # fmt: skip
    assert len(table) == 1  # one primitive for both norms (same shape, type, eps, threads)
    strided = torch.randn(4, 40, 6, generator=GEN).transpose(1, 2)
    with caplog.at_level(logging.WARNING, logger="pygraphx.cpu"):
        got = first(strided)
        first(strided)
    torch.testing.assert_close(got, torch.nn.functional.layer_norm(strided, (40,), w, b, 1e-6))
    said = [r for r in caplog.records if "not contiguous" in r.getMessage()]
    assert len(said) == 1


def _compile(model, monkeypatch, kernel: str, bf16: bool = False) -> pygraphx.Program:
    monkeypatch.setenv(KERNEL_ENV, kernel)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    if bf16:
        pygraphx.quantize_bf16(prog)
    prog.compile(CpuTarget())
    return prog


@needs_onednn
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
def test_fused_float32_norm_stays_on_torch_and_matches_numpy(affine, monkeypatch) -> None:
    model, feeds, want = layernorm_model(affine, residual=True)
    runs = _spy(monkeypatch)
    for kernel in ("onednn", "torch"):
        prog = _compile(model, monkeypatch, kernel)
        assert prog._executable.layernorm_blocks == 1
        got = np.array(prog.run(feeds)[0])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=kernel)
    assert not runs  # a float32 result is torch's (no faster on oneDNN in a model)


def _spy(monkeypatch) -> list:
    """A list that gets one entry at every run of a oneDNN layer-norm primitive."""
    runs: list = []
    real = onednn_layernorm.Primitive.run
    monkeypatch.setattr(onednn_layernorm.Primitive, "run", lambda *a: runs.append(1) or real(*a))
    return runs


def _bf16_block(post_norm: bool):
    """A transformer's norm between products: x + r -> LayerNorm -> MatMul, the norm's output
    also added to the product (post-norm, BERT's: float32 output plus a bf16 copy) or feeding
    only the product (pre-norm, GPT-2's: rounded straight to bf16). The output has more than
    `quantize_bf16`'s small-head limit of values, so the product is bf16."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 128, 160)).astype(np.float32) * 2
    r = rng.standard_normal((4, 128, 160)).astype(np.float32)
    inits = {
        "g": rng.standard_normal(160).astype(np.float32),
        "beta": rng.standard_normal(160).astype(np.float32),
        "w": (rng.standard_normal((160, 160)) / 12).astype(np.float32),
    }
    nodes = [
        helper.make_node("Add", ["x", "r"], ["s"]),
        helper.make_node("LayerNormalization", ["s", "g", "beta"], ["n"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["n", "w"], ["p"]),
    ]
    if post_norm:
        nodes.append(helper.make_node("Add", ["p", "n"], ["y"]))
    out = "y" if post_norm else "p"
    feeds = {"x": x, "r": r}
    return make_model(nodes, feeds, [out], inits), feeds


@needs_onednn
@pytest.mark.parametrize("post_norm", [True, False], ids=["post_norm", "pre_norm"])
def test_bf16_block_matches_ort_as_closely_on_both_kernels(post_norm, monkeypatch) -> None:
    model, feeds = _bf16_block(post_norm)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)[0].astype(np.float64)
    errors, runs = {}, _spy(monkeypatch)
    # (the pre-norm block's bf16-only norm would otherwise take the native kernel: gemm15)
    monkeypatch.setenv("PGX_CPU_LAYERNORM_NATIVE_BF16", "0")
    for kernel in ("onednn", "torch"):
        prog = _compile(model, monkeypatch, kernel, bf16=True)
        assert prog._executable.layernorm_blocks == 1
        before = len(runs)
        got = np.array(prog.run(feeds)[0]).astype(np.float64)
        # the primitive runs for the pre-norm block's bf16 result only (see layernorm._kernel)
        assert len(runs) - before == (kernel == "onednn" and not post_norm)
        errors[kernel] = np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2))
    assert errors["onednn"] < 1e-2, errors
    assert errors["onednn"] <= errors["torch"] * 1.05 + 1e-6, errors
