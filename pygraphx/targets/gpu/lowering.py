"""The gpu target's lowerings, handed to `targets/torch_lowering` as `lowering_overrides`.

* `convolution`: 2-D float convolutions with constant weights through cuDNN / MIOpen
  (`F.conv2d`), weights converted once at prepare to channels-last when the target chose that
  layout (then torch runs the convolution in NHWC and returns a channels-last result, which the
  element-wise groups after it keep); half and bf16 convolutions run in their own type on tensor
  cores (cuDNN accumulates in float32). With Triton on, one whose group after it is its bias,
  residual add and ReLU runs fused with it (`conv_epilogue.py`: cuDNN's fused op or one
  in-place pass). Others: the torch lowering's convolution.
* `dot`: half / bf16 products in their own type (cuBLAS / hipBLASLt tensor cores, float32
  accumulation; with Triton on, a product of a few rows with a constant matrix runs as
  `gemv.py`'s kernel, which needs no cuBLAS workspace); float32 products through the torch
  lowering (`addmm` with the bias of the element-wise group after it folded in); attention
  recognised first (`attention.py`).
* `quant_dot`, `quant_convolution`, `quantizelinear`, `dequantizelinear`: int8 / fp8 GEMMs
  and their quantise / dequantise steps (`quant.py`, `quant_conv.py`), the torch lowering's
  where those decline.
* `pooling`: with Triton on, a 2-D max pool of a channels-last float input as `pool.py`'s
  kernel (torch's channels-last half max pool took six times its bytes' time on the H100),
  with its int8 / fp8 quantise user inside; others (and any pool it does not fit) the torch
  lowering's.
* `pointwise` and `fused_reduce`: generated Triton kernels when the target passes `kernels`
  (`triton_groups.TritonGroups`), else (and for a group the generator refuses) the torch
  lowering's eager code. Recognised attention comes first in `fused_reduce`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.gpu import attention
from pygraphx.targets.gpu.conv_epilogue import Geometry, defer_into_group, epilogue_mode
from pygraphx.targets.gpu.pool import max_pool_nhwc, pool_fits
from pygraphx.targets.gpu.quant import (
    lower_gpu_dequantizelinear,
    lower_gpu_quant_dot,
    lower_gpu_quantizelinear,
)
from pygraphx.targets.gpu.quant_conv import lower_gpu_quant_convolution
from pygraphx.targets.gpu.quant_epilogue import quantising_user
from pygraphx.targets.torch_lowering.context import CHANNELS_LAST, STANDARD, LoweringContext
from pygraphx.targets.torch_lowering.dtypes import torch_dtype
from pygraphx.targets.torch_lowering.lower import LOWERINGS, _load_lowerings
from pygraphx.targets.torch_lowering.lower_math import output_buffer
from pygraphx.targets.torch_lowering.lower_nn import store_result
from pygraphx.targets.torch_lowering.lower_quant import _emit_fresh

if TYPE_CHECKING:
    from pygraphx.targets.gpu.triton_groups import TritonGroups

Lowering = Callable[[LoweringContext, Instruction], bool]

_NATIVE = (torch.float32, torch.float16, torch.bfloat16)


def gpu_overrides(
    channels_last: bool = True, kernels: TritonGroups | None = None
) -> dict[str, Lowering]:
    """Op name -> lowering for the gpu target (see the module docstring)."""
    _load_lowerings()
    torch_lowering = dict(LOWERINGS)
    pointwise, reduce = torch_lowering["pointwise"], torch_lowering["fused_reduce"]
    if kernels is not None:
        pointwise, reduce = kernels.lowering(pointwise), kernels.lowering(reduce)

    triton = kernels is not None

    def conv(ctx: LoweringContext, ins: Instruction) -> bool:
        library = ctx.device.type == "cuda" or (triton and epilogue_mode() == "triton")
        if library and lower_library_convolution(ctx, ins, channels_last, fuse=triton):
            return True
        return torch_lowering["convolution"](ctx, ins)

    def product(c: LoweringContext, i: Instruction) -> bool:
        return plain_dot(c, i, torch_lowering, gemv=triton)

    def dot(ctx: LoweringContext, ins: Instruction) -> bool:
        return attention.lower_attention_dot(ctx, ins, product) or product(ctx, ins)

    def fused_reduce(ctx: LoweringContext, ins: Instruction) -> bool:
        return attention.lower_attention_softmax(ctx, ins, product) or reduce(ctx, ins)

    def pooling(ctx: LoweringContext, ins: Instruction) -> bool:
        return (triton and lower_max_pool(ctx, ins)) or torch_lowering["pooling"](ctx, ins)

    return {
        "convolution": conv,
        "pooling": pooling,
        "dot": dot,
        "pointwise": pointwise,
        "fused_reduce": fused_reduce,
        **quant_overrides(torch_lowering, triton),
    }


def quant_overrides(torch_lowering: dict[str, Lowering], triton: bool) -> dict[str, Lowering]:
    """Op name -> the gpu target's lowering of the quantised ops."""

    def quant_dot(ctx: LoweringContext, ins: Instruction) -> bool:
        return lower_gpu_quant_dot(ctx, ins, torch_lowering["quant_dot"], triton)

    def quantizelinear(ctx: LoweringContext, ins: Instruction) -> bool:
        return lower_gpu_quantizelinear(ctx, ins, torch_lowering["quantizelinear"], triton)

    def dequantizelinear(ctx: LoweringContext, ins: Instruction) -> bool:
        return lower_gpu_dequantizelinear(ctx, ins, torch_lowering["dequantizelinear"])

    def quant_convolution(ctx: LoweringContext, ins: Instruction) -> bool:
        fallback = torch_lowering["quant_convolution"]
        return lower_gpu_quant_convolution(ctx, ins, fallback, triton)

    return {
        "quant_dot": quant_dot,
        "quantizelinear": quantizelinear,
        "quant_convolution": quant_convolution,
        "dequantizelinear": dequantizelinear,
    }


