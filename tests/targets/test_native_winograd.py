"""The native Winograd F(4x4, 3x3) kernel (`native/kernels/winograd_f43.c`, driven by
`torch_lowering/winograd_native.py` from `winograd.build`).

Oracle: torch's `F.conv2d` in float64 with the epilogue in float64. Bound: 3e-5 of the largest
output (F(4,3)'s rounding, as `test_winograd.py`). Skipped (with the reason) where the kernel
cannot be had: no C compiler, no AVX-512F, or PGX_NATIVE=off.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.torch_lowering import winograd, winograd_native  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan  # noqa: E402

BOUND = 3e-5
CL = torch.channels_last


def _available() -> str | None:
    try:
        winograd_native.library()
    except native.NativeUnavailable as exc:
        return str(exc)
    return None


_WHY = _available()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"native Winograd unavailable: {_WHY}")


def _reference(plan: ConvPlan, x: torch.Tensor, other: torch.Tensor | None) -> torch.Tensor:
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


def _run(n, c, h, w, k, pad=1, threads=1, add=False, x_layout="cl", out_slot=False,
         **fields) -> None:  # fmt: skip
    gen = torch.Generator().manual_seed(n * 1000 + c * 10 + h + k)
    weight = torch.randn(k, c, 3, 3, generator=gen) / (3 * c**0.5)
    fields.setdefault("bias", torch.randn(k, generator=gen))
    pre_pad = fields.pop("pre_pad", None)
    plan = ConvPlan(weight, weight, [n, c, h, w], [pad, pad], [1, 1], [1, 1], 1, pre_pad,
                    **fields)  # fmt: skip
    lens = list(plan.x_lens)
    if plan.pre_pad is not None:
        lens[2] -= plan.pre_pad[2] + plan.pre_pad[3]
        lens[3] -= plan.pre_pad[0] + plan.pre_pad[1]
    x = torch.randn(lens, generator=gen)
    if x_layout == "cl":
        x = x.contiguous(memory_format=CL)
    elif x_layout == "strided":  # a channels-last view with gaps between pixels and rows
        big = torch.randn(lens[0], lens[2] + 3, 2 * lens[3] + 1, lens[1] + 5, generator=gen)
        x = big[:, 1 : 1 + lens[2], 1::2, 2 : 2 + lens[1]].permute(0, 3, 1, 2)
        assert x.stride(1) == 1 and not x.is_contiguous(memory_format=CL)
    ho, wo = h + 2 * pad - 2, w + 2 * pad - 2  # (x_lens are after pre_pad)
    other = torch.randn(n, k, ho, wo, generator=gen).contiguous(memory_format=CL) if add else None
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        slot = torch.empty(n, k, ho, wo).contiguous(memory_format=CL) if out_slot else None
        run = winograd.build(plan, lambda: x, None if other is None else (lambda: other), 4, slot)
        y = run()
        y2 = run()  # a second call on the same buffers
    finally:
        torch.set_num_threads(old)
    ref = _reference(plan, x, other)
    assert y.shape == ref.shape and y.is_contiguous(memory_format=CL)
    assert torch.equal(y, y2)
    err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
    assert err < BOUND, f"relative error {err:.2e}"


@pytest.fixture(autouse=True)
def _native_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(winograd_native.NATIVE_ENV, raising=False)
    monkeypatch.delenv(native.NATIVE_ENV, raising=False)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "n, c, h, w, k, pad",
    [
        (1, 16, 16, 16, 16, 1),  # whole tiles, one vector of channels
        (1, 17, 11, 13, 23, 1),  # tiles overhang; channels not a multiple of 16 (tails)
        (3, 20, 9, 7, 40, 0),  # three images, no padding
        (1, 3, 3, 3, 5, 0),  # one output
        (2, 5, 5, 6, 70, 2),  # padding 2; output channels over one 64-block, a tail
        (3, 64, 14, 14, 64, 1),  # several tile blocks over images
        (1, 130, 7, 7, 131, 1),  # few tiles: the output channels split between threads
    ],
)
def test_matches_float64_conv(n, c, h, w, k, pad, threads) -> None:
    _run(n, c, h, w, k, pad, threads=threads, unary="relu")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "unary, scalars, add, add_after",
    [
        ("none", [], False, False),
        ("relu", [], False, False),
        ("hardtanh", [0.0, 6.0], False, False),
        ("swish", [], False, False),  # silu in the kernel (or by torch after it)
        ("relu", [], True, False),  # ResNet's residual: relu(conv + bias + other)
        ("relu", [], True, True),  # relu(conv + bias) + other
        ("none", [], True, False),
        ("swish", [], True, False),  # silu(conv + bias + other)
        ("swish", [], True, True),  # YOLO's bottleneck: silu(conv + bias) + other
    ],
)
def test_epilogue(unary, scalars, add, add_after, threads) -> None:
    _run(3, 19, 10, 9, 33, threads=threads, add=add, unary=unary, scalars=scalars,
         add_after=add_after)  # fmt: skip


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("add, add_after", [(False, False), (True, False), (True, True)])
def test_epilogue_swish_by_torch(add, add_after, threads, monkeypatch) -> None:
    """`PGX_WINOGRAD_NATIVE_SILU=0`: the swish (and an add after it) by torch on the output
    (the setting changes swish layers only)."""
    monkeypatch.setenv(winograd_native.SILU_ENV, "0")
    _run(3, 19, 10, 9, 33, threads=threads, add=add, unary="swish", add_after=add_after)


def test_native_silu_elementwise_over_a_wide_range() -> None:
    """The kernel's silu (a polynomial exp) against float64 element by element: outputs from
    -120 to 120 (past the exp argument's clamp at 88), the convolution's part tiny."""
    k = 80
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(k, 16, 3, 3, generator=gen) * 1e-4
    bias = torch.linspace(-120.0, 120.0, k)
    plan = ConvPlan(weight, weight, [2, 16, 9, 11], [1, 1], [1, 1], [1, 1], 1, None,
                    bias=bias, unary="swish")  # fmt: skip
    x = torch.randn(2, 16, 9, 11, generator=gen).contiguous(memory_format=CL)
    y = winograd.build(plan, lambda: x, None, 4)().double()
    ref = _reference(plan, x, None)
    torch.testing.assert_close(y, ref, rtol=2e-6, atol=1e-6)


def test_native_silu_at_the_float_extremes() -> None:
    """Where exp(-x) overflows the silu is torch's: silu(-3e38) = -0, silu(-inf) = NaN,
    silu(+inf) = +inf, silu(3e38) = 3e38."""
    k = 16
    weight = torch.zeros(k, 16, 3, 3)
    extremes = [-3e38, float("-inf"), 3e38, float("inf"), -100.0, -89.0, 89.0, 0.0]
    bias = torch.tensor(extremes + [1.0] * (k - len(extremes)))
    plan = ConvPlan(weight, weight, [1, 16, 8, 8], [1, 1], [1, 1], [1, 1], 1, None,
                    bias=bias, unary="swish")  # fmt: skip
    x = torch.randn(1, 16, 8, 8).contiguous(memory_format=CL)
    y = winograd.build(plan, lambda: x, None, 4)()
    want = F.silu(bias.view(1, k, 1, 1).expand_as(y))
    torch.testing.assert_close(y, want, rtol=2e-6, atol=1e-30, equal_nan=True)
    assert torch.signbit(y[0, 0]).all()  # -0, as torch's


def test_no_bias_pre_pad_plain_and_strided_inputs_and_out_slot() -> None:
    _run(1, 6, 13, 13, 7, pad=0, bias=None, unary="relu", pre_pad=[2, 1, 0, 1], x_layout="nchw")
    _run(2, 24, 9, 10, 20, threads=2, x_layout="strided", out_slot=True, unary="none")


def test_blocks_balance_jobs_between_threads() -> None:
    # ResNet-50 b1: 56x56 (196 tiles, 64 ch) in an even count of blocks; 7x7 (4 tiles) one
    # block, its output channels split
    tb, ks = winograd_native.blocks(196, 64, 64, 2)
    assert ks == 1 and (-(-196 // tb)) % 2 == 0
    assert winograd_native.blocks(4, 512, 512, 2) == (4, 2)
    assert winograd_native.blocks(4, 512, 512, 1) == (4, 1)
    # a transformed weight past L3 (37.7 MB): 32-tile blocks, not 6 (b8 7x7: read once)
    assert winograd_native.blocks(32, 512, 512, 1) == (32, 1)
    assert winograd_native.blocks(32, 512, 512, 2) == (32, 2)
    assert winograd_native.blocks(32, 256, 256, 1) == (8, 1)


def test_switch_takes_the_torch_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """On: `winograd.build` runs the native kernel; `PGX_WINOGRAD_NATIVE=0`: the torch route."""
    made = []
    real = winograd_native.NativeWinograd

    def spy(*args: object, **kwargs: object) -> object:
        made.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(winograd_native, "NativeWinograd", spy)
    _run(1, 8, 8, 8, 8, unary="relu")
    assert len(made) == 1
    monkeypatch.setenv(winograd_native.NATIVE_ENV, "0")
    assert not winograd_native.available()
    _run(1, 8, 8, 8, 8, unary="relu")
    assert len(made) == 1


def test_measured_choices_are_kept_per_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer's measured choice (`conv_choice`'s cache) timed on one F(4,3) route is not
    reused on the other."""
    from pygraphx.targets.torch_lowering import conv_choice

    weight = torch.randn(16, 16, 3, 3)
    plan = ConvPlan(weight, weight, [1, 16, 20, 20], [1, 1], [1, 1], [1, 1], 1, None)
    names = ["dnnl", "winograd"]
    native_key = conv_choice.choice_key(plan, names, None)
    plain = conv_choice.choice_key(plan, ["dnnl"], None)
    monkeypatch.setenv(winograd_native.NATIVE_ENV, "0")
    assert conv_choice.choice_key(plan, names, None) != native_key
    # a layer without a Winograd candidate keeps its entry on either route
    assert conv_choice.choice_key(plan, ["dnnl"], None) == plain


@pytest.mark.parametrize("unary, scalars", [("relu", []), ("hardtanh", [0.0, 6.0]),
                                            ("swish", []), ("none", [])])  # fmt: skip
def test_special_values_propagate_like_torch(unary: str, scalars: list[float]) -> None:
    """A NaN / Inf in the input gives NaN where torch's direct convolution (then its relu,
    clamp or silu) gives NaN, and no NaN elsewhere (the tiles it does not reach)."""
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(8, 4, 3, 3, generator=gen)
    plan = ConvPlan(weight, weight, [1, 4, 12, 12], [1, 1], [1, 1], [1, 1], 1, None,
                    unary=unary, scalars=scalars)  # fmt: skip
    x = torch.randn(1, 4, 12, 12, generator=gen)
    x[0, 1, 2, 3] = float("nan")
    x[0, 2, 9, 9] = float("inf")
    x = x.contiguous(memory_format=CL)
    got = winograd.build(plan, lambda: x, None, 4)()
    want = _reference(plan, x, None)
    # Winograd spreads a special value over its whole 4x4 output tile (its transforms mix
    # the window): NaN there; the tiles neither value's window reaches match torch's
    assert torch.isnan(got[want.isnan()]).all()
    far = torch.ones(12, 12, dtype=torch.bool)
    far[:8, :8] = False  # the tiles whose windows hold (2, 3)
    far[4:, 4:] = False  # ... and (9, 9)
    torch.testing.assert_close(got[..., far].double(), want[..., far], rtol=1e-4, atol=1e-4)
