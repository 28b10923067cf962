"""`resize` lowered to torch as separable per-axis resampling.

ONNX Resize (without a crop box) is separable: along each resized axis, output position k reads
a few input positions with fixed weights. Those are worked out once, at lowering time, by the
operator's own coordinate helpers (`source_coordinates`, `nearest_index`,
`interpolation_weights`, the ones the reference evaluates), so every coordinate mode, nearest
rounding mode, cubic coefficient, `exclude_outside` and antialias setting means exactly what it
means on `ref`. At run time an axis is one `index_select` (nearest) or a sum of `index_select`s
times their weights (linear, cubic: 2 or 4 taps an axis, more with antialias), on the device,
with no host step (so a CUDA graph can hold it).

The resizes exporters write for `nn.Upsample` / `F.interpolate` run on `F.interpolate`'s own
kernels, writing the slot through their out= forms (several times faster than the gathers; a
nearest upsample is one broadcast copy, `repeat_writer`) where their arithmetic is the
operator's: float data, batch and channels kept, every spatial scale exactly output/input;
nearest with the asymmetric transform, floor rounding and power-of-two factors (where torch's
source index is exact);
(bi/tri)linear with half_pixel, pytorch_half_pixel (outputs longer than 1) or align_corners;
bicubic (4-D) with those transforms and A = -0.75; none with antialias or exclude_outside.
A bf16 channels-last linear resize with the half_pixel transform runs on oneDNN's resampling
primitive instead (`onednn_resample.py`: ~4x torch's bf16 kernel; `PGX_CPU_BF16_RESIZE=torch`
keeps torch's).

Declined (numpy fallback): `tf_crop_and_resize` (extrapolated values outside the box), the
4-input form whose scales or sizes are read at run time, interpolation of integer types (the
reference rounds and saturates), and types torch cannot compute in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.ops.indexing import interpolation_weights, nearest_index, source_coordinates
from pygraphx.targets.torch_lowering.context import CHANNELS_LAST, STANDARD, LoweringContext
from pygraphx.targets.torch_lowering.dtypes import COMPUTE_DTYPES, torch_dtype
from pygraphx.targets.torch_lowering.lower_layout import concat_windows, lower_concat
from pygraphx.targets.torch_lowering.lower_math import output_buffer
from pygraphx.targets.torch_lowering.registry import defer, deferred_producer, lowering

#: (axis, input index of each tap [taps, out_len], weight of each tap shaped to broadcast along
#: the axis, or None for nearest)
AxisPlan = tuple[int, torch.Tensor, list[torch.Tensor] | None]


def _taps(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The non-zero entries of a dense [out, in] weight matrix as [taps, out] input indices and
    weights (rows with fewer taps are padded with weight 0 on index 0)."""
    nonzero = weights != 0
    taps = max(1, int(nonzero.sum(axis=1).max(initial=0)))
    order = np.argsort(~nonzero, axis=1, kind="stable")[:, :taps]  # non-zero columns first
    return order.T, np.take_along_axis(weights, order, axis=1).T


def axis_plans(ins: Instruction, device: torch.device, dtype: torch.dtype) -> list[AxisPlan]:
    """How each resized axis of `ins` reads its input (axes left as they are are skipped)."""
    op = ins.op
    lens = ins.inputs[0].shape.lens()
    plans: list[AxisPlan] = []
    for axis, (in_len, out_len) in enumerate(zip(lens, op.sizes, strict=True)):
        scale = float(op.scales[axis])
        if out_len == in_len and scale == 1.0:
            continue
        coords = source_coordinates(op.coordinate_transformation_mode, out_len, in_len, scale)
        if op.mode == "nearest":
            index = nearest_index(coords, op.nearest_mode, in_len, scale)[None, :]
            plans.append((axis, torch.from_numpy(index).to(device), None))
            continue
        dense = interpolation_weights(
            coords, in_len, op.mode, scale, op.cubic_coeff_a, op.exclude_outside, op.antialias
        )
        index, weight = _taps(dense)
        shape = [1] * len(lens)
        shape[axis] = out_len
        per_tap = [torch.tensor(w, dtype=dtype, device=device).reshape(shape) for w in weight]
        plans.append((axis, torch.from_numpy(np.ascontiguousarray(index)).to(device), per_tap))
    return plans


def resample(t: torch.Tensor, plans: list[AxisPlan]) -> torch.Tensor:
    """`t` resampled along every planned axis in turn."""
    select = torch.index_select
    for axis, index, weights in plans:
        if weights is None:
            t = select(t, axis, index[0])
            continue
        acc = select(t, axis, index[0]) * weights[0]
        for k in range(1, len(weights)):
            acc.addcmul_(select(t, axis, index[k]), weights[k])
        t = acc
    return t


