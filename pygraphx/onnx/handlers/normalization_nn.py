"""Handlers of the CNN normalisations: BatchNormalization, InstanceNormalization and LRN.

BatchNormalization (inference only) stays one IR `batch_norm_inference`, so a later pass can
fold it into the convolution in front of it; training mode is refused. InstanceNormalization
and LRN map to their own IR ops (`instance_norm`, `lrn`).
"""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops.nn import BatchNormInference, InstanceNorm, Lrn

Args = list[Instruction | None]


@onnx_op("BatchNormalization")
def parse_batch_norm(ctx: NodeContext, args: Args) -> list[Instruction]:
    if ctx.attr("training_mode", 0):
        raise ctx.error(
            "training_mode=1 (normalising with batch statistics, updating running ones) is not "
            "supported; pygraphx runs inference only: export the model in eval mode"
        )
    if len(args) < 5 or any(a is None for a in args[:5]):
        raise ctx.error("needs 5 inputs: X, scale, B, input_mean, input_var")
    x, scale, bias, mean, var = args[:5]
    if x.shape.ndim() < 2:
        raise ctx.error(f"input must be N x C x ... (rank >= 2), got lens {x.shape.lens()}")
    # spatial=0 (opset < 9) means per-activation parameters of lens C x D1 x ...
    per_activation = not ctx.attr("spatial", 1) and scale.shape.ndim() > 1
    op = BatchNormInference(
        epsilon=ctx.attr("epsilon", 1e-5),
        momentum=ctx.attr("momentum", 0.9),
        bn_mode=0 if per_activation else 1,
    )
    outs = [ctx.add(op, x, scale, bias, mean, var)]
    if ctx.num_outputs > 3:
        raise ctx.error("saved_mean / saved_var outputs exist in training mode only")
    # inference leaves the running statistics as they were
    return outs + [mean, var][: ctx.num_outputs - 1]


@onnx_op("InstanceNormalization")
def parse_instance_norm(ctx: NodeContext, args: Args) -> Instruction:
    x, scale, bias = args[:3]
    if x.shape.ndim() < 3:
        raise ctx.error(f"input must be N x C x D1 x ... (rank >= 3), got lens {x.shape.lens()}")
    return ctx.add(InstanceNorm(epsilon=ctx.attr("epsilon", 1e-5)), x, scale, bias)


@onnx_op("LRN")
def parse_lrn(ctx: NodeContext, args: Args) -> Instruction:
    op = Lrn(
        alpha=ctx.attr("alpha", 0.0001),
        beta=ctx.attr("beta", 0.75),
        bias=ctx.attr("bias", 1.0),
        size=ctx.attr("size"),
    )
    return ctx.add(op, args[0])
