"""The CPU kernels one 2-D float32 (or bf16) convolution can run on, each with its epilogue.

A `ConvPlan` holds a convolution's geometry and its fused epilogue (a per-channel bias, an
optional full-tensor `add` operand, then an activation: none, relu, hardtanh = clip, or swish =
silu; or, `add_after`, the activation first and the add after it). Every kernel here computes
the same value, on channels-last activations, and returns a new channels-last tensor, so a
choice between them (`conv_choice.py`) never changes the layout the program's other steps see:

* `onednn`: `mkldnn._convolution_pointwise` with the weight reordered once into oneDNN's blocked
  format; bias, add and activation are oneDNN post-ops. Every convolution can take it but
  those whose add is followed by anything but relu, comes after the activation, or meets a
  pre-padded input (torch's op fuses none of those); it is the default where `dnnl` cannot
  run (`conv_choice.default_kernel`). When the add operand is
  dead after the step (`ConvPlan.in_place`, decided by `conv_fusion`),
  `mkldnn._convolution_pointwise_` writes the result over it (oneDNN's sum
  post-op): no new output, and the residual's memory, just read, is the one written.
* `matmul`: a 1x1 convolution with stride 1, no padding and one group is a matrix product of
  the (N*H*W, C) channels-last activations with the (K, C) weight: `mkldnn._linear_pointwise`
  with the weight packed once for that row count, the activation (or the add, when there is no
  activation after it) fused as oneDNN post-ops. It pays less per call than the convolution
  primitive, and its GEMM kernel is a little faster on most of MobileNetV2's and ResNet's
  1x1 layers.
* `dnnl`: the same oneDNN convolution with the same post-ops, but through oneDNN's own C API
  (`onednn_conv.py`, the optional `onednn-cpu-gomp` package): the primitive is made once, at
  prepare, and a call only sets data pointers and executes, without ideep's per-call set-up
  (4.5 us a call instead of 29). A float32 or bf16 layer with a relu / clip / swish epilogue
  or none can take it, where that library loads (bf16: on a CPU with bf16 instructions); it
  is then the default.
* `torch_cl`: `F.conv2d` on channels-last tensors (torch picks its own algorithm per call, the
  weight is not pre-packed), the epilogue applied in place after it. Not for a bf16 layer with
  a float32 ("wide") bias (`wide_bias`): `F.conv2d` takes no float32 bias with bf16
  activations and rounds its product, so the float32-bias answer (product + bias rounded
  once, as the oneDNN kernels give it) would need the product in float32, 1.4-2.8x slower
  than its bf16 form (`benchmarks/results/hyg15.md`); such a layer takes the default instead.
* `winograd`, `winograd2`: a float32 3x3 stride-1 one-group convolution as Winograd F(4x4,
  3x3) or F(2x2, 3x3) (`winograd.py`): the weight transformed once, (m+2)^2 batched GEMMs per
  call between memory-pass transforms, the whole epilogue fused into the output transform.
  A bf16 layer can take `winograd` only, on the native kernel (`winograd.supports_bf16`).

Plain NCHW `F.conv2d` is not a candidate: measured on MobileNetV2's layers (2-core x86,
1 thread) it was 1.3x-10x slower than `onednn` on every layer and would add layout conversions
around it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from pygraphx.targets.torch_lowering import onednn_conv, winograd

Tensor = torch.Tensor
Getter = Callable[[], Tensor]

#: the kernels (`conv_choice.default_kernel` says which is the default)
KERNELS = ("onednn", "matmul", "dnnl", "torch_cl", *winograd.KERNEL_TILES)
#: the kernels that write a given channels-last output buffer (`build_kernel`'s `out`, such as
#: the result's arena slot) instead of returning a new tensor to be copied there
WRITES_OUT = ("dnnl", *winograd.KERNEL_TILES)


@dataclass
class ConvPlan:
    """A 2-D convolution ready for the CPU kernels: weight, geometry, bias, and post-ops.

    `weight` is the plain (K, C/groups, kh, kw) float32 weight; `packed` the onednn kernel's
    reordered copy, or a function making it (`conv_steps.conv_plan`'s, shared through the
    lowering context, so that a layer on another kernel never packs it): see `packed_weight`.
    """

    weight: Tensor
    packed: Tensor | Getter
    x_lens: list[int]  # the input's lens after `pre_pad`
    padding: list[int]
    stride: list[int]
    dilation: list[int]
    groups: int
    pre_pad: list[int] | None
    bias: Tensor | None = None
    unary: str = "none"
    scalars: list[float] = field(default_factory=list)
    other: int | None = None  # env index of the binary add operand
    kernel: str = "onednn"
    linear_packed: Tensor | None = None  # the matmul kernel's packed weight, made once
    in_place: bool = False  # onednn: write the result over the add operand (it is dead after)
    add_after: bool = False  # act(conv + bias) + other: the add operand after the activation
    impl: str | None = None  # dnnl: the oneDNN implementation to run (None: oneDNN's first)
    accumulate: bool = False  # dnnl: add into the output's values (a concat's sum chain)
    dw: ConvPlan | None = None  # dnnl: a depthwise 3x3 convolution run on this 1x1 one's result
    # inside the same primitive (oneDNN's dw post-op, `conv_dw_fusion.py`); the output is its
    # output, the 1x1 one's never written


def is_pointwise(plan: ConvPlan) -> bool:
    """A 1x1 convolution with stride 1, no padding, one group: a matrix product."""
    return (
        plan.weight.shape[2:] == (1, 1)
        and plan.groups == 1
        and plan.pre_pad is None
        and not any(plan.padding)
        and all(s == 1 for s in plan.stride)
    )


def packed_weight(plan: ConvPlan) -> Tensor:
    """The onednn kernel's packed weight, made now if `plan` holds the function making it."""
    if callable(plan.packed):
        plan.packed = plan.packed()
    return plan.packed


