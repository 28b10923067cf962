"""Handlers of the com.microsoft contrib ops that ONNX Runtime's transformer optimiser and
quantiser emit, other than attention: Gelu, BiasGelu, FastGelu, QuickGelu, BiasAdd,
SkipLayerNormalization, SkipSimplifiedLayerNormalization, EmbedLayerNormalization and
MatMulNBits; plus the two that ONNX Runtime registers in the default domain at opset 1:
SimplifiedLayerNormalization and LayerNormalization (the optimiser emits the latter for models
older than opset 17). The contrib attention ops (Attention, MultiHeadAttention,
GroupQueryAttention, RotaryEmbedding) are in `contrib_attention.py`, which shares `MS` and
`_with_bias` from here.

Each is decomposed into IR ops with ONNX Runtime's CPU kernels as the definition: normalisations
compute their statistics in float32, and MatMulNBits dequantises its blockwise N-bit weights at
compile time into one float literal that a plain `dot` consumes.
"""

from __future__ import annotations

from math import ceil

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.handlers.attention import binary, float_input, swish
from pygraphx.onnx.handlers.gemm import add_matmul
from pygraphx.onnx.handlers.layout import arg
from pygraphx.onnx.handlers.normalization import parse_layer_normalization
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops import make_op
from pygraphx.ops.gemm import Dot
from pygraphx.ops.indexing import Gather
from pygraphx.ops.layout import Squeeze

Args = list[Instruction | None]
MS = "com.microsoft"

# --- activations ----------------------------------------------------------------------------


def _with_bias(ctx: NodeContext, x: Instruction, bias: Instruction | None) -> Instruction:
    if bias is None:
        return x
    return ctx.add(make_op("add"), x, ctx.broadcast_to(bias, x.shape.lens()))


@onnx_op("Gelu", domain=MS)
def parse_ms_gelu(ctx: NodeContext, args: Args) -> Instruction:
    float_input(ctx, args[0], "X")
    return ctx.add(make_op("gelu"), args[0])


@onnx_op("BiasGelu", domain=MS)
def parse_bias_gelu(ctx: NodeContext, args: Args) -> Instruction:
    float_input(ctx, args[0], "A")
    return ctx.add(make_op("gelu"), _with_bias(ctx, args[0], args[1]))


@onnx_op("FastGelu", domain=MS)
def parse_fast_gelu(ctx: NodeContext, args: Args) -> Instruction:
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    float_input(ctx, args[0], "X")
    return ctx.add(make_op("gelu_tanh"), _with_bias(ctx, args[0], arg(args, 1)))


@onnx_op("QuickGelu", domain=MS)
def parse_quick_gelu(ctx: NodeContext, args: Args) -> Instruction:
    float_input(ctx, args[0], "X")
    return swish(ctx, args[0], ctx.attr("alpha", 1.702))


@onnx_op("BiasAdd", domain=MS)
def parse_bias_add(ctx: NodeContext, args: Args) -> Instruction:
    x, bias, skip = args[0], args[1], args[2]
    return ctx.add(make_op("add"), _with_bias(ctx, x, bias), ctx.broadcast_to(skip, x.shape.lens()))


# --- normalisations -------------------------------------------------------------------------


def _norm_stats(
    ctx: NodeContext, x: Instruction, axes: tuple[int, ...], epsilon: float, rms: bool
) -> tuple[Instruction, Instruction | None, Instruction]:
    """(normalised x, mean or None, 1 / std) over `axes`, in x's type."""
    mean = None
    centred = x
    if not rms:
        mean = ctx.add(make_op("reduce_mean", axes=axes), x)
        centred = binary(ctx, "sub", x, mean)
    var = ctx.add(make_op("reduce_mean", axes=axes), ctx.add(make_op("mul"), centred, centred))
    inv_std = ctx.add(make_op("rsqrt"), ctx.add(make_op("add"), var, ctx.scalar(epsilon, var)))
    return binary(ctx, "mul", centred, inv_std), mean, inv_std


