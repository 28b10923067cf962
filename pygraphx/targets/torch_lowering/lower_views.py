"""View operators as torch views: transpose, broadcasts, slice, step, (un)squeeze, reshape.

A view is made with torch's own view functions on the actual input tensor (`permute`,
`expand`, indexing, `reshape`), not from the IR strides, so it is right whatever memory format
the input has (a channels-last convolution output, say). A view of a value fixed at prepare time
(a literal, an arena slot) is made once and costs nothing per run; a view of a run-time value is
a step. `reshape` of a tensor whose strides do not allow a view copies, as the IR allows.
`identity` and `shape_guard` (after its run-time check) are the input itself.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.shape import Shape
from pygraphx.targets.torch_lowering.context import CHANNELS_LAST, STANDARD, LoweringContext
from pygraphx.targets.torch_lowering.dtypes import to_numpy
from pygraphx.targets.torch_lowering.registry import lowering

ViewFn = Callable[[torch.Tensor], torch.Tensor]


def view_fn(ins: Instruction) -> ViewFn:
    """The torch function making `ins`'s view from its input tensor."""
    op = ins.op
    name = op.name
    src: Shape = ins.inputs[0].shape
    out_lens = tuple(ins.shape.lens())
    if name == "transpose":
        perm = tuple(op.permutation)
        return lambda x: x.permute(perm)
    if name in ("multibroadcast", "broadcast"):
        if name == "multibroadcast":
            lead = len(out_lens) - src.ndim()
            index = (None,) * lead + (Ellipsis,)
        else:
            trailing = len(out_lens) - op.axis - src.ndim()
            index = (None,) * op.axis + (Ellipsis,) + (None,) * trailing
        return lambda x: x[index].expand(out_lens)
    if name == "slice":
        bounds = op._bounds(src)
        index = tuple(slice(b, e) for b, e in bounds)
        return lambda x: x[index]
    if name == "step":
        index = tuple(slice(None, None, st) for st in op._steps(src))
        return lambda x: x[index]
    if name == "squeeze":
        kept = op._kept(src)
        drop = tuple(k for k in range(src.ndim()) if k not in kept)
        return lambda x: x.squeeze(drop) if drop else x
    if name == "unsqueeze":
        axes = sorted(a + len(out_lens) if a < 0 else a for a in op.axes)
        index = _unsqueeze_index(axes, len(out_lens))
        return lambda x: x[index]
    if name in ("reshape", "flatten"):
        return lambda x: x.reshape(out_lens)
    raise KeyError(name)


def _unsqueeze_index(axes: list[int], rank: int) -> tuple:
    return tuple(None if k in axes else slice(None) for k in range(rank))


@lowering(
    "transpose", "multibroadcast", "broadcast", "slice", "step", "squeeze", "unsqueeze",
    "reshape", "flatten",
)  # fmt: skip
def lower_view(ctx: LoweringContext, ins: Instruction) -> bool:
    fn = view_fn(ins)
    src = ctx.arg(ins, 0)
    x = ctx.value(src)
    layout = _view_layout(ctx, ins, src)
    if x is not None:
        v = fn(x)
        if _shares(v, x) or ctx.const[src]:
            ctx.bind_static(ins, v, layout, const=ctx.const[src])
            return True
    env = ctx.env
    out = ctx.bind_dynamic(ins, layout)

    def step() -> None:
        env[out] = fn(env[src])

    ctx.emit(step, ins, out)
    return True


def _shares(v: torch.Tensor, x: torch.Tensor) -> bool:
    return v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def _view_layout(ctx: LoweringContext, ins: Instruction, src: int) -> str:
    if ctx.layout[src] == CHANNELS_LAST and ins.op.name in ("multibroadcast", "slice", "step"):
        return CHANNELS_LAST if ins.shape.ndim() == 4 else STANDARD
    return STANDARD


#: view ops a chain after a fused step may hold (`view_chain`)
CHAIN_VIEWS = frozenset({"reshape", "transpose", "squeeze", "unsqueeze", "flatten"})

Chain = list[tuple[Instruction, ViewFn, tuple[int, int]]]


def view_chain(ctx: LoweringContext, ins: Instruction) -> Chain:
    """The views that follow `ins` (a run-time value a fused step makes: a GEMM's column part,
    an attention block's output) one after the other, each the only user of the one before (a
    head split or merge: reshape, transpose). The caller's step makes them right after `ins`
    instead of a step each; they are bound here with no step of their own. Each as
    (instruction, its view function, (input index, output index))."""
    chain: Chain = []
    cur = ins
    while len(cur.outputs) == 1 and cur.outputs[0].op.name in CHAIN_VIEWS:
        nxt = cur.outputs[0]
        if len(nxt.inputs) != 1:
            break
        out = ctx.bind_dynamic(nxt)
        ctx.fusers[id(nxt)] = _made_by_chain
        chain.append((nxt, view_fn(nxt), (ctx.index[id(cur)], out)))
        cur = nxt
    return chain


def view_step(env: list, src: int, fn: ViewFn, out: int) -> Callable[[], None]:
    """A profiling step making one view of a chain (`view_chain`) from its input's value."""

    def step() -> None:
        env[out] = fn(env[src])

    return step


def _made_by_chain(ctx: LoweringContext, ins: Instruction) -> bool:
    """A view of a chain: the step before it makes it (`view_chain`), no step of its own."""
    return True


@lowering("identity")
def lower_identity(ctx: LoweringContext, ins: Instruction) -> bool:
    ctx.alias(ins, ctx.arg(ins, 0))
    return True


@lowering("shape_guard")
def lower_shape_guard(ctx: LoweringContext, ins: Instruction) -> bool:
    """Check the run-time shape tensor with the op's numpy code; the value is input 0."""
    env = ctx.env
    x, v = ctx.args(ins)
    op, shape = ins.op, ins.shape
    out = ctx.alias(ins, x)
    if ctx.device.type != "cpu":  # reads values on the host every run (no graph capture)
        ctx.host_reads.append(ins.op.name)

    def step() -> None:
        op.compute(shape, [to_numpy(env[x].cpu()), np.asarray(to_numpy(env[v].cpu()))])

    ctx.emit(step, ins, out)
    return True
