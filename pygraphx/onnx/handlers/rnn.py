"""Handlers of ONNX RNN, GRU and LSTM: one `rnn` / `gru` / `lstm` IR operator per result.

The handler brings the node to the operator's fixed form (see `pygraphx/ops/rnn.py`): layout 1
(batch first) is transposed to layout 0 and back, every omitted optional input becomes a literal
(zero bias, zero initial states, zero peepholes, full-length `sequence_lens`), the activation
list is completed with ONNX's defaults and repeated for the second direction when only one
direction's is given, and `activation_alpha` / `activation_beta` are handed out in order to the
activations that take them, as ONNX Runtime does. The operator is emitted once for each output
the node asks for (`Y`, `Y_h`, `Y_c`).
"""

from __future__ import annotations

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.handlers.layout import arg
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops.layout import Transpose
from pygraphx.ops.rnn import ACTIVATION_PARAMETERS, ACTIVATIONS, DIRECTIONS, Gru, Lstm, Rnn

Args = list[Instruction | None]

# ONNX op -> (IR op class, default activations of one direction)
_KINDS = {
    "RNN": (Rnn, ("tanh",)),
    "GRU": (Gru, ("sigmoid", "tanh")),
    "LSTM": (Lstm, ("sigmoid", "tanh", "tanh")),
}


def _activations(
    ctx: NodeContext, defaults: tuple[str, ...], directions: int
) -> tuple[tuple[str, ...], tuple[float, ...], tuple[float, ...]]:
    """(names, alphas, betas) for every direction's activations."""
    names = tuple(n.lower() for n in ctx.attr("activations", defaults * directions))
    per_direction = len(defaults)
    if len(names) == per_direction and directions == 2:
        names = names * 2
    if len(names) != per_direction * directions:
        raise ctx.error(
            f"{per_direction * directions} activations expected for {directions} direction(s), "
            f"got {list(names)}"
        )
    unknown = [n for n in names if n not in ACTIVATIONS]
    if unknown:
        raise ctx.error(f"unsupported activation(s) {unknown}; supported: {sorted(ACTIVATIONS)}")
    alphas = list(ctx.attr("activation_alpha", ()))
    betas = list(ctx.attr("activation_beta", ()))
    out_alpha, out_beta = [], []
    for name in names:
        default_alpha, default_beta = ACTIVATION_PARAMETERS.get(name, (None, None))
        alpha = beta = 0.0
        if default_alpha is not None:
            alpha = alphas.pop(0) if alphas else default_alpha
        if default_beta is not None:
            beta = betas.pop(0) if betas else default_beta
        out_alpha.append(float(alpha))
        out_beta.append(float(beta))
    return names, tuple(out_alpha), tuple(out_beta)


def _zeros(ctx: NodeContext, lens: list[int], like: Instruction) -> Instruction:
    return ctx.literal(np.zeros(lens, dtype=like.shape.dtype()))


def _state(
    ctx: NodeContext, ins: Instruction | None, lens: list[int], x: Instruction, batch_first: bool
) -> Instruction:
    """An initial state in layout 0 ([D, batch, H]); zeros when omitted."""
    if ins is None:
        return _zeros(ctx, lens, x)
    if batch_first:
        ins = ctx.add(Transpose((1, 0, 2)), ins)
    return ctx.convert(ins, x.shape.type())


def _parse_recurrent(ctx: NodeContext, args: Args) -> list[Instruction | None]:
    op_cls, defaults = _KINDS[ctx.op_type]
    is_lstm = op_cls is Lstm
    x, w, r = args[0], args[1], args[2]
    direction = ctx.attr("direction", "forward")
    if direction not in DIRECTIONS:
        raise ctx.error(f"direction {direction!r} is not one of {list(DIRECTIONS)}")
    d = 2 if direction == "bidirectional" else 1
    batch_first = ctx.attr("layout", 0) == 1
    if x.shape.ndim() != 3:
        raise ctx.error(f"X must be rank 3, got {x.shape.lens()}")
    if batch_first:
        x = ctx.add(Transpose((1, 0, 2)), x)
    seq, batch, _ = x.shape.lens()
    hidden = ctx.attr("hidden_size", r.shape.lens()[-1])
    if r.shape.lens()[-1] != hidden:
        raise ctx.error(f"hidden_size {hidden} differs from R's last dimension {r.shape.lens()}")
    if w.shape.lens()[0] != d:
        raise ctx.error(f"W has {w.shape.lens()[0]} directions, direction {direction!r} has {d}")
    gates = op_cls.num_gates
    b = arg(args, 3)
    b = _zeros(ctx, [d, 2 * gates * hidden], x) if b is None else ctx.convert(b, x.shape.type())
    seq_lens = arg(args, 4)
    if seq_lens is None:
        seq_lens = ctx.literal(np.full([batch], seq, dtype=np.int32))
    else:
        seq_lens = ctx.convert(seq_lens, "int32_type")
    inputs = [x, w, r, b, seq_lens, _state(ctx, arg(args, 5), [d, batch, hidden], x, batch_first)]
    if is_lstm:
        inputs.append(_state(ctx, arg(args, 6), [d, batch, hidden], x, batch_first))
        p = arg(args, 7)
        inputs.append(_zeros(ctx, [d, 3 * hidden], x) if p is None else p)
    names, alphas, betas = _activations(ctx, defaults, d)
    attrs = {
        "hidden_size": hidden,
        "actv_funcs": names,
        "actv_alphas": alphas,
        "actv_betas": betas,
        "direction": direction,
        "clip": float(ctx.attr("clip", 0.0)),
    }
    if op_cls is Gru:
        attrs["linear_before_reset"] = bool(ctx.attr("linear_before_reset", 0))
    if is_lstm:
        attrs["input_forget"] = bool(ctx.attr("input_forget", 0))
    outputs = list(ctx.node.output)
    results: list[Instruction | None] = []
    for k, kind in enumerate(op_cls.outputs):
        if k >= len(outputs) or not outputs[k]:
            results.append(None)
            continue
        y = ctx.add(op_cls(output=kind, **attrs), *inputs)
        if batch_first:
            # Y: [seq, D, batch, H] -> [batch, seq, D, H]; Y_h, Y_c: [D, batch, H] -> [batch, D, H]
            perm = (2, 0, 1, 3) if kind == "hidden_states" else (1, 0, 2)
            y = ctx.add(Transpose(perm), y)
        results.append(y)
    return results


@onnx_op("RNN", since=7)
def parse_rnn(ctx: NodeContext, args: Args) -> list[Instruction | None]:
    return _parse_recurrent(ctx, args)


@onnx_op("GRU", since=7)
def parse_gru(ctx: NodeContext, args: Args) -> list[Instruction | None]:
    return _parse_recurrent(ctx, args)


@onnx_op("LSTM", since=7)
def parse_lstm(ctx: NodeContext, args: Args) -> list[Instruction | None]:
    return _parse_recurrent(ctx, args)
