"""A float32 norm's native kernel writing its arena slot (`layernorm._slot`, helper gpt16):
the kernel with `out` against float64 torch; pre-norm blocks (GPT-2's shape: the residual read
again after the norm) against ONNX Runtime, batch 1 and 3, 1 and 2 threads, with a norm's
result read late (after later norms and products, so a reused slot would show), returned, or
the norm's input read after it; `PGX_CPU_LAYERNORM_SLOT=0` keeps new tensors."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import layernorm, native_layernorm  # noqa: E402
from tests.helpers import make_model  # noqa: E402

RNG = np.random.default_rng(1616)
D, F = 45, 83  # not multiples of 16
GEN = torch.Generator().manual_seed(1616)


def _native_or_skip() -> None:
    try:
        native_layernorm.library()
    except native.NativeUnavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("dims", [(37, 45), (3, 7, 83), (1, 128, 768)])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_into_out_against_float64(monkeypatch, dims, threads) -> None:
    _native_or_skip()
    monkeypatch.setattr(native_layernorm, "get_num_threads", lambda: threads)
    n = dims[-1]
    x = torch.randn(dims, generator=GEN) * 3 + 1
    w, b = torch.randn(n, generator=GEN), torch.randn(n, generator=GEN)
    want = torch.nn.functional.layer_norm(x.double(), (n,), w.double(), b.double(), eps=1e-5)
    out = torch.full(dims, float("nan"))
    norm = native_layernorm.LayerNorm(dims, w, b, 1e-5, out=out)
    for _ in range(2):
        got = norm(x)
        assert got.data_ptr() == out.data_ptr()
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    strided = torch.randn(dims[0], 2 * n, generator=GEN)[:, :n]  # torch's kernel, into out
    want2 = torch.layer_norm(strided, (n,), w, b, 1e-5)
    norm2 = native_layernorm.LayerNorm(strided.shape, w, b, 1e-5, out=torch.empty(strided.shape))
    torch.testing.assert_close(norm2(strided), want2)


def test_out_is_checked() -> None:
    _native_or_skip()
    with pytest.raises(ValueError, match="out must be"):
        native_layernorm.LayerNorm((4, 8), None, None, 1e-5, out=torch.empty(4, 9))
    with pytest.raises(ValueError, match="out must be"):
        native_layernorm.LayerNorm((4, 8), None, None, 1e-5, copy=True, out=torch.empty(4, 8))


def pre_norm(batch: int, expose: str = "") -> tuple:
    """Two pre-norm blocks (GPT-2's order): a = LN(x); h1 = x + a @ w1 + b1; c = LN(h1);
    h2 = h1 + gelu(c @ w2 + b2) @ w3 + b3; out = LN(h2) @ w4. `expose="late"`: out + a @ w1
    (a read after every other norm and product); `"a"`: a returned too; `"input"`: out + h1
    (a norm's input read after it, as GPT-2's residual is)."""
    x = RNG.standard_normal((batch, 7, D)).astype(np.float32)
    inits = {
        "g": (1 + RNG.standard_normal(D) / 4).astype(np.float32),
        "be": RNG.standard_normal(D).astype(np.float32),
        "w1": (RNG.standard_normal((D, D)) / 6).astype(np.float32),
        "b1": RNG.standard_normal(D).astype(np.float32),
        "w2": (RNG.standard_normal((D, F)) / 6).astype(np.float32),
        "b2": RNG.standard_normal(F).astype(np.float32),
        "w3": (RNG.standard_normal((F, D)) / 9).astype(np.float32),
        "b3": RNG.standard_normal(D).astype(np.float32),
        "w4": (RNG.standard_normal((D, D)) / 6).astype(np.float32),
    }
    ln = "LayerNormalization"
    nodes = [
        helper.make_node(ln, ["x", "g", "be"], ["a"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["a", "w1"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["p1"]),
        helper.make_node("Add", ["x", "p1"], ["h1"]),
        helper.make_node(ln, ["h1", "g", "be"], ["c"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["c", "w2"], ["m2"]),
        helper.make_node("Add", ["m2", "b2"], ["p2"]),
        helper.make_node("Gelu", ["p2"], ["u"]),
        helper.make_node("MatMul", ["u", "w3"], ["m3"]),
        helper.make_node("Add", ["m3", "b3"], ["p3"]),
        helper.make_node("Add", ["h1", "p3"], ["h2"]),
        helper.make_node(ln, ["h2", "g", "be"], ["e"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["e", "w4"], ["out"]),
    ]
    outputs = ["out"]
    if expose == "late":
        nodes += [helper.make_node("MatMul", ["a", "w1"], ["m5"]),
                  helper.make_node("Add", ["out", "m5"], ["late"])]  # fmt: skip
        outputs = ["late"]
    elif expose == "a":
        outputs.append("a")
    elif expose == "input":
        nodes.append(helper.make_node("Add", ["out", "h1"], ["late"]))
        outputs = ["late"]
    return make_model(nodes, {"x": x}, outputs, inits, opset=20), x


def _run(monkeypatch, model, x, threads: int) -> list[bool]:
    """The program against ORT over three runs (another input between: a stale slot shows);
    returns which norms took a slot."""
    took: list[bool] = []
    real = layernorm._slot

    def spy(*args):
        out = real(*args)
        took.append(out is not None)
        return out

    monkeypatch.setattr(layernorm, "_slot", spy)
    data = model.SerializeToString()
    sess = ort.InferenceSession(data)
    prog = pygraphx.parse_onnx_buffer(data)
    prog.compile(CpuTarget(threads=threads))
    for feed in (x, x[::-1].copy() * 0.5, x):
        want = sess.run(None, {"x": feed})
        got = prog.run({"x": feed})
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(g), w, rtol=3e-5, atol=3e-5)
    return took


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("expose", ["", "late", "a", "input"])
def test_pre_norm_blocks_against_ort(monkeypatch, batch, threads, expose) -> None:
    _native_or_skip()
    took = _run(monkeypatch, *pre_norm(batch, expose), threads)
    assert len(took) == 3
    # the first two norms' results feed products only (or are read late, or returned: "a")
    assert took[1], took
    assert took[0] == (expose != "a"), took


def test_post_norm_residual_keeps_its_new_tensor(monkeypatch) -> None:
    """A post-norm block's first norm feeds the next residual sum too: no slot, so that sum
    still accumulates into it (`test_gemm14_residual`); against ORT."""
    _native_or_skip()
    from tests.targets.test_gemm14_residual import block

    took = _run(monkeypatch, *block(3), 2)
    assert took == [False, False, False], took  # the other two write over their sums


def test_switch_keeps_new_tensors(monkeypatch) -> None:
    _native_or_skip()
    monkeypatch.setenv(native_layernorm.SLOT_ENV, "0")
    took = _run(monkeypatch, *pre_norm(3), 2)
    assert took == [False, False, False]
