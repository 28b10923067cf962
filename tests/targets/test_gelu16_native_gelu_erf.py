"""GELU's erf form as a native pass over a float32 product (`native_gelu.GeluErf`,
`native/kernels/vmath.h`'s `vm_gelu_erf_ps`; helper gelu16): the kernel against float64
`x * erfc(-x / sqrt 2) / 2` on a dense grid, every float32 of the tail's binades, odd sizes
(tails that are not a multiple of 16), vectors of mixed and of small values (both forms), 1 and 2
threads, inf / NaN; models `gelu(x @ w + b)` (ONNX Gelu and the decomposed erf pattern BERT
exports) against ONNX Runtime, float32 and bf16, batch 1 and 3, the pass taken and switched off."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import gemm_kernels, native_gelu, onednn_linear  # noqa: E402
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
    """x Phi(x) in float64, Phi from erfc: relative accuracy in the tail (torch's float64
    `gelu` and `ndtr` compute 1 + erf and lose it below x = -8)."""
    x = x.double()
    return x * 0.5 * torch.special.erfc(-x / np.sqrt(2.0))


def check(x: torch.Tensor, got: torch.Tensor) -> None:
    want = reference(x)
    assert got.dtype == torch.float32
    live = want.abs() > 1e-37  # (below: denormal results)
    rel = ((got.double() - want).abs() / want.abs().clamp_min(1e-300))[live]
    # relative everywhere, growing with gelu's own condition number (~x^2) in the tail
    bound = 1e-6 * (x.double()[live] ** 2 / 4).clamp_min(1)
    assert bool((rel <= bound).all()), float((rel / bound).max())
    # within 20 float32 units where the value is not small
    big = want.abs() > 1e-3
    if not bool(big.any()):
        return
    ulp = torch.from_numpy(np.spacing(want[big].abs().float().numpy())).double()
    assert float(((got.double()[big] - want[big]).abs() / ulp).max()) <= 20


def test_kernel_dense_grid() -> None:
    x = torch.linspace(-16, 16, 2_000_001, dtype=torch.float64).float()
    check(x, native_gelu.GeluErf()(x.clone()))


def test_kernel_every_tail_float() -> None:
    """Every 5th float32 in [-13, -1.5] and [1.5, 6] (the tail form, whole vectors of it)."""
    lo = np.arange(np.float32(-13).view(np.int32), np.float32(-1.5).view(np.int32), -5)
    pieces = [np.arange(np.float32(1.5).view(np.int32), np.float32(6).view(np.int32), 5), lo]
    x = torch.from_numpy(np.concatenate(pieces).astype(np.int32).view(np.float32).copy())
    check(x, native_gelu.GeluErf()(x.clone()))


def test_kernel_small_vectors() -> None:
    """Vectors of values in (-1.5, 2): the central form; 16 of each in a vector."""
    x = torch.linspace(-1.5, 2, 1_600_001)[1:-1].contiguous()
    x = x[: x.numel() // 16 * 16]
    check(x, native_gelu.GeluErf()(x.clone()))


@pytest.mark.parametrize("n", [1, 15, 17, 4096, 4097, 3 * 4096 + 5, 128 * 3072])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_sizes_and_threads(monkeypatch, n: int, threads: int) -> None:
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    torch.manual_seed(n)
    x = torch.randn(n) * torch.tensor([0.5, 3.0]).repeat((n + 1) // 2)[:n]
    x[: min(n, 4)] = torch.tensor([-13.0, 30.0, 0.0, -1e-8])[: min(n, 4)]
    got = native_gelu.GeluErf()(x.clone())
    check(x, got)
    # and torch's float32 gelu where it is accurate (|y| not small)
    want = torch.nn.functional.gelu(x)
    keep = want.abs() > 0.05
    torch.testing.assert_close(got[keep], want[keep], rtol=2e-6, atol=1e-6)


def test_kernel_in_place_and_special_values() -> None:
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 100.0, -100.0, -0.0, 0.0,
                      -14.0, -20.0] + [1.0] * 7)  # fmt: skip
    fn = native_gelu.GeluErf()
    y = fn(x)
    assert y.data_ptr() == x.data_ptr()
    # nan, inf (x Phi(x) -> inf; torch's float32 vector path gives nan), 0 (the limit; torch
    # nan), 100, 0 (-100 Phi(-100) underflows), -0, 0, a denormal, 0
    assert torch.isnan(y[0]) and y[1] == float("inf") and y[2] == 0 and y[3] == 100.0
    assert y[4] == 0 and y[5] == 0 and torch.signbit(y[5]) and y[6] == 0
    assert -1e-42 < float(y[7]) < 0 and y[8] == 0
    with pytest.raises(ValueError, match="dense float32"):
        fn(torch.randn(4, 6).t())
    with pytest.raises(ValueError, match="dense float32"):
        fn(torch.randn(8, dtype=torch.float64))


def ffn(batch: int, decomposed: bool, k: int = 45, n: int = 83) -> tuple:
    rng = np.random.default_rng(16)
    x = rng.standard_normal((batch, 7, k)).astype(np.float32)
    inits = {
        "w": (rng.standard_normal((k, n)) / 3).astype(np.float32),
        "w2": (rng.standard_normal((n, k)) / 9).astype(np.float32),
        "w3": (rng.standard_normal((k, 5)) / 7).astype(np.float32),
        "b": (rng.standard_normal(n) - 1).astype(np.float32),  # (many values below -1.5)
        "sqrt2": np.array(np.sqrt(2), np.float32),
        "one": np.array(1, np.float32),
        "half": np.array(0.5, np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
    ]
    if decomposed:  # as torch exports BERT's GELU: 0.5 a (1 + erf(a / sqrt 2))
        nodes += [
            helper.make_node("Div", ["a", "sqrt2"], ["d"]),
            helper.make_node("Erf", ["d"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["e1"]),
            helper.make_node("Mul", ["a", "e1"], ["p"]),
            helper.make_node("Mul", ["p", "half"], ["g"]),
        ]
    else:
        nodes.append(helper.make_node("Gelu", ["a"], ["g"]))
    # (an FFN-down product after it, and a head: `quantize_bf16` keeps a product that feeds
    # only the outputs in float32, and then the GELU's group would convert to float32)
    nodes.append(helper.make_node("MatMul", ["g", "w2"], ["h"]))
    nodes.append(helper.make_node("MatMul", ["h", "w3"], ["y"]))
    return make_model(nodes, {"x": x}, ["y"], inits, opset=20), x


@pytest.mark.skipif(not onednn_linear.available(), reason="needs oneDNN's C API library")
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("on", [True, False, "erf_off", "bf16_off"])
@pytest.mark.parametrize("decomposed", [False, True])
@pytest.mark.parametrize("bf16", [False, True])
def test_model_against_ort(monkeypatch, batch: int, on, decomposed: bool, bf16: bool) -> None:
    if bf16 and not gemm_kernels.cpu_has_bf16():
        pytest.skip("needs a processor with bf16 products")
    if on is False:
        monkeypatch.setenv(native_gelu.ENV, "0")
    elif on == "erf_off":
        monkeypatch.setenv(native_gelu.ERF_ENV, "0")
    elif on == "bf16_off":
        monkeypatch.setenv(native_gelu.BF16_ENV, "0")
    else:
        monkeypatch.setenv(native_gelu.BF16_ENV, "1")
    calls: dict[str, list] = {"f32": [], "bf16": []}
    for cls, key in ((native_gelu.GeluErf, "f32"), (native_gelu.GeluErfToBf16, "bf16")):

        def counting(self, t, init=cls.__call__, key=key):
            calls[key].append((t.shape, t.dtype))
            return init(self, t)

        monkeypatch.setattr(cls, "__call__", counting)
    model, x = ffn(batch, decomposed)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    if bf16:
        pygraphx.quantize_bf16(prog)
    prog.compile(CpuTarget(threads=2))
    for v in calls.values():
        v.clear()
    for _ in range(2):
        got = prog.run({"x": x})[0]
        if bf16:
            err = np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2))
            assert err < 1e-2
        else:
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    # the pass runs on the float32 product, once a run, where switched on; in a bf16 program
    # on the bf16 product's float32 result (the float32 pass never)
    f32_on, bf16_on = on in (True, "bf16_off"), on is True
    assert len(calls["f32"]) == (2 if f32_on and not bf16 else 0)
    assert len(calls["bf16"]) == (2 if bf16_on and bf16 else 0)
    assert all(dt == torch.float32 for _, dt in calls["bf16"])
    if bf16 and on is True:
        # one rounding as oneDNN's post-op: the error no worse than that route's (a little
        # slack: the same rounding of a slightly different value)
        monkeypatch.setenv(native_gelu.BF16_ENV, "0")
        old = pygraphx.parse_onnx_buffer(model.SerializeToString())
        pygraphx.quantize_bf16(old)
        old.compile(CpuTarget(threads=2))
        y = old.run({"x": x})[0]
        assert err <= np.sqrt(np.mean((y - want) ** 2) / np.mean(want**2)) * 1.05 + 1e-6


def have_bf16_pass() -> bool:
    return have_kernel() and bool(native_gelu._BOUND.get().gelu_bf16_supported())


@pytest.mark.skipif(not have_bf16_pass(), reason="needs AVX512_BF16 (the bf16 pass)")
@pytest.mark.parametrize("n", [1, 17, 4097, 3 * 4096 + 5, 128 * 3072])
@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_pass_rounds_once(monkeypatch, n: int, threads: int) -> None:
    """`GeluErfToBf16`: the float32 pass's value rounded to nearest even (torch's `.bfloat16()`)
    exactly, into a new tensor, except that a denormal value becomes a zero of its sign (the
    instruction, vcvtneps2bf16, flushes them; x < -13.2); the float32 source left as it was."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    torch.manual_seed(n)
    x = torch.randn(n) * 3
    src = x.clone()
    got = native_gelu.GeluErfToBf16()(src)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    assert torch.equal(src, x)
    wide = native_gelu.GeluErf()(x.clone())
    want = torch.where(wide.abs() < torch.finfo(torch.float32).tiny, wide * 0, wide).bfloat16()
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    with pytest.raises(ValueError, match="dense float32"):
        native_gelu.GeluErfToBf16()(torch.randn(4, 6).t())
