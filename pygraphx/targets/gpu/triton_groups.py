"""Fused `pointwise` and `fused_reduce` groups as generated Triton kernels (`codegen/triton`).

The gpu target hands `TritonGroups.lowering(fallback)` to the torch lowering as the override of
both group ops. Each group is traced (`codegen.trace.group_trace`) with the strides its inputs
and output really have on the device (an arena slot, a channels-last convolution result, a
broadcast view), so a kernel reads views in place instead of copying them to contiguous
buffers first; a run-time input whose strides differ from the prediction gets its own kernel,
built on first sight (during warm-up, before any graph capture). Kernels are built (source
written, module imported) at compile time; identical groups share one kernel object, hence one
Triton compile and one autotune. Launch parameters are tuned at the first call, which the
executable makes during warm-up, before capturing the CUDA graph.

When a group's result has a `quantizelinear` user with one constant scale, to int8 or fp8
e4m3fn (the next product's input: after a layer norm, a GELU, a ReLU), the group's kernel
writes the quantised tensor too (`codegen.triton.kernels.QuantOutput`), and the float one only
when something else reads it: the quantise is no pass of its own over memory. Not for a
quantise whose users dequantise it again (an fp8 round trip, `quant.py` runs it as one pass).

A group the generator refuses (`UnsupportedGroup`, `NotTraceable`) runs through the torch
lowering, or where that declines (a whole-row group with an epilogue) its description through
the torch ops handler (`lower_traced`); `announce()` says so in one warning per kind of
reason, with the number of groups.

Enabled by default on CUDA/ROCm devices (`GpuTarget(triton=False)` or `PGX_GPU_TRITON=0` turns
it off); on the CPU (`device="cpu"`) only under Triton's interpreter (`TRITON_INTERPRET=1`),
else the torch eager code runs there.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from pygraphx.codegen.trace import GroupTrace, NotTraceable, TensorDesc, evaluate, group_trace
from pygraphx.ir.instruction import Instruction
from pygraphx.targets.gpu.quant_epilogue import quantising_user
from pygraphx.targets.gpu.quantise_kernels import fp8_cast
from pygraphx.targets.torch_lowering.context import CHANNELS_LAST, STANDARD, LoweringContext
from pygraphx.targets.torch_lowering.dtypes import numpy_dtype, torch_dtype
from pygraphx.targets.torch_lowering.handler import TORCH
from pygraphx.targets.torch_lowering.lower_math import group_layout, output_buffer

TRITON_ENV = "PGX_GPU_TRITON"
JOBS_ENV = "PGX_GPU_TRITON_JOBS"

Lowering = Callable[[LoweringContext, Instruction], bool]


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def triton_wanted(setting: bool | None, device: torch.device) -> bool:
    """Whether fused groups become Triton kernels on `device` (see the module docstring)."""
    if setting is None:
        setting = os.environ.get(TRITON_ENV, "1").strip() != "0"
    if not setting or importlib.util.find_spec("triton") is None:
        return False
    return device.type == "cuda" or interpreting()


def actual_desc(t: torch.Tensor) -> TensorDesc:
    """The description of a device tensor as a kernel reads it."""
    return TensorDesc(tuple(t.shape), tuple(t.stride()), numpy_dtype(t.dtype))


def _predicted_desc(ctx: LoweringContext, idx: int, desc: TensorDesc) -> TensorDesc:
    """What input slot `idx` will hold: the tensor itself when fixed at prepare time, else the
    IR's strides (channels-last ones where the slot's layout says so)."""
    t = ctx.value(idx)
    if t is not None:
        return TensorDesc(desc.lens, tuple(t.stride()), desc.dtype)
    if ctx.layout[idx] == CHANNELS_LAST and len(desc.lens) == 4 and 0 not in desc.strides:
        n, c, h, w = desc.lens
        return TensorDesc(desc.lens, (c * h * w, 1, w * c, c), desc.dtype)
    return desc


def _fits(t: torch.Tensor, d: TensorDesc) -> bool:
    return all(n == 1 or s == ds for n, s, ds in zip(d.lens, t.stride(), d.strides, strict=True))


def reason_kind(message: str, name: str) -> str:
    """A refusal's message with the group's name and its numbers taken out (groups refused for
    the same reason at other shapes count together)."""
    return re.sub(r"\d+", "N", message.removeprefix(f"{name}: "))


class TritonGroups:
    """Builds the kernels of one compile and remembers what it refused."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.kernels: dict[tuple, Any] = {}  # see `kernel`
        self.samples: dict[int, tuple[Any, list, torch.Tensor, tuple]] = {}  # a call of each
        self.lowered = 0
        self.quantised = 0  # groups whose kernel also writes their quantizelinear's result
        self.refused: Counter[str] = Counter()
        self.examples: dict[str, str] = {}

    def lowering(self, fallback: Lowering) -> Lowering:
        """The override of `pointwise` / `fused_reduce`: a kernel, else `fallback`."""

        def lower(ctx: LoweringContext, ins: Instruction) -> bool:
            return self.lower(ctx, ins) or fallback(ctx, ins) or self.lower_traced(ctx, ins)

        return lower

    def lower_traced(self, ctx: LoweringContext, ins: Instruction) -> bool:
        """A group that neither a kernel nor the torch lowering takes (a whole-row group of
        `RowFusion` with its epilogue): its description run through the torch ops handler,
        eagerly, on the device (capturable, unlike the numpy fallback)."""
        try:
            group = group_trace(ins)
        except NotTraceable:
            return False
        args, env = ctx.args(ins), ctx.env
        idx, out = output_buffer(ctx, ins, STANDARD)

        def step() -> None:
            out.copy_(evaluate(group, TORCH, [env[a] for a in args]))

        ctx.emit(step, ins, idx)
        return True

    def kernel(self, group: GroupTrace, quant: Any = None) -> Any:
        """The built kernel of `group` (with the quantised output `quant`), one per distinct
        source and tensor descriptions: the group's name (which the source names) is replaced
        by its kind, so identical groups of different layers share a kernel (and its compile
        and autotune)."""
        from pygraphx.codegen.triton.build import build_kernel, kernel_key
        from pygraphx.codegen.triton.kernels import kernel_source

        group = dataclasses.replace(group, name=group.kind)
        # the descriptions too: groups of other shapes may coalesce to the same source, but
        # a kernel object checks its arguments against the one group it was built for
        source = kernel_source(group, quant).source
        key = (kernel_key(source, self.device), *group.inputs, group.output)
        found = self.kernels.get(key)
        if found is None:
            found = build_kernel(group, self.device, quant=quant)
            self.kernels[key] = found
        return found

    def _remember(
        self, ctx: LoweringContext, args: Sequence[int], kernel: Any, out: Any, extra=()
    ) -> None:
        """Tensors like a call's (for `compile_ahead`): the fixed ones, else placeholders."""
        if id(kernel) in self.samples:
            return
        inputs = [
            ctx.value(a) if ctx.value(a) is not None else _placeholder(d, self.device)
            for a, d in zip(args, kernel.group.inputs, strict=True)
        ]
        self.samples[id(kernel)] = (kernel, inputs, out, tuple(extra))

    def compile_ahead(self, jobs: int | None = None) -> tuple[int, float]:
        """Compile every kernel's launch configurations now, on `jobs` threads (default:
        `$PGX_GPU_TRITON_JOBS`, else up to 8), so the first run does not compile them one by
        one; returns (compiles, seconds). CUDA/ROCm only (the interpreter compiles nothing)."""
        if self.device.type != "cuda" or not self.samples:
            return 0, 0.0
        jobs = jobs or int(os.environ.get(JOBS_ENV, "0") or 0) or min(8, os.cpu_count() or 1)
        start = time.perf_counter()
        device = self.device

        def compile_one(sample: tuple[Any, list, torch.Tensor, tuple]) -> int:
            kernel, inputs, out, extra = sample
            with torch.cuda.device(device):  # the current device is per thread
                return kernel.compile_ahead(inputs, out, extra)

        with ThreadPoolExecutor(jobs) as pool:
            counts = list(pool.map(compile_one, list(self.samples.values())))
        return sum(counts), time.perf_counter() - start

    def lower(self, ctx: LoweringContext, ins: Instruction) -> bool:
        from pygraphx.codegen.triton.build import UnsupportedGroup

        args = ctx.args(ins)
        layout = group_layout(ctx, ins, args) if ins.op.name == "pointwise" else STANDARD
        try:
            group = group_trace(ins)
            inputs = [_predicted_desc(ctx, a, d) for a, d in zip(args, group.inputs, strict=True)]
            group = dataclasses.replace(group, inputs=inputs)
            if layout == CHANNELS_LAST:
                group = dataclasses.replace(group, output=_channels_last(group.output))
            fused = _quantised_output(ctx, ins, self.device)
            kernel = self.kernel(group, None if fused is None else fused[1])
        except (UnsupportedGroup, NotTraceable) as exc:
            name = ins.module_inputs[0].name if ins.module_inputs else ins.op.name
            kind = reason_kind(reason_kind(str(exc), name), ins.op.name)
            self.refused[kind] += 1
            self.examples.setdefault(kind, f"{ins.op.name} {name}: {exc}")
            return False
        j = in_place_input(ins)
        in_place = j is not None and fused is None and not ctx.has_slot(ins)
        if in_place and self._may_alias(ctx, args[j], kernel, j):
            idx = ctx.bind_dynamic(ins, layout)
            ctx.mark_fresh(idx)
            self._remember(ctx, args, kernel, _placeholder(kernel.group.output, self.device))
            ctx.emit(self._in_place_step(ctx, args, kernel, j, idx), ins, idx)
            self.lowered += 1
            return True
        idx, out = output_buffer(ctx, ins, layout)
        if fused is not None:
            return self._lower_quantising(ctx, ins, args, kernel, (idx, out, layout), fused)
        self._remember(ctx, args, kernel, out)
        ctx.emit(self._step(ctx, args, kernel, out), ins, idx)
        self.lowered += 1
        return True

    def _lower_quantising(self, ctx, ins, args, kernel, where, fused) -> bool:
        """The group's step writing its quantizelinear's tensor too: a new one each run, put
        straight into the slot the quantise (lowered later) binds, which then has no step of
        its own (and no profiled time: it launches nothing, as in a graph)."""
        idx, out, layout = where
        quantise, quant, scale = fused
        dtype = torch.int8 if quant.code == "int8" else torch.float8_e4m3fn
        gather, env, slot = self._gather(ctx, args, kernel), ctx.env, {}

        def new_q() -> torch.Tensor:
            return torch.empty_strided(out.shape, out.stride(), dtype=dtype, device=out.device)

        def run() -> None:
            xs, k = gather()
            q = new_q()
            k(xs, out, (scale, q.view(torch.uint8) if dtype != torch.int8 else q))
            env[slot["q"]] = q

        def bound(c: LoweringContext, q: Instruction) -> bool:
            slot["q"] = c.bind_dynamic(q, layout)
            c.mark_fresh(slot["q"])
            return True

        ctx.fusers[id(quantise)] = bound
        sample_q = new_q()
        sample = sample_q if dtype == torch.int8 else sample_q.view(torch.uint8)
        self._remember(ctx, args, kernel, out, (scale, sample))
        ctx.emit(run, ins, idx)
        self.lowered += 1
        self.quantised += 1
        return True

    @staticmethod
    def _may_alias(ctx: LoweringContext, src: int, kernel: Any, j: int) -> bool:
        """Whether the kernel may write over input `j`: a tensor its producer's step allocated
        (nothing else holds it), read at the very addresses the output is written to."""
        return src in ctx.fresh and kernel.group.inputs[j] == kernel.group.output

    def _in_place_step(
        self, ctx: LoweringContext, args: Sequence[int], kernel: Any, j: int, idx: int
    ) -> Callable[[], None]:
        """The group's kernel writing its result over input `j` (element k is read, then
        written, by the same program). Its first call (the autotune, which launches the kernel
        several times) and a call whose input `j` has other strides write a new tensor."""
        env, gather = ctx.env, self._gather(ctx, args, kernel)
        desc = kernel.group.output
        dtype = torch_dtype(desc.dtype)

        def run() -> None:
            xs, k = gather()
            out = xs[j]
            if k.config is None or not _fits(out, desc):
                out = torch.empty_strided(desc.lens, desc.strides, dtype=dtype, device=out.device)
            k(xs, out)
            env[idx] = out

        return run

    def _step(
        self, ctx: LoweringContext, args: Sequence[int], kernel: Any, out: torch.Tensor
    ) -> Callable[[], None]:
        fixed = [ctx.value(a) for a in args]
        if all(t is not None for t in fixed):
            inputs = list(fixed)

            def run_fixed() -> None:
                kernel(inputs, out)

            return run_fixed
        gather = self._gather(ctx, args, kernel)

        def run() -> None:
            xs, k = gather()
            k(xs, out)

        return run

    def _gather(
        self, ctx: LoweringContext, args: Sequence[int], kernel: Any
    ) -> Callable[[], tuple[list[torch.Tensor], Any]]:
        """Per call: the group's input tensors, and the kernel built for their strides."""
        env, fixed = ctx.env, [ctx.value(a) for a in args]
        by_strides: dict[tuple, Any] = {}

        def gather() -> tuple[list[torch.Tensor], Any]:
            xs = [env[a] if t is None else t for a, t in zip(args, fixed, strict=True)]
            if all(_fits(x, d) for x, d in zip(xs, kernel.group.inputs, strict=True)):
                return xs, kernel
            return xs, self._restrided(kernel, xs, by_strides)

        return gather

    def _restrided(self, kernel: Any, xs: Sequence[torch.Tensor], seen: dict[tuple, Any]) -> Any:
        """The kernel of `kernel`'s group for inputs with the strides of `xs` (built once)."""
        key = tuple(tuple(x.stride()) for x in xs)
        if key not in seen:
            group = dataclasses.replace(kernel.group, inputs=[actual_desc(x) for x in xs])
            seen[key] = self.kernel(group, kernel.quant)
        return seen[key]

    def announce(self) -> None:
        """One warning per kind of refusal (how many groups, one example), if any."""
        for kind, count in sorted(self.refused.items()):
            warnings.warn(
                f"gpu target: {count} fused group(s) run as torch code, not generated Triton "
                f"kernels: {kind} (e.g. {self.examples[kind]})",
                stacklevel=3,
            )


