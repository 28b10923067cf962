"""Handlers of element-wise ONNX ops: arithmetic, math, activations, comparisons, logic, casts.

Inputs of different shapes are multibroadcast first; activations without an IR op of their own
are written as a few pointwise IR ops (a later fusion pass makes them one kernel again).
"""

from __future__ import annotations

from functools import reduce

from pygraphx.ir.instruction import Instruction
from pygraphx.onnx.context import NodeContext, onnx_type_to_shape_type
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops import make_op
from pygraphx.ops.pointwise import (
    FP8_TYPES,
    Clip,
    Convert,
    ConvertSaturate,
    Elu,
    LeakyRelu,
    Where,
)

Args = list[Instruction | None]


def _binary(op_name: str):
    def handler(ctx: NodeContext, args: Args) -> Instruction:
        a, b = ctx.broadcast(args[0], args[1])
        if a.shape.type() != b.shape.type():
            raise ctx.error(f"inputs have different types {a.shape.type()} and {b.shape.type()}")
        return ctx.add(make_op(op_name), a, b)

    return handler


def _unary(op_name: str):
    def handler(ctx: NodeContext, args: Args) -> Instruction:
        return ctx.add(make_op(op_name), args[0])

    return handler


# ONNX op -> IR op, one per line
BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Equal": "equal",
    "Less": "less", "Greater": "greater", "LessOrEqual": "less_or_equal",
    "GreaterOrEqual": "greater_or_equal", "And": "logical_and", "Or": "logical_or",
    "Xor": "logical_xor", "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or",
    "BitwiseXor": "bitwise_xor",
}  # fmt: skip
UNARY = {
    "Abs": "abs", "Neg": "neg", "Sign": "sign", "Floor": "floor", "Ceil": "ceil",
    "Round": "round", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Reciprocal": "recip",
    "Erf": "erf", "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos",
    "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh", "Tanh": "tanh", "Asinh": "asinh",
    "Acosh": "acosh", "Atanh": "atanh", "Sigmoid": "sigmoid", "Relu": "relu", "Not": "not",
    "BitwiseNot": "not", "IsNaN": "isnan",
}  # fmt: skip

for _onnx, _ir in BINARY.items():
    onnx_op(_onnx)(_binary(_ir))
for _onnx, _ir in UNARY.items():
    onnx_op(_onnx)(_unary(_ir))


@onnx_op("Pow")
def parse_pow(ctx: NodeContext, args: Args) -> Instruction:
    x, y = ctx.broadcast(args[0], args[1])
    return ctx.add(make_op("pow"), x, y)


@onnx_op("Mod")
def parse_mod(ctx: NodeContext, args: Args) -> Instruction:
    # fmod=1: C fmod (the dividend's sign). fmod=0: the divisor's sign, on floats too, as
    # Python's % and onnx's node tests have it (x % 0 and inf % y are NaN, x % +-inf is x when
    # the signs agree and +-inf when they differ); ONNX Runtime refuses fmod=0 on floats.
    a, b = ctx.broadcast(args[0], args[1])
    if a.shape.type() != b.shape.type():
        raise ctx.error(f"inputs have different types {a.shape.type()} and {b.shape.type()}")
    return ctx.add(make_op("fmod" if ctx.attr("fmod", 0) else "mod"), a, b)


def _variadic(op_name: str):
    def handler(ctx: NodeContext, args: Args) -> Instruction:
        xs = ctx.broadcast(*[a for a in args if a is not None])
        return reduce(lambda acc, x: ctx.add(make_op(op_name), acc, x), xs[1:], xs[0])

    return handler


for _onnx, _ir in {"Max": "max", "Min": "min", "Sum": "add"}.items():
    onnx_op(_onnx)(_variadic(_ir))


@onnx_op("Mean")
def parse_mean(ctx: NodeContext, args: Args) -> Instruction:
    total = _variadic("add")(ctx, args)
    n = sum(1 for a in args if a is not None)
    return ctx.add(make_op("div"), total, ctx.scalar(n, total))


@onnx_op("LeakyRelu")
def parse_leaky_relu(ctx: NodeContext, args: Args) -> Instruction:
    return ctx.add(LeakyRelu(ctx.attr("alpha", 0.01)), args[0])


@onnx_op("Elu")
def parse_elu(ctx: NodeContext, args: Args) -> Instruction:
    return ctx.add(Elu(ctx.attr("alpha", 1.0)), args[0])


@onnx_op("Selu")
def parse_selu(ctx: NodeContext, args: Args) -> Instruction:
    # selu(x) = gamma * elu_alpha(x)
    x = args[0]
    alpha = ctx.attr("alpha", 1.67326319217681884765625)
    gamma = ctx.attr("gamma", 1.05070102214813232421875)
    e = ctx.add(Elu(alpha), x)
    return ctx.add(make_op("mul"), e, ctx.scalar(gamma, x))


@onnx_op("Celu")
def parse_celu(ctx: NodeContext, args: Args) -> Instruction:
    # celu(x) = max(0, x) + min(0, alpha * (exp(x / alpha) - 1)) = alpha * elu_1(x / alpha);
    # half and bf16 are computed in float32 and rounded once (as ONNX's reference does)
    x = args[0]
    in_type = x.shape.type()
    if in_type in ("half_type", "bf16_type"):
        x = ctx.convert(x, "float_type")
    alpha = ctx.attr("alpha", 1.0)
    scaled = ctx.add(make_op("div"), x, ctx.scalar(alpha, x))
    e = ctx.add(Elu(1.0), scaled)
    return ctx.convert(ctx.add(make_op("mul"), e, ctx.scalar(alpha, x)), in_type)


