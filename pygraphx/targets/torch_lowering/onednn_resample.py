"""Linear (bilinear, trilinear) `resize` of channels-last bf16 tensors as a oneDNN resampling
primitive made once at prepare, run with only the data pointers changing.

Why: torch's bf16 channels-last bilinear kernel is about twice its float32 one (UNet-small's
two x2 upsamples at bf16: ~3 ms against OpenVINO bf16's ~1 ms, `benchmarks/results/
bf16zoo12.md`); oneDNN's jit resampling reads and writes bf16 and computes in float32.
`benchmarks/unet13_probe.py` measures it against torch's kernel and a float32 round trip.

What runs here: `resize` in linear mode of a 4-D bf16 tensor (`plan_resample` takes 5-D too;
`lower_resize` sends only 4-D ones, the case measured), batch and channels kept,
every spatial axis resized by an exact factor (output / input), with the half_pixel transform
(or pytorch_half_pixel with every output length above 1, the same there), no antialias and no
exclude_outside: oneDNN's linear resampling is exactly that (source coordinate
(o + 0.5) / f - 0.5, the two neighbours clamped to the edges, weights in float32), which is the
operator's own definition (ONNX Resize, linear, half_pixel). align_corners, asymmetric and the
other modes keep torch's kernels (`lower_resize.py`). The input is the channels-last tensor a
convolution gives; the output is written in the step's slot (channels-last).

A primitive is made for each thread count the step runs under (oneDNN fixes it when the
primitive is made), the first at prepare; where oneDNN offers only its reference kernel the
torch lowering runs it (said once on the `pygraphx.cpu` logger).
`PGX_CPU_BF16_RESIZE=torch` keeps torch's kernel (A/B measurements); `onednn` (the default)
takes this one where it applies.
"""

from __future__ import annotations

import os
from ctypes import POINTER, byref, c_float, c_int, c_void_p
from dataclasses import dataclass

import torch

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering.dtypes import torch_dtype
from pygraphx.targets.torch_lowering.gemm_kernels import cpu_has_bf16
from pygraphx.targets.torch_lowering.onednn_capi import (
    DTYPES,
    FORWARD_INFERENCE,
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
)

Tensor = torch.Tensor
#: the environment variable choosing the bf16 linear resize kernel: `onednn` (default), `torch`
KERNEL_ENV = "PGX_CPU_BF16_RESIZE"
#: the default of `KERNEL_ENV`
DEFAULT_KERNEL = "onednn"
RESAMPLING_LINEAR = 0x2FFF1  # dnnl_resampling_linear
TAG_NHWC, TAG_NDHWC = 22, 23  # dnnl_acdb, dnnl_acdeb


@dataclass(frozen=True)
class ResamplePlan:
    """One linear resampling: NC(D)HW lens of input and output, and the dtype."""

    x_lens: tuple[int, ...]
    out_lens: tuple[int, ...]
    dtype: torch.dtype


def kernel_choice() -> str:
    """`PGX_CPU_BF16_RESIZE`: `onednn` or `torch`."""
    raw = os.environ.get(KERNEL_ENV, DEFAULT_KERNEL).strip().lower()
    if raw not in ("onednn", "torch"):
        raise ValueError(f"{KERNEL_ENV}={raw!r}: expected 'onednn' or 'torch'")
    return raw


def plan_resample(ins: Instruction) -> ResamplePlan | None:
    """The oneDNN resampling computing `ins` (a `resize`) exactly, or None (module docstring)."""
    op = ins.op
    x_lens, out_lens = list(ins.inputs[0].shape.lens()), list(ins.shape.lens())
    dt = torch_dtype(ins.shape.dtype())
    if len(ins.inputs) != 1 or len(x_lens) not in (4, 5) or dt != torch.bfloat16:
        return None
    if op.mode != "linear" or op.antialias or op.exclude_outside or not cpu_has_bf16():
        return None
    ctm = op.coordinate_transformation_mode
    if ctm not in ("half_pixel", "pytorch_half_pixel"):
        return None
    if ctm == "pytorch_half_pixel" and any(n == 1 for n in out_lens[2:]):
        return None
    if list(op.sizes) != out_lens or out_lens[:2] != x_lens[:2]:
        return None
    if any(float(f) != 1.0 for f in op.scales[:2]):
        return None
    spatial = zip(x_lens[2:], out_lens[2:], op.scales[2:], strict=True)
    if any(n_in == 0 or float(f) != n_out / n_in for n_in, n_out, f in spatial):
        return None
    return ResamplePlan(tuple(x_lens), tuple(out_lens), dt)


def _declare(lib: object) -> None:
    fn = lib.dnnl_resampling_forward_primitive_desc_create
    fn.restype = c_int
    fn.argtypes = [POINTER(c_void_p), c_void_p, c_int, c_int, POINTER(c_float), c_void_p,
                   c_void_p, c_void_p]  # fmt: skip


class Primitive(SourceToDest):
    """One resampling primitive of `plan` on channels-last tensors (its oneDNN objects are
    destroyed with it). `OneDnnError` where oneDNN offers only its reference kernel."""

    what = "resampling"

    def __init__(self, rt: Runtime, plan: ResamplePlan) -> None:
        self.start(rt)
        lib = rt.lib
        _declare(lib)
        dt = DTYPES[plan.dtype]
        tag = TAG_NHWC if len(plan.x_lens) == 4 else TAG_NDHWC
        mds = [rt.desc(list(plan.x_lens), dt, tag), rt.desc(list(plan.out_lens), dt, tag)]
        factors = [o / i for i, o in zip(plan.x_lens[2:], plan.out_lens[2:], strict=True)]
        try:
            with scratchpad_attr(lib) as attr:
                status = lib.dnnl_resampling_forward_primitive_desc_create(
                    byref(self.pd), rt.engine, FORWARD_INFERENCE, RESAMPLING_LINEAR,
                    (c_float * len(factors))(*factors), mds[0], mds[1], attr,
                )  # fmt: skip
            check(status, f"resampling_forward_primitive_desc_create {list(plan.x_lens)}")
            self.bind(f"resampling {list(plan.x_lens)} {plan.dtype}", mds[0], mds[1])
        finally:
            release(lib, [], None, None, mds)


class Resample(PerThreadCount):
    """`plan` run on channels-last tensors through a primitive per thread count (the one of
    now made at once: `OneDnnError` when oneDNN cannot run it well)."""

    def __init__(self, rt: Runtime, plan: ResamplePlan) -> None:
        self.rt, self.plan = rt, plan
        super().__init__(lambda: Primitive(rt, plan))


__all__ = ["KERNEL_ENV", "Resample", "ResamplePlan", "kernel_choice", "plan_resample", "runtime"]
