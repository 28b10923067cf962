"""Winograd F(m x m, 3 x 3) convolution on the CPU: fewer multiplications for dense 3x3 layers.

A 3x3 stride-1 convolution of float32 channels-last activations (one group, no dilation) is
computed on tiles of m x m outputs, each read from an (m + 2) x (m + 2) window of the input
(Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", 2016):

    Y = A^T [ (G g G^T) (.) (B^T d B) ] A      per tile d, weight g, channel pair

The weight transform `G g G^T` is made once (at prepare, in float64). A call then runs:

1. the input copied into a zero-bordered buffer of whole windows (the padding);
2. then, chunk by chunk of window rows (`chunks`), the input transform's row pass: `B^T`
   times the (m + 2) rows of every window row, one product over strided windows (the
   overlapping windows are not copied);
3. the columns of every window gathered (one strided copy, (m + 2) / m the size), so that the
   column pass is a product too, written in the layout the big products read: a (tiles, C)
   matrix per window point;
4. (m + 2)^2 products (tiles, C) x (C, K) as one oneDNN matmul primitive, its transformed
   weight packed once (`onednn_bmm.py`); the bias added to the one point whose output
   transform is constant over the tile;
5. the output transform as one product with the Kronecker square A^T (x) A^T (the tile's
   points are the outer axis, so it needs no copy);
6. the epilogue's first step (the residual add, the activation, or a copy) writing the tiles,
   cropped to the image, into the channels-last output; its other steps in place there.

Every pass is a product or a copy, a few calls per chunk: the sparse transforms as additions
over strided views were 22 calls (F(4,3)) and 1.3x slower at one thread. The small products
are batched over a tile axis (torch runs one (6, N) product on one thread).

F(4x4, 3x3) (`winograd`) does 36 products per 16 outputs per channel pair instead of 144 (4x
fewer multiplications); F(2x2, 3x3) (`winograd2`) 16 per 4 instead of 36 (2.25x). The price is
rounding: relative to the output's largest value, F(2,3)'s result is within about 1e-6 of
float64 (direct float32: 1-2.5e-6), F(4,3)'s within about 1e-5 (0.6-1.3e-5 on ResNet-50's and
UNet's layers; `tests/targets/test_winograd.py` bounds them by 2e-6 and 3e-5). The
transforms are memory passes, so the kernel only wins on layers with many tiles per weight
(large feature maps, larger batches): `conv_choice` (mode `measure`) times it against oneDNN
on each layer's real shape and keeps it only where it is faster.

Where a C compiler and AVX-512F are at hand, F(4,3) runs instead as one native kernel
(`winograd_native.py`, wino13): the three passes per block of tiles inside L2, the threads
splitting the blocks (`PGX_WINOGRAD_NATIVE=0`: the route above), with its own rule
(`winograd_rule.RULE_NATIVE_*`). A bf16 layer runs F(4,3) on the native kernel only
(`supports_bf16`: bf16 activations widened in the kernel, float32 arithmetic, bf16 output), by
its own rule (`winograd_rule.RULE_BF16_*`, bf16wino14). Which layers the default mode runs on
F(4,3) untimed: `winograd_rule.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from pygraphx.targets.torch_lowering import winograd_native
from pygraphx.targets.torch_lowering.onednn_bmm import BatchedMatmul
from pygraphx.targets.torch_lowering.onednn_conv import ConvPlan  # (a Protocol of its fields)
from pygraphx.targets.torch_lowering.winograd_scratch import (  # (re-exported)
    SCRATCH_ENV,
    SCRATCH_KEY,
    Scratch,
    program_scratch,
    scratch_enabled,
)

Tensor = torch.Tensor
Getter = Callable[[], Tensor]


@dataclass(frozen=True)
class Transform:
    """The matrices of F(m x m, 3 x 3)."""

    m: int
    bt: tuple[tuple[float, ...], ...]  # (m + 2) x (m + 2): B^T, the input transform
    g: tuple[tuple[float, ...], ...]  # (m + 2) x 3: G, the weight transform
    at: tuple[tuple[float, ...], ...]  # m x (m + 2): A^T, the output transform

    @property
    def alpha(self) -> int:
        """The window's side, m + 2."""
        return self.m + 2


