"""Data-movement operators lowered to torch: concat, constant pad, reverse, gather.

Each writes its arena slot directly: `torch.cat(..., out=)` (adjacent consecutive slices of one
tensor copied as one span, `concat_parts`; a nearest upsample input may write its own window,
`lower_resize.concat_with_repeat`), a fill plus a copy into the inner
window for `pad`, `index_select`/`gather` with `out=` for the gathers (negative indices are
wrapped first; out-of-range ones raise in torch, as they raise in the reference).

Declined (numpy fallback): reflect/edge/wrap padding, `gathernd`, the scatters, `compress`,
`einsum`, `det`, `bitshift`, `topk`, `prefix_scan_sum`, the dynamic slice/pad ops, and
any of these on types torch cannot compute in.
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.printer import instruction_names
from pygraphx.targets.torch_lowering.context import CHANNELS_LAST, STANDARD, LoweringContext
from pygraphx.targets.torch_lowering.dtypes import COMPUTE_DTYPES, python_scalar, torch_dtype
from pygraphx.targets.torch_lowering.lower_math import output_buffer
from pygraphx.targets.torch_lowering.registry import lowering


def concat_layout(ctx: LoweringContext, ins: Instruction, args: list[int]) -> str:
    """Channels-last for a 4-D concat whose parts are all channels-last (a UNet's skip joined
    with its upsampled path, both from convolutions): a standard result would transpose every
    part here and the next convolution would transpose it back."""
    if ins.shape.ndim() != 4 or not args:
        return STANDARD
    if all(ctx.layout[i] == CHANNELS_LAST for i in args):
        return CHANNELS_LAST
    return STANDARD


def _computable(ins: Instruction) -> bool:
    return torch_dtype(ins.shape.dtype()) in COMPUTE_DTYPES


def concat_axis(ins: Instruction) -> int:
    return ins.op.axis + ins.shape.ndim() if ins.op.axis < 0 else ins.op.axis


def concat_windows(out: torch.Tensor, ins: Instruction) -> list[torch.Tensor]:
    """The window of concat `ins`'s output `out` that each of its inputs fills, in order."""
    axis = concat_axis(ins)
    windows = []
    start = 0
    for x in ins.inputs:
        size = x.shape.lens()[axis]
        windows.append(out.narrow(axis, start, size))
        start += size
    return windows


#: one copy of a concat: (env index read, whether its view is widened along the axis, length)
Part = tuple[int, bool, int]


def _axis_span(ins: Instruction, axis: int) -> tuple[int, int] | None:
    """(start, end) along `axis` when `ins` is a slice cutting only that axis, else None."""
    if ins.op.name != "slice":
        return None
    lens = ins.inputs[0].shape.lens()
    bounds = ins.op._bounds(ins.inputs[0].shape)
    if any(bounds[k] != (0, n) for k, n in enumerate(lens) if k != axis):
        return None
    return bounds[axis]


def concat_groups(ins: Instruction, axis: int) -> list[list[Instruction]]:
    """Concat `ins`'s inputs grouped by copy (see `concat_parts`): adjacent inputs that are
    consecutive slices of one tensor along the axis are one group."""
    groups: list[list[Instruction]] = []
    last: tuple[Instruction, int] | None = None  # (source of the last slice part, its end)
    for x in ins.inputs:
        span = _axis_span(x, axis)
        if span is not None and last == (x.inputs[0], span[0]):
            groups[-1].append(x)
        else:
            groups.append([x])
        last = (x.inputs[0], span[1]) if span is not None else None
    return groups


def concat_parts(ctx: LoweringContext, ins: Instruction, axis: int) -> list[Part]:
    """What each copy of concat `ins` reads: adjacent inputs that are consecutive slices of
    one tensor along the axis (a C2f block's two halves of one convolution's output) are one
    copy, of the first slice's view widened over the others (it reads the slices' values, not
    their source's, which may be released once the slices are made)."""
    return [
        (ctx.index[id(g[0])], len(g) > 1, sum(x.shape.lens()[axis] for x in g))
        for g in concat_groups(ins, axis)
    ]


def part_reader(env: list, axis: int, part: Part) -> Callable[[], torch.Tensor]:
    """A function returning the tensor `part` reads this run."""
    idx, widened, length = part
    if not widened:
        return lambda: env[idx]

    def read() -> torch.Tensor:
        v = env[idx]
        size = list(v.shape)
        size[axis] = length
        return v.as_strided(size, v.stride(), v.storage_offset())

    return read


