"""Handlers of ONNX Attention (opsets 23-25), RotaryEmbedding (23), Swish (24), SwiGLU (28)
and LinearAttention (27).

All are decomposed into IR ops: scaled dot-product attention becomes `dot`, `softmax` and
pointwise ops on `[batch, heads, seq, head_size]` tensors, following the ONNX definition step by
step (Q and K are each scaled by `sqrt(scale)`, softcap comes before the mask, the softmax may
run in `softmax_precision`, and a query row whose combined mask disallows every key gives zeros).

Masks: a boolean `attn_mask` becomes an additive 0 / -inf bias, a shorter last dimension is
padded with -inf, and the causal and sliding-window masks are offset-aware (bottom-right aligned
by the past length, or per batch by `nonpad_kv_seqlen`). Every part that is known at compile
time is folded into one literal bias; run-time parts (a mask input, `nonpad_kv_seqlen`) are IR
ops. LinearAttention is a recurrence and maps to the `linear_attention` operator. The helpers
here (`split_heads`, `merge_heads`, `repeat_kv`, `rotate`, ...) are shared
with the com.microsoft contrib handlers (`contrib_attention.py`, `contrib.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import sqrt

import numpy as np
import onnx

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.shape import FLOAT_TYPES, from_dtype, to_dtype
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.handlers.layout import arg
from pygraphx.onnx.handlers.softmax import reshape
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops import make_op
from pygraphx.ops.attention import LinearAttention
from pygraphx.ops.copy_ops import Concat, Pad
from pygraphx.ops.gemm import Dot
from pygraphx.ops.indexing import Gather
from pygraphx.ops.layout import Slice, Step, Transpose, Unsqueeze
from pygraphx.ops.pointwise import Where
from pygraphx.ops.softmax import Softmax

Args = list[Instruction | None]
# a mask part: a compile-time array or a run-time instruction, broadcastable to the scores
BiasPart = np.ndarray | Instruction

NEG_INF = float("-inf")


def binary(ctx: NodeContext, name: str, x: Instruction, y: Instruction) -> Instruction:
    """`name(x, y)` with numpy broadcasting of both operands."""
    x, y = ctx.broadcast(x, y)
    return ctx.add(make_op(name), x, y)


def float_input(ctx: NodeContext, x: Instruction, what: str) -> None:
    if x.shape.type() not in FLOAT_TYPES:
        raise ctx.error(f"{what} must be a floating-point tensor, got {x.shape.type()}")


# --- head layout ----------------------------------------------------------------------------


def split_heads(ctx: NodeContext, x: Instruction, heads: int, what: str) -> Instruction:
    """[batch, seq, heads * size] -> [batch, heads, seq, size]."""
    lens = x.shape.lens()
    if len(lens) != 3:
        raise ctx.error(f"{what} must be 3-D [batch, seq, hidden], got {lens}")
    if heads <= 0 or lens[2] % heads:
        raise ctx.error(f"{what}'s hidden size {lens[2]} is not a multiple of {heads} heads")
    x = reshape(ctx, x, [lens[0], lens[1], heads, lens[2] // heads])
    return ctx.add(Transpose((0, 2, 1, 3)), x)


def merge_heads(ctx: NodeContext, x: Instruction) -> Instruction:
    """[batch, heads, seq, size] -> [batch, seq, heads * size]."""
    b, n, s, h = x.shape.lens()
    return reshape(ctx, ctx.add(Transpose((0, 2, 1, 3)), x), [b, s, n * h])


def repeat_kv(ctx: NodeContext, x: Instruction, reps: int) -> Instruction:
    """Repeat each head `reps` times in place ([h0, h0, h1, h1, ...]), for grouped queries."""
    if reps == 1:
        return x
    b, n, s, h = x.shape.lens()
    x = ctx.add(Unsqueeze((2,)), x)
    x = ctx.broadcast_to(x, [b, n, reps, s, h])
    return reshape(ctx, x, [b, n * reps, s, h])


def last_axis_slice(ctx: NodeContext, x: Instruction, start: int, end: int) -> Instruction:
    rank = x.shape.ndim()
    if start == 0 and end == x.shape.lens()[-1]:
        return x
    return ctx.add(Slice(axes=(rank - 1,), starts=(start,), ends=(end,)), x)


# --- masks ----------------------------------------------------------------------------------


def window_allowed(
    q_len: int, kv_len: int, offset: int, causal: bool, left: int = -1, right: int = -1
) -> np.ndarray:
    """[q, kv] bool: query i (at absolute position offset + i) may attend key j."""
    i = np.arange(q_len).reshape(-1, 1) + offset
    j = np.arange(kv_len).reshape(1, -1)
    allowed = np.ones((q_len, kv_len), dtype=bool)
    if causal:
        allowed &= j <= i
    if left >= 0:
        allowed &= i - j <= left
    if right >= 0:
        allowed &= j - i <= right
    return allowed


def additive(allowed: np.ndarray, dtype: np.dtype, fill: float = NEG_INF) -> np.ndarray:
    """A bool mask as an additive bias: 0 where allowed, `fill` elsewhere."""
    return np.where(allowed, 0, fill).astype(dtype)


def bool_to_bias(ctx: NodeContext, mask: Instruction, type_name: str, fill: float) -> Instruction:
    """A run-time bool mask as an additive bias of `type_name`: 0 where true, `fill` where not."""
    zero = ctx.literal(np.zeros((), dtype=to_dtype(type_name)))
    neg = ctx.literal(np.full((), fill, dtype=to_dtype(type_name)))
    lens = mask.shape.lens()
    return ctx.add(Where(), mask, ctx.broadcast_to(zero, lens), ctx.broadcast_to(neg, lens))


def sum_bias(ctx: NodeContext, parts: Sequence[BiasPart], dtype: np.dtype) -> BiasPart | None:
    """The sum of bias parts: compile-time parts are added in numpy, run-time ones as IR."""
    static = [p for p in parts if isinstance(p, np.ndarray)]
    dynamic = [p for p in parts if isinstance(p, Instruction)]
    total: BiasPart | None = None
    if static:
        total = static[0].astype(dtype)
        for p in static[1:]:
            total = (total + p).astype(dtype)
    if not dynamic:
        return total
    out = dynamic[0]
    for p in dynamic[1:]:
        out = binary(ctx, "add", out, p)
    if total is not None:
        out = binary(ctx, "add", out, ctx.literal(total))
    return out


def add_bias(ctx: NodeContext, scores: Instruction, bias: BiasPart | None) -> Instruction:
    if bias is None:
        return scores
    if isinstance(bias, np.ndarray):
        if not np.any(bias):
            return scores
        bias = ctx.literal(bias.astype(scores.shape.dtype()))
    bias = ctx.convert(bias, scores.shape.type())
    return ctx.add(make_op("add"), scores, ctx.broadcast_to(bias, scores.shape.lens()))


def guarded_softmax(
    ctx: NodeContext, scores: Instruction, bias: BiasPart | None, softmax_type: str | None = None
) -> Instruction:
    """Softmax over the last axis; rows whose bias is -inf everywhere become zeros (the ONNX
    fully-masked-row rule), decided on the bias, not on the scores."""
    if softmax_type is not None:
        scores = ctx.convert(scores, softmax_type)
    axis = scores.shape.ndim() - 1
    probs = ctx.add(Softmax(axis=axis), scores)
    if bias is None:
        return probs
    lens = probs.shape.lens()
    if isinstance(bias, np.ndarray):
        dead = np.isneginf(np.max(bias, axis=-1, keepdims=True)) if bias.ndim else None
        if dead is None or not np.any(dead):
            return probs
        dead_ins = ctx.literal(dead)
    else:
        peak = ctx.add(make_op("reduce_max", axes=(bias.shape.ndim() - 1,)), bias)
        dead_ins = ctx.add(make_op("equal"), peak, ctx.scalar(NEG_INF, peak))
    return ctx.add(Where(), ctx.broadcast_to(dead_ins, lens), ctx.scalar(0, probs), probs)


# --- the ONNX Attention operator ------------------------------------------------------------


def softcap(ctx: NodeContext, x: Instruction, cap: float) -> Instruction:
    """cap * tanh(x / cap); x itself when cap <= 0."""
    if cap <= 0:
        return x
    t = ctx.add(make_op("tanh"), ctx.add(make_op("div"), x, ctx.scalar(cap, x)))
    return ctx.add(make_op("mul"), t, ctx.scalar(cap, x))


def _onnx_mask(ctx: NodeContext, mask: Instruction, total: int, dtype: np.dtype) -> BiasPart:
    """attn_mask as an additive bias of `dtype`, its last dimension padded to `total`."""
    lens = mask.shape.lens()
    if not lens or lens[-1] > total:
        raise ctx.error(f"attn_mask of shape {lens} does not fit {total} keys")
    value = ctx.const(mask)
    type_name = from_dtype(dtype)
    pad = total - lens[-1]
    if value is not None:
        if value.dtype == np.bool_:
            value = additive(value, dtype)
        value = np.asarray(value).astype(dtype)
        if pad:
            widths = [(0, 0)] * (value.ndim - 1) + [(0, pad)]
            value = np.pad(value, widths, constant_values=NEG_INF)
        return value
    if mask.shape.type() == "bool_type":
        bias = bool_to_bias(ctx, mask, type_name, NEG_INF)
    else:
        bias = ctx.convert(mask, type_name)
    if pad:
        rank = len(lens)
        pads = (0,) * (2 * rank - 1) + (pad,)
        bias = ctx.add(Pad(pads=pads, value=NEG_INF), bias)
    return bias


def _per_batch_window(
    ctx: NodeContext,
    offsets: Instruction,
    q_len: int,
    kv_len: int,
    causal: bool,
    left: int,
    right: int,
    dtype: np.dtype,
) -> Instruction:
    """[batch, 1, q, kv] additive bias of a window whose offset is a run-time [batch] vector."""
    batch = offsets.shape.lens()[0]
    lens = [batch, 1, q_len, kv_len]
    off = reshape(ctx, ctx.convert(offsets, "int64_type"), [batch, 1, 1, 1])
    pos = ctx.literal(np.arange(q_len, dtype=np.int64).reshape(1, 1, q_len, 1))
    key = ctx.broadcast_to(
        ctx.literal(np.arange(kv_len, dtype=np.int64).reshape(1, 1, 1, -1)), lens
    )
    diff = ctx.add(make_op("sub"), ctx.broadcast_to(binary(ctx, "add", pos, off), lens), key)
    conditions = []
    if causal:
        conditions.append(ctx.add(make_op("greater_or_equal"), diff, ctx.scalar(0, diff)))
    if left >= 0:
        conditions.append(ctx.add(make_op("less_or_equal"), diff, ctx.scalar(left, diff)))
    if right >= 0:
        conditions.append(ctx.add(make_op("greater_or_equal"), diff, ctx.scalar(-right, diff)))
    allowed = conditions[0]
    for c in conditions[1:]:
        allowed = ctx.add(make_op("logical_and"), allowed, c)
    return bool_to_bias(ctx, allowed, from_dtype(dtype), NEG_INF)


def _padding_bias(
    ctx: NodeContext, lengths: Instruction, kv_len: int, dtype: np.dtype
) -> Instruction:
    """[batch, 1, 1, kv] bias: -inf at key positions at or past each batch entry's length."""
    batch = lengths.shape.lens()[0]
    lens = [batch, 1, 1, kv_len]
    key = ctx.literal(np.arange(kv_len, dtype=np.int64).reshape(1, 1, 1, -1))
    length = reshape(ctx, ctx.convert(lengths, "int64_type"), [batch, 1, 1, 1])
    allowed = ctx.add(make_op("less"), ctx.broadcast_to(key, lens), ctx.broadcast_to(length, lens))
    return bool_to_bias(ctx, allowed, from_dtype(dtype), NEG_INF)