def kernels_for(plan: ConvPlan) -> list[str]:
    """The kernels that can run `plan` with its whole epilogue (`conv_choice.default_kernel`
    says which is the default)."""
    if plan.accumulate:  # oneDNN's sum post-op into the output's values: `dnnl` only
        return ["dnnl"] if onednn_conv.supports(plan) and onednn_conv.available() else []
    # torch's mkldnn convolution fuses an add followed by relu or nothing, not one after the
    # activation, and not with a pre-padded input
    names = []
    if plan.other is None or (
        not plan.add_after and plan.unary in ("none", "relu") and plan.pre_pad is None
    ):
        names.append("onednn")
    # oneDNN's matmul fuses a binary add or an activation, not an add followed by one
    if is_pointwise(plan) and (plan.other is None or plan.unary == "none"):
        names.append("matmul")
    if onednn_conv.supports(plan) and onednn_conv.available():
        names.append("dnnl")
    if not wide_bias(plan):
        names.append("torch_cl")
    if winograd.supports(plan):
        names += list(winograd.KERNEL_TILES)
    elif winograd.supports_bf16(plan):  # F(4,3) on bf16 activations: the native kernel only
        names.append("winograd")
    return names


def wide_bias(plan: ConvPlan) -> bool:
    """A bf16 layer whose bias is float32 (kept unrounded, `conv_epilogue_match.wide_bias`):
    the oneDNN kernels add it to the float32 product before the one rounding."""
    return (
        plan.weight.dtype == torch.bfloat16
        and plan.bias is not None
        and plan.bias.dtype == torch.float32
    )


def fuses_epilogue(plan: ConvPlan) -> bool:
    """Whether a oneDNN kernel (`onednn` or `dnnl`) runs `plan` with its whole epilogue."""
    return any(name in ("onednn", "dnnl") for name in kernels_for(plan))


def build_kernel(
    plan: ConvPlan,
    kernel: str,
    get_x: Getter,
    get_other: Getter | None,
    out: Tensor | None = None,
    scratch: winograd.Scratch | None = None,
) -> Callable[[], Tensor]:
    """A closure running `plan` on `get_x()` (and the add operand `get_other()`) with `kernel`;
    it returns a new channels-last tensor (a kernel of `WRITES_OUT` given `out`: `out`, written
    every call). `scratch`: the program's Winograd temporaries (`winograd.program_scratch`;
    without one a Winograd kernel makes its own)."""
    if kernel == "matmul":
        return _matmul(plan, get_x, get_other)
    if kernel == "torch_cl":
        return _torch_cl(plan, get_x, get_other)
    if kernel == "dnnl":
        return onednn_conv.build(plan, get_x, get_other, out)
    if kernel in winograd.KERNEL_TILES:
        m = winograd.KERNEL_TILES[kernel]
        return winograd.build(plan, get_x, get_other, m, out, scratch)
    if kernel != "onednn":
        raise ValueError(f"unknown convolution kernel {kernel!r}; one of {', '.join(KERNELS)}")
    return _onednn(plan, get_x, get_other)