_F2 = Transform(
    m=2,
    bt=((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
    g=((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1)),
    at=((1, 1, 1, 0), (0, 1, -1, -1)),
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
    return plan.weight.dtype == torch.float32 and _shape_ok(plan)


def supports_bf16(plan: ConvPlan) -> bool:
    """Whether `plan` is a bf16 layer of `supports`'s shape that the native kernel runs on
    bf16 activations (F(4,3) in float32 on the widened input, the output rounded to bf16 once;
    `winograd_native.bf16_available`, `PGX_WINOGRAD_NATIVE_BF16`): kernel `winograd` only."""
    return (
        plan.weight.dtype == torch.bfloat16
        and _shape_ok(plan)
        and winograd_native.supports(plan)
        and winograd_native.bf16_available()
    )


def _shape_ok(plan: ConvPlan) -> bool:
    return (
        plan.weight.dim() == 4
        and tuple(plan.weight.shape[2:]) == (3, 3)
        and plan.groups == 1
        and all(s == 1 for s in plan.stride)
        and all(d == 1 for d in plan.dilation)
        and not plan.accumulate
    )


def weight_transform(weight: Tensor, m: int) -> Tensor:
    """The (m+2)^2 matrices (C, K) of `G g G^T`, ordered (row, column) of the tile as the
    input transform writes them, computed in float64 and rounded once to float32."""
    g = torch.tensor(TRANSFORMS[m].g, dtype=torch.float64)
    k, c = weight.shape[:2]
    # one product: ((a, b), (i, j)) = g[a, i] g[b, j] times every (C, K) pair's 9 taps (an
    # einsum over the four axes took twice as long on ResNet-50's 256-channel layers), written
    # in the result's order: the weight's two channel axes swapped first (a copy of 9-tap
    # runs) instead of the product's (K * C, 36) result permuted after it, which took 5x as
    # long (1 thread, 512 x 512: 16.5 against 123 ms, 256 x 256: 3.6 against 18.5; compile)
    # in runs of input channels: float64 temporaries of ~1 MB, not 75 MB of fresh pages for
    # a 512-channel layer
    kron = torch.kron(g, g)
    taps = weight.detach().permute(1, 0, 2, 3).reshape(c, k * 9)
    out = torch.empty(kron.shape[0], c, k, dtype=torch.float32)  # ((a, b), C, K)
    step = max(1, (1 << 17) // (k * 9))
    for c0 in range(0, c, step):
        run = taps[c0 : c0 + step].to(torch.float64).view(-1, 9)  # (C' * K, 9)
        out[:, c0 : c0 + step] = (kron @ run.T).view(-1, min(step, c - c0), k)
    return out


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
    k = plan.weight.shape[0]
    return Geometry(n, c, k, h, w, top, left, ho, wo, th, tw, m * th + 2, m * tw + 2)


#: a call works through the tiles in chunks of window rows whose transformed input takes
#: about this many bytes (it and the products then stay in the core's caches between the
#: passes; one pass over a batch-8 layer's whole transformed input went to memory) ...
CHUNK_BYTES = 1 << 20
#: ... but with at least this many tiles (the products' rows: fewer, and the transformed
#: weight, (m + 2)^2 * C * K floats, is read again for too few rows)
MIN_CHUNK_TILES = 256


@dataclass(frozen=True)
class Chunk:
    """Window rows [r0, r1) (image i's tile row t is window row i * th + t): output rows
    [y0, y1) of images [n0, n1)."""

    r0: int
    r1: int
    n0: int
    n1: int
    y0: int
    y1: int


def chunks(geo: Geometry, m: int) -> list[Chunk]:
    """The chunks of window rows a call works through: whole images, several at a time, or
    runs of tile rows of one image (see `CHUNK_BYTES`)."""
    g = geo
    row_bytes = (m + 2) ** 2 * g.tw * g.c * 4
    per = max(CHUNK_BYTES // row_bytes, -(-MIN_CHUNK_TILES // g.tw), 1)
    if per >= g.th:  # whole images
        step = max(per // g.th, 1)
        return [
            Chunk(i * g.th, min(i + step, g.n) * g.th, i, min(i + step, g.n), 0, g.ho)
            for i in range(0, g.n, step)
        ]
    return [
        Chunk(
            i * g.th + t,
            i * g.th + min(t + per, g.th),
            i,
            i + 1,
            t * m,
            min((t + per) * m, g.ho),
        )  # fmt: skip
        for i in range(g.n)
        for t in range(0, g.th, per)
    ]


def _fresh(role: str, shape: Sequence[int]) -> Tensor:
    """A new temporary (`Scratch.get`'s signature; the old path)."""
    return torch.empty(shape, dtype=torch.float32)


def _padded(x: Tensor, geo: Geometry, scratch: Scratch | None = None) -> Tensor:
    """`x` (NCHW lens, any strides) copied into a zero-bordered (N * hp, wp, C) buffer of
    whole windows, the images one after another: `scratch`'s for this geometry (its border
    already zero), else a new one."""
    g = geo
    bottom, right = g.top + g.h, g.left + g.w
    if scratch is not None:
        flat = scratch.padded(g)
        buf = flat.view(g.n, g.hp, g.wp, g.c)
        buf[:, g.top : bottom, g.left : right].copy_(x.permute(0, 2, 3, 1))
        return flat
    flat = torch.empty(g.n * g.hp, g.wp, g.c, dtype=x.dtype)
    buf = flat.view(g.n, g.hp, g.wp, g.c)
    buf[:, : g.top].zero_()
    buf[:, bottom:].zero_()
    buf[:, g.top : bottom, : g.left].zero_()
    buf[:, g.top : bottom, right:].zero_()
    buf[:, g.top : bottom, g.left : right].copy_(x.permute(0, 2, 3, 1))
    return flat


#: (source, destination) -> the destination written: one step of the epilogue
EpilogueOp = Callable[[Tensor, Tensor, Tensor | None], Tensor]


def activation_op(unary: str, scalars: Sequence[float]) -> EpilogueOp | None:
    """The activation writing `dst` from `src` (they may be one tensor), None for none."""
    if unary == "relu":
        return lambda s, d, o: torch.clamp_min(s, 0.0, out=d)
    if unary == "hardtanh":
        lo, hi = scalars
        return lambda s, d, o: torch.clamp(s, lo, hi, out=d)
    if unary == "swish":
        return lambda s, d, o: torch.ops.aten.silu.out(s, out=d)
    if unary != "none":
        raise ValueError(f"convolution epilogue: unknown activation {unary!r}")
    return None


def activate_(y: Tensor, unary: str, scalars: Sequence[float]) -> None:
    """Apply the epilogue's activation to `y` in place (none, relu, hardtanh = clip, swish =
    silu)."""
    op = activation_op(unary, scalars)
    if op is not None:
        op(y, y, None)


def epilogue_ops(plan: ConvPlan, add: bool) -> list[EpilogueOp]:
    """The epilogue after the bias, in the plan's order: add, activation, or the reverse."""

    def add_op(s: Tensor, d: Tensor, o: Tensor | None) -> Tensor:
        return torch.add(s, o, out=d)

    act = activation_op(plan.unary, plan.scalars)
    ops = [] if act is None else [act]
    if add:
        ops.insert(len(ops) if plan.add_after else 0, add_op)
    if not ops:
        ops = [lambda s, d, o: d.copy_(s)]
    return ops


class Winograd:
    """One layer's Winograd convolution: the transformed weight and the per-call passes."""

    def __init__(self, plan: ConvPlan, m: int, scratch: Scratch | None = None) -> None:
        """`scratch`: the program's (`program_scratch`); without one, a scratch of its own
        (none with `PGX_WINOGRAD_SCRATCH=0`)."""
        if not supports(plan):
            raise ValueError("winograd: a float32 3x3 stride-1 convolution with one group only")
        self.t = TRANSFORMS[m]
        self.geo = geometry(plan, m)
        self.chunks = chunks(self.geo, m)
        self.products = BatchedMatmul(weight_transform(plan.weight, m))
        self.bias = None if plan.bias is None else plan.bias.float().contiguous()
        self.bt = torch.tensor(self.t.bt, dtype=torch.float32)
        at = torch.tensor(self.t.at, dtype=torch.float32)
        # (its entries are products of two small integers: exact in float32)
        self.aa = torch.kron(at, at)
        if not scratch_enabled():
            scratch = None
        elif scratch is None:
            scratch = Scratch()
        self.scratch = scratch
        self.alloc = _fresh if self.scratch is None else self.scratch.get

    def __call__(self, x: Tensor, y: Tensor, other: Tensor | None, ops: list[EpilogueOp]) -> None:
        """The convolution of `x` (NCHW lens, any strides) into `y` ((N, Ho, Wo, K)
        contiguous) with the epilogue `ops` (the add operand `other`, (N, Ho, Wo, K) lens)."""
        flat = _padded(x, self.geo, self.scratch)
        for chunk in self.chunks:
            v = self._input_transform(flat, chunk)
            prod = self.products(v, self.alloc("prod", (v.shape[0], v.shape[1], self.geo.k)))
            tiles = self._output_transform(prod, chunk)
            self._store(tiles, chunk, y, other, ops)

    def _input_transform(self, flat: Tensor, chunk: Chunk) -> Tensor:
        """The chunk's transformed input V[(a, b), window * tile, C]: a (tiles, C) matrix per
        point of the tile."""
        g, m, a = self.geo, self.t.m, self.t.alpha
        windows = chunk.r1 - chunk.r0
        row = g.wp * g.c
        # the input's row pass: B^T times each window row's (m + 2) rows, one product per
        # image (its windows are one strided sequence)
        u1 = self.alloc("u1", (windows, a, row))  # (window, a, wp, C)
        for i in range(chunk.n0, chunk.n1):
            t0, t1 = max(chunk.r0 - i * g.th, 0), min(chunk.r1 - i * g.th, g.th)
            start = (i * g.hp + t0 * m) * row
            rows = flat.as_strided((t1 - t0, a, row), (m * row, row, 1), start)
            at = i * g.th + t0 - chunk.r0
            torch.bmm(self.bt.expand(t1 - t0, a, a), rows, out=u1[at : at + t1 - t0])
        # the columns gathered: X[a, l, window, tile, C] = u1[window, a, m * tile + l, C]
        cols = self.alloc("cols", (a, a, windows, g.tw, g.c))
        cols.copy_(u1.as_strided(cols.shape, (row, g.c, a * row, m * g.c, 1)))
        # the column pass, a product per row a (a batch: both threads work; one (6, N)
        # product runs on one): V[a, b, window, tile, C], a (tiles, C) matrix per point
        v = self.alloc("v", (a, a, windows * g.tw * g.c))
        torch.matmul(self.bt, cols.view(a, a, -1), out=v)
        return v.view(a * a, windows * g.tw, g.c)

    def _output_transform(self, prod: Tensor, chunk: Chunk) -> Tensor:
        """The chunk's output tiles before the epilogue, Y[p, q, window, tile, K] (p the row
        in the tile, q the column), from the products M[(a, b), window * tile, K]."""
        g, m, a = self.geo, self.t.m, self.t.alpha
        if self.bias is not None:
            prod[BIAS_POINT * a + BIAS_POINT].add_(self.bias)
        # one product with the m^2 x (m + 2)^2 matrix A^T (x) A^T: Y[(p, q), X] =
        # sum over (a, b) of A^T[p, a] A^T[q, b] M[(a, b), X]. 2.4x the arithmetic of two
        # passes (rows, then columns: two batched products and an intermediate), but one call
        # and one pass: 1 thread, thread CPU time, the layers' sums 0.64-0.99x of the two
        # passes' (YOLOv8-style 0.88x, ResNet-50 b1 0.93x, b8 0.96x, UNet 0.99x; wino2.md)
        y = self.alloc("tiles", (m * m, prod[0].numel()))
        torch.mm(self.aa, prod.view(a * a, -1), out=y)
        return y.view(m, m, chunk.r1 - chunk.r0, g.tw, g.k)

    def _store(
        self,
        tiles: Tensor,
        chunk: Chunk,
        y: Tensor,
        other: Tensor | None,
        ops: list[EpilogueOp],
    ) -> None:
        """The chunk's tiles cropped to the image and written into `y` by the epilogue's
        first step (its other steps in place there)."""
        g, m = self.geo, self.t.m
        images = chunk.n1 - chunk.n0
        # (image, tile row, p, tile, q, K)
        src = tiles.permute(2, 0, 3, 1, 4).view(images, -1, m, g.tw, m, g.k)
        dst = y[chunk.n0 : chunk.n1, chunk.y0 : chunk.y1]
        part = None if other is None else other[chunk.n0 : chunk.n1, chunk.y0 : chunk.y1]
        for (t0, ti, p), (u0, tj, q) in _blocks(chunk.y1 - chunk.y0, g.wo, m):
            shape = (images, ti, p, tj, q, g.k)
            rows, cols = slice(t0 * m, t0 * m + ti * p), slice(u0 * m, u0 * m + tj * q)
            out = dst[:, rows, cols].view(shape)
            add = None if part is None else part[:, rows, cols].view(shape)
            ops[0](src[:, t0 : t0 + ti, :p, u0 : u0 + tj, :q], out, add)
        for op in ops[1:]:
            op(dst, dst, part)


def _blocks(h: int, w: int, m: int) -> list[tuple[tuple[int, int, int], ...]]:
    """The blocks of an h x w region: its whole m x m tiles, and the cropped tiles below and
    to the right; each as ((first tile row, tile rows, rows per tile), (first tile column,
    tile columns, columns per tile))."""
    down, across = [], []
    for size, out in ((h, down), (w, across)):
        whole, rest = divmod(size, m)
        if whole:
            out.append((0, whole, m))
        if rest:
            out.append((whole, 1, rest))
    return [(r, c) for r in down for c in across]


def _check_out(out: Tensor, g: Geometry, dtype: torch.dtype = torch.float32) -> None:
    """Refuse an output buffer that is not a channels-last `dtype` tensor of the result's
    lens."""
    if (
        list(out.shape) != [g.n, g.k, g.ho, g.wo]
        or out.dtype != dtype
        or not out.is_contiguous(memory_format=torch.channels_last)
    ):
        raise ValueError(
            f"winograd: the output buffer {list(out.shape)} {out.dtype} is not a channels-last "
            f"{dtype} tensor of the result's lens {[g.n, g.k, g.ho, g.wo]}"
        )


def build(
    plan: ConvPlan,
    get_x: Getter,
    get_other: Getter | None,
    m: int = 4,
    out: Tensor | None = None,
    scratch: Scratch | None = None,
) -> Callable[[], Tensor]:
    """A closure running `plan` with F(m x m, 3 x 3) on `get_x()` (and the add operand
    `get_other()`), returning a new channels-last tensor with the whole epilogue applied; or,
    given `out` (a channels-last float32 tensor of the result's lens, such as its arena slot,
    not the add operand), writing `out` every call and returning it (no new result, and no copy
    of one into the slot). `scratch`: the program's temporaries (`Winograd`)."""
    ops = epilogue_ops(plan, get_other is not None)
    bf16 = plan.weight.dtype == torch.bfloat16
    if bf16 and not (m == 4 and supports_bf16(plan)):
        raise ValueError("winograd: a bf16 layer runs on the native F(4,3) kernel only")
    if m == 4 and winograd_native.supports(plan) and (bf16 or winograd_native.available()):
        geo = geometry(plan, m)
        conv = winograd_native.NativeWinograd(
            plan, geo, weight_transform(plan.weight, m), get_other is not None, ops,
            scratch if scratch_enabled() else None,
        )
        if out is not None:
            _check_out(out, geo, conv.dtype)
        return conv.closure(get_x, get_other, out)
    conv = Winograd(plan, m, scratch)
    g = conv.geo
    if out is not None:
        _check_out(out, g)
    # one call now, on zeros: a first call runs 1.5-2x slower than the next ones (its buffers
    # fresh pages, the transformed weight and MKL's state cold; ResNet-50's first stage at
    # batch 1), and the compile's timing keeps only candidates near the fastest first call
    warm = epilogue_ops(plan, False)
    f32 = torch.float32
    conv(torch.zeros(g.n, g.c, g.h, g.w, dtype=f32), torch.empty(g.n, g.ho, g.wo, g.k, dtype=f32),
         None, warm)  # fmt: skip

    def run() -> Tensor:
        y = (torch.empty(g.n, g.ho, g.wo, g.k, dtype=f32) if out is None
             else out.permute(0, 2, 3, 1))  # fmt: skip
        other = None if get_other is None else get_other().permute(0, 2, 3, 1)
        conv(get_x(), y, other, ops)
        return y.permute(0, 3, 1, 2) if out is None else out  # NCHW lens, channels-last

    return run


__all__ = [
    "KERNEL_TILES",
    "SCRATCH_ENV",
    "SCRATCH_KEY",
    "TRANSFORMS",
    "Chunk",
    "Geometry",
    "Scratch",
    "Transform",
    "Winograd",
    "activate_",
    "activation_op",
    "build",
    "chunks",
    "epilogue_ops",
    "geometry",
    "program_scratch",
    "scratch_enabled",
    "supports",
    "supports_bf16",
    "weight_transform",
]