def _attention_bias(
    ctx: NodeContext,
    mask: Instruction | None,
    nonpad: Instruction | None,
    past_len: int,
    q_len: int,
    kv_len: int,
    dtype: np.dtype,
) -> BiasPart | None:
    causal = bool(ctx.attr("is_causal", 0))
    left, right = ctx.attr("left_window_size", -1), ctx.attr("right_window_size", -1)
    parts: list[BiasPart] = []
    if mask is not None:
        parts.append(_onnx_mask(ctx, mask, kv_len, dtype))
    if causal or left >= 0 or right >= 0:
        if nonpad is not None and past_len == 0:
            offsets = ctx.add(make_op("sub"), nonpad, ctx.scalar(q_len, nonpad))
            parts.append(_per_batch_window(ctx, offsets, q_len, kv_len, causal, left, right, dtype))
        else:
            allowed = window_allowed(q_len, kv_len, past_len, causal, left, right)
            parts.append(additive(allowed, dtype))
    if nonpad is not None:
        parts.append(_padding_bias(ctx, nonpad, kv_len, dtype))
    if not parts:
        return None
    return sum_bias(ctx, parts, dtype)


def _present(ctx: NodeContext, past: Instruction | None, x: Instruction) -> Instruction:
    if past is None:
        return x
    return ctx.add(Concat(axis=2), ctx.convert(past, x.shape.type()), x)


