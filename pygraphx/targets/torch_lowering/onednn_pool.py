"""2-D max / average pooling of channels-last float32 or bf16 tensors as a oneDNN pooling
primitive made once at prepare, run with only the data pointers changing.

Why: in a CNN's run the pooling steps come after the convolutions, which run oneDNN through
its C API (`onednn_conv.py`) and never enter torch's dispatcher; the first torch op after
them finds torch's dispatcher and kernel code evicted from the caches by the weights streamed
through and pays 60-130 us whatever it is (MobileNetV2's global average pool: 115-135 us of
thread CPU in a run on the 2-core EPYC, 7-13 us when called again right away). oneDNN's code
is warm there. `benchmarks/pooldnnl_ab.py` measures the steps in runs, A/B.

What runs here (everything else keeps the torch lowering of `lower_nn.py`, unchanged):

* global pooling, and a window covering the whole unpadded input: a pooling of that kernel;
* windowed pooling whose geometry oneDNN expresses exactly: max pooling (padding never wins;
  dilation as oneDNN's gaps), average pooling without dilation, excluding the padding from
  the divisor (`pooling_avg_exclude_padding`) or, `count_include_pad`, including it
  (`pooling_avg_include_padding`) when no window reaches ceil_mode's overhang (oneDNN would
  count it, the IR does not). ceil_mode's overhang is end padding for oneDNN (exact: padding
  takes no part in a max or an excluding average); asymmetric padding is oneDNN's own. A
  window lying wholly in padding is declined (its value would differ).

bf16 poolings run here only on a CPU with bf16 instructions (`cpu_has_bf16`, as the bf16
convolutions). The input is the channels-last tensor a convolution gives (`nhwc`); the output
is written in the step's arena slot, or a new tensor per call where it has none. A primitive
is made for each thread count the step runs under (oneDNN fixes it when the primitive is
made), the first at prepare; where oneDNN offers only its reference kernel for a pooling
(dilated max pooling in oneDNN 3.2, ...) the torch lowering runs it, said once on the
`pygraphx.cpu` logger.
`PGX_CPU_POOL=torch` keeps torch's kernels for every pooling (A/B measurements).

Numbers: the same as torch's for finite inputs (averages accumulate in float32 and a bf16
result is rounded once). One difference: a NaN in a max pool's window is not always
propagated (oneDNN's kernel compares as ONNX Runtime's MLAS one does: a NaN wins only where it
comes last), where torch's kernel and the `ref` target give NaN.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from ctypes import byref
from dataclasses import dataclass

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering.context import CHANNELS_LAST, STANDARD, LoweringContext
from pygraphx.targets.torch_lowering.dtypes import torch_dtype
from pygraphx.targets.torch_lowering.gemm_kernels import cpu_has_bf16
from pygraphx.targets.torch_lowering.onednn_capi import (
    DTYPES,
    FORWARD_INFERENCE,
    POOLING_AVG_EXCLUDE,
    POOLING_AVG_INCLUDE,
    POOLING_MAX,
    TAG_NHWC,
    Dims,
    OneDnnError,
    Runtime,
    check,
    release,
    runtime,
)
from pygraphx.targets.torch_lowering.onednn_step import (
    PerThreadCount,
    SourceToDest,
    scratchpad_attr,
    warn_once,
)

Tensor = torch.Tensor
#: the environment variable choosing the kernel: `onednn` (the default) or `torch`
KERNEL_ENV = "PGX_CPU_POOL"


@dataclass(frozen=True)
class PoolPlan:
    """One pooling in oneDNN's terms: algorithm, NCHW lens of input and output, and the
    spatial kernel, strides, dilation (oneDNN's gaps: 0 is dense) and paddings."""

    algorithm: int
    x_lens: tuple[int, ...]
    out_lens: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    pad_l: tuple[int, ...]
    pad_r: tuple[int, ...]
    dtype: torch.dtype


def plan_pooling(ins: Instruction) -> PoolPlan | None:
    """The oneDNN pooling computing `ins` (a `pooling` of a 4-D float32 / bf16 input) exactly,
    or None where oneDNN's semantics would differ or it is not a max / average pooling."""
    op = ins.op
    x_lens, out_lens = ins.inputs[0].shape.lens(), ins.shape.lens()
    dt = torch_dtype(ins.inputs[0].shape.dtype())
    if len(x_lens) != 4 or dt not in DTYPES or op.mode not in ("max", "average"):
        return None
    if dt == torch.bfloat16 and not cpu_has_bf16():
        return None  # oneDNN's bf16 pooling measured only on a CPU with bf16 instructions
    full = op.global_ or (
        list(op.lengths) == x_lens[2:] and not any(op.padding) and out_lens[2:] == [1, 1]
    )
    if full:
        alg = POOLING_MAX if op.mode == "max" else POOLING_AVG_EXCLUDE
        zero = (0, 0)
        return PoolPlan(alg, tuple(x_lens), tuple(out_lens), tuple(x_lens[2:]), (1, 1), zero,
                        zero, zero, dt)  # fmt: skip
    dil = list(op.dilations)
    if op.mode == "average" and any(d != 1 for d in dil):
        return None
    begin, end, out = op.geometry(x_lens)
    if out != out_lens[2:]:
        return None
    spans = [(k - 1) * d + 1 for k, d in zip(op.lengths, dil, strict=True)]
    # the end padding oneDNN needs for this output size: ceil_mode's overhang included
    pad_r = [
        max(e, (o - 1) * s + span - n - b)
        for n, b, e, o, s, span in zip(x_lens[2:], begin, end, out, op.stride, spans, strict=True)
    ]
    if any(p >= span for p, span in zip(begin + pad_r, spans + spans, strict=True)):
        return None  # a window could lie wholly in padding
    if op.mode == "max":
        alg = POOLING_MAX
    elif not op.count_include_pad:
        alg = POOLING_AVG_EXCLUDE
    elif pad_r == list(end):
        alg = POOLING_AVG_INCLUDE
    else:
        return None  # oneDNN would count ceil_mode's overhang in the divisor
    return PoolPlan(alg, tuple(x_lens), tuple(out_lens), tuple(op.lengths), tuple(op.stride),
                    tuple(d - 1 for d in dil), tuple(begin), tuple(pad_r), dt)  # fmt: skip


class Primitive(SourceToDest):
    """One pooling primitive of `plan` on channels-last tensors, with its memory objects and
    scratchpad (the oneDNN objects are destroyed with it). `OneDnnError` where oneDNN offers
    only its reference kernel for it."""

    what = "pooling"

    def __init__(self, rt: Runtime, plan: PoolPlan) -> None:
        self.start(rt)
        lib = rt.lib
        dt = DTYPES[plan.dtype]
        mds = [rt.desc(list(plan.x_lens), dt, TAG_NHWC), rt.desc(list(plan.out_lens), dt, TAG_NHWC)]
        try:
            with scratchpad_attr(lib) as attr:
                status = lib.dnnl_pooling_forward_primitive_desc_create(
                    byref(self.pd), rt.engine, FORWARD_INFERENCE, plan.algorithm, mds[0],
                    mds[1], Dims(*plan.stride), Dims(*plan.kernel), Dims(*plan.dilation),
                    Dims(*plan.pad_l), Dims(*plan.pad_r), attr,
                )  # fmt: skip
            check(status, f"pooling_forward_primitive_desc_create {list(plan.x_lens)}")
            self.bind(f"pooling {list(plan.x_lens)} {plan.dtype}", mds[0], mds[1])
        finally:
            release(lib, [], None, None, mds)


class Pool(PerThreadCount):
    """`plan` run on channels-last tensors through a primitive per thread count (the one of
    now made at once: `OneDnnError` when oneDNN cannot run it well)."""

    def __init__(self, rt: Runtime, plan: PoolPlan) -> None:
        self.rt, self.plan = rt, plan
        super().__init__(lambda: Primitive(rt, plan))


def wanted(ctx: LoweringContext) -> bool:
    """On the CPU with oneDNN allowed (`mkldnn` option), `PGX_CPU_POOL` not `torch`, and
    oneDNN's C API library loaded."""
    if ctx.device.type != "cpu" or not ctx.options.get("mkldnn", True):
        return False
    if os.environ.get(KERNEL_ENV, "onednn").strip().lower() == "torch":
        return False
    return runtime() is not None


def lower_onednn_pooling(ctx: LoweringContext, ins: Instruction) -> bool:
    """Emit `ins` (a `pooling`) as a oneDNN primitive where `plan_pooling` finds one for it
    and its input is channels-last; False (nothing emitted) otherwise."""
    if not wanted(ctx):
        return False
    x = ctx.arg(ins, 0)
    plan = plan_pooling(ins)
    if plan is None or ctx.layout[x] != CHANNELS_LAST:
        return False
    rt = runtime()
    assert rt is not None  # (`wanted`)
    try:
        pool = Pool(rt, plan)
    except OneDnnError as exc:
        warn_once("pool_ref", "cpu pooling: the torch lowering instead of oneDNN (%s)", exc)
        return False
    one = all(n == 1 for n in plan.out_lens[2:])
    idx, out = ctx.output(ins, STANDARD if one else CHANNELS_LAST)
    ctx.emit(_step(ctx.env, x, idx, out, pool), ins, idx)
    if out is None:
        ctx.mark_fresh(idx)
    return True


def _step(env: list, x: int, idx: int, out: Tensor | None, pool: Pool) -> Callable[[], None]:
    """The step pooling `env[x]` into `out` (or into a new channels-last tensor stored at
    `env[idx]` when `out` is None)."""
    cl = torch.channels_last
    plan = pool.plan
    n, c, h, w = plan.out_lens
    strides, dtype, empty = (c * h * w, 1, w * c, c), plan.dtype, torch.empty_strided

    def source() -> Tensor:
        xt = env[x]
        if xt.is_contiguous(memory_format=cl) and xt.dtype == dtype:
            return xt
        warn_once("pool_copy", "cpu pooling %s: its input is not channels-last %s, copied first",
                  list(plan.x_lens), dtype)  # fmt: skip
        return xt.to(dtype).contiguous(memory_format=cl)

    if out is not None:

        def step() -> None:
            pool(source(), out)

    else:

        def step() -> None:
            y = empty(plan.out_lens, strides, dtype=dtype)
            pool(source(), y)
            env[idx] = y

    return step


__all__ = ["KERNEL_ENV", "Pool", "PoolPlan", "lower_onednn_pooling", "plan_pooling", "wanted"]
