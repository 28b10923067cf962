"""The Winograd convolution kernels (`torch_lowering/winograd.py`, kernels `winograd` = F(4x4,
3x3) and `winograd2` = F(2x2, 3x3)).

Oracles: float64 `F.conv2d` (with the epilogue in float64) for the kernel itself, the direct
1-D correlation for the transform matrices, and ONNX Runtime for compiled models. Error bounds:
relative to the largest output, F(2,3) within 2e-6 and F(4,3) within 3e-5 (direct float32
is about 1e-6 here).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.cpu.threads import LOAD_ADAPT_ENV  # noqa: E402
from pygraphx.targets.torch_lowering import (  # noqa: E402
    conv_choice,
    onednn_bmm,
    onednn_conv,
    winograd,
    winograd_native,
    winograd_rule,
)
from pygraphx.targets.torch_lowering.conv_kernels import (  # noqa: E402
    KERNELS,
    ConvPlan,
    build_kernel,
    kernels_for,
)
from tests.helpers import make_model, run_ort  # noqa: E402

#: relative error bound (max |error| / max |reference|) of each kernel against float64
BOUND = {"winograd": 3e-5, "winograd2": 2e-6}
WINO = list(winograd.KERNEL_TILES)
CL = torch.channels_last


def _plan(x_lens: list[int], k: int, pad: int = 1, **fields: object) -> ConvPlan:
    gen = torch.Generator().manual_seed(sum(x_lens) * 31 + k)
    w = torch.randn(k, x_lens[1], 3, 3, generator=gen)
    return ConvPlan(w, w, list(x_lens), [pad, pad], [1, 1], [1, 1], 1, None, **fields)


def _reference(plan: ConvPlan, x: torch.Tensor, other: torch.Tensor | None) -> torch.Tensor:
    """The plan's convolution and epilogue in float64."""
    xd = x.double()
    if plan.pre_pad is not None:
        xd = F.pad(xd, plan.pre_pad)
    bias = None if plan.bias is None else plan.bias.double()
    y = F.conv2d(xd, plan.weight.double(), bias, 1, plan.padding)
    if other is not None and not plan.add_after:
        y = y + other.double()
    if plan.unary == "relu":
        y = y.relu()
    elif plan.unary == "hardtanh":
        y = y.clamp(*plan.scalars)
    elif plan.unary == "swish":
        y = F.silu(y)
    if other is not None and plan.add_after:
        y = y + other.double()
    return y


def _check(plan: ConvPlan, kernel: str, with_other: bool = False, x_cl: bool = True) -> None:
    n, c, h, w = plan.x_lens
    if plan.pre_pad is not None:
        h -= plan.pre_pad[2] + plan.pre_pad[3]
        w -= plan.pre_pad[0] + plan.pre_pad[1]
    gen = torch.Generator().manual_seed(n + c + h * w)
    x = torch.randn(n, c, h, w, generator=gen)
    if x_cl:
        x = x.contiguous(memory_format=CL)
    ref_plain = _reference(plan, x, None)  # for the result's lens
    other = torch.randn(ref_plain.shape, generator=gen) if with_other else None
    if other is not None:
        plan.other = 0
    ref = _reference(plan, x, other)
    get_other = None if other is None else (lambda: other)
    y = build_kernel(plan, kernel, lambda: x, get_other)()
    assert y.shape == ref.shape
    assert y.dtype == torch.float32 and y.is_contiguous(memory_format=CL)
    err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
    assert err < BOUND[kernel], f"{kernel}: relative error {err:.2e}"


@pytest.mark.parametrize("kernel", WINO)
@pytest.mark.parametrize(
    "x_lens, k, pad",
    [
        ([1, 16, 16, 16], 8, 1),  # whole tiles
        ([1, 8, 9, 11], 5, 1),  # tiles overhang the image on both sides
        ([3, 16, 14, 13], 24, 0),  # several images, no padding
        ([2, 32, 7, 7], 16, 1),  # ResNet's last stage, batched
        ([1, 3, 3, 3], 4, 0),  # one output
        ([2, 4, 5, 6], 3, 2),  # padding 2 (outputs larger than the input)
        ([3, 32, 40, 40], 48, 1),  # YOLO-sized: two chunks of whole images (F(4,3))
    ],
)
def test_matches_float64_conv(kernel: str, x_lens: list[int], k: int, pad: int) -> None:
    _check(_plan(x_lens, k, pad), kernel)