def plain_dot(
    ctx: LoweringContext,
    ins: Instruction,
    torch_lowering: dict[str, Lowering],
    gemv: bool = False,
) -> bool:
    """A product with no attention around it: low precision natively (a few rows times a
    constant matrix as `gemv.py`'s Triton kernel when `gemv`), float32 as torch lowers."""
    dtype = torch_dtype(ins.shape.dtype())
    if dtype in (torch.float16, torch.bfloat16) and ctx.device.type == "cuda":
        if gemv:
            from pygraphx.targets.gpu.gemv import lower_gemv

            if lower_gemv(ctx, ins):
                return True
        if _lower_native_dot(ctx, ins):
            return True
    return torch_lowering["dot"](ctx, ins)


def _lower_native_dot(ctx: LoweringContext, ins: Instruction) -> bool:
    """half / bf16 GEMM in its own type (tensor cores, float32 accumulation inside cuBLAS)."""
    if any(torch_dtype(i.shape.dtype()) != torch_dtype(ins.shape.dtype()) for i in ins.inputs):
        return False
    env = ctx.env
    a, b = ctx.args(ins)
    idx, out = output_buffer(ctx, ins, STANDARD)
    matmul = torch.matmul
    w = ctx.constant(b)
    if w is not None and out.is_contiguous():

        def step() -> None:
            matmul(env[a], w, out=out)

    else:

        def step() -> None:
            out.copy_(matmul(env[a], env[b]))

    ctx.emit(step, ins, idx)
    return True


