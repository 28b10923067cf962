"""An encoder's last layer norm and the masked token sum of mean pooling as one native step
(`torch_lowering/norm_pool.py`, `layernorm.c`'s `ln_pool_f32`, helper norms18): the kernel
against float64 numpy (odd hidden sizes, masks with zeros, 1 and 2 threads); whole programs
(a residual block, its norm, sentence-transformers' mean pooling, with and without the L2
normalisation) against ONNX Runtime, batch 1 and 3, 1 and 2 threads, masks with zeros and a
sentence masked out entirely; the step must have been taken (or not, where the pattern does not
hold); `PGX_CPU_NORM_POOL=0` keeps the old steps."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import native_layernorm, norm_pool  # noqa: E402
from tests.helpers import make_model  # noqa: E402

RNG = np.random.default_rng(1818)


def _native_or_skip() -> None:
    try:
        native_layernorm.library()
    except native.NativeUnavailable as exc:
        pytest.skip(str(exc))


def _mask(batch: int, tokens: int) -> np.ndarray:
    """Ones then zeros per sentence (padding), a zero inside one, one sentence all zeros
    where batch > 2."""
    m = np.zeros((batch, tokens), np.int64)
    for b in range(batch):
        m[b, : max(1, tokens - 3 * b - 1)] = 1
    m[0, tokens // 2] = 0
    if batch > 2:
        m[2] = 0
    return m


def _reference(x, mask, w, b, eps):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return (y * mask[..., None]).sum(1)


@pytest.mark.parametrize("dims", [(1, 7, 45), (3, 33, 83), (8, 128, 384), (2, 5, 16), (3, 4, 1)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("affine", [True, False])
def test_kernel_against_float64(dims, threads, affine) -> None:
    _native_or_skip()
    B, T, N = dims
    x = (RNG.standard_normal(dims) * 3 + 1).astype(np.float32)
    mask = _mask(B, T).astype(np.float32)
    mask[0, 0] = 0.5  # any value, not only 0 / 1
    w = (1 + RNG.standard_normal(N) / 4).astype(np.float32) if affine else None
    b = RNG.standard_normal(N).astype(np.float32) if affine else None
    out = torch.full((B, 1, N), float("nan"))
    pool = norm_pool.Pool(dims, None if w is None else torch.from_numpy(w),
                          None if b is None else torch.from_numpy(b), 1e-5, out)  # fmt: skip
    xt, mt = torch.from_numpy(x), torch.from_numpy(mask).reshape(B, T, 1)
    for _ in range(2):  # (the sums start from zero each call)
        got = pool(xt, mt, threads)
        assert got.data_ptr() == out.data_ptr()
        want = _reference(x, mask, w, b, 1e-5)
        np.testing.assert_allclose(got.numpy().reshape(B, N), want, rtol=2e-5, atol=2e-5 * T)
    fresh = norm_pool.Pool(dims, None, None, 1e-5, None)(xt, mt, threads)
    np.testing.assert_allclose(fresh.numpy().reshape(B, N), _reference(x, mask, None, None, 1e-5),
                               rtol=2e-5, atol=2e-5 * T)  # fmt: skip


@pytest.mark.parametrize("dims", [(1, 7, 45), (3, 33, 83), (8, 128, 384), (3, 4, 1)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("l2", [False, True])
def test_kernel_mean_from_int64_mask(dims, threads, l2) -> None:
    """The tail taken in: the int64 mask read as it is, the sum divided by max(count, clamp)
    (a sentence masked out entirely: 0 / clamp), and with `l2` the L2 normalisation."""
    _native_or_skip()
    B, T, N = dims
    x = (RNG.standard_normal(dims) * 3 + 1).astype(np.float32)
    mask = _mask(B, T)
    w = (1 + RNG.standard_normal(N) / 4).astype(np.float32)
    b = RNG.standard_normal(N).astype(np.float32)
    out = torch.full((B, N), float("nan"))
    pool = norm_pool.Pool(dims, torch.from_numpy(w), torch.from_numpy(b), 1e-5, out,
                          clamp=1e-9, mask_i64=True, l2eps=1e-12 if l2 else None)  # fmt: skip
    for _ in range(2):
        got = pool(torch.from_numpy(x), torch.from_numpy(mask), threads)
        assert got.data_ptr() == out.data_ptr()
        count = np.maximum(mask.sum(1, keepdims=True).astype(np.float64), 1e-9)
        want = _reference(x, mask.astype(np.float64), w, b, 1e-5) / count
        if l2:
            want = want / np.maximum(np.sqrt((want * want).sum(1, keepdims=True)), 1e-12)
        np.testing.assert_allclose(got.numpy(), want, rtol=2e-5, atol=2e-5)
    with pytest.raises(RuntimeError, match="not as lowered"):  # a float mask: not as lowered
        pool(torch.from_numpy(x), torch.from_numpy(mask).float(), threads)


def test_kernel_checks_its_inputs() -> None:
    _native_or_skip()
    pool = norm_pool.Pool((2, 5, 16), None, None, 1e-5, None)
    with pytest.raises(ValueError, match="out must be"):
        norm_pool.Pool((2, 5, 16), None, None, 1e-5, torch.empty(2, 16), clamp=None)
    with pytest.raises(RuntimeError, match="not as lowered"):
        pool(torch.zeros(2, 5, 17), torch.zeros(2, 5, 1), 1)
    with pytest.raises(RuntimeError, match="not as lowered"):
        pool(torch.zeros(2, 5, 16), torch.zeros(2, 5, 1, dtype=torch.float64), 1)


D, F = 45, 83  # not multiples of 16


def encoder_pool(batch: int, tokens: int, normalize: bool, expose: str = "",
                 mask_first: bool = False) -> tuple:  # fmt: skip
    """A post-norm FFN block (h -> relu(h w0 + b0) w1 + b1 + h, the residual sum a product
    step makes each run, as MiniLM's last FFN-down), its LayerNormalization, then
    sentence-transformers' pooling: (y * mask).sum(1) / clamp(mask.sum(1), 1e-9), and where
    `normalize` the L2 normalisation. `expose="y"`: the norm's output returned too (no fused
    step: the norm's affine part is not the pooling's alone); `"count"`: the mask's count
    returned too (the step, without the mean's tail). `mask_first`: the float mask also
    multiplies the block's input (made before the block and read elsewhere: the step reads
    the float mask, no tail)."""
    h = RNG.standard_normal((batch, tokens, D)).astype(np.float32)
    mask = _mask(batch, tokens)
    inits = {
        "w0": (RNG.standard_normal((D, F)) / 6).astype(np.float32),
        "b0": RNG.standard_normal(F).astype(np.float32),
        "w1": (RNG.standard_normal((F, D)) / 9).astype(np.float32),
        "b1": RNG.standard_normal(D).astype(np.float32),
        "g": (1 + RNG.standard_normal(D) / 4).astype(np.float32),
        "be": RNG.standard_normal(D).astype(np.float32),
        "ax1": np.array([1], np.int64),
        "axm": np.array([-1], np.int64),
        "tiny": np.array(1e-9, np.float32),
        "l2eps": np.array(1e-12, np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["h", "w0"], ["m0"]),
        helper.make_node("Add", ["m0", "b0"], ["p0"]),
        helper.make_node("Relu", ["p0"], ["r0"]),
        helper.make_node("MatMul", ["r0", "w1"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["p1"]),
        helper.make_node("Add", ["p1", "h"], ["x"]),
        helper.make_node("LayerNormalization", ["x", "g", "be"], ["y"], axis=-1, epsilon=1e-12),
        helper.make_node("Unsqueeze", ["mask", "axm"], ["mu"]),
        helper.make_node("Cast", ["mu"], ["mf"], to=1),
        helper.make_node("Mul", ["y", "mf"], ["ym"]),
        helper.make_node("ReduceSum", ["ym", "ax1"], ["s"], keepdims=0),
        helper.make_node("ReduceSum", ["mf", "ax1"], ["c"], keepdims=0),
        helper.make_node("Max", ["c", "tiny"], ["cc"]),
        helper.make_node("Div", ["s", "cc"], ["pooled"]),
    ]
    out = "pooled"
    if normalize:
        nodes += [
            helper.make_node("Mul", ["pooled", "pooled"], ["sq"]),
            helper.make_node("ReduceSum", ["sq", "axm"], ["ss"], keepdims=1),
            helper.make_node("Sqrt", ["ss"], ["nrm"]),
            helper.make_node("Max", ["nrm", "l2eps"], ["nn"]),
            helper.make_node("Div", ["pooled", "nn"], ["emb"]),
        ]
        out = "emb"
    if mask_first:
        nodes = nodes[7:9] + [helper.make_node("Mul", ["h", "mf"], ["hm"])] + nodes[:7] + nodes[9:]
        nodes[3].input[0] = "hm"  # MatMul(hm, w0)
    outputs = [out] + ([expose] if expose in ("y", "c", "pooled") else [])
    return make_model(nodes, {"h": h, "mask": mask}, outputs, inits, opset=18), h, mask


def _run(model, h, mask, threads: int) -> tuple[int, int, int]:
    """The program against ORT over three runs (other inputs between); the number of fused
    norm + pooling steps its lowering made, of those with the mean's tail, and with the L2
    normalisation."""
    data = model.SerializeToString()
    sess = ort.InferenceSession(data)
    prog = pygraphx.parse_onnx_buffer(data)
    prog.compile(CpuTarget(threads=threads))
    other = np.ascontiguousarray(h[:, ::-1]) * 0.5
    mask2 = mask.copy()
    mask2[:, 0] = 1
    for feed_h, feed_m in ((h, mask), (other, mask2), (h, mask)):
        feeds = {"h": feed_h, "mask": feed_m}
        want = sess.run(None, feeds)
        got = prog.run(feeds)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(g), w, rtol=2e-5, atol=2e-5)
    cache = prog._executable.lowered.ctx.cache
    return (cache.get(norm_pool.BLOCKS, 0), cache.get(norm_pool.TAILS, 0),
            cache.get(norm_pool.L2S, 0))  # fmt: skip


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("normalize", [False, True])
def test_pooling_against_ort(batch, threads, normalize) -> None:
    _native_or_skip()
    assert _run(*encoder_pool(batch, 19, normalize), threads) == (1, 1, int(normalize))


@pytest.mark.parametrize("threads", [1, 2])
def test_mask_made_before_the_block(threads) -> None:
    _native_or_skip()
    assert _run(*encoder_pool(3, 19, True, mask_first=True), threads) == (1, 0, 0)


def test_count_returned_keeps_its_steps() -> None:
    _native_or_skip()
    assert _run(*encoder_pool(3, 19, True, expose="c"), 2) == (1, 0, 0)


def test_switch_keeps_old_steps(monkeypatch) -> None:
    _native_or_skip()
    monkeypatch.setenv(norm_pool.ENV, "0")
    assert _run(*encoder_pool(3, 19, True), 2) == (0, 0, 0)


def test_norm_output_returned_is_not_fused() -> None:
    _native_or_skip()
    assert _run(*encoder_pool(3, 19, True, expose="y"), 2) == (0, 0, 0)


def test_mean_returned_keeps_the_l2_steps() -> None:
    """The mean before the L2 normalisation returned too: the step writes the mean, the L2
    normalisation stays."""
    _native_or_skip()
    assert _run(*encoder_pool(3, 19, True, expose="pooled"), 2) == (1, 1, 0)
