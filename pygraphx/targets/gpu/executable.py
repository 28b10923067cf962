"""A program lowered for the GPU, run as one captured CUDA/HIP graph where it can be.

The first run binds static device buffers to the parameters, runs the steps twice on a side
stream (lazy library initialisation: cuDNN algorithm search, cuBLAS handles, Triton autotune),
then captures one pass over the steps into a `torch.cuda.CUDAGraph` on that same stream (one
per device, shared by every program: `capture_stream`); cuBLAS's cached workspaces are freed
around both (`release_library_workspaces`), so the capture allocates the one it needs in the
graph's own pool and no program leaves one behind. Every later run copies its inputs into
the static buffers, replays the graph and reads the outputs from the tensors the capture
produced (the graph rewrites them in place). A program whose steps cannot be captured (a numpy
fallback, a step that reads values on the host: data-dependent shapes, host control flow)
says so in one warning and runs its steps one by one; so does every run when `PGX_GPU_GRAPH=0`
or the target's `graph=False`.

I/O: host numpy arrays in and out (`offload_copy=True`, MIGraphX's default), or device
arguments (`GpuArgument`, torch CUDA tensors, DLPack objects): see `run_device`.

Profiling (`observer`): the steps run uncaptured twice: once queued behind a spin kernel, each
between two CUDA events, which gives every step's device time without host time in it
(`_device_times`; a view step whose result shares its input's storage launched nothing and
counts 0, not the ~1.4 us two back-to-back events measure), then once step by step to show the
observer each value. The run's wall time is never less than the sum of the device times, so
perf's measured overhead is never negative, and the device times add up to about what one
graph replay takes.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from pygraphx.ir.argument import Argument
from pygraphx.ir.instruction import Instruction
from pygraphx.runtime.evaluator import EvaluationError
from pygraphx.runtime.executor import Observer, step_error
from pygraphx.targets.gpu.device_api import GpuArgument, as_device_tensor
from pygraphx.targets.torch_lowering import Lowered
from pygraphx.targets.torch_lowering.dtypes import from_numpy, to_numpy, torch_dtype
from pygraphx.targets.torch_lowering.fallback_cost import announce_cost, timed_steps

GRAPH_ENV = "PGX_GPU_GRAPH"
WARMUP_RUNS = 2
#: device clock cycles the first profiled run spins for (~50 ms at 2 GHz); later runs adapt
SPIN_CYCLES = 100_000_000
#: ops whose step, where its result shares its input's storage, only rebinds a tensor
VIEW_OPS = frozenset(
    {"reshape", "transpose", "slice", "multibroadcast", "broadcast", "squeeze", "unsqueeze",
     "flatten", "step"}
)  # fmt: skip


class GpuExecutable:
    """See the module docstring."""

    def __init__(
        self,
        lowered: Lowered,
        device: torch.device,
        offload_copy: bool = True,
        graph: bool | None = None,
    ) -> None:
        self.lowered = lowered
        self.device = device
        self.offload_copy = offload_copy
        self.env = lowered.ctx.env
        self.steps = [s.fn for s in lowered.steps]
        self._fallback_flags = [s.fallback for s in lowered.steps]
        self._cost_pending = any(self._fallback_flags)
        module = lowered.ctx.cache["module"]
        shapes = {p.op.parameter: p.shape for p in module.get_parameters()}
        self.params = [(name, idx, shapes[name]) for name, idx in lowered.params]
        self.outputs = list(lowered.outputs)
        if graph is None:
            graph = os.environ.get(GRAPH_ENV, "1").strip() != "0"
        self.use_graph = bool(graph) and device.type == "cuda"
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: dict[str, torch.Tensor] = {}
        self.graph_outputs: list[torch.Tensor] = []
        self._spin_cycles = SPIN_CYCLES
        self.why_uncaptured: str | None = None if self.use_graph else "graphs disabled"

    # --- the public protocol --------------------------------------------------------------
    def run(self, params: Mapping[str, np.ndarray], observer: Observer | None = None) -> list:
        """Host arrays in; host arrays out (copies no later run overwrites)."""
        tensors = {name: from_numpy(np.asarray(a, order="C")) for name, a in params.items()}
        outs = self._execute(tensors, observer)
        return [to_numpy(t.contiguous().cpu()) for t in outs]

    def takes_device_arguments(self, params: Mapping[str, Any]) -> bool:
        """Whether `Program.run` should hand these parameters to `run_device`."""
        return not self.offload_copy or any(
            as_device_tensor(v) is not None for v in params.values()
        )

    def run_device(
        self,
        params: Mapping[str, Any],
        observer: Observer | None = None,
        output_names: list[str] | None = None,
    ) -> list:
        """Device arguments in and out. Inputs on the device are bound without a copy (copied
        into the graph's static buffers when it replays); host inputs are uploaded. Outputs:
        when `params` holds a device buffer under an output's name (`get_outputs()`, as
        MIGraphX's `allocate_gpu` examples do) the output is copied there and that buffer is
        returned; else a fresh `GpuArgument` (or host `Argument`s with offload_copy)."""
        names = [name for name, _, _ in self.params]
        unknown = sorted(set(params) - set(names) - set(output_names or []))
        if unknown:
            raise ValueError(
                f"unknown parameter(s) {unknown}; the program's parameters are {names}"
            )
        out_buffers = {k: v for k, v in params.items() if k not in names}
        tensors = {name: self._device_input(name, params) for name in names}
        outs = self._execute(tensors, observer)
        if self.offload_copy:
            return [Argument(to_numpy(t.contiguous().cpu())) for t in outs]
        return self._device_outputs(outs, out_buffers, output_names or [])

    @property
    def fallbacks(self) -> dict[str, int]:
        """Op name -> instructions that run through numpy `compute()` (host round trips)."""
        return dict(self.lowered.ctx.fallbacks)

    @property
    def attention_blocks(self) -> int:
        return int(self.lowered.ctx.cache.get("attention_blocks", 0))

    def __len__(self) -> int:
        return len(self.steps)

    # --- running --------------------------------------------------------------------------
    def _execute(
        self, tensors: Mapping[str, torch.Tensor], observer: Observer | None
    ) -> list[torch.Tensor]:
        with torch.inference_mode(), self._device_context():
            if observer is not None:
                self._run_profiled(tensors, observer)
                return [self.env[i] for i in self.outputs]
            if self.use_graph and self.graph is None:
                self._capture(tensors)
            if self.graph is not None:
                for name, t in tensors.items():
                    self.static[name].copy_(t, non_blocking=True)
                self.graph.replay()
                return self.graph_outputs
            self._bind(tensors)
            if self._cost_pending:  # the first uncaptured run says what the fallback costs
                self._cost_pending = False
                self._run_timing_fallbacks()
                return [self.env[i] for i in self.outputs]
            self._run_steps(self.steps)
            return [self.env[i] for i in self.outputs]

    def _run_steps(self, steps: list[Callable[[], None]]) -> None:
        """Run `steps` (this executable's, possibly wrapped); an error is re-raised as a
        `pygraphx.EvaluationError` naming the instructions of the step that failed."""
        k = -1
        try:
            for k, step in enumerate(steps):  # noqa: B007 - k names the failed step
                step()
        except EvaluationError:
            raise
        except Exception as exc:  # re-raised with the instruction named, nothing lost
            computes = self.lowered.steps[k].instructions if 0 <= k < len(steps) else ()
            raise step_error(computes, exc) from exc

    def _run_timing_fallbacks(self) -> None:
        sync = self._sync
        steps, timer = timed_steps(self.steps, self._fallback_flags, sync)
        sync()
        start = time.perf_counter()
        self._run_steps(steps)
        sync()
        total = time.perf_counter() - start
        announce_cost(sum(self.fallbacks.values()), timer.seconds, total, "gpu")

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _device_context(self) -> Any:
        if self.device.type == "cuda":
            return torch.cuda.device(self.device)
        return torch.autograd.grad_mode.no_grad()

    def _bind(self, tensors: Mapping[str, torch.Tensor]) -> None:
        env, device = self.env, self.device
        for name, idx, _ in self.params:
            t = tensors[name]
            env[idx] = t if t.device == device else t.to(device, non_blocking=True)

    def _capture(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Warm up, then capture the steps as one graph (or say why not and stay eager)."""
        self.use_graph = False
        if not self.steps:  # nothing runs on the device: nothing to capture
            self.why_uncaptured = "no device steps"
            return
        if self.lowered.ctx.fallbacks:
            ops = ", ".join(sorted(self.lowered.ctx.fallbacks))
            self._uncaptured(f"steps run on the host through numpy ({ops})")
            return
        host_reads = self.lowered.ctx.cache.get("host_reads")
        if host_reads:
            ops = ", ".join(sorted(set(host_reads)))
            self._uncaptured(f"steps read device values on the host ({ops})")
            return
        self.static = {
            name: torch.empty(shape.lens(), dtype=torch_dtype(shape.dtype()), device=self.device)
            for name, _, shape in self.params
        }
        for name, t in tensors.items():
            self.static[name].copy_(t)
        stream = capture_stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        for _ in range(WARMUP_RUNS):
            # freed before each pass: a workspace the last steps took (cuBLAS, for a final
            # GEMM) must not stay live through the next pass's activation peak
            release_library_workspaces(self.device)
            with torch.cuda.stream(stream):
                self._bind(self.static)
                self._run_steps(self.steps)
        self._drop_dynamic()  # the warm-up's outputs must not stay live beside the capture's
        release_library_workspaces(self.device)
        graph = torch.cuda.CUDAGraph()
        try:
            self._bind(self.static)
            with torch.cuda.graph(graph, stream=stream):
                for step in self.steps:
                    step()
        except RuntimeError as exc:  # announced; the steps then run uncaptured
            torch.cuda.synchronize(self.device)
            self._uncaptured(f"capture failed: {str(exc).splitlines()[0]}")
            return
        finally:
            release_library_workspaces(self.device)
        self.graph = graph
        # the tensors the replays rewrite (env's slots change when a profiled run binds anew)
        self.graph_outputs = [self.env[i] for i in self.outputs]

    def _drop_dynamic(self) -> None:
        """Forget every run-time value (parameters bound, tensors the steps allocated)."""
        env, static = self.env, self.lowered.ctx.static
        for i in range(len(env)):
            if not static[i]:
                env[i] = None

    def _uncaptured(self, why: str) -> None:
        self.why_uncaptured = why
        warnings.warn(f"gpu target: running without a CUDA graph: {why}", stacklevel=4)

    def _run_profiled(self, tensors: Mapping[str, torch.Tensor], observer: Observer) -> None:
        """Device time of every step (`_device_times`), then a step-by-step pass that shows the
        observer each instruction's value with that time."""
        cuda = self.device.type == "cuda"
        times = self._device_times(tensors) if cuda else None
        self._bind(tensors)
        env = self.env
        for k, (ins, fn, slot) in enumerate(self.lowered.profile):
            seconds = 0.0
            if fn is not None:
                seconds = times[k] if times is not None else _timed(ins, fn)
            value = env[slot] if slot >= 0 else None
            observer(ins, _host(value), seconds)

    def _device_times(self, tensors: Mapping[str, torch.Tensor]) -> list[float]:
        """Seconds each profiled step's kernels take on the device, with no host time in them:
        a spin kernel keeps the device busy while the host queues every step between two
        events, so the steps then run back to back. The spin is sized from the last pass's
        host time (the first pass guesses)."""
        self._bind(tensors)
        cycles = self._spin_cycles
        Event = torch.cuda.Event
        spin = (Event(enable_timing=True), Event(enable_timing=True))
        spin[0].record()
        torch.cuda._sleep(cycles)
        spin[1].record()
        pairs: list[tuple[Any, Any] | None] = []
        start = time.perf_counter()
        for ins, fn, slot in self.lowered.profile:
            if fn is None:
                pairs.append(None)
                continue
            source = self._view_source(ins)
            pair = (Event(enable_timing=True), Event(enable_timing=True))
            pair[0].record()
            _named(ins, fn)
            pair[1].record()
            # a view of its input's storage launched nothing: its step rebinds a tensor on
            # the host (and is no part of the graph); the events' own gap is no work of it
            pairs.append(
                None if source is not None and _storage(self.env[slot]) == source else pair
            )
        host = time.perf_counter() - start
        torch.cuda.synchronize(self.device)
        per_second = cycles / max(spin[0].elapsed_time(spin[1]) / 1e3, 1e-6)
        self._spin_cycles = int(min(max(2.0 * host * per_second, 1e6), 2e10))
        return [p[0].elapsed_time(p[1]) / 1e3 if p is not None else 0.0 for p in pairs]

    def _view_source(self, ins: Instruction) -> int | None:
        """The storage address of a view instruction's input, read before its step runs (the
        step may release it); None for other instructions."""
        if ins.op.name not in VIEW_OPS or not ins.inputs:
            return None
        src = self.lowered.ctx.index.get(id(ins.inputs[0]))
        return _storage(self.env[src]) if src is not None else None

    # --- device I/O -----------------------------------------------------------------------
    def _device_input(self, name: str, params: Mapping[str, Any]) -> torch.Tensor:
        if name not in params:
            raise ValueError(f"missing parameter {name!r}")
        value = params[name]
        shape = next(s for n, _, s in self.params if n == name)
        t = as_device_tensor(value)
        if t is None:
            arr = value.array if isinstance(value, Argument) else np.asarray(value)
            t = from_numpy(np.asarray(arr, order="C"))
        want = torch_dtype(shape.dtype())
        if t.dtype != want or list(t.shape) != shape.lens():
            raise ValueError(
                f"parameter {name!r} expects {shape.type()} {shape.lens()} but got "
                f"{t.dtype} {list(t.shape)}"
            )
        return t

    def _device_outputs(
        self, outs: list[torch.Tensor], buffers: Mapping[str, Any], names: list[str]
    ) -> list[GpuArgument]:
        result = []
        for k, t in enumerate(outs):
            name = names[k] if k < len(names) else f"main:#output_{k}"
            buf = as_device_tensor(buffers[name]) if name in buffers else None
            if buf is not None:
                buf.copy_(t)
                result.append(GpuArgument(buf))
            else:
                result.append(GpuArgument(t.clone(memory_format=torch.contiguous_format)))
        return result


_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream every program on `device` warms up and is captured on. cuBLAS keeps
    a workspace (32 MiB on Hopper) per handle and stream for good, so a new stream per program,
    or a warm-up stream apart from the capture stream, would each leave one behind."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[index] = torch.cuda.Stream(index)
    return _CAPTURE_STREAMS[index]


def release_library_workspaces(device: torch.device) -> None:
    """Free the cuBLAS workspaces torch caches per stream, as torch.compile's CUDA graphs do
    around their warm-up and capture: the warm-up's workspace then goes back to the ordinary
    pool, the capture allocates its own in the graph's private pool (which the graph keeps: only
    its replays use it), and no captured graph points at a workspace that eager code may reuse.
    Any stream that needs one later allocates it again. Without the private torch hook (older or
    other builds) nothing is freed and the workspaces stay cached: memory only, announced."""
    torch.cuda.synchronize(device)
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is None:
        warnings.warn(
            "gpu target: this torch cannot free cuBLAS workspaces; each stays cached",
            stacklevel=3,
        )
        return
    clear()


def _storage(t: Any) -> int | None:
    return t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) else None


def _timed(ins: Instruction, fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    _named(ins, fn)
    return time.perf_counter() - start


def _named(ins: Instruction, fn: Callable[[], None]) -> None:
    """Run the profiled step `fn` of `ins`; an error names it as `_run_steps` does."""
    try:
        fn()
    except EvaluationError:
        raise
    except Exception as exc:  # re-raised with the instruction named, nothing lost
        raise step_error([ins], exc) from exc


def _host(value: Any) -> np.ndarray | None:
    if isinstance(value, torch.Tensor):
        return to_numpy(value.detach().contiguous().cpu())
    return value if isinstance(value, np.ndarray) else None