_QUANT_CODES = {"int8_type": "int8", "fp8e4m3fn_type": "fp8"}


def _quantised_output(ctx: LoweringContext, ins: Instruction, device: torch.device):
    """(the `quantizelinear` user the group's kernel computes too, its `QuantOutput`, its
    scale) or None (module docstring)."""
    from pygraphx.codegen.triton.kernels import QuantOutput

    if ins.shape.type() not in ("float_type", "half_type", "bf16_type"):
        return None
    quantise, scale, store = quantising_user(ctx, ins, tuple(_QUANT_CODES))
    if quantise is None or any(u.op.name == "dequantizelinear" for u in quantise.outputs):
        return None
    code = _QUANT_CODES[quantise.shape.type()]
    cast = code == "fp8" and fp8_cast(device)
    return quantise, QuantOutput(code, store, cast), scale


def in_place_input(ins: Instruction) -> int | None:
    """The input an element-wise group may overwrite with its result: a convolution's result
    (a tensor its step allocates) that only this group reads, of the group's own shape and
    type. The memory plan leaves such groups out of the arena (`target.unplanned`)."""
    if ins.op.name != "pointwise":
        return None
    for j, x in enumerate(ins.inputs):
        if x.op.name != "convolution" or x.shape.type() != ins.shape.type():
            continue
        if x.shape.lens() == ins.shape.lens() and all(u is ins for u in x.outputs):
            return j
    return None


def _placeholder(desc: TensorDesc, device: torch.device) -> torch.Tensor:
    return torch.empty(1, dtype=torch_dtype(desc.dtype), device=device)


def _channels_last(desc: TensorDesc) -> TensorDesc:
    n, c, h, w = desc.lens
    return TensorDesc(desc.lens, (c * h * w, 1, w * c, c), desc.dtype)