def _softmax_type(ctx: NodeContext) -> str | None:
    code = ctx.attr("softmax_precision", None)
    if code is None:
        return None
    try:
        return from_dtype(onnx.helper.tensor_dtype_to_np_dtype(code))
    except (KeyError, ValueError, TypeError):
        raise ctx.error(f"softmax_precision {code} is not a supported type") from None


@onnx_op("Attention", since=23)
def parse_attention(ctx: NodeContext, args: Args) -> list[Instruction | None]:
    q, k, v = args[0], args[1], args[2]
    mask, past_k, past_v, nonpad = arg(args, 3), arg(args, 4), arg(args, 5), arg(args, 6)
    for what, x in (("Q", q), ("K", k), ("V", v)):
        float_input(ctx, x, what)
    if (past_k is None) != (past_v is None):
        raise ctx.error("past_key and past_value must be given together")
    rank = q.shape.ndim()
    if rank != k.shape.ndim() or rank != v.shape.ndim() or rank not in (3, 4):
        raise ctx.error(
            f"Q, K and V must all be 3-D or all 4-D, got {q.shape.lens()}, {k.shape.lens()}, "
            f"{v.shape.lens()}"
        )
    if rank == 3:
        q_heads, kv_heads = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
        q = split_heads(ctx, q, q_heads, "Q")
        k = split_heads(ctx, k, kv_heads, "K")
        v = split_heads(ctx, v, kv_heads, "V")
    q_heads, kv_heads = q.shape.lens()[1], k.shape.lens()[1]
    if q_heads % kv_heads or v.shape.lens()[1] != kv_heads:
        raise ctx.error(f"{q_heads} query heads cannot be grouped over {kv_heads} key heads")
    type_name, dtype = q.shape.type(), q.shape.dtype()
    k, v = ctx.convert(k, type_name), ctx.convert(v, type_name)
    past_len = past_k.shape.lens()[2] if past_k is not None else 0
    k, v = _present(ctx, past_k, k), _present(ctx, past_v, v)
    present_k, present_v = k, v
    q_len, head = q.shape.lens()[2], q.shape.lens()[3]
    kv_len = k.shape.lens()[2]
    if k.shape.lens()[3] != head:
        raise ctx.error(f"Q's head size {head} differs from K's {k.shape.lens()[3]}")
    scale = ctx.attr("scale", 1 / sqrt(head))
    # as the definition says: Q and K are each scaled by sqrt(scale), in the input type
    root = np.asarray(np.sqrt(scale), dtype=dtype)
    k = repeat_kv(ctx, k, q_heads // kv_heads)
    v = repeat_kv(ctx, v, q_heads // kv_heads)
    qs = ctx.add(make_op("mul"), q, ctx.scalar(root, q))
    ks = ctx.add(make_op("mul"), k, ctx.scalar(root, k))
    qk = ctx.add(Dot(), qs, ctx.add(Transpose((0, 1, 3, 2)), ks))
    capped = softcap(ctx, qk, ctx.attr("softcap", 0.0))
    bias = _attention_bias(ctx, mask, nonpad, past_len, q_len, kv_len, dtype)
    scores = add_bias(ctx, capped, bias)
    probs = guarded_softmax(ctx, scores, bias, _softmax_type(ctx))
    probs = ctx.convert(probs, type_name)
    y = ctx.add(Dot(), probs, v)
    if rank == 3:
        y = merge_heads(ctx, y)
    mode = ctx.attr("qk_matmul_output_mode", 0)
    qk_out = {0: qk, 1: capped, 2: scores, 3: probs}.get(mode)
    if qk_out is None:
        raise ctx.error(f"qk_matmul_output_mode {mode} is not 0, 1, 2 or 3")
    return [y, present_k, present_v, ctx.convert(qk_out, type_name)]


# --- rotary embeddings ----------------------------------------------------------------------


def rotate(
    ctx: NodeContext,
    x: Instruction,
    cos: Instruction,
    sin: Instruction,
    interleaved: bool,
    rotary_dim: int,
) -> Instruction:
    """RoPE on x [..., seq, size] (the head axis may sit anywhere before the last two), with
    cos / sin already broadcastable to x's rotated part ([..., rotary_dim / 2])."""
    lens = x.shape.lens()
    rank = len(lens)
    size = lens[-1]
    if rotary_dim % 2 or rotary_dim > size:
        raise ctx.error(f"rotary_embedding_dim {rotary_dim} must be even and <= {size}")
    half = rotary_dim // 2
    rot = last_axis_slice(ctx, x, 0, rotary_dim)
    if interleaved:
        x1 = ctx.add(Step(axes=(rank - 1,), steps=(2,)), rot)
        x2 = ctx.add(Step(axes=(rank - 1,), steps=(2,)), last_axis_slice(ctx, rot, 1, rotary_dim))
    else:
        x1 = last_axis_slice(ctx, rot, 0, half)
        x2 = last_axis_slice(ctx, rot, half, rotary_dim)
    half_lens = x1.shape.lens()
    cos = ctx.broadcast_to(ctx.convert(cos, x.shape.type()), half_lens)
    sin = ctx.broadcast_to(ctx.convert(sin, x.shape.type()), half_lens)
    mul, sub, add = make_op("mul"), make_op("sub"), make_op("add")
    real = ctx.add(sub, ctx.add(mul, cos, x1), ctx.add(mul, sin, x2))
    imag = ctx.add(add, ctx.add(mul, sin, x1), ctx.add(mul, cos, x2))
    if interleaved:
        pair = [ctx.add(Unsqueeze((rank,)), t) for t in (real, imag)]
        out = reshape(ctx, ctx.add(Concat(axis=rank), *pair), lens[:-1] + [rotary_dim])
    else:
        out = ctx.add(Concat(axis=rank - 1), real, imag)
    if rotary_dim < size:
        out = ctx.add(Concat(axis=rank - 1), out, last_axis_slice(ctx, x, rotary_dim, size))
    return out


@onnx_op("RotaryEmbedding", since=23)
def parse_rotary_embedding(ctx: NodeContext, args: Args) -> Instruction:
    x, cos, sin, positions = args[0], args[1], args[2], arg(args, 3)
    float_input(ctx, x, "X")
    lens = x.shape.lens()
    if len(lens) == 4:
        head = lens[3]
        xs = ctx.add(Transpose((0, 2, 1, 3)), x)  # [batch, seq, heads, size]
    elif len(lens) == 3:
        heads = ctx.attr("num_heads", 0)
        if heads <= 0 or lens[2] % heads:
            raise ctx.error(f"num_heads {heads} must divide the hidden size {lens[2]} (3-D X)")
        head = lens[2] // heads
        xs = reshape(ctx, x, [lens[0], lens[1], heads, head])
    else:
        raise ctx.error(f"X must be 3-D or 4-D, got {lens}")
    rotary_dim = ctx.attr("rotary_embedding_dim", 0) or head
    if positions is not None:
        positions = ctx.convert(positions, "int64_type")
        cos = ctx.add(Gather(0), cos, positions)
        sin = ctx.add(Gather(0), sin, positions)
    batch, seq = xs.shape.lens()[:2]
    for what, c in (("cos_cache", cos), ("sin_cache", sin)):
        if c.shape.lens() != [batch, seq, rotary_dim // 2]:
            raise ctx.error(
                f"{what} gives {c.shape.lens()} per token, expected {[batch, seq, rotary_dim // 2]}"
            )
    cos, sin = (ctx.add(Unsqueeze((2,)), c) for c in (cos, sin))  # [batch, seq, 1, half]
    out = rotate(ctx, xs, cos, sin, bool(ctx.attr("interleaved", 0)), rotary_dim)
    if len(lens) == 4:
        return ctx.add(Transpose((0, 2, 1, 3)), out)
    return reshape(ctx, out, lens)


# --- gated activations ----------------------------------------------------------------------


def swish(ctx: NodeContext, x: Instruction, alpha: float) -> Instruction:
    """x * sigmoid(alpha * x)."""
    if alpha == 1.0:
        return ctx.add(make_op("silu"), x)
    z = ctx.add(make_op("mul"), x, ctx.scalar(alpha, x))
    return ctx.add(make_op("mul"), x, ctx.add(make_op("sigmoid"), z))


@onnx_op("Swish", since=24)
def parse_swish(ctx: NodeContext, args: Args) -> Instruction:
    float_input(ctx, args[0], "X")
    return swish(ctx, args[0], ctx.attr("alpha", 1.0))


@onnx_op("SwiGLU", since=28)
def parse_swiglu(ctx: NodeContext, args: Args) -> Instruction:
    a, b = args[0], args[1]
    float_input(ctx, a, "A")
    if a.shape.lens() != b.shape.lens() or a.shape.type() != b.shape.type():
        raise ctx.error(
            f"A and B must have the same shape and type (no broadcasting), got "
            f"{a.shape.type()} {a.shape.lens()} and {b.shape.type()} {b.shape.lens()}"
        )
    return ctx.add(make_op("mul"), swish(ctx, a, ctx.attr("alpha", 1.0)), b)


# --- linear attention -----------------------------------------------------------------------


@onnx_op("LinearAttention", since=27)
def parse_linear_attention(ctx: NodeContext, args: Args) -> list[Instruction | None]:
    q, k, v, past, decay, beta = args[0], args[1], args[2], arg(args, 3), arg(args, 4), arg(args, 5)
    rule = ctx.attr("update_rule", "gated_delta")
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gated != (decay is not None) or delta != (beta is not None):
        raise ctx.error(
            f"update_rule {rule!r} needs {'a' if gated else 'no'} decay and "
            f"{'a' if delta else 'no'} beta input"
        )
    q_heads, kv_heads = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    for what, x in (("query", q), ("key", k), ("value", v)):
        float_input(ctx, x, what)
        if x.shape.ndim() != 3:
            raise ctx.error(f"{what} must be 3-D [batch, seq, heads * size], got {x.shape.lens()}")
    if past is None:
        b = q.shape.lens()[0]
        dk, dv = q.shape.lens()[2] // q_heads, v.shape.lens()[2] // kv_heads
        past = ctx.literal(np.zeros([b, kv_heads, dk, dv], dtype=q.shape.dtype()))
    inputs = [q, k, v, past] + [x for x in (decay, beta) if x is not None]
    attrs = {
        "update_rule": rule,
        "q_num_heads": q_heads,
        "kv_num_heads": kv_heads,
        "scale": ctx.attr("scale", 0.0),
    }
    wanted = list(ctx.node.output)
    return [
        ctx.add(LinearAttention(output=kind, **attrs), *inputs)
        if k_out < len(wanted) and wanted[k_out]
        else None
        for k_out, kind in enumerate(("output", "present_state"))
    ]
