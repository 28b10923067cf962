"""bf16 2-D deconvolution (ConvTranspose) computed in bf16 through oneDNN, with its bias and
activation fused.

Before this (and still with `PGX_CPU_BF16_DECONV=float32`), a bf16 `deconvolution` computes
in float32 (`lower_nn.lower_deconvolution`: input and weight converted every run, the result
rounded back to bf16), and the bias add that follows is a step of its own. Here a bf16
deconvolution whose weight is a literal runs on oneDNN with the weight reordered into its
blocked bf16 format once, at prepare; oneDNN accumulates in float32 and rounds the result
once. Where oneDNN's library is installed and the deconvolution is uncropped, its own
primitive writes the step's slot (`onednn_deconv.py`, `capi_step`); otherwise torch's oneDNN
op (`mkldnn._convolution_transpose_pointwise`, the one inductor's CPU freezing path takes)
makes a new tensor, copied into the slot (`PGX_CPU_BF16_DECONV=torch` always takes it).
UNet-small's two 2x2 stride-2 ConvTranspose at 2 threads: 1.5-1.6 ms each in float32 against
0.64 on torch's op, 0.61 on the primitive (`benchmarks/unet13_probe.py`); in the network at 1
thread 1.6 and 1.4 ms of thread CPU a layer (`benchmarks/results/unet13.md`).

When the deconvolution's only user is a pointwise group act(deconv + c1 + c2 ...) (constants
broadcast along the channels: a bias; act none, relu, clip, silu:
`conv_epilogue_match.match_epilogue` without a tensor operand) the group is folded in: the
constants summed into oneDNN's bias (in float32 where `quantize_bf16` kept the bias's float32
value, added to the float32 product before the one rounding, as the bf16 convolutions take it;
else in bf16) and the activation a oneDNN post-op, one step. Any other user keeps its own
step. Profiling runs the two apart (the unfused twins, on torch's
op). The fused step reads the deconvolution's input while it writes the group's slot: the
cpu target's memory plan keeps the two apart (`fused_reader`, in `fused_reads.READERS`).

The IR's padding is applied as a crop of the unpadded result (as the float32 path does), so
every padding / output_padding the IR expresses means the same here (on torch's op; the
primitive takes only uncropped ones). The result is channels-last (the input is made
channels-last first when it is not). On a CPU without bf16 instructions, without oneDNN, or
with a weight that is not a literal, the float32-compute path runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.ops.spatial import split_padding
from pygraphx.targets.torch_lowering.context import CHANNELS_LAST, LoweringContext
from pygraphx.targets.torch_lowering.gemm_kernels import bf16_gemm
from pygraphx.targets.torch_lowering.registry import defer, deferred_producer
from pygraphx.targets.torch_lowering.store import store_result

#: the environment variable choosing how a bf16 deconvolution computes: `bf16` (default, here:
#: oneDNN's C API primitive where it can run, else torch's oneDNN op), `torch` (here, always
#: torch's op) or `float32` (the float32-compute path of `lower_nn.lower_deconvolution`)
DECONV_ENV = "PGX_CPU_BF16_DECONV"
#: the default of `DECONV_ENV`
DEFAULT_MODE = "bf16"
#: oneDNN post-op names (torch's mkldnn attr) fused after the bias
_UNARY = ("none", "relu", "swish", "hardtanh")
CL = torch.channels_last


def mode() -> str:
    """`PGX_CPU_BF16_DECONV`: `bf16`, `torch` or `float32`."""
    raw = os.environ.get(DECONV_ENV, DEFAULT_MODE).strip().lower()
    if raw not in ("bf16", "torch", "float32"):
        raise ValueError(f"{DECONV_ENV}={raw!r}: expected 'bf16', 'torch' or 'float32'")
    return raw


def usable(ctx: LoweringContext, ins: Instruction) -> bool:
    """Whether bf16 deconvolution `ins` runs here (module docstring)."""
    if ctx.device.type != "cpu" or not ctx.options.get("mkldnn", True):
        return False
    if not torch.backends.mkldnn.is_available() or mode() == "float32":
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
        self.x_lens, self.w = x_lens, w.to(torch.bfloat16)
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
        self.full = [
            (n - 1) * s + d * (k - 1) + 1
            for n, s, d, k in zip(
                x_lens[2:], self.stride, self.dilation, ins.inputs[1].shape.lens()[2:], strict=True
            )
        ]
        self.trim = any(s.start != 0 for s in self.crop[2:]) or self.full != out_lens[2:]

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


def fused_reader(ins: Instruction) -> Instruction | None:
    """The pointwise group a bf16 deconvolution `ins` may be fused into (its step reads the
    deconvolution's input while it writes the group's slot), else None: part of the cpu
    target's `fused_reads`, so that the C API primitive can write that slot."""
    from pygraphx.targets.torch_lowering.conv_dw_fusion import may_fuse

    if ins.op.name != "deconvolution" or len(ins.outputs) != 1:
        return None
    if ins.shape.type() != "bf16_type" or mode() != "bf16" or not ins.inputs[1].is_literal():
        return None
    begin, end = split_padding(ins.op, ins.op.padding, 2)
    if any(begin) or any(end):  # cropped: torch's op makes a new tensor, no overlap
        return None
    user = ins.outputs[0]
    return user if may_fuse(ins, user) else None