@lowering("concat")
def lower_concat(ctx: LoweringContext, ins: Instruction) -> bool:
    if not _computable(ins):
        return False
    axis = concat_axis(ins)
    args = ctx.args(ins)
    layout = concat_layout(ctx, ins, args)
    idx, out = output_buffer(ctx, ins, layout)
    env = ctx.env
    parts = concat_parts(ctx, ins, axis)
    readers = [part_reader(env, axis, p) for p in parts]
    if layout == STANDARD:
        cat = torch.cat

        def step() -> None:
            cat([read() for read in readers], axis, out=out)

    else:
        # channels-last parts into a channels-last result: each part is one strided copy
        # into its window (torch.cat with out= would restride or reallocate the slot)
        windows = out.split([p[2] for p in parts], axis)
        copies = list(zip(windows, readers, strict=True))

        def step() -> None:
            for window, read in copies:
                window.copy_(read())

    ctx.emit(step, ins, idx)
    return True


@lowering("pad")
def lower_pad(ctx: LoweringContext, ins: Instruction) -> bool:
    op = ins.op
    if op.mode != "constant" or not _computable(ins):
        return False
    rank = ins.shape.ndim()
    lens = ins.inputs[0].shape.lens()
    inner = tuple(slice(op.pads[k], op.pads[k] + lens[k]) for k in range(rank))
    value = python_scalar(op.value, torch_dtype(ins.shape.dtype()))
    x = ctx.arg(ins, 0)
    idx, out = output_buffer(ctx, ins, "std")
    window = out[inner]
    env = ctx.env

    def step() -> None:
        out.fill_(value)
        window.copy_(env[x])

    ctx.emit(step, ins, idx)
    return True


@lowering("reverse")
def lower_reverse(ctx: LoweringContext, ins: Instruction) -> bool:
    if not _computable(ins):
        return False
    rank = ins.shape.ndim()
    axes = tuple(sorted({a + rank if a < 0 else a for a in ins.op.axes}))
    x = ctx.arg(ins, 0)
    idx, out = output_buffer(ctx, ins, "std")
    env = ctx.env

    def step() -> None:
        out.copy_(torch.flip(env[x], axes) if axes else env[x])

    ctx.emit(step, ins, idx)
    return True


def _wrap(i: torch.Tensor, n: int) -> torch.Tensor:
    """Indices with negatives counted from the end (left out of range: torch raises)."""
    return torch.where(i < 0, i + n, i)


def _gatherable(ins: Instruction) -> bool:
    """A gather-like instruction torch can run: computable types and int32/int64 indices."""
    return _computable(ins) and ins.inputs[1].shape.type() in ("int32_type", "int64_type")


def _gather_axis(ins: Instruction) -> int:
    rank = ins.inputs[0].shape.ndim()
    return ins.op.axis + rank if ins.op.axis < 0 else ins.op.axis


@lowering("gather")
def lower_gather(ctx: LoweringContext, ins: Instruction) -> bool:
    if not _gatherable(ins):
        return False
    data_shape, idx_shape = (i.shape for i in ins.inputs)
    axis = _gather_axis(ins)
    lens = data_shape.lens()
    n = lens[axis]
    flat_lens = lens[:axis] + [prod(idx_shape.lens())] + lens[axis + 1 :]
    d, i = ctx.args(ins)
    idx, out = output_buffer(ctx, ins, "std")
    out_flat = out.view(flat_lens)
    env = ctx.env
    select = torch.index_select
    fixed = ctx.constant(i)
    if fixed is not None:
        ids = _wrap(fixed.reshape(-1).long(), n)
        if bool(((ids < 0) | (ids >= n)).any()):
            return False  # the reference raises its own error for the bad index at run time

        def step_fixed() -> None:
            select(env[d], axis, ids, out=out_flat)

        ctx.emit(step_fixed, ins, idx)
        return True

    def step() -> None:
        try:
            select(env[d], axis, _wrap(env[i].reshape(-1), n), out=out_flat)
        except IndexError:  # torch says only "index out of range in self"
            raise IndexError(gather_range_message(ins, env[i], n)) from None

    ctx.emit(step, ins, idx)
    return True


def gather_range_message(ins: Instruction, indices: torch.Tensor, n: int) -> str:
    """What an out-of-range gather index is: the node, the indices' source, the valid range."""
    bad = indices[(indices < -n) | (indices >= n)].reshape(-1)
    first = int(bad[0]) if bad.numel() else None
    source = ins.inputs[1]
    named = f"input {source.op.parameter!r}" if source.is_param() else "its indices"
    label = instruction_names(ins.module).get(id(ins), ins.op.name) if ins.module else ins.op.name
    return (
        f"{label} gather[axis={ins.op.axis}]: {named} holds {first}, out of range for a "
        f"dimension of {n} (valid indices: -{n} to {n - 1})"
    )


@lowering("gather_elements")
def lower_gather_elements(ctx: LoweringContext, ins: Instruction) -> bool:
    if not _gatherable(ins):
        return False
    axis = _gather_axis(ins)
    n = ins.inputs[0].shape.lens()[axis]
    d, i = ctx.args(ins)
    idx, out = output_buffer(ctx, ins, "std")
    env = ctx.env

    def step() -> None:
        torch.gather(env[d], axis, _wrap(env[i], n).long(), out=out)

    ctx.emit(step, ins, idx)
    return True
