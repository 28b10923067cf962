"""Winograd F(m x m, 3 x 3) convolution on the CPU: fewer multiplications for dense 3x3 layers.

A 3x3 stride-1 convolution of float32 channels-last activations (one group, no dilation) is
computed on tiles of m x m outputs, each read from an (m + 2) x (m + 2) window of the input
(Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016):

    Y = A^T [ (G g G^T) (.) (B^T d B) ] A      per tile d, weight g, channel pair

The weight transform `G g G^T` is made once (at prepare, in float64). A call then runs:

1. the input copied into a zero-bordered buffer of whole windows (the padding);
2. the input transform's row pass, `B^T` times the (m + 2) rows of every window row, one
   matrix product over strided windows (no copy of the overlapping windows);
3. its column pass as a few additions over strided views (`B` is sparse: 12 adds for m = 4),
   written in the layout the products read: one (tiles, C) matrix per window point;
4. (m + 2)^2 products (tiles, C) x (C, K) in one `torch.bmm`; the bias added to the one point
   whose output transform is constant over the tile;
5. the output transform's row pass as one matrix product, its column pass as additions written
   straight into the channels-last output (tiles that overhang the image cropped);
6. the rest of the epilogue in place: the residual add, relu / clip / silu, in the plan's order.

F(4x4, 3x3) (`winograd`) does 36 products per 16 outputs per channel pair instead of 144 (4x
fewer multiplications); F(2x2, 3x3) (`winograd2`) 16 per 4 instead of 36 (2.25x). The price is
rounding: F(2,3)'s result is within about 1e-6 of direct float32 relative to the output's
scale, F(4,3)'s within a few 1e-6 (`tests/targets/test_winograd.py` measures both against
float64). The transforms are memory passes, so the kernel only wins on layers with many
tiles per weight (large feature maps, larger batches): `conv_choice` times it against oneDNN
on each layer's real shape and keeps it only where it is faster.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

Tensor = torch.Tensor
Getter = Callable[[], Tensor]


class ConvPlan(Protocol):
    """The fields of `conv_kernels.ConvPlan` this kernel reads (that module imports this one)."""

    weight: Tensor
    x_lens: list[int]
    padding: list[int]
    stride: list[int]
    dilation: list[int]
    groups: int
    pre_pad: list[int] | None
    bias: Tensor | None
    unary: str
    scalars: list[float]
    add_after: bool
    accumulate: bool

#: one step of a transform pass: out[dst] = src_a + alpha * src_b ("tN" names a temporary,
#: "iN" the pass's input N, "oN" its output N; src_a may be dst itself: an in-place update)
Step = tuple[str, str, str, float]


@dataclass(frozen=True)
class Transform:
    """The matrices of F(m x m, 3 x 3) and the addition programs of its column passes."""

    m: int
    bt: tuple[tuple[float, ...], ...]  # (m + 2) x (m + 2): B^T, the input transform
    g: tuple[tuple[float, ...], ...]  # (m + 2) x 3: G, the weight transform
    at: tuple[tuple[float, ...], ...]  # m x (m + 2): A^T, the output transform
    in_steps: tuple[Step, ...]  # B^T applied as additions (the input's column pass)
    out_steps: tuple[Step, ...]  # A^T applied as additions (the output's column pass)

    @property
    def alpha(self) -> int:
        """The window's side, m + 2."""
        return self.m + 2