def lazy_kernel(
    plan: ConvPlan,
    kernel: str,
    get_x: Getter,
    get_other: Getter | None,
    scratch: winograd.Scratch | None = None,
) -> Callable[[], Tensor]:
    """`build_kernel`'s closure, made at the first call (a kernel that may never run, such as
    a fused step's unfused twin for profiling, packs no weight until it does)."""
    made: list[Callable[[], Tensor]] = []

    def run() -> Tensor:
        if not made:
            made.append(build_kernel(plan, kernel, get_x, get_other, scratch=scratch))
        return made[0]()

    return run


def _channels_last_input(plan: ConvPlan, get_x: Getter) -> Getter:
    cl, pre_pad = torch.channels_last, plan.pre_pad
    if pre_pad is None:
        return lambda: get_x().contiguous(memory_format=cl)
    return lambda: F.pad(get_x().contiguous(memory_format=cl), pre_pad)


def _onednn(plan: ConvPlan, get_x: Getter, get_other: Getter | None) -> Callable[[], Tensor]:
    conv = torch.ops.mkldnn._convolution_pointwise
    binary = torch.ops.mkldnn._convolution_pointwise.binary
    w, b, p, s, d, g = (
        packed_weight(plan),
        plan.bias,
        plan.padding,
        plan.stride,
        plan.dilation,
        plan.groups,
    )
    unary, scalars, cl = plan.unary, plan.scalars, torch.channels_last
    x_in = _channels_last_input(plan, get_x)
    if get_other is not None:
        post = None if unary == "none" else unary
        if plan.in_place:  # oneDNN's sum post-op: the result lands in the operand's memory
            over = torch.ops.mkldnn._convolution_pointwise_.binary

            def run_in_place() -> Tensor:
                other = get_other().contiguous(memory_format=cl)
                return over(other, x_in(), w, b, p, s, d, g, "add", None, post, [], "")

            return run_in_place

        def run_binary() -> Tensor:
            other = get_other().contiguous(memory_format=cl)
            return binary(x_in(), other, w, b, p, s, d, g, "add", None, post, [], "")

        return run_binary

    def run() -> Tensor:
        return conv(x_in(), w, b, p, s, d, g, unary, scalars, "")

    return run


def _matmul(plan: ConvPlan, get_x: Getter, get_other: Getter | None) -> Callable[[], Tensor]:
    n, c, h, w_ = plan.x_lens
    k = plan.weight.shape[0]
    rows = n * h * w_
    if plan.linear_packed is None:  # made once: measuring and the chosen kernel share it
        weight = plan.weight.reshape(k, c).contiguous()
        plan.linear_packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
    packed = plan.linear_packed
    linear = torch.ops.mkldnn._linear_pointwise
    binary = torch.ops.mkldnn._linear_pointwise.binary
    b, unary, scalars, cl = plan.bias, plan.unary, plan.scalars, torch.channels_last

    def rows_of(t: Tensor, channels: int) -> Tensor:
        return t.contiguous(memory_format=cl).permute(0, 2, 3, 1).reshape(rows, channels)

    def image(y: Tensor) -> Tensor:
        return y.view(n, h, w_, k).permute(0, 3, 1, 2)

    if get_other is not None:

        def run_binary() -> Tensor:
            return image(binary(rows_of(get_x(), c), rows_of(get_other(), k), packed, b, "add"))

        return run_binary

    def run() -> Tensor:
        return image(linear(rows_of(get_x(), c), packed, b, unary, scalars, ""))

    return run


def _torch_cl(plan: ConvPlan, get_x: Getter, get_other: Getter | None) -> Callable[[], Tensor]:
    if wide_bias(plan):  # (`kernels_for` leaves it out: the bias would be rounded)
        raise ValueError(
            "torch_cl: a bf16 convolution with a float32 bias (F.conv2d would round it); "
            f"run it on one of {kernels_for(plan)}"
        )
    cl = torch.channels_last
    w = plan.weight.contiguous(memory_format=cl)
    b, p, s, d, g = plan.bias, plan.padding, plan.stride, plan.dilation, plan.groups
    unary, scalars = plan.unary, list(plan.scalars)
    x_in = _channels_last_input(plan, get_x)

    add_first = get_other is not None and not plan.add_after

    def run() -> Tensor:
        y = F.conv2d(x_in(), w, b, s, p, d, g)
        if add_first:
            y.add_(get_other())
        winograd.activate_(y, unary, scalars)
        if get_other is not None and not add_first:
            y.add_(get_other())
        return y

    return run


__all__ = [
    "KERNELS",
    "WRITES_OUT",
    "ConvPlan",
    "build_kernel",
    "fuses_epilogue",
    "is_pointwise",
    "kernels_for",
    "lazy_kernel",
    "packed_weight",
    "wide_bias",
]