_LINEAR_BY_RANK = {3: "linear", 4: "bilinear", 5: "trilinear"}


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def interpolate_args(ins: Instruction) -> dict[str, Any] | None:
    """`F.interpolate` keyword arguments computing `ins` exactly as the operator defines it, or
    None where torch's arithmetic would differ (see the module docstring)."""
    op = ins.op
    lens = ins.inputs[0].shape.lens()
    rank = len(lens)
    ctm = op.coordinate_transformation_mode
    if rank not in _LINEAR_BY_RANK or op.antialias or op.exclude_outside:
        return None
    if tuple(op.sizes[:2]) != tuple(lens[:2]) or any(float(f) != 1.0 for f in op.scales[:2]):
        return None
    spatial = list(zip(lens[2:], op.sizes[2:], op.scales[2:], strict=True))
    if any(n_in == 0 or float(f) != n_out / n_in for n_in, n_out, f in spatial):
        return None
    size = list(op.sizes[2:])
    if op.mode == "nearest":
        exact = all(
            n_out % n_in == 0 and _power_of_two(n_out // n_in) for n_in, n_out, _ in spatial
        )
        if ctm == "asymmetric" and op.nearest_mode == "floor" and exact:
            return {"size": size, "mode": "nearest"}
        return None
    if ctm == "pytorch_half_pixel" and any(n_out == 1 for _, n_out, _ in spatial):
        return None
    if ctm not in ("half_pixel", "pytorch_half_pixel", "align_corners"):
        return None
    if op.mode == "linear":
        mode = _LINEAR_BY_RANK[rank]
    elif op.mode == "cubic" and rank == 4 and op.cubic_coeff_a == -0.75:
        mode = "bicubic"
    else:
        return None
    return {"size": size, "mode": mode, "align_corners": ctm == "align_corners"}


#: torch's out= resampling kernels (what `F.interpolate` calls) by mode; each takes (input,
#: output size, align_corners, one scale per spatial axis (None: from the sizes), out=)
_UPSAMPLE_OUT = {
    "linear": (torch._C._nn.upsample_linear1d, 1),
    "bilinear": (torch._C._nn.upsample_bilinear2d, 2),
    "trilinear": (torch._C._nn.upsample_trilinear3d, 3),
    "bicubic": (torch._C._nn.upsample_bicubic2d, 2),
}

Writer = Callable[[torch.Tensor, torch.Tensor], None]


def repeat_factors(ins: Instruction) -> list[int] | None:
    """The per-spatial-axis integer factors when `ins` repeats every input element along each
    spatial axis (`nn.Upsample(mode="nearest")` by powers of two, see `interpolate_args`),
    else None."""
    fast = interpolate_args(ins) if torch_dtype(ins.shape.dtype()).is_floating_point else None
    if fast is None or fast["mode"] != "nearest":
        return None
    lens = ins.inputs[0].shape.lens()
    return [n_out // n_in for n_in, n_out in zip(lens[2:], fast["size"], strict=True)]


def repeat_writer(factors: list[int]) -> Writer:
    """`write(x, dst)`: each element of `x` repeated `factors[k]` times along spatial axis k,
    straight into `dst` (any strides: a window of a concat's output too), in one pass: `dst`
    viewed with each spatial axis split in (input length, factor), `x` broadcast along the
    factors."""
    index: tuple[Any, ...] = (slice(None), slice(None))
    for _ in factors:
        index += (slice(None), None)

    def write(x: torch.Tensor, dst: torch.Tensor) -> None:
        view = dst
        for k, f in enumerate(factors):
            view = view.unflatten(2 + 2 * k, (view.shape[2 + 2 * k] // f, f))
        view.copy_(x[index].expand(view.shape))

    return write


def resize_writer(ins: Instruction, device: torch.device) -> Writer:
    """`write(x, out)` computing resize `ins` of `x` into `out` (its own slot or a window)."""
    factors = repeat_factors(ins)
    if factors is not None:
        return repeat_writer(factors)
    dtype = torch_dtype(ins.shape.dtype())
    fast = interpolate_args(ins) if dtype.is_floating_point else None
    if fast is not None:  # torch's kernel writes `out` itself (no result tensor to copy)
        kernel, n = _UPSAMPLE_OUT[fast["mode"]]
        size, corners, scales = fast["size"], fast["align_corners"], (None,) * n
        return lambda x, out: kernel(x, size, corners, *scales, out=out)
    plans = axis_plans(ins, device, dtype)
    return lambda x, out: out.copy_(resample(x, plans))


def onednn_writer(ctx: LoweringContext, ins: Instruction) -> Writer | None:
    """`write(x, out)` through oneDNN's bf16 linear resampling (`onednn_resample.py`) where it
    computes `ins` exactly, the input is channels-last and `PGX_CPU_BF16_RESIZE` allows it;
    else None."""
    from pygraphx.targets.torch_lowering import onednn_resample as rs
    from pygraphx.targets.torch_lowering.onednn_step import warn_once

    if ctx.device.type != "cpu" or not ctx.options.get("mkldnn", True):
        return None
    plan = rs.plan_resample(ins)
    if plan is None or len(plan.x_lens) != 4 or rs.kernel_choice() != "onednn":
        return None
    rt = rs.runtime()
    if rt is None:
        return None
    try:
        resample = rs.Resample(rt, plan)
    except rs.OneDnnError as exc:
        warn_once("resize_ref", "cpu resize: torch's kernel instead of oneDNN's (%s)", exc)
        return None
    cl = torch.channels_last

    def write(x: torch.Tensor, out: torch.Tensor) -> None:
        if not x.is_contiguous(memory_format=cl):  # (a convolution's result always is)
            x = x.contiguous(memory_format=cl)
        resample(x, out)

    return write


def resize_layout(ctx: LoweringContext, ins: Instruction) -> str:
    """A channels-last input (a convolution's) keeps its layout: a standard result would
    transpose it here and back at the next convolution."""
    x = ctx.arg(ins, 0)
    return CHANNELS_LAST if ctx.layout[x] == CHANNELS_LAST and ins.shape.ndim() == 4 else STANDARD


def resizable(ins: Instruction) -> bool:
    """Whether torch runs resize `ins` (else the numpy fallback)."""
    op = ins.op
    dtype = torch_dtype(ins.shape.dtype())
    if len(ins.inputs) != 1 or dtype not in COMPUTE_DTYPES:
        return False
    if op.coordinate_transformation_mode == "tf_crop_and_resize":
        return False
    return op.mode == "nearest" or dtype.is_floating_point


def lower_resize_alone(ctx: LoweringContext, ins: Instruction) -> None:
    """Resize `ins` as one step writing its own slot."""
    x = ctx.arg(ins, 0)
    layout = resize_layout(ctx, ins)
    idx, out = output_buffer(ctx, ins, layout)
    onednn = layout == CHANNELS_LAST and out.is_contiguous(memory_format=torch.channels_last)
    write = (onednn_writer(ctx, ins) if onednn else None) or resize_writer(ins, ctx.device)
    env = ctx.env

    def step() -> None:
        write(env[x], out)

    ctx.emit(step, ins, idx)


@lowering("resize")
def lower_resize(ctx: LoweringContext, ins: Instruction) -> bool:
    if not resizable(ins):
        return False
    user = concat_reader(ins)
    # an upsample feeding a concat (YOLO's neck) may write its window of the concat's output
    # directly (`concat_with_repeat`)
    if user is not None and defer(ctx, ins, user, concat_with_repeat):
        return True
    lower_resize_alone(ctx, ins)
    return True


def concat_reader(ins: Instruction) -> Instruction | None:
    """The concat an upsample `ins` may be deferred into (`lower_resize`: the concat's step
    then reads the upsample's input while it writes its own result), else None: part of the
    cpu target's `fused_reads`, so that the memory plan keeps the two apart."""
    if ins.op.name != "resize" or len(ins.outputs) != 1:
        return None
    user = ins.outputs[0]
    if user.op.name == "concat" and resizable(ins) and repeat_factors(ins) is not None:
        return user
    return None


def concat_with_repeat(ctx: LoweringContext, concat: Instruction) -> bool:
    """Lower `concat` with its deferred upsample input (`lower_resize`): one step repeats the
    upsample's input straight into its window of the concat's output and copies the other
    inputs into theirs, so the upsampled tensor is never written on its own (YOLOv8's neck:
    0.2-0.4 ms a concat on one core). The separate steps are kept for profiling."""
    resize = deferred_producer(ctx, concat)
    if not ctx.apart(resize.inputs[0], concat):  # the plan gave the concat the input's memory
        lower_resize_alone(ctx, resize)
        return False
    saved, ctx.steps = ctx.steps, []
    lower_resize_alone(ctx, resize)
    if not lower_concat(ctx, concat):  # the concat falls back to numpy: the resize runs alone
        ctx.steps = saved + ctx.steps
        return False
    unfused, ctx.steps = ctx.steps, saved
    idx = ctx.index[id(concat)]
    factors = repeat_factors(resize)
    assert factors is not None  # (checked before deferring)
    write = repeat_writer(factors)
    windows = concat_windows(ctx.env[idx], concat)
    repeats = [w for w, i in zip(windows, concat.inputs, strict=True) if i is resize]
    copies = [
        (w, a) for w, a, i in zip(windows, ctx.args(concat), concat.inputs, strict=True)
        if i is not resize
    ]  # fmt: skip
    x = ctx.arg(resize, 0)
    env = ctx.env

    def step() -> None:
        for window in repeats:
            write(env[x], window)
        for window, a in copies:
            window.copy_(env[a])

    ctx.emit(step, [resize, concat], idx, unfused)
    return True