def lower_alone(ctx: LoweringContext, ins: Instruction, capi: bool = True) -> None:
    """`ins` as a step of its own (`capi=False`: on torch's op, a fused step's unfused twin)."""
    plan = Plan(ctx, ins)
    if capi and capi_step(ctx, plan, ins, ins):
        return
    store_result(ctx, ins, plan.producer(ctx.env, ctx.arg(ins, 0)), CHANNELS_LAST)


def fuse_group(ctx: LoweringContext, user: Instruction) -> bool:
    """Emit deconvolution + bias group as one oneDNN call (the fuser of a deconvolution
    deferred into its group `user`); the separate steps are kept for profiling."""
    from pygraphx.targets.torch_lowering.conv_epilogue_match import match_epilogue, wide_bias
    from pygraphx.targets.torch_lowering.fallback import lower_fallback
    from pygraphx.targets.torch_lowering.lower_math import lower_pointwise

    deconv = deferred_producer(ctx, user)
    epi = match_epilogue(ctx, deconv, user)
    if epi is None or epi.other is not None or epi.unary not in _UNARY:
        lower_alone(ctx, deconv)
        return False
    plan = Plan(ctx, deconv)
    # float32 where the bias kept its float32 value (`conv_epilogue_match.wide_bias`): oneDNN
    # adds it to the float32 product before the one rounding; else bf16, as before
    dtype = torch.float32 if wide_bias(user, deconv) else torch.bfloat16
    plan.bias = torch.from_numpy(epi.bias).to(dtype) if epi.bias.any() else None
    plan.unary, plan.scalars = epi.unary, list(epi.scalars)
    saved, ctx.steps = ctx.steps, []
    lower_alone(ctx, deconv, capi=False)
    if not lower_pointwise(ctx, user):
        lower_fallback(ctx, user)
    unfused, ctx.steps = ctx.steps, saved
    if capi_step(ctx, plan, deconv, user, unfused):
        return True
    produce = plan.producer(ctx.env, ctx.arg(deconv, 0))
    store_result(ctx, user, produce, CHANNELS_LAST, [deconv, user], unfused)
    return True


def capi_step(
    ctx: LoweringContext,
    plan: Plan,
    deconv: Instruction,
    last: Instruction,
    unfused: list | None = None,
) -> bool:
    """Emit `plan` (computing `deconv`, and `last`: its fused group, or itself) as oneDNN's
    C API primitive writing `last`'s slot (`onednn_deconv.py`) where it can; False (nothing
    emitted) otherwise."""
    from pygraphx.targets.torch_lowering import onednn_capi, onednn_deconv

    if mode() != "bf16" or plan.trim or not ctx.has_slot(last):
        return False
    if not ctx.apart(deconv.inputs[0], last):
        return False
    rt = onednn_capi.runtime()
    if rt is None:
        return False
    x_lens = plan.x_lens
    full = [x_lens[0], deconv.shape.lens()[1], *plan.full]
    geometry = onednn_deconv.Geometry(x_lens, full, plan.w, plan.bias, plan.stride,
                                      plan.dilation, plan.groups, plan.unary, plan.scalars)
    try:
        kernel = onednn_deconv.Deconv(rt, geometry)
    except onednn_capi.OneDnnError:
        return False  # (oneDNN's reference kernel only: torch's op runs it)
    idx, out = ctx.output(last, CHANNELS_LAST)
    assert out is not None and out.is_contiguous(memory_format=CL)  # (`has_slot`)
    env, x = ctx.env, ctx.arg(deconv, 0)

    def step() -> None:
        kernel(env[x].contiguous(memory_format=CL), out)

    ctx.emit(step, [deconv, last] if last is not deconv else deconv, idx, unfused)
    ctx.cache["deconv_capi"] = ctx.cache.get("deconv_capi", 0) + 1
    return True


__all__ = ["DECONV_ENV", "Plan", "fused_reader", "lower_bf16_deconvolution", "mode", "usable"]