@pytest.mark.parametrize("kernel", WINO)
@pytest.mark.parametrize(
    "unary, scalars, add, add_after",
    [
        ("none", [], False, False),
        ("relu", [], False, False),
        ("hardtanh", [0.0, 6.0], False, False),
        ("swish", [], False, False),
        ("relu", [], True, False),  # ResNet's residual: relu(conv + bias + other)
        ("none", [], True, False),
        ("swish", [], True, True),  # YOLO's bottleneck: silu(conv + bias) + other
    ],
)
def test_epilogue(
    kernel: str, unary: str, scalars: list[float], add: bool, add_after: bool
) -> None:
    gen = torch.Generator().manual_seed(3)
    plan = _plan([2, 12, 10, 9], 20, unary=unary, scalars=scalars, add_after=add_after)
    plan.bias = torch.randn(20, generator=gen)
    _check(plan, kernel, with_other=add)


@pytest.mark.parametrize("kernel", WINO)
@pytest.mark.parametrize("per_chunk", [1, 2, 5, 6])
def test_chunks_of_tile_rows_and_images(
    kernel: str, per_chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call in chunks of `per_chunk` window rows (runs of tile rows of one image, or groups
    of whole images), with a residual add and relu split along the chunks (the torch route:
    the native F(4,3) kernel has no chunks)."""
    monkeypatch.setenv(winograd_native.NATIVE_ENV, "0")
    monkeypatch.setattr(winograd, "CHUNK_BYTES", 1)
    monkeypatch.setattr(winograd, "MIN_CHUNK_TILES", per_chunk * 3)
    plan = _plan([3, 5, 11, 10], 6, unary="relu", bias=torch.ones(6))
    geo = winograd.geometry(plan, winograd.KERNEL_TILES[kernel])
    assert geo.tw == -(-10 // winograd.KERNEL_TILES[kernel]) and geo.tw <= 5
    assert len(winograd.chunks(geo, winograd.KERNEL_TILES[kernel])) > 1
    _check(plan, kernel, with_other=True)


@pytest.mark.parametrize("kernel", WINO)
def test_pre_pad_and_plain_layout_input(kernel: str) -> None:
    """An asymmetric pad (`pre_pad`, F.pad's order) and an NCHW-contiguous input."""
    plan = _plan([2, 6, 12 + 1, 10 + 3], 7, pad=0)
    plan.pre_pad = [2, 1, 0, 1]
    _check(plan, kernel, x_cl=False)


@pytest.mark.parametrize("m", sorted(winograd.TRANSFORMS))
def test_transform_matrices_compute_correlation(m: int) -> None:
    """A^T [(G g) * (B^T d)] is the 1-D correlation of d with g."""
    t = winograd.TRANSFORMS[m]
    bt, g, at = (torch.tensor(a, dtype=torch.float64) for a in (t.bt, t.g, t.at))
    rng = np.random.default_rng(m)
    d, k = (torch.from_numpy(rng.standard_normal(s)) for s in (t.alpha, 3))
    direct = torch.tensor([float((d[i : i + 3] * k).sum()) for i in range(m)], dtype=torch.float64)
    torch.testing.assert_close(at @ ((g @ k) * (bt @ d)), direct, rtol=1e-12, atol=1e-12)


def test_only_dense_3x3_stride1_float32() -> None:
    base = _plan([1, 8, 8, 8], 8)
    assert set(WINO) <= set(kernels_for(base)) and set(WINO) <= set(KERNELS)
    w1 = torch.randn(8, 8, 1, 1)
    others = [
        ConvPlan(w1, w1, [1, 8, 8, 8], [0, 0], [1, 1], [1, 1], 1, None),  # 1x1
        ConvPlan(base.weight, base.weight, [1, 8, 8, 8], [1, 1], [2, 2], [1, 1], 1, None),
        ConvPlan(base.weight, base.weight, [1, 8, 8, 8], [2, 2], [1, 1], [2, 2], 1, None),
        ConvPlan(base.weight[:, :4], base.weight, [1, 8, 8, 8], [1, 1], [1, 1], [1, 1], 2, None),
    ]
    for plan in others:
        assert not set(WINO) & set(kernels_for(plan))
        with pytest.raises(ValueError, match="winograd"):
            winograd.Winograd(plan, 4)
    # a bf16 layer: the torch-ops route never; F(4,3) only on the native kernel (bf16wino14)
    bf16 = ConvPlan(
        base.weight.bfloat16(), base.weight, [1, 8, 8, 8], [1, 1], [1, 1], [1, 1], 1, None
    )
    wino = [name for name in WINO if name in kernels_for(bf16)]
    assert wino == (["winograd"] if winograd.supports_bf16(bf16) else [])
    with pytest.raises(ValueError, match="winograd"):
        winograd.Winograd(bf16, 4)
    with pytest.raises(ValueError, match="winograd"):
        winograd.build(bf16, lambda: torch.zeros(1, 8, 8, 8, dtype=torch.bfloat16), None, 2)


def _resnet_block() -> tuple[object, dict[str, np.ndarray]]:
    """A basic ResNet block: 3x3 + relu, 3x3 + residual add + relu, then a 3x3 + relu6."""
    rng = np.random.default_rng(11)
    c = 16

    def f32(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    inits = {"w0": f32(c, c, 3, 3), "b0": f32(c), "w1": f32(c, c, 3, 3), "b1": f32(c),
             "w2": f32(8, c, 3, 3), "lo": np.float32(0.0), "hi": np.float32(6.0)}  # fmt: skip
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        node("Relu", ["c0"], ["a0"]),
        node("Conv", ["a0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        node("Add", ["c1", "x"], ["s1"]),
        node("Relu", ["s1"], ["a1"]),
        node("Conv", ["a1", "w2"], ["c2"], pads=[0, 1, 2, 1]),
        node("Clip", ["c2", "lo", "hi"], ["y"]),
    ]
    feeds = {"x": rng.standard_normal((2, c, 13, 11)).astype(np.float32)}
    return make_model(nodes, feeds, ["y"], inits), feeds


@pytest.fixture
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (conv_choice.KERNEL_ENV, conv_choice.BUDGET_ENV, conv_choice.WINOGRAD_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(conv_choice.CACHE_ENV, "off")  # never the per-user file (conftest.py)
    conv_choice.clear_cache()


def _compiled(model: object, caplog: pytest.LogCaptureFixture, **settings: str) -> object:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    with caplog.at_level(logging.INFO, logger="pygraphx.cpu"):
        prog.compile(CpuTarget(**settings))
    return prog


@pytest.mark.usefixtures("_fresh")
@pytest.mark.parametrize("kernel", WINO)
def test_forced_kernel_matches_ort(kernel: str, caplog: pytest.LogCaptureFixture) -> None:
    model, feeds = _resnet_block()
    prog = _compiled(model, caplog, conv_kernel=kernel)
    chosen = prog._executable.lowered.ctx.cache["conv_choice"].chosen
    assert chosen[kernel] == 3
    np.testing.assert_allclose(prog.run(feeds)[0], run_ort(model, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("_fresh")
def test_off_runs_no_winograd_and_measure_times_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model, feeds = _resnet_block()
    prog = _compiled(model, caplog, conv_kernel="off")
    assert not set(WINO) & set(prog._executable.lowered.ctx.cache["conv_choice"].chosen)
    timed: list[list[str]] = []
    real = conv_choice.time_kernels

    def spy(plan: ConvPlan, names: list[str], *args: object) -> dict[str, float]:
        timed.append(list(names))
        return real(plan, names, *args)

    monkeypatch.setattr(conv_choice, "time_kernels", spy)
    monkeypatch.setenv(conv_choice.BUDGET_ENV, "30")
    prog = _compiled(model, caplog, conv_kernel="measure")
    assert len(timed) == 3 and all(set(WINO) <= set(names) for names in timed)
    np.testing.assert_allclose(prog.run(feeds)[0], run_ort(model, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 37, 300])
def test_batched_matmul_matches_float64(rows: int) -> None:
    """oneDNN's primitive (or torch.bmm without the library) against a float64 product, for
    two row counts in a row (a primitive each) and again at the first."""
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(5, 24, 40, generator=gen)
    mm = onednn_bmm.BatchedMatmul(weight)
    for n in (rows, rows + 3, rows):
        src = torch.randn(5, n, 24, generator=gen)
        want = torch.bmm(src.double(), weight.double())
        torch.testing.assert_close(mm(src).double(), want, rtol=1e-5, atol=1e-5)


def test_batched_matmul_without_the_library_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(onednn_bmm, "runtime", lambda: None)
    monkeypatch.setattr(onednn_bmm, "_ANNOUNCED", set())
    weight = torch.randn(3, 4, 5)
    with caplog.at_level(logging.WARNING, logger="pygraphx.cpu"):
        mm = onednn_bmm.BatchedMatmul(weight)
    assert "products run on torch.bmm" in caplog.text
    src = torch.randn(3, 7, 4)
    torch.testing.assert_close(mm(src), torch.bmm(src, weight))


def test_library_present_uses_onednn() -> None:
    if not onednn_conv.available():
        pytest.skip("oneDNN's C API library (onednn-cpu-gomp) not installed")
    mm = onednn_bmm.BatchedMatmul(torch.randn(2, 8, 8))
    mm(torch.randn(2, 3, 8))
    assert mm._made, "no oneDNN primitive was made"


def _wide_model(c: int, hw: int, batch: int) -> tuple[object, dict[str, np.ndarray]]:
    """One 3x3 convolution of `c` channels to `c`, bias and ReLU, on `hw` x `hw` maps."""
    rng = np.random.default_rng(5)
    inits = {
        "w": (rng.standard_normal((c, c, 3, 3)) / (3 * np.sqrt(c))).astype(np.float32),
        "b": (rng.standard_normal(c) * 0.1).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    feeds = {"x": rng.standard_normal((batch, c, hw, hw)).astype(np.float32)}
    return make_model(nodes, feeds, ["y"], inits), feeds


@pytest.mark.usefixtures("_fresh")
@pytest.mark.parametrize("route", ["torch", "native"])
@pytest.mark.parametrize(
    ("c", "hw", "batch", "threads", "want", "want_native"),
    [
        (128, 28, 1, 2, True, True),  # 49 tiles of 128 channels
        (256, 7, 8, 2, True, True),  # 7x7 maps, but 8 images: 32 tiles, the rule's fewest
        (256, 14, 1, 2, False, True),  # 16 tiles: slower than oneDNN at 2 threads (torch route)
        (256, 14, 1, 1, True, True),  # ... but faster at one thread
        (256, 7, 1, 1, False, True),  # 4 tiles: (4, C) products (native: 0.84x oneDNN)
        (256, 7, 1, 2, False, False),  # 4 tiles at 2 threads: slower on either route
        (64, 32, 1, 2, False, True),  # 64 channels: not at 2 threads (unproven there)
        (64, 32, 1, 1, True, True),  # ... at one thread: 64 tiles, 38 M multiply-adds
        (32, 64, 1, 1, False, True),  # 32 channels: loses (torch route)
        (64, 20, 1, 1, False, True),  # 25 tiles (enough at one thread) but 15 M multiply-adds
        (8, 32, 1, 1, False, False),  # 8 channels
        (16, 16, 1, 1, False, False),  # 16 channels, 16 tiles, but 0.6 M multiply-adds
    ],
)
def test_default_mode_rule(
    c: int,
    hw: int,
    batch: int,
    threads: int,
    want: bool,
    want_native: bool,
    route: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog,
) -> None:
    """`PGX_CONV_WINOGRAD=rule` (the default): the default mode runs the layers
    `winograd_rule.by_rule` names at the program's thread count on F(4,3) without timing them, and
    matches ORT; `off` keeps them on oneDNN."""
    if route == "native":
        if not winograd_native.available():
            pytest.skip("the native Winograd kernel is unavailable here")
        want = want_native
    monkeypatch.setenv(winograd_native.NATIVE_ENV, "0" if route == "torch" else "1")
    model, feeds = _wide_model(c, hw, batch)
    # the program's thread count, even where the machine is busy (the load adaptation would
    # compile it on fewer threads)
    monkeypatch.setenv(LOAD_ADAPT_ENV, "0")
    timed: list[list[str]] = []
    real = conv_choice.time_kernels
    monkeypatch.setattr(
        conv_choice, "time_kernels", lambda p, n, *a: timed.append(n) or real(p, n, *a)
    )
    for rule in ("rule", "off"):
        monkeypatch.setenv(conv_choice.WINOGRAD_ENV, rule)
        conv_choice.clear_cache()
        prog = _compiled(model, caplog, threads=threads)
        chosen = prog._executable.lowered.ctx.cache["conv_choice"].chosen
        assert (chosen["winograd"] == 1) == (want and rule == "rule"), (rule, chosen)
        assert not any("winograd" in names for names in timed)
        got = prog.run(feeds)[0]
        np.testing.assert_allclose(
            got, run_ort(model, feeds)[0], rtol=1e-4, atol=3e-5 * np.abs(got).max()
        )


def test_rule_limits_by_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """`by_rule` at an explicit thread count (the torch route's rule): 16 tiles and 64
    channels pass at one thread only; from two threads 128 channels and 16 tiles a thread (at
    least 32); above `RULE_MAX_THREADS` no layer (the 16-core host's A/Bs)."""
    monkeypatch.setenv(winograd_native.NATIVE_ENV, "0")
    weight = torch.randn(256, 256, 3, 3)
    plan = ConvPlan(weight, weight, [1, 256, 14, 14], [1, 1], [1, 1], [1, 1], 1, None)
    assert [winograd_rule.by_rule(plan, n) for n in (1, 2, 16)] == [True, False, False]
    low, high = winograd_rule.rule_limits(1), winograd_rule.rule_limits(2)
    assert low[0] < high[0] and low[1] < high[1]
    assert winograd_rule.rule_limits(4) == (high[0], 64) and winograd_rule.rule_limits(8) == (high[0], 128)
    assert winograd_rule.rule_limits(winograd_rule.RULE_MAX_THREADS + 1) is None
    big = ConvPlan(weight, weight, [2, 256, 14, 14], [1, 1], [1, 1], [1, 1], 1, None)  # 32 tiles
    assert [winograd_rule.by_rule(big, n) for n in (1, 2, 4, 16)] == [True, True, False, False]
    b8 = ConvPlan(weight, weight, [8, 256, 28, 28], [1, 1], [1, 1], [1, 1], 1, None)  # 392
    assert [winograd_rule.by_rule(b8, n) for n in (2, 4, 8, 16)] == [True, True, True, False]
    narrow = torch.randn(64, 64, 3, 3)
    plan64 = ConvPlan(narrow, narrow, [1, 64, 56, 56], [1, 1], [1, 1], [1, 1], 1, None)
    assert [winograd_rule.by_rule(plan64, n) for n in (1, 2)] == [True, False]


def test_native_rule_limits_by_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the native kernel: 16 channels, 4 tiles at one thread and 16 at two, 10 M
    multiply-adds; above two threads 64 channels and 32 tiles, or 4 a thread where more."""
    if not winograd_native.available():
        pytest.skip("the native Winograd kernel is unavailable here")
    monkeypatch.setenv(winograd_native.NATIVE_ENV, "1")
    assert winograd_rule.rule_limits(1) == (16, 4) and winograd_rule.rule_limits(2) == (16, 16)
    assert winograd_rule.rule_limits(4) == (64, 32) and winograd_rule.rule_limits(16) == (64, 64)
    weight = torch.randn(512, 512, 3, 3)
    b1_7x7 = ConvPlan(weight, weight, [1, 512, 7, 7], [1, 1], [1, 1], [1, 1], 1, None)
    assert [winograd_rule.by_rule(b1_7x7, n) for n in (1, 2, 4)] == [True, False, False]
    w64 = torch.randn(64, 64, 3, 3)
    b1_56 = ConvPlan(w64, w64, [1, 64, 56, 56], [1, 1], [1, 1], [1, 1], 1, None)  # 196 tiles
    assert [winograd_rule.by_rule(b1_56, n) for n in (1, 2, 4, 16, 64)] == [True] * 4 + [False]
    w128 = torch.randn(128, 128, 3, 3)
    b1_28 = ConvPlan(w128, w128, [1, 128, 28, 28], [1, 1], [1, 1], [1, 1], 1, None)  # 49 tiles
    assert [winograd_rule.by_rule(b1_28, n) for n in (2, 8, 16)] == [True, True, False]
    w256 = torch.randn(256, 256, 3, 3)
    b1_14 = ConvPlan(w256, w256, [1, 256, 14, 14], [1, 1], [1, 1], [1, 1], 1, None)  # 16 tiles
    assert [winograd_rule.by_rule(b1_14, n) for n in (1, 2, 4)] == [True, True, False]
    w32 = torch.randn(32, 32, 3, 3)
    b8_32 = ConvPlan(w32, w32, [8, 32, 80, 80], [1, 1], [1, 1], [1, 1], 1, None)  # 32 channels
    assert [winograd_rule.by_rule(b8_32, n) for n in (2, 4)] == [True, False]
    monkeypatch.setenv(winograd_native.NATIVE_ENV, "0")
    assert [winograd_rule.by_rule(b1_56, n) for n in (1, 2)] == [True, False]


def test_rule_setting_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(conv_choice.WINOGRAD_ENV, "sometimes")
    with pytest.raises(conv_choice.ConvChoiceError, match="PGX_CONV_WINOGRAD='sometimes'"):
        conv_choice.choice_state({}, {})


def test_rule_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(conv_choice.WINOGRAD_ENV, raising=False)
    assert conv_choice.choice_state({}, {}).winograd == "rule"
