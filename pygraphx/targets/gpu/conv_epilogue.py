"""fp16 / bf16 / fp32 convolutions with their bias, residual add and ReLU fused (gpu target).

A float convolution on the library path (`lowering.library_geometry`) whose only user is a
`pointwise` group of the form

    [relu](conv + c1 + c2 + ... [+ other])

(each `c` a constant that varies along the channels only, a folded BatchNorm's bias; `other`
one full tensor of the group's shape: a ResNet block's residual, or a downsample block's
shortcut convolution, whose bias is then summed into this one's) is deferred into that group
(`registry.defer`) and both run as one step, in one of two forms:

* `cudnn`: cuDNN's fused convolution + bias (+ z) + ReLU, `torch.cudnn_convolution_relu` /
  `torch.cudnn_convolution_add_relu` (what torch's frozen-graph optimisation uses): no pass
  over memory of its own. CUDA only (MIOpen has no such op: declined on `torch.version.hip`),
  and only for groups that end in a ReLU;
* `triton`: the library convolution (`F.conv2d`, no bias: torch adds a bias in a separate
  kernel) then one in-place Triton pass `y = [relu](y + bias [+ other])` over its result (the
  work the separate group did, with the constants summed into one vector at prepare).

`PGX_GPU_CONV_EPILOGUE` picks: `auto` (default: on CUDA, where `cudnn` applies, each layer
shape times both forms once at prepare on random data, each captured in a CUDA graph, and keeps
the faster, cached per process, `choices()` lists them; where it does not apply, on ROCm or for
a group without a ReLU, the convolution and its group stay apart: the `triton` form gained
nothing there, MobileNetV2 fp16 b32 0.856 against 0.850 ms on the H100), `cudnn` (where it
applies, else apart), `triton` (every such group), or `off` (the convolution and its group as
separate steps, as before). On the CPU (`device="cpu"`,
tests) only an explicit `triton` fuses (under Triton's interpreter). The fused step is timed
under the group when profiling (the convolution shows no time of its own). A group whose
result is quantised, or that has an arena slot (Triton off), or whose residual is in another
layout than the convolution's, keeps its separate steps.

Measured on an H100 (`benchmarks/fuse16_probe.py`, `benchmarks/results/h100_fuse16_probe.txt`):
on ResNet-50's 20 layer shapes at batch 32 (fp16, channels-last, each form captured in a CUDA
graph) cuDNN's fused op took 0.447 ms summed against 0.564 for the convolution plus one pass
and 0.380 for the bare convolutions, the fastest form on every shape; F.conv2d with its bias
then torch's in-place add / ReLU took 0.964 ms. ResNet-50 b32 fp16: 1.443 -> 1.156 ms per run
(device time of the steps 1.724 -> 1.307 ms), relative RMS error against ORT float32 3.6e-3
either way; float32 (NCHW, no TF32) 10.20 -> 9.65 ms.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.settings import env_choice
from pygraphx.targets.torch_lowering.context import CHANNELS_LAST, LoweringContext
from pygraphx.targets.torch_lowering.conv_epilogue_match import add_leaves
from pygraphx.targets.torch_lowering.dtypes import torch_dtype
from pygraphx.targets.torch_lowering.registry import defer, deferred_producer, is_deferred

log = logging.getLogger(__name__)

EPILOGUE_ENV = "PGX_GPU_CONV_EPILOGUE"
MODES = ("auto", "cudnn", "triton", "off")
#: (device, dtype, geometry, layout, epilogue kind, tf32) -> the form `auto` measured fastest
_CHOICES: dict[tuple, str] = {}


@dataclass(frozen=True)
class Geometry:
    """A library convolution's constant weight (in its layout) and arguments."""

    weight: torch.Tensor
    stride: list[int]
    padding: list[int]
    dilation: list[int]
    groups: int
    layout: str

    def conv(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return F.conv2d(x, self.weight, bias, self.stride, self.padding, self.dilation, self.groups)


@dataclass
class Epilogue:
    """A group matched as [relu](conv + bias [+ other])."""

    bias: torch.Tensor | None  # (C,) in the convolution's type, the constants summed
    other: Instruction | None
    relu: bool


def epilogue_mode() -> str:
    """`PGX_GPU_CONV_EPILOGUE` (default `auto`); another value is an error naming it."""
    return env_choice(EPILOGUE_ENV, MODES, "auto", lower=True)


def choices() -> dict[tuple, str]:
    """The forms `auto` chose in this process, by layer key (a copy)."""
    return dict(_CHOICES)


def fusable_user(ctx: LoweringContext, conv: Instruction) -> Instruction | None:
    """The pointwise group `conv` may be deferred into, or None (module docstring; a group
    whose result is quantised keeps its own kernel, which writes the quantised tensor too)."""
    if len(conv.outputs) != 1 or epilogue_mode() == "off":
        return None
    if ctx.device.type != "cuda" and epilogue_mode() != "triton":
        return None
    user = conv.outputs[0]
    if user.op.name != "pointwise" or is_deferred(ctx, user) or id(user) in ctx.fusers:
        return None
    if user.shape.type() != conv.shape.type() or user.shape.lens() != conv.shape.lens():
        return None
    if sum(1 for i in user.inputs if i is conv) != 1:
        return None
    if any(u.op.name == "quantizelinear" for u in user.outputs):
        return None
    return user


def defer_into_group(
    ctx: LoweringContext,
    conv: Instruction,
    geometry: Geometry,
    alone: Callable[[LoweringContext, Instruction], None],
) -> bool:
    """Defer `conv` into its group when it may be fused (`fusable_user`); the group's lowering
    then emits the fused step, or `alone(ctx, conv)` and the group's own when the group is
    no such epilogue."""
    user = fusable_user(ctx, conv)
    if user is None:
        return False

    def fuse(c: LoweringContext, group: Instruction) -> bool:
        producer = deferred_producer(c, group)
        epi = match_epilogue(c, producer, group)
        if epi is None or c.has_slot(group) or not _same_layout(c, epi, geometry.layout):
            alone(c, producer)
            return False
        form = choose_form(c, producer, geometry, epi)
        if form == "off":
            alone(c, producer)
            return False
        emit_fused(c, producer, group, geometry, epi, form)
        return True

    return defer(ctx, conv, user, fuse)


def _same_layout(ctx: LoweringContext, epi: Epilogue, layout: str) -> bool:
    return epi.other is None or ctx.layout[ctx.index[id(epi.other)]] == layout


# --- matching -----------------------------------------------------------------------------


def match_epilogue(ctx: LoweringContext, conv: Instruction, user: Instruction) -> Epilogue | None:
    """`user`'s body as [relu](conv + channel constants [+ one full tensor]), else None."""
    body = user.module_inputs[0]
    outer = {id(p): x for p, x in zip(body.get_parameters(), user.inputs, strict=True)}
    node = body.get_returns()[0]
    relu = node.op.name == "relu"
    if relu:
        node = node.inputs[0]
    leaves: list[Instruction] = []
    if not add_leaves(node, leaves, root=True):
        return None
    channels = conv.shape.lens()[1]
    bias = torch.zeros(channels, dtype=torch.float32)
    found_bias, other, seen = False, None, 0
    for leaf in leaves:
        x = outer.get(id(leaf))
        if x is None:
            return None
        if x is conv:
            seen += 1
            continue
        c = _channel_vector(ctx, x, channels)
        if c is not None:
            bias, found_bias = bias + c, True
        elif other is None and not x.shape.broadcasted() and x.shape.lens() == user.shape.lens():
            other = x
        else:
            return None
    if seen != 1 or (not relu and other is None and not found_bias):
        return None
    dtype = torch_dtype(conv.shape.dtype())
    return Epilogue(bias.to(dtype).to(ctx.device) if found_bias else None, other, relu)


def _channel_vector(ctx: LoweringContext, x: Instruction, channels: int) -> torch.Tensor | None:
    """A float constant of 4 dimensions that varies along axis 1 only, as (C,) float32."""
    idx = ctx.index.get(id(x))
    t = None if idx is None else ctx.constant(idx)
    if t is None or t.dim() != 4 or not t.dtype.is_floating_point or t.shape[1] != channels:
        return None
    if any(t.stride(k) != 0 for k in (0, 2, 3) if t.shape[k] != 1):
        return None
    return t[0, :, 0, 0].float().cpu()


# --- the fused step -----------------------------------------------------------------------


def emit_fused(
    ctx: LoweringContext,
    conv: Instruction,
    user: Instruction,
    geometry: Geometry,
    epi: Epilogue,
    form: str,
) -> None:
    """Emit one step computing `user` from `conv`'s input in `form` (`cudnn` or `triton`);
    it stores the tensor it makes at the group's index (the group has no arena slot)."""
    env, x = ctx.env, ctx.index[id(conv.inputs[0])]
    z = None if epi.other is None else ctx.index[id(epi.other)]
    run = fused_function(form, geometry, epi)
    idx = ctx.bind_dynamic(user, geometry.layout)
    ctx.mark_fresh(idx)
    counts = ctx.cache.setdefault("conv_epilogue", {})
    counts[form] = counts.get(form, 0) + 1

    if z is None:

        def step() -> None:
            env[idx] = run(env[x], None)

    else:

        def step() -> None:
            env[idx] = run(env[x], env[z])

    ctx.emit(step, [conv, user], idx)


def cudnn_applies(device: torch.device, epi: Epilogue) -> bool:
    """Whether cuDNN's fused op can run the epilogue: a CUDA (not ROCm) device, a ReLU."""
    return (
        device.type == "cuda"
        and torch.version.hip is None
        and epi.relu
        and hasattr(torch, "cudnn_convolution_add_relu")
    )


def fused_function(
    form: str, geometry: Geometry, epi: Epilogue
) -> Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]:
    """(x, other) -> the group's value, in `form` (`cudnn` or `triton`)."""
    g, bias, relu = geometry, epi.bias, epi.relu
    if form == "cudnn":
        w, args = g.weight, (g.stride, g.padding, g.dilation, g.groups)
        conv_relu, conv_add_relu = torch.cudnn_convolution_relu, torch.cudnn_convolution_add_relu

        def cudnn(x: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
            if z is None:
                return conv_relu(x, w, bias, *args)
            return conv_add_relu(x, w, z, 1.0, bias, *args)

        return cudnn

    def triton_form(x: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
        y = g.conv(x)
        epilogue_in_place(y, bias, z, relu)
        return y

    return triton_form


def choose_form(ctx: LoweringContext, conv: Instruction, geometry: Geometry, epi: Epilogue) -> str:
    """`cudnn`, `triton` or `off` (apart) for this layer (module docstring: `auto` measures
    where cuDNN applies, once per key)."""
    mode = epilogue_mode()
    if mode == "triton":
        return "triton"
    if not cudnn_applies(ctx.device, epi):
        return "off"
    if mode == "cudnn":
        return "cudnn"
    x_lens = list(conv.inputs[0].shape.lens())
    key = (
        str(ctx.device), str(geometry.weight.dtype), tuple(x_lens), tuple(geometry.weight.shape),
        tuple(geometry.stride), tuple(geometry.padding), tuple(geometry.dilation),
        geometry.groups, geometry.layout, epi.other is not None, epi.bias is not None,
        torch.backends.cudnn.allow_tf32,
    )  # fmt: skip
    if key not in _CHOICES:
        _CHOICES[key] = _measure(ctx, conv, geometry, epi, x_lens)
        log.info("gpu conv epilogue: %s for %s", _CHOICES[key], key)
    return _CHOICES[key]


def _measure(
    ctx: LoweringContext, conv: Instruction, geometry: Geometry, epi: Epilogue, x_lens: list
) -> str:
    """The faster form on random data of the layer's shapes (a form that raises is out, and
    said so in the log: cuDNN has no fused kernel for some types and shapes)."""
    dtype = geometry.weight.dtype
    fmt = torch.channels_last if geometry.layout == CHANNELS_LAST else torch.contiguous_format
    x = torch.randn(x_lens, device=ctx.device, dtype=dtype).contiguous(memory_format=fmt)
    z = None
    if epi.other is not None:
        z = torch.randn(conv.shape.lens(), device=ctx.device, dtype=dtype)
        z = z.contiguous(memory_format=fmt)
    times: dict[str, float] = {}
    for form in ("cudnn", "triton"):
        run = fused_function(form, geometry, epi)
        try:
            times[form] = _time(lambda r=run: r(x, z))
        except RuntimeError as exc:
            log.warning("gpu conv epilogue: %s form unavailable for %s: %s", form, x_lens, exc)
    if not times:
        raise RuntimeError(f"no fused convolution form runs {conv.name()} ({x_lens})")
    return min(times, key=times.__getitem__)


def _time(fn: Callable[[], Any], reps: int = 10, rounds: int = 3) -> float:
    """Device ms of one call: `reps` calls captured in one CUDA graph (the program runs
    captured, so no host launch time counts), the best of `rounds` replays' means."""
    for _ in range(2):  # cuDNN plans, Triton compiles: before the capture
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    best = float("inf")
    for _ in range(rounds):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, begin.elapsed_time(end) / reps)
    return best


# --- the in-place epilogue kernel -----------------------------------------------------------

_BLOCK = 2048
_warned: set[str] = set()


@triton.jit
def _epilogue_kernel(
    y_ptr, b_ptr, z_ptr, n, C, INNER, HAS_B: tl.constexpr, HAS_Z: tl.constexpr,
    RELU: tl.constexpr, CL: tl.constexpr, WIDE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """y[i] = [relu](y[i] + b[channel of i] [+ z[i]]) in float32, over a dense tensor whose
    element i has channel i % C (`CL`, channels-last) or (i // INNER) % C (standard, INNER =
    H*W); 64-bit offsets only when `WIDE` (2**31 elements or more)."""
    pid = tl.program_id(0)
    if WIDE:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    if HAS_B:
        channel = offs % C if CL else (offs // INNER) % C
        v += tl.load(b_ptr + channel, mask=mask).to(tl.float32)
    if HAS_Z:
        v += tl.load(z_ptr + offs, mask=mask).to(tl.float32)
    if RELU:
        v = tl.maximum(v, 0.0)
    tl.store(y_ptr + offs, v.to(y_ptr.dtype.element_ty), mask=mask)


def epilogue_in_place(
    y: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None, relu: bool
) -> None:
    """`y` = [relu](y + bias (along axis 1) [+ z]) in place, one pass (`_epilogue_kernel`) when
    `y` is dense channels-last or standard and `z` has its strides; else torch's in-place ops
    (several passes: said once per process in a warning)."""
    fmt = torch.channels_last if y.is_contiguous(memory_format=torch.channels_last) else None
    dense = fmt is not None or y.is_contiguous()
    if not dense or (z is not None and z.stride() != y.stride()):
        _slow_epilogue(y, bias, z, relu)
        return
    n, c = y.numel(), y.shape[1]
    cl = fmt is not None and y.dim() == 4
    inner = 1 if cl else y[0, 0].numel()
    grid = (triton.cdiv(n, _BLOCK),)
    _epilogue_kernel[grid](
        y, y if bias is None else bias, y if z is None else z, n, c, inner,
        HAS_B=bias is not None, HAS_Z=z is not None, RELU=relu, CL=cl,
        WIDE=n + _BLOCK >= 2**31, BLOCK=_BLOCK,
    )  # fmt: skip


def _slow_epilogue(
    y: torch.Tensor, bias: torch.Tensor | None, z: torch.Tensor | None, relu: bool
) -> None:
    key = f"{tuple(y.shape)} {y.stride()} {None if z is None else z.stride()}"
    if key not in _warned:
        _warned.add(key)
        log.warning("gpu conv epilogue: strides %s not dense alike: torch's in-place ops", key)
    if bias is not None:
        y.add_(bias.view(1, -1, *([1] * (y.dim() - 2))))
    if z is not None:
        y.add_(z)
    if relu:
        y.relu_()
