"""bf16 2-D deconvolution (ConvTranspose) computed in bf16 through oneDNN, with its bias and
activation fused.

Before this (and still with `PGX_CPU_BF16_DECONV=float32`), a bf16 `deconvolution` computes
in float32 (`lower_nn.lower_deconvolution`: input and weight converted every run, the result
rounded back to bf16), and the bias add that follows is a step of its own. Here a bf16
deconvolution whose weight is a literal runs on torch's oneDNN kernel
(`mkldnn._convolution_transpose_pointwise`, the one inductor's CPU freezing path takes) with
the weight reordered into oneDNN's blocked bf16 format once, at prepare; oneDNN accumulates in
float32 and rounds the result once. UNet-small's two 2x2 stride-2 ConvTranspose at 2 threads:
1.5-1.6 ms each in float32 against 0.64 here (`benchmarks/unet13_probe.py`).

When the deconvolution's only user is a pointwise group act(deconv + c1 + c2 ...) (constants
broadcast along the channels: a bias; act none, relu, clip, silu: `conv_fusion.match_epilogue`
without a tensor operand) the group is folded in: the constants summed into oneDNN's bias (in
bf16, as the bf16 convolutions take it) and the activation a oneDNN post-op, one step. Any
other user keeps its own step. Profiling runs the two apart (the unfused twins).

The IR's padding is applied as a crop of the unpadded result (as the float32 path does), so
every padding / output_padding the IR expresses means the same here. The result is a new
channels-last tensor (the input is made channels-last first when it is not), copied into the
step's arena slot. On a CPU without bf16 instructions, without oneDNN, or with a weight that
is not a literal, the float32-compute path runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.ops.spatial import split_padding
from pygraphx.targets.torch_lowering.context import CHANNELS_LAST, LoweringContext
from pygraphx.targets.torch_lowering.dtypes import torch_dtype
from pygraphx.targets.torch_lowering.gemm_kernels import bf16_gemm
from pygraphx.targets.torch_lowering.registry import defer, deferred_producer
from pygraphx.targets.torch_lowering.store import store_result

#: the environment variable choosing how a bf16 deconvolution computes: `bf16` (default, here)
#: or `float32` (the float32-compute path of `lower_nn.lower_deconvolution`)
DECONV_ENV = "PGX_CPU_BF16_DECONV"
#: the default of `DECONV_ENV`
DEFAULT_MODE = "bf16"
#: oneDNN post-op names (torch's mkldnn attr) fused after the bias
_UNARY = ("none", "relu", "swish", "hardtanh")
CL = torch.channels_last


def mode() -> str:
    """`PGX_CPU_BF16_DECONV`: `bf16` or `float32`."""
    raw = os.environ.get(DECONV_ENV, DEFAULT_MODE).strip().lower()
    if raw not in ("bf16", "float32"):
        raise ValueError(f"{DECONV_ENV}={raw!r}: expected 'bf16' or 'float32'")
    return raw


def usable(ctx: LoweringContext, ins: Instruction) -> bool:
    """Whether bf16 deconvolution `ins` runs here (module docstring)."""
    if ctx.device.type != "cpu" or not ctx.options.get("mkldnn", True):
        return False
    if not torch.backends.mkldnn.is_available() or mode() != "bf16":
        return False
    x, w = ins.inputs
    if {x.shape.type(), w.shape.type(), ins.shape.type()} != {"bf16_type"}:
        return False
    if x.shape.ndim() != 4 or ins.shape.elements() == 0 or not bf16_gemm(ctx):
        return False
    begin, end = split_padding(ins.op, ins.op.padding, 2)
    if any(p < 0 for p in begin + end):
        return False
    return ctx.constant(ctx.arg(ins, 1)) is not None


class Plan:
    """The oneDNN deconvolution of `ins`: its packed weight, geometry and crop; `bias`,
    `unary`, `scalars`: the fused epilogue."""

    def __init__(self, ctx: LoweringContext, ins: Instruction) -> None:
        op = ins.op
        x_lens = list(ins.inputs[0].shape.lens())
        begin, _ = split_padding(op, op.padding, 2)
        out_lens = ins.shape.lens()
        self.crop = (slice(None), slice(None)) + tuple(
            slice(b, b + n) for b, n in zip(begin, out_lens[2:], strict=True)
        )
        self.stride, self.dilation, self.groups = list(op.stride), list(op.dilation), op.group
        w = ctx.constant(ctx.arg(ins, 1))
        key = ("mkldnn_deconv_weight", id(ins.inputs[1]), tuple(self.stride),
               tuple(self.dilation), self.groups, tuple(x_lens))  # fmt: skip
        if key not in ctx.packed_weights:
            ctx.packed_weights[key] = torch.ops.mkldnn._reorder_convolution_transpose_weight(
                w.to(torch.bfloat16).contiguous(), [0, 0], [0, 0], self.stride, self.dilation,
                self.groups, x_lens,
            )  # fmt: skip
        self.weight = ctx.packed_weights[key]
        self.bias: torch.Tensor | None = None
        self.unary, self.scalars = "none", []
        self.trim = any(s.start != 0 for s in self.crop[2:]) or [
            (n - 1) * s + d * (k - 1) + 1
            for n, s, d, k in zip(
                x_lens[2:], self.stride, self.dilation, ins.inputs[1].shape.lens()[2:], strict=True
            )
        ] != out_lens[2:]

    def producer(self, env: list, x: int) -> Callable[[], torch.Tensor]:
        """The closure computing the (new, channels-last) result from env[x]."""
        kernel = torch.ops.mkldnn._convolution_transpose_pointwise
        w, b, unary, scalars = self.weight, self.bias, self.unary, self.scalars
        stride, dilation, groups, crop = self.stride, self.dilation, self.groups, self.crop
        zero = [0, 0]

        def produce() -> torch.Tensor:
            xt = env[x].contiguous(memory_format=CL)
            y = kernel(xt, w, b, zero, zero, stride, dilation, groups, unary, scalars, "")
            return y[crop] if self.trim else y

        return produce


def lower_bf16_deconvolution(ctx: LoweringContext, ins: Instruction) -> bool:
    """Lower `ins` here (fused with its bias group where it has one); False when `usable`
    says no (nothing emitted)."""
    if not usable(ctx, ins):
        return False
    from pygraphx.targets.torch_lowering.conv_dw_fusion import may_fuse

    user = ins.outputs[0] if len(ins.outputs) == 1 else None
    if user is not None and may_fuse(ins, user) and defer(ctx, ins, user, fuse_group):
        return True
    lower_alone(ctx, ins)
    return True


def lower_alone(ctx: LoweringContext, ins: Instruction) -> None:
    plan = Plan(ctx, ins)
    store_result(ctx, ins, plan.producer(ctx.env, ctx.arg(ins, 0)), CHANNELS_LAST)


def fuse_group(ctx: LoweringContext, user: Instruction) -> bool:
    """Emit deconvolution + bias group as one oneDNN call (the fuser of a deconvolution
    deferred into its group `user`); the separate steps are kept for profiling."""
    from pygraphx.targets.torch_lowering.conv_fusion import match_epilogue
    from pygraphx.targets.torch_lowering.fallback import lower_fallback
    from pygraphx.targets.torch_lowering.lower_math import lower_pointwise

    deconv = deferred_producer(ctx, user)
    epi = match_epilogue(ctx, deconv, user)
    if epi is None or epi.other is not None or epi.unary not in _UNARY:
        lower_alone(ctx, deconv)
        return False
    plan = Plan(ctx, deconv)
    plan.bias = torch.from_numpy(epi.bias).to(torch.bfloat16) if epi.bias.any() else None
    plan.unary, plan.scalars = epi.unary, list(epi.scalars)
    saved, ctx.steps = ctx.steps, []
    lower_alone(ctx, deconv)
    if not lower_pointwise(ctx, user):
        lower_fallback(ctx, user)
    unfused, ctx.steps = ctx.steps, saved
    produce = plan.producer(ctx.env, ctx.arg(deconv, 0))
    store_result(ctx, user, produce, CHANNELS_LAST, [deconv, user], unfused)
    return True


__all__ = ["DECONV_ENV", "Plan", "lower_bf16_deconvolution", "mode", "usable"]