def _affine(
    ctx: NodeContext, y: Instruction, gamma: Instruction | None, beta: Instruction | None
) -> Instruction:
    y_type = y.shape.type()
    if gamma is not None:
        y = binary(ctx, "mul", y, ctx.convert(gamma, y_type))
    if beta is not None:
        y = binary(ctx, "add", y, ctx.convert(beta, y_type))
    return y


def _skip_norm(ctx: NodeContext, args: Args, rms: bool) -> list[Instruction | None]:
    x, skip, gamma = args[0], args[1], args[2]
    beta = None if rms else arg(args, 3)
    bias = arg(args, 3 if rms else 4)
    float_input(ctx, x, "input")
    total = ctx.add(make_op("add"), x, ctx.broadcast_to(skip, x.shape.lens()))
    total = _with_bias(ctx, total, bias)
    axis = x.shape.ndim() - 1
    work = ctx.convert(total, "float_type") if x.shape.type() != "double_type" else total
    y, mean, inv_std = _norm_stats(ctx, work, (axis,), ctx.attr("epsilon", 1e-12), rms)
    y = _affine(ctx, ctx.convert(y, x.shape.type()), gamma, beta)
    return [y, mean, inv_std, total]


@onnx_op("SkipLayerNormalization", domain=MS)
def parse_skip_layer_normalization(ctx: NodeContext, args: Args) -> list[Instruction | None]:
    return _skip_norm(ctx, args, rms=False)


@onnx_op("SkipSimplifiedLayerNormalization", domain=MS)
def parse_skip_simplified_layer_normalization(
    ctx: NodeContext, args: Args
) -> list[Instruction | None]:
    y, _, inv_std, total = _skip_norm(ctx, args, rms=True)
    # there is no mean in an RMS normalisation; ONNX Runtime fills that output with zeros
    zeros = ctx.literal(np.zeros(inv_std.shape.lens(), dtype=inv_std.shape.dtype()))
    return [y, zeros, inv_std, total]


@onnx_op("SimplifiedLayerNormalization")
def parse_simplified_layer_normalization(ctx: NodeContext, args: Args) -> list[Instruction]:
    # ONNX Runtime registers this RMS normalisation in the default domain (opset 1)
    x, scale = args[0], args[1]
    float_input(ctx, x, "X")
    rank = x.shape.ndim()
    axis = ctx.attr("axis", -1)
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank:
        raise ctx.error(f"axis {ctx.attr('axis', -1)} is out of range for rank {rank}")
    work = ctx.convert(x, "float_type") if x.shape.type() != "double_type" else x
    y, _, inv_std = _norm_stats(
        ctx, work, tuple(range(axis, rank)), ctx.attr("epsilon", 1e-5), True
    )
    y = _affine(ctx, ctx.convert(y, scale.shape.type()), scale, None)
    return [y, inv_std]


@onnx_op("LayerNormalization", since=1)
def parse_layer_normalization_v1(ctx: NodeContext, args: Args) -> list[Instruction]:
    # ONNX Runtime's contrib LayerNormalization in the default domain, for opsets before 17
    # (the transformer optimiser emits it); same semantics as the opset-17 operator
    return parse_layer_normalization(ctx, args)


