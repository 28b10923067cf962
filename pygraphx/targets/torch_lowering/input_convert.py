"""A float32 NCHW value converted to bf16 for convolutions only: one oneDNN reorder that
converts and goes channels-last at once.

`quantize_bf16` puts a `convert` (float32 -> bf16) between a CNN's float32 image and its first
convolution. Lowered as any element-wise group, that is a torch step writing a bf16 NCHW
tensor, which the convolution's oneDNN call then reorders to channels-last (`onednn_conv`'s
`source`: a second pass over the image). Here a convert whose users are all convolutions
becomes one oneDNN reorder primitive (made at prepare; the image read once, float32 NCHW ->
bf16 NHWC written into the convert's arena slot, which the convolutions read as it is, a
channels-last tensor; a channels-last float32 source, a value computed in the network, gets
its own NHWC -> NHWC conversion, made at its first call). MobileNetV2 b1 on the 2-core EPYC,
2 threads, `--bf16`: the convert step took 90 us (minimum over runs) before its convolution's
own reorder; now 33 us, and the run 3-6 % less (`benchmarks/results/mnv12.md`).

Numbers: oneDNN rounds to nearest even, as torch's conversion does. One difference from the
IR's clamping `convert`: a finite float32 beyond bf16's largest finite value (above
3.3961e38, where rounding goes past it) becomes an infinity here, where `convert` (and the
`ref` target) clamp it to bf16's largest finite value; NaN and the infinities stay.

Switch: `PGX_CPU_INPUT_CONVERT=torch` (or `INPUT_CONVERT = False`) keeps the torch step.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering.context import CHANNELS_LAST, LoweringContext
from pygraphx.targets.torch_lowering.onednn_capi import (
    DTYPES,
    TAG_NCHW,
    TAG_NHWC,
    Reorder,
    runtime,
)

#: module switch (A/B): False keeps the element-wise torch step
INPUT_CONVERT = True
ENV = "PGX_CPU_INPUT_CONVERT"

_CONVS = frozenset({"convolution"})


def wanted() -> bool:
    return INPUT_CONVERT and os.environ.get(ENV, "onednn").strip().lower() != "torch"


def lone_convert(ins: Instruction) -> bool:
    """Whether `ins` is a `convert` to bf16, alone or as the only op of a pointwise group."""
    if ins.op.name == "convert":
        op = ins.op
    elif ins.op.name == "pointwise" and ins.module_inputs:
        body = [
            i
            for i in ins.module_inputs[0].instructions
            if not (i.is_param() or i.is_literal() or i.op.name.startswith("@"))
        ]
        if len(body) != 1 or body[0].op.name != "convert":
            return False
        op = body[0].op
    else:
        return False
    return getattr(op, "target_type", None) == "bf16_type"


def matches(ctx: LoweringContext, ins: Instruction) -> bool:
    """Whether `ins` converts a float32 4-D value to bf16 for convolutions only, and runs here."""
    if not wanted() or ctx.device.type != "cpu" or len(ins.inputs) != 1:
        return False
    x = ins.inputs[0]
    if x.shape.type() != "float_type" or x.shape.ndim() != 4 or ins.shape.ndim() != 4:
        return False
    if not ins.outputs or any(u.op.name not in _CONVS for u in ins.outputs):
        return False
    if not ctx.has_slot(ins) or runtime() is None:
        return False
    return lone_convert(ins)


def lower_input_convert(ctx: LoweringContext, ins: Instruction) -> bool:
    """Emit `ins` (see `matches`) as one oneDNN reorder into its channels-last arena slot;
    False (nothing emitted) when it does not match."""
    if not matches(ctx, ins):
        return False
    lens = [int(n) for n in ins.shape.lens()]
    reorders = _Reorders(lens)
    reorders.get(TAG_NCHW)  # (made now: a failure shows at compile, not in a run)
    x = ctx.arg(ins, 0)
    idx, out = ctx.output(ins, CHANNELS_LAST)
    assert out is not None and out.is_contiguous(memory_format=torch.channels_last)
    ctx.emit(_step(ctx.env, x, out, reorders), ins, idx)
    ctx.cache["input_convert"] = ctx.cache.get("input_convert", 0) + 1
    return True


class _Reorders:
    """float32 -> bf16 NHWC reorders of one shape, one per source layout (NCHW made at
    lowering; NHWC, a channels-last float32 value, at its first call)."""

    def __init__(self, lens: list[int]) -> None:
        self.lens = lens
        self.made: dict[int, Reorder] = {}

    def get(self, tag: int) -> Reorder:
        r = self.made.get(tag)
        if r is None:
            rt = runtime()
            assert rt is not None
            src_md = rt.desc(self.lens, DTYPES[torch.float32], tag)
            dst_md = rt.desc(self.lens, DTYPES[torch.bfloat16], TAG_NHWC)
            try:
                r = self.made[tag] = Reorder(rt, src_md, dst_md)
            finally:  # (the primitive and its memories keep their own copies)
                rt.lib.dnnl_memory_desc_destroy(src_md)
                rt.lib.dnnl_memory_desc_destroy(dst_md)
        return r


def _step(env: list, x: int, out: torch.Tensor, reorders: _Reorders) -> Callable[[], None]:
    dst, cl = out.data_ptr(), torch.channels_last
    nchw = reorders.get(TAG_NCHW).run

    def step() -> None:
        t = env[x]
        if t.is_contiguous():  # the network's input as given
            nchw(t.data_ptr(), dst)
        elif t.is_contiguous(memory_format=cl):  # a float32 value computed channels-last
            reorders.get(TAG_NHWC).run(t.data_ptr(), dst)
        else:
            dense = t.contiguous()  # (held until the reorder has read it)
            nchw(dense.data_ptr(), dst)

    step.reorders = reorders  # type: ignore[attr-defined]  # (kept alive with the step)
    return step


__all__ = [
    "ENV",
    "INPUT_CONVERT",
    "TAG_NCHW",
    "TAG_NHWC",
    "lone_convert",
    "lower_input_convert",
    "matches",
    "wanted",
]
