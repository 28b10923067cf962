"""Handlers of the ONNX losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both are decomposed into IR ops following ONNX's definitions (and its reference
implementation). With input `x` of lens (N, C, d1, ..., dk) and integer labels `t` of lens
(N, d1, ..., dk), known at run time only:

- labels equal to `ignore_index` are replaced by 0 (`where`), so that the gathers below stay in
  range whatever `ignore_index` is (it may lie outside [0, C));
- `loss[n, d] = -x[n, t[n, d], d]` is a `gather_elements` along axis 1 of the labels unsqueezed
  there, set to 0 where the label is ignored; with class weights it is multiplied by
  `w[n, d] = weight[t[n, d]]` (a `gather`, also 0 where ignored);
- `reduction="none"` returns that per-element loss, `"sum"` its `reduce_sum`, `"mean"` the sum
  divided by the sum of the weights `w` (the count of labels not ignored when there are no
  weights; their plain `reduce_mean` when nothing can be ignored). When every label is ignored
  the mean is 0 / 0 = NaN, as in ONNX's reference.

SoftmaxCrossEntropyLoss is NegativeLogLikelihoodLoss of `logsoftmax(x, axis=1)`, which is also its
optional second output. Half and bf16 inputs are computed in float32 and rounded once.
"""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.shape import FLOAT_TYPES
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops import make_op
from pygraphx.ops.indexing import INDEX_TYPES
from pygraphx.ops.pointwise import Where

Args = list[Instruction | None]

REDUCTIONS = ("none", "sum", "mean")
# computed in float32 and rounded once to the input type
_WIDENED = ("half_type", "bf16_type")


def _check(
    ctx: NodeContext, x: Instruction, labels: Instruction, weight: Instruction | None
) -> None:
    xs, ts = x.shape, labels.shape
    if xs.type() not in FLOAT_TYPES or xs.type().startswith("fp8"):
        raise ctx.error(f"input must be float, float16, bf16 or double, got {xs.type()}")
    if ts.type() not in INDEX_TYPES:
        raise ctx.error(f"labels must be int32 or int64, got {ts.type()}")
    lens, tlens = xs.lens(), ts.lens()
    if len(lens) < 2:
        raise ctx.error(f"input must have lens (N, C, d1, ...), got {lens}")
    if tlens != [lens[0]] + lens[2:]:
        raise ctx.error(
            f"labels lens {tlens} do not fit the input lens {lens}: expected {[lens[0]] + lens[2:]}"
        )
    if weight is not None:
        if weight.shape.lens() != [lens[1]]:
            raise ctx.error(f"weight must have lens [C] = [{lens[1]}], got {weight.shape.lens()}")
        if weight.shape.type() != xs.type():
            raise ctx.error(f"weight type {weight.shape.type()} differs from input {xs.type()}")


def _reduction(ctx: NodeContext) -> str:
    reduction = ctx.attr("reduction", "mean")
    if reduction not in REDUCTIONS:
        raise ctx.error(f"reduction {reduction!r} is not one of {', '.join(REDUCTIONS)}")
    return reduction


def _reduce_all(ctx: NodeContext, name: str, y: Instruction) -> Instruction:
    """`name` (reduce_sum / reduce_mean) over every axis of y, as a tensor of rank 0."""
    axes = tuple(range(len(y.shape.lens())))
    r = ctx.add(make_op(name, axes=axes), y)
    return ctx.add(make_op("squeeze", axes=axes), r)


def nll_loss(
    ctx: NodeContext,
    x: Instruction,
    labels: Instruction,
    weight: Instruction | None,
    reduction: str,
    ignore_index: int | None,
) -> Instruction:
    """NegativeLogLikelihoodLoss of the (log-probability) input `x`, in x's type."""
    ignored = None
    if ignore_index is not None:
        ignored = ctx.add(make_op("equal"), labels, ctx.scalar(ignore_index, labels))
        labels = ctx.add(Where(), ignored, ctx.scalar(0, labels), labels)
    picked = ctx.add(
        make_op("gather_elements", axis=1), x, ctx.add(make_op("unsqueeze", axes=(1,)), labels)
    )
    loss = ctx.add(make_op("neg"), ctx.add(make_op("squeeze", axes=(1,)), picked))
    zero = ctx.scalar(0, loss)
    if ignored is not None:
        loss = ctx.add(Where(), ignored, zero, loss)
    w = None  # the weight of each label, when not all 1
    if weight is not None:
        w = ctx.add(make_op("gather", axis=0), weight, labels)
        if ignored is not None:
            w = ctx.add(Where(), ignored, zero, w)
        loss = ctx.add(make_op("mul"), loss, w)
    elif ignored is not None and reduction == "mean":
        w = ctx.convert(ctx.add(make_op("not"), ignored), loss.shape.type())
    if reduction == "none":
        return loss
    if reduction == "sum":
        return _reduce_all(ctx, "reduce_sum", loss)
    if w is None:
        return _reduce_all(ctx, "reduce_mean", loss)
    total = _reduce_all(ctx, "reduce_sum", loss)
    return ctx.add(make_op("div"), total, _reduce_all(ctx, "reduce_sum", w))


def _parse(ctx: NodeContext, args: Args, softmax: bool) -> list[Instruction]:
    x, labels = args[0], args[1]
    weight = args[2] if len(args) > 2 else None
    _check(ctx, x, labels, weight)
    reduction = _reduction(ctx)
    ignore_index = ctx.attr("ignore_index", None)
    in_type = x.shape.type()
    if in_type in _WIDENED:
        x = ctx.convert(x, "float_type")
        weight = None if weight is None else ctx.convert(weight, "float_type")
    log_prob = ctx.add(make_op("logsoftmax", axis=1), x) if softmax else x
    loss = nll_loss(ctx, log_prob, labels, weight, reduction, ignore_index)
    outs = [ctx.convert(loss, in_type)]
    if softmax and ctx.num_outputs > 1:
        outs.append(ctx.convert(log_prob, in_type))
    return outs


@onnx_op("NegativeLogLikelihoodLoss", since=12)
def parse_negative_log_likelihood_loss(ctx: NodeContext, args: Args) -> list[Instruction]:
    return _parse(ctx, args, softmax=False)


@onnx_op("SoftmaxCrossEntropyLoss", since=12)
def parse_softmax_cross_entropy_loss(ctx: NodeContext, args: Args) -> list[Instruction]:
    return _parse(ctx, args, softmax=True)