@onnx_op("EmbedLayerNormalization", domain=MS)
def parse_embed_layer_normalization(ctx: NodeContext, args: Args) -> list[Instruction]:
    ids, segments, words, positions = args[0], arg(args, 1), args[2], args[3]
    segment_table, gamma, beta = arg(args, 4), args[5], args[6]
    mask, position_ids = arg(args, 7), arg(args, 8)
    batch, seq = ids.shape.lens()
    lens = [batch, seq, words.shape.lens()[1]]
    emb = ctx.add(Gather(0), words, ctx.convert(ids, "int64_type"))
    if position_ids is None:
        pos = ctx.add(Gather(0), positions, ctx.literal(np.arange(seq, dtype=np.int64)))
    else:
        pos = ctx.add(Gather(0), positions, ctx.convert(position_ids, "int64_type"))
    total = ctx.add(make_op("add"), emb, ctx.broadcast_to(pos, lens))
    if segments is not None and segment_table is not None:
        seg = ctx.add(Gather(0), segment_table, ctx.convert(segments, "int64_type"))
        total = ctx.add(make_op("add"), total, seg)
    work = ctx.convert(total, "float_type")
    y, _, _ = _norm_stats(ctx, work, (2,), ctx.attr("epsilon", 1e-12), False)
    y = _affine(ctx, ctx.convert(y, total.shape.type()), gamma, beta)
    if mask is None:
        mask_index = ctx.literal(np.zeros([batch], dtype=np.int32))
    else:
        ones = ctx.convert(ctx.add(make_op("equal"), mask, ctx.scalar(1, mask)), "int32_type")
        mask_index = ctx.add(Squeeze((1,)), ctx.add(make_op("reduce_sum", axes=(1,)), ones))
    return [y, mask_index, total]


# --- MatMulNBits ----------------------------------------------------------------------------


def _unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """LSB-first `bits`-bit values of each row of uint8 `packed` (last axis), `count` per row."""
    flat = packed.reshape(-1, packed.shape[-1]).astype(np.uint8)
    stream = np.unpackbits(flat, axis=-1, bitorder="little")
    usable = (stream.shape[1] // bits) * bits
    groups = stream[:, :usable].reshape(flat.shape[0], -1, bits).astype(np.int32)
    values = (groups << np.arange(bits, dtype=np.int32)).sum(axis=-1)
    return values[:, :count].reshape(packed.shape[:-1] + (count,))


def dequantize_nbits(
    packed: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    bits: int,
    block: int,
    k: int,
    n: int,
    group_index: np.ndarray | None = None,
) -> np.ndarray:
    """MatMulNBits' weight as float32 [n, k]: (q - zero_point) * scale per block along k."""
    blocks = ceil(k / block)
    q = _unpack_bits(packed.reshape(n, blocks, -1), bits, block).reshape(n, blocks * block)[:, :k]
    scales = np.asarray(scales, dtype=np.float32).reshape(n, blocks)
    if zero_points is None:
        zp = np.full((n, blocks), 2 ** (bits - 1), dtype=np.float32)
    elif zero_points.dtype == np.uint8:
        zp = _unpack_bits(zero_points.reshape(n, -1), bits, blocks).astype(np.float32)
    else:
        zp = np.asarray(zero_points, dtype=np.float32).reshape(n, blocks)
    which = np.arange(k) // block if group_index is None else np.asarray(group_index)[:k]
    return (q.astype(np.float32) - zp[:, which]) * scales[:, which]


@onnx_op("MatMulNBits", domain=MS)
def parse_matmul_nbits(ctx: NodeContext, args: Args) -> Instruction:
    a, b, scales = args[0], args[1], args[2]
    zero_points, group_index, bias = arg(args, 3), arg(args, 4), arg(args, 5)
    float_input(ctx, a, "A")
    k, n = ctx.attr("K"), ctx.attr("N")
    bits, block = ctx.attr("bits", 4), ctx.attr("block_size")
    if not 2 <= bits <= 8:
        raise ctx.error(f"bits must be between 2 and 8, got {bits}")
    if ctx.attr("weight_prepacked", 0):
        raise ctx.error("prepacked (execution-provider specific) weights are not supported")
    if a.shape.lens()[-1] != k:
        raise ctx.error(f"A's last dimension {a.shape.lens()[-1]} differs from K = {k}")
    packed = ctx.require_const(b, "B")
    zp = None if zero_points is None else ctx.require_const(zero_points, "zero_points")
    gidx = None if group_index is None else ctx.require_const(group_index, "g_idx")
    weight = dequantize_nbits(
        packed, ctx.require_const(scales, "scales"), zp, bits, block, k, n, gidx
    )
    w = ctx.literal(np.ascontiguousarray(weight.T).astype(a.shape.dtype()))
    y = add_matmul(ctx, a, w, Dot())
    return _with_bias(ctx, y, bias)
