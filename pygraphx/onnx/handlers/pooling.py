"""Handlers of ONNX pooling: MaxPool, AveragePool, LpPool, their Global forms, and MaxUnpool.

All become one IR `pooling` (mode max / average / lpnorm) with explicit padding; `auto_pad` is
resolved from the static input shape. Attributes that later opsets added (count_include_pad in
7, ceil_mode in 10, dilations in 10 / 19 / 18, storage_order in 8) default to the older
behaviour, so one handler serves every version. Global pooling uses the whole spatial extent as
the window, as MIGraphX's parser does for static shapes. MaxPool's optional `Indices` output is
a second IR op, `pooling_indices`.
"""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction
from pygraphx.onnx.context import NodeContext
from pygraphx.onnx.handlers.conv import auto_pads, spatial_attr, spatial_rank
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops.pooling import MaxUnpool, Pooling, PoolingIndices
from pygraphx.ops.spatial import dilated

Args = list[Instruction | None]


def _window(ctx: NodeContext, x: Instruction) -> dict[str, object]:
    """The window attributes shared by every non-global pooling op."""
    nd = spatial_rank(ctx, x)
    kernel = tuple(ctx.attr("kernel_shape"))
    if len(kernel) != nd:
        raise ctx.error(f"kernel_shape {list(kernel)} needs {nd} values (one per spatial dim)")
    strides = spatial_attr(ctx, "strides", nd, 1)
    dilations = spatial_attr(ctx, "dilations", nd, 1)
    spans = [dilated(k, d) for k, d in zip(kernel, dilations, strict=True)]
    pads = auto_pads(ctx, x.shape.lens()[2:], spans, strides)
    return {
        "padding": pads,
        "stride": strides,
        "lengths": kernel,
        "dilations": dilations,
        "ceil_mode": bool(ctx.attr("ceil_mode", 0)),
    }


@onnx_op("MaxPool")
def parse_max_pool(ctx: NodeContext, args: Args) -> list[Instruction]:
    x = args[0]
    window = _window(ctx, x)
    outs = [ctx.add(Pooling(mode="max", **window), x)]
    if ctx.num_outputs > 1:
        order = ctx.attr("storage_order", 0)
        outs.append(ctx.add(PoolingIndices(storage_order=order, **window), x))
    return outs


@onnx_op("AveragePool")
def parse_average_pool(ctx: NodeContext, args: Args) -> Instruction:
    x = args[0]
    include = bool(ctx.attr("count_include_pad", 0))
    return ctx.add(Pooling(mode="average", count_include_pad=include, **_window(ctx, x)), x)


def _lp_order(ctx: NodeContext) -> int:
    p = ctx.attr("p", 2)  # a float before opset 2
    if p != int(p) or p < 1:
        raise ctx.error(f"p={p}: only positive integer orders are supported")
    return int(p)


@onnx_op("LpPool")
def parse_lp_pool(ctx: NodeContext, args: Args) -> Instruction:
    x = args[0]
    return ctx.add(Pooling(mode="lpnorm", lp_order=_lp_order(ctx), **_window(ctx, x)), x)


def _global(mode: str):
    def handler(ctx: NodeContext, args: Args) -> Instruction:
        x = args[0]
        nd = spatial_rank(ctx, x)
        lp = _lp_order(ctx) if mode == "lpnorm" else 2
        op = Pooling(
            mode=mode,
            padding=(0,) * (2 * nd),
            stride=(1,) * nd,
            lengths=tuple(x.shape.lens()[2:]),
            dilations=(1,) * nd,
            lp_order=lp,
        )
        return ctx.add(op, x)

    return handler


for _onnx, _mode in {
    "GlobalAveragePool": "average",
    "GlobalMaxPool": "max",
    "GlobalLpPool": "lpnorm",
}.items():
    onnx_op(_onnx)(_global(_mode))


@onnx_op("MaxUnpool", since=9)
def parse_max_unpool(ctx: NodeContext, args: Args) -> Instruction:
    x, indices = args[0], args[1]
    out_shape = args[2] if len(args) > 2 else None
    if out_shape is not None:
        lens = [int(v) for v in ctx.require_const(out_shape, "output_shape")]
    else:
        # the inverse of the pooling's output size, as the spec defines it
        nd = spatial_rank(ctx, x)
        kernel = tuple(ctx.attr("kernel_shape"))
        strides = spatial_attr(ctx, "strides", nd, 1)
        pads = tuple(ctx.attr("pads", (0,) * (2 * nd)))
        if len(kernel) != nd or len(pads) != 2 * nd:
            raise ctx.error(f"kernel_shape {list(kernel)} / pads {list(pads)} do not fit rank")
        spatial = [
            (n - 1) * s + k - pads[i] - pads[i + nd]
            for i, (n, s, k) in enumerate(zip(x.shape.lens()[2:], strides, kernel, strict=True))
        ]
        lens = [*x.shape.lens()[:2], *spatial]
    return ctx.add(MaxUnpool(out_lens=tuple(lens)), x, indices)
