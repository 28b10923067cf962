"""Handlers of the com.microsoft contrib attention ops that ONNX Runtime's transformer
optimiser emits: Attention, MultiHeadAttention, RotaryEmbedding and GroupQueryAttention.

Like the other contrib handlers (`contrib.py`, whose `MS` domain and `_with_bias` are used
here), each is decomposed into IR ops with ONNX Runtime's CPU kernels as the definition: the
attention ops compute `scale * Q K^T + mask + bias` in the input type and mask with
`mask_filter_value` (not -inf), on `[batch, heads, seq, head_size]` tensors built with the
helpers of the ONNX attention handlers (`attention.py`: `split_heads`, `merge_heads`,
`repeat_kv`, `rotate`, ...). GroupQueryAttention keeps the KV cache at a static length:
max(total_sequence_length, past length) when `total_sequence_length` is a constant, else the
declared present shape, else the past length (no growth beyond the given past); the cache write
position is a run-time value (`concat_past_present`).
"""

from __future__ import annotations

from math import sqrt

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.shape import to_dtype
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.handlers.attention import (
    BiasPart,
    add_bias,
    additive,
    binary,
    bool_to_bias,
    float_input,
    guarded_softmax,
    last_axis_slice,
    merge_heads,
    repeat_kv,
    rotate,
    softcap,
    split_heads,
    sum_bias,
    window_allowed,
)
from pygraphx.onnx.handlers.contrib import MS, _with_bias
from pygraphx.onnx.handlers.gemm import add_matmul
from pygraphx.onnx.handlers.layout import arg
from pygraphx.onnx.handlers.softmax import reshape
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops import make_op
from pygraphx.ops.attention import ConcatPastPresent
from pygraphx.ops.copy_ops import Concat, Pad
from pygraphx.ops.gemm import Dot
from pygraphx.ops.indexing import Gather
from pygraphx.ops.layout import Slice, Squeeze, Transpose, Unsqueeze
from pygraphx.ops.softmax import Softmax

Args = list[Instruction | None]


def axis_slice(ctx: NodeContext, x: Instruction, axis: int, start: int, end: int) -> Instruction:
    return ctx.add(Slice(axes=(axis,), starts=(start,), ends=(end,)), x)


def _scaled_attention(
    ctx: NodeContext,
    q: Instruction,
    k: Instruction,
    v: Instruction,
    scale: float,
    bias: BiasPart | None,
    cap: float = 0.0,
    guard: bool = False,
) -> tuple[Instruction, Instruction, Instruction]:
    """softmax(scale * q k^T (+ softcap) + bias) v on [batch, heads, seq, size] tensors (k, v
    already repeated to q's heads). Returns (output, scores with bias, probabilities)."""
    qk = ctx.add(Dot(), q, ctx.add(Transpose((0, 1, 3, 2)), k))
    qk = softcap(ctx, ctx.add(make_op("mul"), qk, ctx.scalar(scale, qk)), cap)
    scores = add_bias(ctx, qk, bias)
    if guard:
        probs = guarded_softmax(ctx, scores, bias)
    else:
        probs = ctx.add(Softmax(axis=3), scores)
    return ctx.add(Dot(), probs, v), scores, probs


def _mask_index_bias(
    ctx: NodeContext,
    mask: Instruction,
    batch: int,
    q_len: int,
    total: int,
    causal: bool,
    past: int,
    fill: float,
    type_name: str,
) -> Instruction:
    """ONNX Runtime's mask_index formats (and the causal mask) as a [batch, 1, q, total] bias
    of `fill` where masked, 0 elsewhere."""
    lens = mask.shape.lens()
    mask = ctx.convert(mask, "int32_type")
    out_lens = [batch, q_len, total]
    if lens == [batch] or lens == [2 * batch]:
        key = ctx.literal(np.arange(total, dtype=np.int32).reshape(1, total))
        key = ctx.broadcast_to(key, [batch, total])
        end = mask if lens == [batch] else last_axis_slice(ctx, mask, 0, batch)
        end = ctx.broadcast_to(ctx.add(Unsqueeze((1,)), end), [batch, total])
        allowed = ctx.add(make_op("less"), key, end)
        if lens == [2 * batch]:
            start = last_axis_slice(ctx, mask, batch, 2 * batch)
            start = ctx.broadcast_to(ctx.add(Unsqueeze((1,)), start), [batch, total])
            after = ctx.add(make_op("greater_or_equal"), key, start)
            allowed = ctx.add(make_op("logical_and"), allowed, after)
        allowed = ctx.broadcast_to(ctx.add(Unsqueeze((1,)), allowed), out_lens)
    elif len(lens) == 2 and lens[1] == total and lens[0] in (1, batch):
        raw = ctx.add(make_op("greater"), mask, ctx.scalar(0, mask))
        allowed = ctx.broadcast_to(ctx.add(Unsqueeze((1,)), raw), out_lens)
    elif len(lens) == 2 and lens[1] == 1:  # a dummy mask: no masking
        allowed = ctx.broadcast_to(ctx.literal(np.ones((), dtype=bool)), out_lens)
    elif len(lens) == 3 and lens[1:] == [q_len, total]:
        raw = ctx.add(make_op("greater"), mask, ctx.scalar(0, mask))
        allowed = ctx.broadcast_to(raw, out_lens)
    else:
        raise ctx.error(
            f"mask of shape {lens} is not a supported mask_index format for batch {batch}, "
            f"sequence {q_len} and total sequence {total}"
        )
    if causal:
        tri = ctx.literal(window_allowed(q_len, total, past, True))
        allowed = ctx.add(make_op("logical_and"), allowed, ctx.broadcast_to(tri, out_lens))
    bias = bool_to_bias(ctx, allowed, type_name, fill)
    return ctx.add(Unsqueeze((1,)), bias)