_F2 = Transform(
    m=2,
    bt=((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
    g=((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1)),
    at=((1, 1, 1, 0), (0, 1, -1, -1)),
    in_steps=(
        ("o0", "i0", "i2", -1.0),
        ("o1", "i1", "i2", 1.0),
        ("o2", "i2", "i1", -1.0),
        ("o3", "i1", "i3", -1.0),
    ),
    out_steps=(
        ("o0", "i0", "i1", 1.0),
        ("o0", "o0", "i2", 1.0),
        ("o1", "i1", "i2", -1.0),
        ("o1", "o1", "i3", -1.0),
    ),
)

_F4 = Transform(
    m=4,
    bt=(
        (4, 0, -5, 0, 1, 0),
        (0, -4, -4, 1, 1, 0),
        (0, 4, -4, -1, 1, 0),
        (0, -2, -1, 2, 1, 0),
        (0, 2, -1, -2, 1, 0),
        (0, 4, 0, -5, 0, 1),
    ),
    g=(
        (1 / 4, 0, 0),
        (-1 / 6, -1 / 6, -1 / 6),
        (-1 / 6, 1 / 6, -1 / 6),
        (1 / 24, 1 / 12, 1 / 6),
        (1 / 24, -1 / 12, 1 / 6),
        (0, 0, 1),
    ),
    at=(
        (1, 1, 1, 1, 1, 0),
        (0, 1, -1, 2, -2, 0),
        (0, 1, 1, 4, 4, 0),
        (0, 1, -1, 8, -8, 1),
    ),
    in_steps=(
        ("o0", "i4", "i0", 4.0),  # 4 d0 - 5 d2 + d4
        ("o0", "o0", "i2", -5.0),
        ("t0", "i4", "i2", -4.0),  # d4 - 4 d2
        ("t1", "i3", "i1", -4.0),  # d3 - 4 d1
        ("o1", "t0", "t1", 1.0),
        ("o2", "t0", "t1", -1.0),
        ("t2", "i4", "i2", -1.0),  # d4 - d2
        ("t3", "i3", "i1", -1.0),  # d3 - d1
        ("o3", "t2", "t3", 2.0),
        ("o4", "t2", "t3", -2.0),
        ("o5", "i5", "i1", 4.0),  # 4 d1 - 5 d3 + d5
        ("o5", "o5", "i3", -5.0),
    ),
    out_steps=(
        ("t0", "i1", "i2", 1.0),  # s1
        ("t1", "i1", "i2", -1.0),  # d1
        ("t2", "i3", "i4", 1.0),  # s2
        ("t3", "i3", "i4", -1.0),  # d2
        ("o0", "i0", "t0", 1.0),
        ("o0", "o0", "t2", 1.0),
        ("o1", "t1", "t3", 2.0),
        ("o2", "t0", "t2", 4.0),
        ("o3", "i5", "t1", 1.0),
        ("o3", "o3", "t3", 8.0),
    ),
)

#: the tile sizes, by output tile side m
TRANSFORMS = {2: _F2, 4: _F4}
#: the kernel names (`conv_kernels.KERNELS`) and their tile sides
KERNEL_TILES = {"winograd": 4, "winograd2": 2}
#: the point (row, column) of the transformed tile whose output transform is 1 everywhere:
#: the bias is added there once instead of to every output (column 1 of A^T is all ones)
BIAS_POINT = 1


def supports(plan: ConvPlan) -> bool:
    """Whether `plan` is a float32 3x3 convolution with stride 1, no dilation, one group."""
    return (
        plan.weight.dtype == torch.float32
        and plan.weight.dim() == 4
        and tuple(plan.weight.shape[2:]) == (3, 3)
        and plan.groups == 1
        and all(s == 1 for s in plan.stride)
        and all(d == 1 for d in plan.dilation)
        and not plan.accumulate
    )


def weight_transform(weight: Tensor, m: int) -> Tensor:
    """The (m+2)^2 matrices (C, K) of `G g G^T`, ordered (column, row) of the tile as the
    input transform writes them, computed in float64 and rounded once to float32."""
    g = torch.tensor(TRANSFORMS[m].g, dtype=torch.float64)
    w = weight.detach().to(torch.float64)
    u = torch.einsum("ai,kcij,bj->bakc", g, w, g)  # (column b, row a, K, C)
    return u.reshape(-1, w.shape[0], w.shape[1]).transpose(1, 2).contiguous().float()


def _run_steps(steps: Sequence[Step], inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> None:
    """Apply an addition program: every output (a strided view) written in place."""
    named: dict[str, Tensor] = {f"i{i}": t for i, t in enumerate(inputs)}
    named.update({f"o{i}": t for i, t in enumerate(outputs)})
    for dst, a, b, alpha in steps:
        if dst not in named:  # a temporary, shaped as the outputs
            named[dst] = torch.empty_like(outputs[0], memory_format=torch.contiguous_format)
        torch.add(named[a], named[b], alpha=alpha, out=named[dst])


@dataclass(frozen=True)
class Geometry:
    """Sizes of one Winograd convolution: images, channels, padding, tiles, buffers."""

    n: int
    c: int
    k: int
    h: int  # the input's rows and columns before padding
    w: int
    top: int
    left: int
    ho: int  # the output's rows and columns
    wo: int
    th: int  # tiles down and across one image
    tw: int
    rows: int  # window rows per image in the buffer (th, or th + 1 to merge images)
    hp: int  # buffer rows per image, columns
    wp: int


def geometry(plan: ConvPlan, m: int) -> Geometry:
    """The sizes of `plan` tiled for F(m x m, 3 x 3)."""
    n, c, h, w = plan.x_lens
    top = left = bottom = right = 0
    if plan.pre_pad is not None:  # F.pad's order: left, right, top, bottom
        left, right, top, bottom = plan.pre_pad
        h -= top + bottom
        w -= left + right
    top, bottom = top + plan.padding[0], bottom + plan.padding[0]
    left, right = left + plan.padding[1], right + plan.padding[1]
    ho, wo = h + top + bottom - 2, w + left + right - 2
    th, tw = -(-ho // m), -(-wo // m)
    # with several images, each gets a whole window row more, so that the windows of all
    # images are one strided sequence (the extra one straddles two images: its tiles dropped)
    rows = th + 1 if n > 1 else th
    hp = m * rows if n > 1 else m * th + 2
    k = plan.weight.shape[0]
    return Geometry(n, c, k, h, w, top, left, ho, wo, th, tw, rows, hp, m * tw + 2)


def _padded(x: Tensor, geo: Geometry, alpha: int) -> Tensor:
    """`x` (NCHW lens, any strides) copied into a new zero-bordered (rows, wp, C) buffer of
    whole windows: the buffer's images one after another, two more zero rows at the end
    when the last image's extra window row reads past it."""
    g = geo
    extra = alpha - g.hp // g.rows if g.n > 1 else 0  # rows the last window overhangs
    flat = torch.empty(g.n * g.hp + extra, g.wp, g.c, dtype=x.dtype)
    buf = flat[: g.n * g.hp].view(g.n, g.hp, g.wp, g.c)
    bottom, right = g.top + g.h, g.left + g.w
    buf[:, : g.top].zero_()
    buf[:, bottom:].zero_()
    buf[:, g.top : bottom, : g.left].zero_()
    buf[:, g.top : bottom, right:].zero_()
    flat[g.n * g.hp :].zero_()
    buf[:, g.top : bottom, g.left : right].copy_(x.permute(0, 2, 3, 1))
    return flat


class Winograd:
    """One layer's Winograd convolution: the transformed weight and the per-call passes."""

    def __init__(self, plan: ConvPlan, m: int) -> None:
        if not supports(plan):
            raise ValueError("winograd: a float32 3x3 stride-1 convolution with one group only")
        self.t = TRANSFORMS[m]
        self.geo = geometry(plan, m)
        self.u = weight_transform(plan.weight, m)
        self.bias = None if plan.bias is None else plan.bias.float().contiguous()
        self.bt = torch.tensor(self.t.bt, dtype=torch.float32)
        self.at = torch.tensor(self.t.at, dtype=torch.float32)

    def __call__(self, x: Tensor, y: Tensor) -> None:
        """The convolution of `x` (NCHW lens, any strides) into `y` ((N, Ho, Wo, K)
        contiguous), before the epilogue's add and activation."""
        g, m, a = self.geo, self.t.m, self.t.alpha
        flat = _padded(x, g, a)
        windows = g.n * g.rows
        # the input's row pass: B^T times each window row's (m + 2) rows, one product
        rows = flat.as_strided((windows, a, g.wp * g.c), (m * g.wp * g.c, g.wp * g.c, 1))
        u1 = torch.matmul(self.bt, rows).view(windows, a, g.wp, g.c)
        # its column pass: V[b, a, window, tile, C], one (tiles, C) matrix per point (b, a)
        v = torch.empty(a, a, windows, g.tw, g.c, dtype=x.dtype)
        span = m * (g.tw - 1) + 1
        cols = [u1[:, :, i : i + span : m] for i in range(a)]
        _run_steps(self.t.in_steps, cols, [v[i].transpose(0, 1) for i in range(a)])
        prod = torch.bmm(v.view(a * a, windows * g.tw, g.c), self.u)
        if self.bias is not None:
            prod[BIAS_POINT * a + BIAS_POINT].add_(self.bias)
        # the output's row pass (over a), one product: Z[b, p, window, tile, K]
        z = torch.matmul(self.at, prod.view(a, a, -1)).view(a, m, windows, g.tw, g.k)
        self._column_pass(z, y)

    def _column_pass(self, z: Tensor, y: Tensor) -> None:
        """A^T over the tile's columns, written into `y` (through a buffer of whole tiles
        when the tiles overhang the image)."""
        g, m, a = self.geo, self.t.m, self.t.alpha
        whole = g.ho == m * g.th and g.wo == m * g.tw
        full = y if whole else torch.empty(g.n, m * g.th, m * g.tw, g.k, dtype=y.dtype)
        tiles = full.view(g.n, g.th, m, g.tw, m, g.k)
        ins = [
            z[b].view(m, g.n, g.rows, g.tw, g.k)[:, :, : g.th].permute(1, 2, 0, 3, 4)
            for b in range(a)
        ]
        _run_steps(self.t.out_steps, ins, [tiles[:, :, :, :, q] for q in range(m)])
        if not whole:
            y.copy_(full[:, : g.ho, : g.wo])


def activate_(y: Tensor, unary: str, scalars: Sequence[float]) -> None:
    """Apply the epilogue's activation to `y` in place (none, relu, hardtanh = clip, swish =
    silu)."""
    if unary == "relu":
        y.relu_()
    elif unary == "hardtanh":
        y.clamp_(scalars[0], scalars[1])
    elif unary == "swish":
        torch.nn.functional.silu(y, inplace=True)
    elif unary != "none":
        raise ValueError(f"convolution epilogue: unknown activation {unary!r}")


def build(
    plan: ConvPlan, get_x: Getter, get_other: Getter | None, m: int = 4
) -> Callable[[], Tensor]:
    """A closure running `plan` with F(m x m, 3 x 3) on `get_x()` (and the add operand
    `get_other()`), returning a new channels-last tensor with the whole epilogue applied."""
    conv = Winograd(plan, m)
    g = conv.geo
    unary, scalars, add_after = plan.unary, list(plan.scalars), plan.add_after

    def run() -> Tensor:
        y = torch.empty(g.n, g.ho, g.wo, g.k, dtype=torch.float32)
        conv(get_x(), y)
        out = y.permute(0, 3, 1, 2)  # NCHW lens, channels-last strides
        if get_other is not None and not add_after:
            out.add_(get_other())
        activate_(out, unary, scalars)
        if get_other is not None and add_after:
            out.add_(get_other())
        return out

    return run


__all__ = [
    "KERNEL_TILES",
    "TRANSFORMS",
    "Geometry",
    "Transform",
    "Winograd",
    "activate_",
    "build",
    "geometry",
    "supports",
    "weight_transform",
]