def lower_max_pool(ctx: LoweringContext, ins: Instruction) -> bool:
    """A 2-D max pool (not global) of a channels-last float input as `pool.max_pool_nhwc`
    writing a channels-last slot, and its int8 / fp8 `quantizelinear` user's tensor when it
    has one with one constant scale that a product reads (`quant_epilogue.quantising_user`:
    that quantise then only binds it; a quantise dequantised again is left to `quant.py`,
    which does the round trip in one pass); False when it does not fit (`pool.pool_fits`)."""
    op, x_shape = ins.op, ins.inputs[0].shape
    x = ctx.arg(ins, 0)
    if op.mode != "max" or op.global_ or torch_dtype(x_shape.dtype()) not in _NATIVE:
        return False
    if ctx.layout[x] != CHANNELS_LAST or ins.shape.ndim() != 4:
        return False
    lens = x_shape.lens()
    begin, end, _ = op.geometry(lens)
    kernel, stride = tuple(op.lengths), tuple(op.stride)
    if list(begin) != list(end) or not pool_fits(lens, kernel, stride, begin, op.dilations):
        return False
    idx, out = output_buffer(ctx, ins, CHANNELS_LAST)
    env, pads, cl = ctx.env, tuple(begin), torch.channels_last
    quantise, scale, store = quantising_user(ctx, ins)
    if quantise is not None and any(u.op.name == "dequantizelinear" for u in quantise.outputs):
        quantise = None  # a round trip (fp8 into cuDNN): `quant.py` makes it one pass
    holder: dict = {}
    if quantise is not None:  # the pool's quantise: its value is the tensor the step leaves
        qtype = torch_dtype(quantise.shape.dtype())

        def bound(c: LoweringContext, q: Instruction) -> bool:
            return _emit_fresh(c, q, lambda: holder["q"], CHANNELS_LAST)

        ctx.fusers[id(quantise)] = bound

    def step() -> None:
        xt = env[x]
        if not xt.is_contiguous(memory_format=cl):  # recorded channels-last: a no-op
            xt = xt.contiguous(memory_format=cl)
        if quantise is None:
            max_pool_nhwc(xt, out, kernel, stride, pads)
            return
        q = torch.empty(out.shape, dtype=qtype, device=out.device, memory_format=cl)
        max_pool_nhwc(xt, out, kernel, stride, pads, (scale, q, store))
        holder["q"] = q

    ctx.emit(step, ins, idx)
    return True


def lower_library_convolution(
    ctx: LoweringContext, ins: Instruction, channels_last: bool, fuse: bool = False
) -> bool:
    """2-D convolution with a constant weight and symmetric padding, in its own float type
    (`gpu_overrides` calls it on CUDA / ROCm devices; tests call it on the CPU). With `fuse`,
    deferred into the element-wise group after it where `conv_epilogue` fuses the two."""
    geometry = library_geometry(ctx, ins, channels_last)
    if geometry is None:
        return False
    if fuse and defer_into_group(ctx, ins, geometry, _lower_alone_with(geometry)):
        return True
    _lower_alone_with(geometry)(ctx, ins)
    return True


def _lower_alone_with(geometry: Geometry) -> Callable[[LoweringContext, Instruction], None]:
    """The step storing the tensor the library convolution returns."""

    def alone(ctx: LoweringContext, ins: Instruction) -> None:
        env, x, conv = ctx.env, ctx.arg(ins, 0), geometry.conv

        def produce() -> torch.Tensor:
            return conv(env[x])

        store_result(ctx, ins, produce, geometry.layout)

    return alone


def library_geometry(
    ctx: LoweringContext, ins: Instruction, channels_last: bool
) -> Geometry | None:
    """The weight (relaid once, `weight_in_layout`) and arguments of a convolution the
    library runs (4-D, input and output of one float type, a constant weight, symmetric
    padding), else None."""
    x_shape, w_shape = (i.shape for i in ins.inputs[:2])
    dtype = torch_dtype(ins.shape.dtype())
    if len(ins.inputs) != 2 or x_shape.ndim() != 4 or dtype not in _NATIVE:
        return None
    if torch_dtype(x_shape.dtype()) != dtype:
        return None
    op = ins.op
    begin, end = op.pads(x_shape.lens(), w_shape.lens())
    w = ctx.constant(ctx.arg(ins, 1))
    if begin != end or w is None:
        return None
    w = weight_in_layout(ctx, ins, w, channels_last)
    layout = CHANNELS_LAST if channels_last else STANDARD
    return Geometry(w, list(op.stride), list(begin), list(op.dilation), op.group, layout)


def weight_in_layout(
    ctx: LoweringContext, ins: Instruction, w: torch.Tensor, channels_last: bool
) -> torch.Tensor:
    """`ins`'s constant weight `w` (input 1) in the layout its convolution runs in, held once
    (`LoweringContext.replace_literal`)."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    converted = w.contiguous(memory_format=fmt)
    ctx.replace_literal(ins, 1, converted)
    return converted
