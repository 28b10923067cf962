"""int8 and fp8 `quant_convolution` on the gpu target (2-D, constant weights, one group).

int8, two ways, chosen per convolution by `PGX_GPU_INT8_CONV` (read at prepare):

* `gemm` (default): the convolution as one int8 GEMM in channels-last order (exact int32
  sums). With Triton GEMMs (`PGX_GPU_INT8_GEMM`, `quant.py`) it is `quant_conv_kernels.conv`:
  an implicit GEMM reading the input in place (NHWC; the stem's 3 channels gathered), tiles
  autotuned per shape. With cuBLAS it first gathers its patches (`im2col`: a padded NHWC copy
  and one strided gather, K = kh*kw*C) for `torch._int_mm` (`quant.dequantised_product`).
  The result rows are the NHWC output. A `dequantizelinear` user with a per-channel scale is
  the kernel's epilogue, so the output is the user's float type, channels-last; with Triton
  GEMMs a bias / residual / ReLU group after it is too, and the int8 quantise of the group's
  result for the next convolution (`quant_epilogue.py`): between convolutions the activations
  stay int8.
* `fp16`: cuDNN's half convolution on dequantised values, for convolutions that are not 1x1
  (`mixed`: 1x1 as `gemm`, the rest so) or all of them (`fp16`). The input is
  `half(q) * s_x` (the activation's scale, read from the `quantizelinear` that made it), the
  weight `half(q_w * s_w)` once at prepare; the sums are cuDNN's (float32 accumulation, half
  result), so the result is the quantised program's to half precision, not exact. Only with a
  fusable dequantise user and a constant activation scale; other convolutions use `gemm`.

fp8 e4m3 (`passes/fold_fp8.py` makes them where Triton kernels run and `fp8_conv_mode` says
`triton`, the default on Hopper: float32 sums, then a per-channel `mul` in the group after it;
with `cudnn`, the default elsewhere, the fp8 values are dequantised for cuDNN's half
convolution): `quant_conv_kernels.conv` with fp8 operands; the
group's scale, bias, residual, ReLU and fp8 quantise of the result are its epilogue as for
int8.

The int8 mode in use is logged once per prepare. Grouped convolutions, asymmetric padding,
runtime weights (and fp8 without Triton) are declined to the torch lowering (the numpy
fallback on a GPU, announced there); `fold_fp8` folds only the fp8 convolutions the kernel
takes (`fp8_kernel_fits`), so the others stay cuDNN half on dequantised values.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.gpu import quant_conv_kernels as qck
from pygraphx.targets.gpu.fp8_gemm import padded
from pygraphx.targets.gpu.quant import (
    FP8,
    IntGemm,
    announce_inexact_fp8,
    dequantised_product,
    int8_gemm_choice,
)
from pygraphx.targets.gpu.quant_epilogue import (
    PRESCALE,
    EpiloguePlan,
    bind_quantised,
    deferred_epilogue,
)
from pygraphx.targets.settings import env_choice
from pygraphx.targets.torch_lowering.context import CHANNELS_LAST, LoweringContext
from pygraphx.targets.torch_lowering.dtypes import torch_dtype
from pygraphx.targets.torch_lowering.lower_math import output_buffer
from pygraphx.targets.torch_lowering.lower_quant import _emit_fresh, channel_vector
from pygraphx.targets.torch_lowering.registry import defer

log = logging.getLogger(__name__)

Lowering = Callable[[LoweringContext, Instruction], bool]
INT8_CONV_ENV = "PGX_GPU_INT8_CONV"
MODES = ("gemm", "mixed", "fp16")
FP8_CONV_ENV = "PGX_GPU_FP8_CONV"
FP8_MODES = ("cudnn", "triton")


def fp8_conv_mode(device: torch.device | None = None) -> str:
    """`PGX_GPU_FP8_CONV` for convolutions on `device`: `triton` (fp8 convolutions as the fp8
    kernel, `fold_fp8` folds them; its sums are Hopper's fp8 accumulation, `quant_conv_kernels.
    FP8_NATIVE`) or `cudnn` (cuDNN half on the fp8 values dequantised). Unset: `triton` on a
    CUDA device of compute capability 9.x, where it was measured faster than cuDNN half (H100,
    ResNet-50 b32: 1.278-1.321 ms against 1.851-1.886, `benchmarks/results/h100_fp8conv_*`;
    the fp16 program then took 1.430-1.465, before `conv_epilogue` fused its convolutions'
    bias / ReLU / residual: 1.147 since, ahead of fp8), else `cudnn` (not measured
    elsewhere). The choice is logged once; `triton` asked for where it is not the default
    says that its sums are not float32-exact (`announce_inexact_fp8`)."""
    default = "triton" if _hopper(device) else "cudnn"
    mode = env_choice(FP8_CONV_ENV, FP8_MODES, default)
    if mode == "triton" and default != "triton" and torch.cuda.is_available():
        announce_inexact_fp8(FP8_CONV_ENV)
    if _LOGGED.get(device) != mode:
        _LOGGED[device] = mode
        log.info("gpu fp8 convolutions: %s (%s; default here: %s)", mode, FP8_CONV_ENV, default)
    return mode


_LOGGED: dict = {}


def _hopper(device: torch.device | None) -> bool:
    """Whether `device` is a CUDA device of compute capability 9.x."""
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device)[0] == 9


def conv_mode() -> str:
    """`PGX_GPU_INT8_CONV` (gemm, mixed or fp16; gemm when unset)."""
    return env_choice(INT8_CONV_ENV, MODES, "gemm")


class Geometry:
    """A 2-D convolution's window: kernel, stride, padding, dilation, and its output size."""

    def __init__(self, ins: Instruction) -> None:
        op = ins.op
        x_lens, w_lens = (i.shape.lens() for i in ins.inputs)
        begin, end = op.pads(x_lens, w_lens)
        self.n, self.c, self.h, self.w = x_lens
        self.c_out, _, self.kh, self.kw = w_lens
        self.stride, self.pad, self.dilation = list(op.stride), list(begin), list(op.dilation)
        self.ho, self.wo = ins.shape.lens()[2:]
        self.rows = self.n * self.ho * self.wo
        self.k = self.kh * self.kw * self.c

    @property
    def pointwise(self) -> bool:
        """A 1x1 convolution whose NHWC input already is the GEMM's left operand."""
        return (self.kh, self.kw) == (1, 1) and self.stride == [1, 1] and self.pad == [0, 0]

    def columns(self, x: torch.Tensor) -> torch.Tensor:
        """The (rows, k) int8 GEMM operand of the NCHW-shaped `x` (im2col in NHWC order)."""
        xh = x.permute(0, 2, 3, 1)
        if self.pointwise:
            return xh.reshape(self.rows, self.c)
        ph, pw = self.pad
        if ph or pw:
            xh = F.pad(xh, (0, 0, pw, pw, ph, ph))
        elif not xh.is_contiguous():
            xh = xh.contiguous()
        s_n, s_h, s_w, s_c = xh.stride()
        (sh, sw), (dh, dw) = self.stride, self.dilation
        patches = xh.as_strided(
            (self.n, self.ho, self.wo, self.kh, self.kw, self.c),
            (s_n, s_h * sh, s_w * sw, s_h * dh, s_w * dw, s_c),
        )
        return patches.reshape(self.rows, self.k)


def kernel_shape_fits(ins: Instruction) -> bool:
    """Whether the convolution `ins` has a shape the kernels take: 2-D, one group, explicit
    symmetric padding."""
    x, w = ins.inputs
    if x.shape.ndim() != 4 or ins.op.group != 1 or ins.op.padding_mode != 0:
        return False
    begin, end = ins.op.pads(x.shape.lens(), w.shape.lens())
    return list(begin) == list(end)


def fp8_kernel_fits(ins: Instruction) -> bool:
    """Whether the `convolution` `ins` of dequantised fp8 values would run as the fp8 kernel
    once folded (`kernel_shape_fits`, its weight dequantised from a literal): `fold_fp8` folds
    only those (others stay cuDNN half on the dequantised values, not the numpy fallback)."""
    w = ins.inputs[1]
    constant = w.op.name == "dequantizelinear" and w.inputs[0].op.name == "@literal"
    return constant and kernel_shape_fits(ins)


def channel_scale(ctx: LoweringContext, user: Instruction, channels: int) -> torch.Tensor | None:
    """`user`'s scale as a float32 vector when it is a constant varying along axis 1 only."""
    if user.op.name != "dequantizelinear" or len(user.inputs) != 2:
        return None
    return channel_vector(ctx, user, 1, channels, any_float=True)


def lower_gpu_quant_convolution(
    ctx: LoweringContext, ins: Instruction, fallback: Lowering, triton: bool
) -> bool:
    """int8 convolution as `gemm` or `fp16`, fp8 as the Triton kernel (module docstring), else
    `fallback`."""
    x, w = ins.inputs
    weights = ctx.constant(ctx.arg(ins, 1))
    kind = x.shape.type()
    if kind not in ("int8_type", FP8) or w.shape.type() != kind or weights is None:
        return fallback(ctx, ins)
    if not kernel_shape_fits(ins) or (kind == FP8 and not triton):
        return fallback(ctx, ins)
    geo = Geometry(ins)
    if kind == FP8:
        return _lower_fp8(ctx, ins, geo, weights)
    fused = None
    if len(ins.outputs) == 1 and ins.outputs[0].inputs[0] is ins:
        scale = channel_scale(ctx, ins.outputs[0], geo.c_out)
        fused = None if scale is None else (ins.outputs[0], scale)
    mode = conv_mode()
    if "int8_conv_mode" not in ctx.cache:
        ctx.cache["int8_conv_mode"] = mode
        log.info("gpu int8 convolutions: %s (%s)", mode, INT8_CONV_ENV)
    if mode == "fp16" or (mode == "mixed" and not geo.pointwise):
        if fused is not None and _lower_half(ctx, ins, geo, weights, fused):
            return True
    return _lower_gemm(ctx, ins, geo, weights, fused, triton)


def _lower_gemm(ctx, ins, geo: Geometry, weights, fused, triton: bool) -> bool:
    wmat = weights.permute(2, 3, 1, 0).reshape(geo.k, geo.c_out)
    xi, env = ctx.arg(ins, 0), ctx.env
    if fused is not None and _lower_fused_gemm(ctx, ins, geo, weights, wmat, fused, triton):
        return True
    gemm = IntGemm(wmat, geo.rows, ctx.device)
    idx, out = output_buffer(ctx, ins, CHANNELS_LAST)
    rows = out.permute(0, 2, 3, 1).reshape(geo.rows, geo.c_out)

    def step() -> None:
        rows.copy_(gemm(geo.columns(env[xi])))

    ctx.emit(step, ins, idx)
    return True


def _lower_fused_gemm(ctx, ins, geo: Geometry, weights, wmat, fused, triton: bool) -> bool:
    """The convolution, its dequantise (and, with Triton GEMMs, a bias / residual / ReLU group
    after it, and that group's int8 quantise: `quant_epilogue.py`) as one kernel writing NHWC
    rows."""
    user, scale = fused
    product = dequantised_product(wmat, geo.rows, ctx.device, triton)
    columns = geo.columns
    if int8_gemm_choice(triton) == "triton":
        product, columns = implicit_conv(weights, geo), input_reader(geo, ctx.device)
    emit = _emitter(ctx, ins, geo, product, columns, scale)

    def fuse(c: LoweringContext, u: Instruction) -> bool:
        if int8_gemm_choice(triton) == "triton" and deferred_epilogue(c, u, 1, geo.c_out, emit):
            return True
        return emit(c, u, None)

    return defer(ctx, ins, user, fuse)


def _lower_fp8(ctx: LoweringContext, ins: Instruction, geo: Geometry, weights) -> bool:
    """The fp8 convolution as `quant_conv_kernels.conv`: with the group after it as the
    epilogue (its leading per-channel `mul` the scale) when it fits, else alone (float32)."""
    product, columns = implicit_conv(weights, geo), input_reader(geo, ctx.device)
    ones = torch.ones(geo.c_out, dtype=torch.float32, device=ctx.device)
    late: dict = {}
    emit = _emitter(ctx, ins, geo, product, columns, ones, late)
    if deferred_epilogue(ctx, ins, 1, geo.c_out, emit, scaled=True):
        return True
    if len(ins.outputs) == 1:  # a group reading it as a residual may scale it here

        def prescale(scale: torch.Tensor, dtype: torch.dtype) -> None:
            late.update(scale=scale, dtype=dtype)

        ctx.cache.setdefault(PRESCALE, {})[id(ins)] = prescale
    return emit(ctx, ins, None)


def _emitter(ctx, ins: Instruction, geo: Geometry, product, columns, scale, late=None):
    """`emit(c, at, plan)`: one step at `at` running `product(columns(x), scale, out, ...)`
    into a new channels-last tensor of `at`'s type, with `plan`'s epilogue (its scale, when it
    has one, instead of `scale`) and 8-bit quantised output when it has them. `late` (an fp8
    product run alone): a "scale" and "dtype" set there after this (before any run, by the
    plan of the group reading it: `EpiloguePlan.use_prescale`) replace `scale` and the type."""
    late = {} if late is None else late
    xi, env = ctx.arg(ins, 0), ctx.env
    nhwc, flat = (geo.n, geo.ho, geo.wo, geo.c_out), (geo.rows, geo.c_out)

    def rows(t: torch.Tensor) -> torch.Tensor:
        return t.permute(0, 2, 3, 1).reshape(geo.rows, geo.c_out)

    def emit(c: LoweringContext, at: Instruction, plan: EpiloguePlan | None) -> bool:
        ep = None if plan is None else plan.epilogue
        residual = (lambda: None) if plan is None else plan.residual_rows(env, rows)
        holder = {} if plan is None else bind_quantised(c, plan, CHANNELS_LAST)
        s = scale if plan is None or plan.scale is None else plan.scale
        dtype = torch_dtype(at.shape.dtype())

        def produce() -> torch.Tensor:
            out = torch.empty(nhwc, dtype=late.get("dtype", dtype), device=env[xi].device)
            q = None if plan is None else plan.quantised_output(nhwc, out.device)
            qv = None if q is None else q.view(flat)
            product(columns(env[xi]), late.get("scale", s), out.view(flat), ep, residual(), qv)
            if q is not None:
                holder["q"] = q.permute(0, 3, 1, 2)
            return out.permute(0, 3, 1, 2)

        # a new tensor, not the user's arena slot: one kernel reads the input while it
        # writes (a 1x1 convolution reads its input in place); the convolution is listed
        # with the step, so its input lives until then
        return _emit_fresh(c, at, produce, CHANNELS_LAST, [] if at is ins else [ins])

    return emit


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """`t` as uint8 when it is fp8 (copies and gathers of fp8 go through its bytes)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def input_reader(geo: Geometry, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """The input as `quant_conv_kernels.conv` reads it: dense channels-last when its channels
    are a multiple of the K block (a tap at a time); for few channels (`qck.row_layout`) a
    zero-padded NHWC copy (`RowsInput`, on `device`); else as it is (gathered)."""
    if qck.row_layout(geo.c, geo.kw, geo.dilation) is not None:
        return RowsInput(geo, device)
    if geo.c % qck.CONV_BLOCK_K != 0:
        return lambda x: x
    return channels_last


class RowsInput:
    """`quant_conv_kernels`' `ROWS` input of a convolution of few channels: one buffer, made
    once, (N, H + 2 ph, W', c4) bytes, zero but where each call copies the input in (its
    padding stays zero; W' leaves room for the last window's padded run; `qck.pad_rows`).
    Called with the (N, C, H, W) int8 / fp8 input, it returns the buffer as an
    (N, c4, H', W') channels-last tensor of the input's type."""

    def __init__(self, geo: Geometry, device) -> None:
        self.c4, self.run = qck.row_layout(geo.c, geo.kw, geo.dilation)
        (ph, pw), (_, sw) = geo.pad, geo.stride
        wide = max(geo.w + 2 * pw, (geo.wo - 1) * sw + self.run // self.c4)
        shape = (geo.n, geo.h + 2 * ph, wide, self.c4)
        self.buffer = torch.zeros(shape, dtype=torch.uint8, device=device)
        self.pads = (ph, pw)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        qck.pad_rows(_bytes(x), self.buffer, self.pads)
        return self.buffer.permute(0, 3, 1, 2).view(x.dtype)


def channels_last(x: torch.Tensor) -> torch.Tensor:
    if x.is_contiguous(memory_format=torch.channels_last):
        return x
    return _bytes(x).contiguous(memory_format=torch.channels_last).view(x.dtype)


def _weight_rows(weights: torch.Tensor, geo: Geometry) -> torch.Tensor:
    """The (C_out, kh*kw*C) weight matrix in (kh, kw, c) order, of the weights' type, its
    rows 16-byte aligned (a view of a wider matrix when K is not a multiple of 16)."""
    w = _bytes(weights).permute(0, 2, 3, 1).reshape(geo.c_out, geo.k)
    wide = torch.zeros((geo.c_out, padded(geo.k, 16)), dtype=w.dtype, device=w.device)
    wide[:, : geo.k] = w
    return wide[:, : geo.k].view(weights.dtype)


def _row_weights(weights: torch.Tensor, geo: Geometry, c4: int, run: int) -> torch.Tensor:
    """The (C_out, kh * run) weights of the `ROWS` mode: per kernel row its (kw, c4) taps,
    zero past (kw, C), zero-padded to `run` bytes."""
    taps = _bytes(weights).permute(0, 2, 3, 1)
    wide = torch.zeros((geo.c_out, geo.kh, run // c4, c4), dtype=taps.dtype, device=taps.device)
    wide[:, :, : geo.kw, : geo.c] = taps
    return wide.reshape(geo.c_out, geo.kh * run).view(weights.dtype)


def implicit_conv(weights: torch.Tensor, geo: Geometry) -> Callable:
    """`(x, scale, out, ...)` running `quant_conv_kernels.conv` on the NHWC input in place, or
    for few channels on `RowsInput`'s padded copy (`qck.ROWS`; `input_reader` makes it)."""
    layout = qck.row_layout(geo.c, geo.kw, geo.dilation)
    if layout is None:
        wt, run_bytes = _weight_rows(weights, geo), None
        geometry = (geo.kw, geo.stride, geo.pad, geo.dilation, geo.ho, geo.wo)
    else:
        wt, run_bytes = _row_weights(weights, geo, *layout), layout[1]
        geometry = (1, geo.stride, (0, 0), (1, 1), geo.ho, geo.wo)
    conv = qck.conv

    def run(x, scale, out, epilogue=None, residual=None, qout=None) -> None:
        if run_bytes is None:
            conv(x, wt, scale, out, geometry, epilogue, residual, qout)
        else:
            conv(x, wt, scale, out, geometry, epilogue, residual, qout, run=run_bytes)

    return run


def _activation_scale(ctx: LoweringContext, ins: Instruction) -> float | None:
    """The one scale of the `quantizelinear` that made `ins`'s input, when constant."""
    q = ins.inputs[0]
    if q.op.name != "quantizelinear" or len(q.inputs) != 2 or id(q.inputs[1]) not in ctx.index:
        return None
    t = ctx.constant(ctx.arg(q, 1))
    if t is None or t.numel() == 0:
        return None
    flat = t.reshape(-1).to(torch.float32)
    return float(flat[0]) if bool((flat == flat[0]).all()) and float(flat[0]) > 0 else None


def _lower_half(ctx, ins, geo: Geometry, weights, fused) -> bool:
    """cuDNN's half convolution of the dequantised input and weights (the `fp16` mode)."""
    s_x = _activation_scale(ctx, ins)
    if s_x is None:
        return False
    user, scale = fused
    per_weight = (scale / s_x).view(-1, 1, 1, 1)
    w_half = (weights.to(torch.float32) * per_weight).to(torch.float16)
    w_half = w_half.contiguous(memory_format=torch.channels_last)
    xi, env = ctx.arg(ins, 0), ctx.env
    conv, half = F.conv2d, torch.float16
    geometry = (geo.stride, geo.pad, geo.dilation)

    dtype, cl = torch_dtype(user.shape.dtype()), torch.channels_last

    def produce() -> torch.Tensor:
        xh = env[xi].to(half).mul_(s_x)
        y = conv(xh, w_half, None, *geometry)
        return y.to(dtype).contiguous(memory_format=cl)

    return defer(ctx, ins, user, lambda c, u: _emit_fresh(c, u, produce, CHANNELS_LAST))


__all__ = [
    "FP8_CONV_ENV",
    "INT8_CONV_ENV",
    "conv_mode",
    "fp8_conv_mode",
    "fp8_kernel_fits",
    "kernel_shape_fits",
    "lower_gpu_quant_convolution",
]
