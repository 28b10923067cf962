"""Neural-network operators lowered to torch: convolution, deconvolution, pooling, norms.

* `convolution`: on the CPU, 2-D float32 convolutions with constant weights run through oneDNN
  with the weights reordered once at prepare (`mkldnn._convolution_pointwise`, or for a 1x1
  layer a oneDNN matrix product when timing it at prepare finds it faster: `conv_choice.py`)
  on channels-last activations; the element-wise group that follows (bias, residual add,
  relu / relu6) is fused into the convolution as oneDNN post-ops (`conv_fusion.py`). Other
  convolutions use `torch.nn.functional.conv{1,2,3}d` (asymmetric padding: `F.pad` first).
* `deconvolution`: `conv_transpose{1,2,3}d`, then the IR's begin/end crop; a bf16 2-D one with
  a literal weight runs in bf16 on oneDNN with its bias group fused (`deconv_bf16.py`;
  `PGX_CPU_BF16_DECONV=float32` computes it in float32 here).
* `pooling`: on the CPU, 2-D max/average pooling of channels-last float32 / bf16 tensors
  through a oneDNN primitive made once where it computes the IR's geometry exactly
  (`onednn_pool.py`); otherwise max/average through `F.{max,avg}_pool{1,2,3}d` when torch's
  geometry matches the IR's (checked on one channel at prepare), global pooling as
  `amax`/`mean`.
* `batch_norm_inference` (spatial), `instance_norm`, `lrn` (odd sizes): their torch functions.

Results torch allocates are kept as run-time values (`conv_output="torch"`, see
`conv_fusion.py`) or copied into the arena slot (`conv_output="arena"`, the cpu target's
default).

Declined (numpy fallback): integer and fp8 convolutions and pooling, lpnorm pooling, pooling
with asymmetric padding, average pooling with dilation, deconvolution with negative padding,
`batch_norm_inference` per activation, `lrn` of even size, `deform_convolution`,
`pooling_indices`, `max_unpool`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pygraphx.ir.instruction import Instruction
from pygraphx.ops.spatial import split_padding
from pygraphx.targets.torch_lowering.context import CHANNELS_LAST, STANDARD, LoweringContext
from pygraphx.targets.torch_lowering.dtypes import FLOAT_DTYPES, torch_dtype
from pygraphx.targets.torch_lowering.registry import lowering
from pygraphx.targets.torch_lowering.store import store_result, torch_pad

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_DECONV = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}
_MAXPOOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVGPOOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _float_compute(ins: Instruction) -> torch.dtype | None:
    """The dtype an NN op computes in: its own float type, float32 for half/bf16; None for the
    types it is not lowered for."""
    dt = torch_dtype(ins.shape.dtype())
    if dt not in FLOAT_DTYPES:
        return None
    return dt if dt in (torch.float32, torch.float64) else torch.float32


# --- convolution ----------------------------------------------------------------------------


@lowering("convolution")
def lower_convolution(ctx: LoweringContext, ins: Instruction) -> bool:
    from pygraphx.targets.torch_lowering import conv_fusion

    if conv_fusion.lower_mkldnn_convolution(ctx, ins):
        return True
    return lower_generic_convolution(ctx, ins)


def lower_generic_convolution(ctx: LoweringContext, ins: Instruction) -> bool:
    work = _float_compute(ins)
    x_shape, w_shape = (i.shape for i in ins.inputs)
    nd = x_shape.ndim() - 2
    if work is None or nd not in _CONV:
        return False
    op = ins.op
    begin, end = op.pads(x_shape.lens(), w_shape.lens())
    conv = _CONV[nd]
    stride, dilation, groups = list(op.stride), list(op.dilation), op.group
    pre_pad = None if begin == end else torch_pad(begin, end)
    padding = begin if pre_pad is None else [0] * nd
    env = ctx.env
    x, w = ctx.args(ins)
    out_dtype = torch_dtype(ins.shape.dtype())
    w_fixed = ctx.constant(w)
    if w_fixed is not None:
        w_fixed = w_fixed.to(work)

    def produce() -> torch.Tensor:
        xt = env[x]
        if xt.dtype != work:
            xt = xt.to(work)
        if pre_pad is not None:
            xt = F.pad(xt, pre_pad)
        wt = w_fixed if w_fixed is not None else env[w].to(work)
        y = conv(xt, wt, None, stride, padding, dilation, groups)
        return y if y.dtype == out_dtype else y.to(out_dtype)

    store_result(ctx, ins, produce, ctx.layout[x] if nd == 2 else STANDARD)
    return True


@lowering("deconvolution")
def lower_deconvolution(ctx: LoweringContext, ins: Instruction) -> bool:
    from pygraphx.targets.torch_lowering.deconv_bf16 import lower_bf16_deconvolution

    if lower_bf16_deconvolution(ctx, ins):  # bf16 in bf16 (`PGX_CPU_BF16_DECONV`)
        return True
    work = _float_compute(ins)
    x_shape = ins.inputs[0].shape
    nd = x_shape.ndim() - 2
    op = ins.op
    if work is None or nd not in _DECONV:
        return False
    begin, end = split_padding(op, op.padding, nd)
    if any(p < 0 for p in begin + end):
        return False
    out_lens = ins.shape.lens()
    crop = (slice(None), slice(None)) + tuple(
        slice(b, b + n) for b, n in zip(begin, out_lens[2:], strict=True)
    )
    deconv = _DECONV[nd]
    stride, dilation, groups = list(op.stride), list(op.dilation), op.group
    env = ctx.env
    x, w = ctx.args(ins)
    out_dtype = torch_dtype(ins.shape.dtype())

    def produce() -> torch.Tensor:
        y = deconv(env[x].to(work), env[w].to(work), None, stride, 0, 0, groups, dilation)
        y = y[crop]
        return y.to(out_dtype) if y.dtype != out_dtype else y

    # torch keeps a channels-last input's layout (a UNet decoder's upsampling after a
    # convolution): so says the record, for the concat that joins it to its skip
    store_result(ctx, ins, produce, ctx.layout[x] if nd == 2 else STANDARD)
    return True


# --- pooling --------------------------------------------------------------------------------


@lowering("pooling")
def lower_pooling(ctx: LoweringContext, ins: Instruction) -> bool:
    from pygraphx.targets.torch_lowering.onednn_pool import lower_onednn_pooling

    if lower_onednn_pooling(ctx, ins):
        return True
    op = ins.op
    x_shape = ins.inputs[0].shape
    dt = torch_dtype(x_shape.dtype())
    nd = x_shape.ndim() - 2
    if dt not in FLOAT_DTYPES or op.mode not in ("max", "average"):
        return False
    x = ctx.arg(ins, 0)
    env = ctx.env
    layout = ctx.layout[x] if nd == 2 else STANDARD
    lens = x_shape.lens()
    full = op.global_ or (
        list(op.lengths) == lens[2:] and not any(op.padding) and ins.shape.lens()[2:] == [1] * nd
    )
    if full:
        dims = tuple(range(2, 2 + nd))
        reduce = torch.amax if op.mode == "max" else torch.mean
        idx, out = _slot_or_private(ctx, ins)

        def step() -> None:
            reduce(env[x], dims, keepdim=True, out=out)

        ctx.emit(step, ins, idx)
        return True
    if nd not in _MAXPOOL:
        return False
    begin, end, _ = op.geometry(lens)
    if begin != end:
        return False
    kernel, stride, dil = list(op.lengths), list(op.stride), list(op.dilations)
    if op.mode == "max":
        pool = _MAXPOOL[nd]
        args: tuple = (kernel, stride, begin, dil, bool(op.ceil_mode))
    else:
        if any(d != 1 for d in dil):
            return False
        pool = _AVGPOOL[nd]
        args = (kernel, stride, begin, bool(op.ceil_mode), bool(op.count_include_pad))
    # the output's spatial size checked on one real channel: a meta tensor would make torch
    # import sympy (about 1 s of the first compile in a process)
    try:
        probe = pool(torch.zeros([1, 1, *lens[2:]], dtype=torch.float32), *args)
    except RuntimeError:
        return False  # torch rejects the geometry (padding larger than half the window, ...)
    if list(probe.shape[2:]) != ins.shape.lens()[2:]:
        return False

    def produce() -> torch.Tensor:
        return pool(env[x], *args)

    store_result(ctx, ins, produce, layout)
    return True


def _slot_or_private(ctx: LoweringContext, ins: Instruction) -> tuple[int, torch.Tensor]:
    from pygraphx.targets.torch_lowering.lower_math import output_buffer

    return output_buffer(ctx, ins, STANDARD)


# --- normalisation --------------------------------------------------------------------------


@lowering("batch_norm_inference")
def lower_batch_norm(ctx: LoweringContext, ins: Instruction) -> bool:
    op = ins.op
    work = _float_compute(ins)
    if work is None or op.bn_mode != 1:
        return False
    env = ctx.env
    x, scale, bias, mean, var = ctx.args(ins)
    eps = float(op.epsilon)
    out_dtype = torch_dtype(ins.shape.dtype())

    def produce() -> torch.Tensor:
        s, b, m, v = (env[i].to(work) for i in (scale, bias, mean, var))
        y = F.batch_norm(env[x].to(work), m, v, s, b, False, 0.0, eps)
        return y.to(out_dtype)

    store_result(ctx, ins, produce, ctx.layout[x] if ins.shape.ndim() == 4 else STANDARD)
    return True


@lowering("instance_norm")
def lower_instance_norm(ctx: LoweringContext, ins: Instruction) -> bool:
    work = _float_compute(ins)
    if work is None:
        return False
    env = ctx.env
    x, scale, bias = ctx.args(ins)
    eps = float(ins.op.epsilon)
    out_dtype = torch_dtype(ins.shape.dtype())

    def produce() -> torch.Tensor:
        y = F.instance_norm(
            env[x].to(work), weight=env[scale].to(work), bias=env[bias].to(work), eps=eps
        )
        return y.to(out_dtype)

    store_result(ctx, ins, produce)
    return True


@lowering("lrn")
def lower_lrn(ctx: LoweringContext, ins: Instruction) -> bool:
    op = ins.op
    work = _float_compute(ins)
    if work is None or op.size % 2 == 0 or ins.shape.ndim() < 3:
        return False  # torch centres even windows the other way
    env = ctx.env
    x = ctx.arg(ins, 0)
    size, alpha, beta, k = op.size, float(op.alpha), float(op.beta), float(op.bias)
    out_dtype = torch_dtype(ins.shape.dtype())

    def produce() -> torch.Tensor:
        y = F.local_response_norm(env[x].to(work), size, alpha, beta, k)
        return y.to(out_dtype)

    store_result(ctx, ins, produce)
    return True


__all__ = ["CHANNELS_LAST", "store_result"]