def _contrib_bias(
    ctx: NodeContext,
    mask: Instruction | None,
    attention_bias: Instruction | None,
    batch: int,
    q_len: int,
    total: int,
    past: int,
    type_name: str,
) -> BiasPart | None:
    fill = ctx.attr("mask_filter_value", -10000.0)
    causal = bool(ctx.attr("unidirectional", 0)) and q_len > 1
    parts: list[BiasPart] = []
    if mask is not None:
        parts.append(
            _mask_index_bias(ctx, mask, batch, q_len, total, causal, past, fill, type_name)
        )
    elif causal:
        allowed = window_allowed(q_len, total, past, True)
        parts.append(additive(allowed, to_dtype(type_name), fill))
    if attention_bias is not None:
        parts.append(ctx.convert(attention_bias, type_name))
    if not parts:
        return None
    return sum_bias(ctx, parts, to_dtype(type_name))


@onnx_op("Attention", domain=MS)
def parse_ms_attention(ctx: NodeContext, args: Args) -> list[Instruction | None]:
    x, weights, bias, mask = args[0], args[1], arg(args, 2), arg(args, 3)
    past, attention_bias = arg(args, 4), arg(args, 5)
    if arg(args, 6) is not None or ctx.attr("past_present_share_buffer", 0):
        raise ctx.error("past_present_share_buffer / past_sequence_length are not supported")
    if ctx.attr("do_rotary", 0):
        raise ctx.error("do_rotary is not supported (ONNX Runtime's CPU kernel has none either)")
    float_input(ctx, x, "input")
    heads = ctx.attr("num_heads")
    if x.shape.ndim() != 3:
        raise ctx.error(f"input must be [batch, seq, hidden], got {x.shape.lens()}")
    batch, seq, _ = x.shape.lens()
    width = weights.shape.lens()[1]
    sizes = list(ctx.attr("qkv_hidden_sizes", (width // 3,) * 3))
    if len(sizes) != 3 or sum(sizes) != width:
        raise ctx.error(f"qkv_hidden_sizes {sizes} do not add up to the weights' {width} columns")
    qkv = add_matmul(ctx, x, weights, Dot())
    qkv = _with_bias(ctx, qkv, bias)
    starts = [0, sizes[0], sizes[0] + sizes[1]]
    q, k, v = (
        split_heads(ctx, last_axis_slice(ctx, qkv, s, s + n), heads, what)
        for s, n, what in zip(starts, sizes, ("Q", "K", "V"), strict=True)
    )
    past_len = 0
    if past is not None:
        past_len = past.shape.lens()[3]
        pk = ctx.add(Squeeze((0,)), axis_slice(ctx, past, 0, 0, 1))
        pv = ctx.add(Squeeze((0,)), axis_slice(ctx, past, 0, 1, 2))
        k = ctx.add(Concat(axis=2), pk, k)
        v = ctx.add(Concat(axis=2), pv, v)
    total = past_len + seq
    present = None
    if ctx.num_outputs > 1:
        if k.shape.lens() != v.shape.lens():
            raise ctx.error("present needs equal Q/K/V hidden sizes (qkv_hidden_sizes differ)")
        present = ctx.add(Concat(axis=0), *(ctx.add(Unsqueeze((0,)), t) for t in (k, v)))
    scale = ctx.attr("scale", 0.0) or 1 / sqrt(sizes[0] // heads)
    bias_part = _contrib_bias(
        ctx, mask, attention_bias, batch, seq, total, past_len, x.shape.type()
    )
    y, _, _ = _scaled_attention(ctx, q, k, v, scale, bias_part)
    return [merge_heads(ctx, y), present]


def _bnsh(ctx: NodeContext, x: Instruction, heads: int, bias: Instruction | None, what: str):
    """A 3-D [batch, seq, hidden] input (plus its bias slice) as [batch, heads, seq, size]."""
    return split_heads(ctx, _with_bias(ctx, x, bias), heads, what)


@onnx_op("MultiHeadAttention", domain=MS)
def parse_multi_head_attention(ctx: NodeContext, args: Args) -> list[Instruction]:
    q, k, v, bias = args[0], arg(args, 1), arg(args, 2), arg(args, 3)
    mask, attention_bias = arg(args, 4), arg(args, 5)
    past_k, past_v = arg(args, 6), arg(args, 7)
    if arg(args, 8) is not None or arg(args, 9) is not None:
        raise ctx.error("past_sequence_length and cache_indirection are not supported")
    float_input(ctx, q, "query")
    heads = ctx.attr("num_heads")
    q_lens = q.shape.lens()
    batch, seq = q_lens[0], q_lens[1]

    def bias_slice(start: int, end: int) -> Instruction | None:
        return None if bias is None else last_axis_slice(ctx, bias, start, end)

    if len(q_lens) == 5:  # packed QKV [batch, seq, heads, 3, size]
        size = q_lens[4]
        parts = []
        for j in range(3):
            t = ctx.add(Squeeze((3,)), axis_slice(ctx, q, 3, j, j + 1))
            t = reshape(ctx, t, [batch, seq, heads * size])
            parts.append(
                _bnsh(ctx, t, heads, bias_slice(j * heads * size, (j + 1) * heads * size), "QKV")
            )
        qh, kh, vh = parts
    else:
        hidden = q_lens[2]
        qh = _bnsh(ctx, q, heads, bias_slice(0, hidden), "query")
        k_lens = k.shape.lens()
        if len(k_lens) == 5:  # packed KV [batch, kv_seq, heads, 2, size]
            size = k_lens[4]
            kv = []
            for j in range(2):
                t = ctx.add(Squeeze((3,)), axis_slice(ctx, k, 3, j, j + 1))
                t = reshape(ctx, t, [batch, k_lens[1], heads * size])
                start = hidden + j * heads * size
                kv.append(_bnsh(ctx, t, heads, bias_slice(start, start + heads * size), "KV"))
            kh, vh = kv
        elif len(k_lens) == 4:  # already [batch, heads, kv_seq, size] (no bias applies)
            kh, vh = k, v
        else:
            kh = _bnsh(ctx, k, heads, bias_slice(hidden, 2 * hidden), "key")
            v_hidden = v.shape.lens()[2]
            vh = _bnsh(ctx, v, heads, bias_slice(2 * hidden, 2 * hidden + v_hidden), "value")
    past_len = 0
    if past_k is not None and past_v is not None:
        past_len = past_k.shape.lens()[2]
        kh = ctx.add(Concat(axis=2), past_k, kh)
        vh = ctx.add(Concat(axis=2), past_v, vh)
    total = kh.shape.lens()[2]
    scale = ctx.attr("scale", 0.0) or 1 / sqrt(qh.shape.lens()[3])
    bias_part = _contrib_bias(
        ctx, mask, attention_bias, batch, seq, total, past_len, q.shape.type()
    )
    y, scores, _ = _scaled_attention(ctx, qh, kh, vh, scale, bias_part)
    return [merge_heads(ctx, y), kh, vh, scores]


def _rotary_positions(
    ctx: NodeContext, positions: Instruction, batch: int, seq: int
) -> Instruction:
    """[batch, seq] int64 positions from ONNX Runtime's two formats: [1] (an offset added to
    0..seq-1) or [batch, seq]."""
    positions = ctx.convert(positions, "int64_type")
    if positions.shape.lens() == [batch, seq]:
        return positions
    if positions.shape.elements() != 1:
        raise ctx.error(
            f"position_ids must be [1] or [{batch}, {seq}], got {positions.shape.lens()}"
        )
    steps = ctx.literal(np.arange(seq, dtype=np.int64).reshape(1, seq))
    offset = reshape(ctx, positions, [1, 1])
    return ctx.broadcast_to(binary(ctx, "add", steps, offset), [batch, seq])


def _rope_bsnh(
    ctx: NodeContext,
    x: Instruction,
    positions: Instruction,
    cos: Instruction,
    sin: Instruction,
    interleaved: bool,
    rotary_dim: int,
) -> Instruction:
    """RoPE on x [batch, seq, heads, size] at [batch, seq] positions of the caches."""
    cos = ctx.add(Unsqueeze((2,)), ctx.add(Gather(0), cos, positions))
    sin = ctx.add(Unsqueeze((2,)), ctx.add(Gather(0), sin, positions))
    return rotate(ctx, x, cos, sin, interleaved, rotary_dim)


@onnx_op("RotaryEmbedding", domain=MS)
def parse_ms_rotary_embedding(ctx: NodeContext, args: Args) -> Instruction:
    x, positions, cos, sin = args[0], args[1], args[2], args[3]
    float_input(ctx, x, "input")
    lens = x.shape.lens()
    half = cos.shape.lens()[1]
    rotary_dim = ctx.attr("rotary_embedding_dim", 0)
    heads = ctx.attr("num_heads", 0)
    if len(lens) == 4:  # [batch, heads, seq, size]
        batch, heads, seq, size = lens
        xs = ctx.add(Transpose((0, 2, 1, 3)), x)
    elif len(lens) == 3:
        batch, seq, hidden = lens
        if heads <= 0:
            heads = hidden // (2 * half)
        if heads <= 0 or hidden % heads:
            raise ctx.error(f"num_heads {heads} does not divide the hidden size {hidden}")
        size = hidden // heads
        xs = reshape(ctx, x, [batch, seq, heads, size])
    else:
        raise ctx.error(f"input must be 3-D or 4-D, got {lens}")
    rotary_dim = rotary_dim or 2 * half
    pos = _rotary_positions(ctx, positions, batch, seq)
    out = _rope_bsnh(ctx, xs, pos, cos, sin, bool(ctx.attr("interleaved", 0)), rotary_dim)
    if len(lens) == 4:
        return ctx.add(Transpose((0, 2, 1, 3)), out)
    return reshape(ctx, out, lens)


def _gqa_present_length(
    ctx: NodeContext, total: Instruction, past: Instruction | None, seq: int
) -> tuple[int, bool]:
    """(present cache length, whether this is the first prompt), both static."""
    past_len = past.shape.lens()[2] if past is not None else 0
    value = ctx.const(total)
    if value is not None:
        total_len = int(np.asarray(value).reshape(-1)[0])
        return max(total_len, past_len), total_len == seq
    declared = ctx.declared_lens(1)
    if declared is not None and len(declared) == 4:
        return declared[2], past is None
    return (past_len if past is not None else seq), past is None


def _gqa_unpack_qkv(
    ctx: NodeContext, packed: Instruction, heads: int, kv_heads: int
) -> tuple[Instruction, Instruction, Instruction]:
    """Query, key and value sliced out of a packed [batch, seq, (heads + 2 kv_heads) size] input."""
    width = packed.shape.lens()[2]
    size = width // (heads + 2 * kv_heads)
    q = last_axis_slice(ctx, packed, 0, heads * size)
    k = last_axis_slice(ctx, packed, heads * size, (heads + kv_heads) * size)
    v = last_axis_slice(ctx, packed, (heads + kv_heads) * size, width)
    return q, k, v


def _gqa_bias(
    ctx: NodeContext,
    kept: Instruction,
    seqlens: Instruction,
    lens: list[int],
    type_name: str,
    attention_bias: Instruction | None,
) -> Instruction:
    """The additive attention bias of GroupQueryAttention: causal, padding and window masks."""
    # query s of batch b sees key t iff t <= kept[b] + s, t <= seqlens_k[b] and, with a local
    # window of w keys (ONNX Runtime counts the query's own key), t > kept[b] + s - w
    batch, _, seq, present_len = lens
    pos_q = ctx.literal(np.arange(seq, dtype=np.int64).reshape(1, 1, seq, 1))
    key = ctx.broadcast_to(
        ctx.literal(np.arange(present_len, dtype=np.int64).reshape(1, 1, 1, -1)), lens
    )
    query_pos = ctx.broadcast_to(
        binary(ctx, "add", pos_q, reshape(ctx, kept, [batch, 1, 1, 1])), lens
    )
    allowed = ctx.add(make_op("less_or_equal"), key, query_pos)
    last = ctx.broadcast_to(reshape(ctx, seqlens, [batch, 1, 1, 1]), lens)
    allowed = ctx.add(make_op("logical_and"), allowed, ctx.add(make_op("less_or_equal"), key, last))
    window = ctx.attr("local_window_size", -1)
    if window > 0:
        low = ctx.add(make_op("sub"), query_pos, ctx.scalar(window - 1, query_pos))
        allowed = ctx.add(
            make_op("logical_and"), allowed, ctx.add(make_op("greater_or_equal"), key, low)
        )
    parts: list[BiasPart] = [bool_to_bias(ctx, allowed, type_name, float("-inf"))]
    if attention_bias is not None:
        ab = ctx.convert(attention_bias, type_name)
        ab_lens = ab.shape.lens()
        if ab_lens[-1] < present_len:
            pads = (0,) * 7 + (present_len - ab_lens[-1],)
            ab = ctx.add(Pad(pads=pads, value=float("-inf")), ab)
        parts.append(ab)
    return sum_bias(ctx, parts, to_dtype(type_name))


@onnx_op("GroupQueryAttention", domain=MS)
def parse_group_query_attention(ctx: NodeContext, args: Args) -> list[Instruction | None]:
    q, k, v = args[0], arg(args, 1), arg(args, 2)
    past_k, past_v, seqlens_k, total = arg(args, 3), arg(args, 4), args[5], args[6]
    cos, sin, position_ids, attention_bias = arg(args, 7), arg(args, 8), arg(args, 9), arg(args, 10)
    for k_extra in range(11, len(args)):
        if args[k_extra] is not None:
            raise ctx.error("head_sink, quantized KV caches and Q/K norms are not supported")
    if ctx.attr("smooth_softmax", 0) == 1 or ctx.attr("sliding_window_cache", 0):
        raise ctx.error("smooth_softmax and sliding_window_cache are not supported")
    float_input(ctx, q, "query")
    heads, kv_heads = ctx.attr("num_heads"), ctx.attr("kv_num_heads")
    batch, seq, width = q.shape.lens()
    if k is None:  # packed QKV
        q, k, v = _gqa_unpack_qkv(ctx, q, heads, kv_heads)
    size = q.shape.lens()[2] // heads
    # [batch, seq, heads, size]
    qs = reshape(ctx, q, [batch, seq, heads, size])
    ks = reshape(ctx, k, [batch, seq, kv_heads, size])
    present_len, prompt = _gqa_present_length(ctx, total, past_k, seq)
    seqlens = ctx.convert(seqlens_k, "int64_type")
    if prompt:
        kept = ctx.literal(np.zeros([batch], dtype=np.int64))
    else:  # the cache holds seqlens_k + 1 - seq entries before this step
        kept = ctx.add(make_op("sub"), seqlens, ctx.scalar(seq - 1, seqlens))
    if ctx.attr("do_rotary", 0):
        if cos is None or sin is None:
            raise ctx.error("do_rotary needs cos_cache and sin_cache")
        if position_ids is not None:
            pos = ctx.convert(position_ids, "int64_type")
        else:
            steps = ctx.literal(np.arange(seq, dtype=np.int64).reshape(1, seq))
            pos = binary(ctx, "add", ctx.add(Unsqueeze((1,)), kept), steps)
        interleaved = bool(ctx.attr("rotary_interleaved", 0))
        rotary_dim = 2 * cos.shape.lens()[1]
        qs = _rope_bsnh(ctx, qs, pos, cos, sin, interleaved, rotary_dim)
        ks = _rope_bsnh(ctx, ks, pos, cos, sin, interleaved, rotary_dim)
    qh = ctx.add(Transpose((0, 2, 1, 3)), qs)
    kh = ctx.add(Transpose((0, 2, 1, 3)), ks)
    vh = split_heads(ctx, v, kv_heads, "value")
    caches = []
    for new, past in ((kh, past_k), (vh, past_v)):
        inputs = [kept, new] + ([past] if past is not None else [])
        caches.append(ctx.add(ConcatPastPresent(present_length=present_len), *inputs))
    present_k, present_v = caches
    type_name = q.shape.type()
    bias = _gqa_bias(ctx, kept, seqlens, [batch, 1, seq, present_len], type_name, attention_bias)
    reps = heads // kv_heads
    scale = ctx.attr("scale", 0.0) or 1 / sqrt(size)
    y, scores, probs = _scaled_attention(
        ctx,
        qh,
        repeat_kv(ctx, present_k, reps),
        repeat_kv(ctx, present_v, reps),
        scale,
        bias,
        ctx.attr("softcap", 0.0),
        guard=True,
    )
    qk_mode = ctx.attr("qk_output", 0)
    qk = {0: None, 1: scores, 2: probs}.get(qk_mode)
    return [merge_heads(ctx, y), present_k, present_v, qk]