@onnx_op("ThresholdedRelu")
def parse_thresholded_relu(ctx: NodeContext, args: Args) -> Instruction:
    x = args[0]
    cond = ctx.add(make_op("greater"), x, ctx.scalar(ctx.attr("alpha", 1.0), x))
    return ctx.add(Where(), cond, x, ctx.scalar(0, x))


@onnx_op("HardSigmoid")
def parse_hard_sigmoid(ctx: NodeContext, args: Args) -> Instruction:
    # max(0, min(1, alpha * x + beta))
    alpha, beta = ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5)
    return ctx.add(make_op("hardsigmoid", alpha=alpha, beta=beta), args[0])


@onnx_op("HardSwish")
def parse_hard_swish(ctx: NodeContext, args: Args) -> Instruction:
    return ctx.add(make_op("hardswish"), args[0])  # x * hardsigmoid(x, 1/6, 0.5)


@onnx_op("Softplus")
def parse_softplus(ctx: NodeContext, args: Args) -> Instruction:
    return ctx.add(make_op("softplus"), args[0])  # log(exp(x) + 1)


@onnx_op("Softsign")
def parse_softsign(ctx: NodeContext, args: Args) -> Instruction:
    # x / (1 + |x|)
    x = args[0]
    d = ctx.add(make_op("add"), ctx.add(make_op("abs"), x), ctx.scalar(1, x))
    return ctx.add(make_op("div"), x, d)


@onnx_op("Mish")
def parse_mish(ctx: NodeContext, args: Args) -> Instruction:
    return ctx.add(make_op("mish"), args[0])  # x * tanh(softplus(x))


@onnx_op("Gelu", since=20)
def parse_gelu(ctx: NodeContext, args: Args) -> Instruction:
    approximate = ctx.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.error(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return ctx.add(make_op("gelu_tanh" if approximate == "tanh" else "gelu"), args[0])


@onnx_op("PRelu")
def parse_prelu_v1(ctx: NodeContext, args: Args) -> Instruction:
    # before opset 7 a 1-D slope of length C applies per channel (axis 1), not to the last axis
    x, slope = args[0], args[1]
    lens = x.shape.lens()
    if slope.shape.ndim() == 1 and len(lens) > 2 and slope.shape.lens()[0] == lens[1] > 1:
        slope = ctx.add(make_op("reshape", dims=(lens[1],) + (1,) * (len(lens) - 2)), slope)
    return parse_prelu(ctx, [x, slope])


@onnx_op("PRelu", since=7)
def parse_prelu(ctx: NodeContext, args: Args) -> Instruction:
    x, slope = ctx.broadcast(args[0], args[1])
    neg = ctx.add(make_op("mul"), x, slope)
    cond = ctx.add(make_op("less"), x, ctx.scalar(0, x))
    return ctx.add(Where(), cond, neg, x)


@onnx_op("Clip")
def parse_clip_v1(ctx: NodeContext, args: Args) -> Instruction:
    x = args[0]
    lo = ctx.scalar(ctx.attr("min", -3.4028234663852886e38), x)
    hi = ctx.scalar(ctx.attr("max", 3.4028234663852886e38), x)
    return ctx.add(Clip(), x, lo, hi)


@onnx_op("Clip", since=11)
def parse_clip(ctx: NodeContext, args: Args) -> Instruction:
    x = args[0]
    lo = args[1] if len(args) > 1 else None
    hi = args[2] if len(args) > 2 else None
    if lo is not None:
        x = ctx.add(make_op("max"), *ctx.broadcast(x, lo))
    if hi is not None:
        x = ctx.add(make_op("min"), *ctx.broadcast(x, hi))
    return x


@onnx_op("Where")
def parse_where(ctx: NodeContext, args: Args) -> Instruction:
    c, a, b = ctx.broadcast(args[0], args[1], args[2])
    return ctx.add(Where(), c, a, b)


def _cast(ctx: NodeContext, x: Instruction, target: str) -> Instruction:
    """Cast `x` to `target`; to an fp8 type `saturate` (opset 19+, default 1) clamps values out
    of range, the infinities included, to the type's largest finite value."""
    if x.shape.type() == target:
        return x
    if target in FP8_TYPES and ctx.attr("saturate", 1):
        return ctx.add(ConvertSaturate(target), x)
    return ctx.add(Convert(target, clamp=False), x)  # ONNX's IEEE overflow, as ORT


@onnx_op("Cast")
def parse_cast(ctx: NodeContext, args: Args) -> Instruction:
    try:
        target = onnx_type_to_shape_type(ctx.attr("to"))
    except ValueError as exc:
        raise ctx.error(str(exc)) from None
    return _cast(ctx, args[0], target)


@onnx_op("CastLike")
def parse_cast_like(ctx: NodeContext, args: Args) -> Instruction:
    return _cast(ctx, args[0], args[1].shape.type())


@onnx_op("Identity")
def parse_identity(ctx: NodeContext, args: Args) -> Instruction:
    return args[0]


@onnx_op("Dropout")
def parse_dropout(ctx: NodeContext, args: Args) -> list[Instruction]:
    # inference: identity, and an all-true mask when asked for
    x = args[0]
    outs = [x]
    if ctx.num_outputs > 1:
        import numpy as np

        mask = ctx.literal(np.ones((), dtype=np.bool_))
        outs.append(ctx.broadcast_to(mask, x.shape.lens()))
    return outs
