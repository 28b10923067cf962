"""The `cpu` target: the optimised program lowered to torch calls on the CPU.

Compiling runs the target-independent pipeline (`optimize_passes()`: constant folding, algebra,
pointwise and reduce fusion, memory colouring); `prepare` then lowers `main` through
`targets/torch_lowering` into pre-bound steps over torch tensors (oneDNN convolutions with
packed weights and fused epilogues, MKL GEMMs, generated in-place code for fused element-wise
groups, one arena for the intermediates) and wraps them in the lean executor.

Threads: `threads.py` decides how many (`threads=`, `PGX_CPU_THREADS`, else the physical
cores this process may use, capped) and how many each step gets; `scheduling.py` applies it per
run (process-wide budget, `torch.set_num_threads` only where the count changes, the caller's
count restored after the run). Runs happen under `torch.inference_mode()`; one program runs
one call at a time (its tensors are shared by every run), other programs run alongside.
Parameters and outputs are exchanged as numpy arrays that share memory with the tensors
(`torch.from_numpy`, `Tensor.numpy()`); outputs are fresh arrays that a later run does not
overwrite.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pygraphx.ir.mapped import release_weight_pages
from pygraphx.passes.fold_qdq import fold_qdq
from pygraphx.passes.manager import Pass, module_pass
from pygraphx.passes.pipeline import optimize_passes
from pygraphx.runtime.executor import Executor, Observer
from pygraphx.targets.base import Target
from pygraphx.targets.cpu import allocator_setting, openmp_setting
from pygraphx.targets.cpu.bf16 import announce_slow_bf16
from pygraphx.targets.cpu.lowering import cpu_overrides
from pygraphx.targets.cpu.scheduling import RunScope, plan_step_threads, with_thread_switches
from pygraphx.targets.cpu.threads import ThreadCount, resolve_threads, step_policy_enabled
from pygraphx.targets.torch_lowering import Lowered, lower_module
from pygraphx.targets.torch_lowering.conv_chain import chain_steps
from pygraphx.targets.torch_lowering.conv_choice import finish as finish_conv_choice
from pygraphx.targets.torch_lowering.conv_residual import residual_slot
from pygraphx.targets.torch_lowering.dtypes import DIRECT_NP, DIRECT_TORCH, env_value, to_numpy
from pygraphx.targets.torch_lowering.fallback_cost import FallbackTimer, announce_cost, timed_steps
from pygraphx.targets.torch_lowering.fused_reads import fused_reads

if TYPE_CHECKING:
    from pygraphx.ir.program import Program

log = logging.getLogger("pygraphx.cpu")

#: where convolution results live by default: "arena" (the `dnnl` kernel writes each fused
#: group's slot itself; the plan keeps a fused convolution's input live through its group). A/B
#: in one process against "torch" (torch-allocated outputs), process CPU ms on the 2-core EPYC:
#: equal or 1-4% less on MobileNetV2 b1/b8, YOLOv8-style, UNet at 1 and 2 threads, ResNet-50 b1
#: -0.5 to -8% at 2 threads and -1.5 to +1.8% at 1 (a tie within the shared machine's noise)
#: (`benchmarks/arena_conv_ab.py`, benchmarks/results/arena_conv.md)
CONV_OUTPUT = "arena"


def announce_fallbacks(fallbacks: Mapping[str, int]) -> None:
    """One warning per compile when instructions run through numpy instead of torch: which ops,
    how many, and where their cost shows (the first run says their share of its time, see
    `fallback_cost.py`; `perf` times every step)."""
    if not fallbacks:
        return
    ops = ", ".join(f"{name} x{n}" for name, n in sorted(fallbacks.items()))
    total = sum(fallbacks.values())
    warnings.warn(
        f"cpu target: {total} instruction(s) run through the numpy fallback, not torch ({ops}); "
        "the first run says what they cost, `pygraphx-driver perf --cpu` the time of each",
        RuntimeWarning,
        stacklevel=3,
    )


_announced: set[str] = set()


def announce_threads(threads: ThreadCount) -> None:
    """Log (INFO, logger `pygraphx.cpu`, once per distinct line) the thread count, the
    OpenMP waiting policy torch's workers run with and torch's allocator pages
    (`targets/cpu/__init__.py`)."""
    line = (f"cpu target: threads {threads}; OpenMP: {openmp_setting()}; allocator: "
            f"{allocator_setting()}")  # fmt: skip
    if line not in _announced:
        _announced.add(line)
        log.info("%s", line)


def cpu_threads() -> int:
    """The default thread count of the cpu target (`PGX_CPU_THREADS`, else the physical cores
    this process may use, capped; see `threads.py`)."""
    return resolve_threads().n


class CpuExecutable:
    """A program lowered to torch on the CPU (see the module docstring)."""

    def __init__(self, lowered: Lowered, threads: int = 1, step_policy: bool = False) -> None:
        self.lowered = lowered
        self.threads = threads
        self.step_threads = plan_step_threads(lowered.steps, threads, step_policy)
        self.scope = RunScope(threads)
        self._lock = threading.Lock()
        ctx = lowered.ctx
        env = ctx.env
        params = list(lowered.params)
        outputs = list(lowered.outputs)
        fresh = ctx.fresh

        # bind and collect take the direct way for the common case (the run's other Python
        # is cold after the steps: 25 + 31 us a MobileNetV2 b1 run at 2 threads before)
        from_numpy, ndarray, tensor = torch.from_numpy, np.ndarray, torch.Tensor

        def bind(values: Mapping[str, np.ndarray]) -> None:
            for name, idx in params:
                a = values[name]
                if a.__class__ is ndarray and a.dtype in DIRECT_NP:
                    flags = a.flags  # (a read-only array would warn; strides may be negative)
                    if flags.writeable and flags.c_contiguous:
                        env[idx] = from_numpy(a)
                        continue
                env[idx] = env_value(a)

        def take(idx: int) -> np.ndarray:
            t = env[idx]
            if isinstance(t, np.ndarray):  # a type torch cannot hold (see dtypes.py)
                return t.copy()
            if idx in fresh and t.is_contiguous():
                return to_numpy(t)
            return to_numpy(t.clone(memory_format=torch.contiguous_format))

        outs = [(idx, idx in fresh) for idx in outputs]

        def collect() -> list[np.ndarray]:
            got = []
            for idx, new in outs:  # a fresh dense tensor of a numpy type: its own array
                t = env[idx]
                direct = new and t.__class__ is tensor and t.dtype in DIRECT_TORCH
                got.append(t.numpy() if direct and t.is_contiguous() else take(idx))
            return got

        def show(idx: int) -> np.ndarray | None:
            t = env[idx]
            if isinstance(t, np.ndarray):
                return t
            return to_numpy(t) if t is not None else None

        # consecutive oneDNN convolution steps run as one step (`conv_chain`)
        self.chained = chain_steps(lowered.steps, self.step_threads, env, ctx.static)
        chained = self.chained
        fns = with_thread_switches(chained.fns, chained.counts, self.scope.limit, threads)
        # (run17) the run scope's exit reads torch's thread count back only where some step
        # may have switched it
        self.scope.switches = any(f is not g for f, g in zip(fns, chained.fns, strict=True))
        #: (run17) `Program.run` calls `run` without the program's lock: `run` takes `_lock`
        #: itself (one lock a run, not two)
        self.reentrant = True
        computes = self.chained.computes
        self.executor = Executor(fns, bind, collect, lowered.profile, show, self.scope, computes)
        # the first run times the fallback steps once and says what they cost (fallback_cost)
        flags = self.chained.fallbacks
        self._first: tuple[Executor, FallbackTimer] | None = None
        if any(flags):
            timed, timer = timed_steps(fns, flags)
            first = Executor(timed, bind, collect, (), show, self.scope, computes)
            self._first = (first, timer)

    def run(
        self, params: dict[str, np.ndarray], observer: Observer | None = None
    ) -> list[np.ndarray]:
        with self._lock:  # the env and arena are this program's: one run at a time
            if observer is not None:
                # the profiled path runs a fused step's unfused twins, which leave a value in
                # its arena slot where the fused step stores a new tensor (a GEMM's or a
                # convolution's group, `registry.storing`): copied, a later run cannot
                # overwrite the outputs; its time is no run's (the stall adaptation skips it)
                self.scope.timed = False
                try:
                    return [np.array(o, copy=True) for o in self.executor.run(params, observer)]
                finally:
                    self.scope.timed = True
            if self._first is None:
                return self.executor.run(params)
            (first, timer), self._first = self._first, None
            start = time.perf_counter()
            outputs = first.run(params)
            total = time.perf_counter() - start
            announce_cost(sum(self.lowered.ctx.fallbacks.values()), timer.seconds, total)
            return outputs

    @property
    def attention_blocks(self) -> int:
        """Attention blocks run as one fused `scaled_dot_product_attention` step."""
        return int(self.lowered.ctx.cache.get("attention_blocks", 0))

    @property
    def layernorm_blocks(self) -> int:
        """Layer normalisations run as one `F.layer_norm` step."""
        return int(self.lowered.ctx.cache.get("layernorm_blocks", 0))

    @property
    def fallbacks(self) -> dict[str, int]:
        """Op name -> instructions that run through numpy `compute()` (no torch lowering)."""
        return dict(self.lowered.ctx.fallbacks)

    def __len__(self) -> int:
        return len(self.executor)


class CpuTarget(Target):
    """`get_target("cpu")`: torch on the CPU.

    Keyword settings (they apply to this target object, not to saved programs):
    `threads=N` (threads per run; default `PGX_CPU_THREADS`, else the physical cores this
    process may use, capped: see `threads.py`), `step_threads=False` (every step on all the
    run's threads; default `PGX_CPU_STEP_THREADS`, on); and for the lowering
    `conv_output="arena" | "torch"` (where convolution, pooling and normalisation results
    live, see `torch_lowering/conv_fusion.py`; default `CONV_OUTPUT`),
    `conv_kernel="impl" | "measure" | "off" | <kernel>` (how each convolution's kernel is
    chosen, see `torch_lowering/conv_choice.py`), `mkldnn=False` (no oneDNN convolutions),
    `mkl_linear=False` (no packed MKL GEMMs), `attention=False` / `layernorm=False` (no fused
    attention / layer normalisation, see `lowering.py`), `onednn_attention=False` (attention
    through torch: neither oneDNN's primitives nor the native kernel, see
    `torch_lowering/attention.py`).
    """

    name = "cpu"

    def __init__(
        self, threads: int | None = None, step_threads: bool | None = None, **settings: Any
    ) -> None:
        known = {"conv_output", "conv_kernel", "mkldnn", "mkl_linear", "attention", "layernorm",
                 "onednn_attention"}  # fmt: skip
        unknown = set(settings) - known
        if unknown:
            raise ValueError(f"unknown cpu target settings {sorted(unknown)}")
        self.settings = settings
        self.threads: ThreadCount = resolve_threads(threads)
        self.step_policy = step_policy_enabled(step_threads)

    def get_passes(self, options: dict[str, Any]) -> list[Pass]:
        # QDQ models (ONNX Runtime's quantize_static) run their dot / convolution as integer
        # products: folded before constant propagation turns the weights' dequantise to float
        return [module_pass(fold_qdq), *optimize_passes(policy=self.fusion_policy())]

    def prepare(self, program: Program, options: dict[str, Any]) -> CpuExecutable:
        release_weight_pages(program)  # what the passes read; lowering reads each again once
        with self.threads_scope(), torch.inference_mode():
            options = {"conv_output": CONV_OUTPUT, **options, **self.settings}
            options["lowering_overrides"] = cpu_overrides(options)
            if options["conv_output"] == "arena":  # fused steps write their group's slot
                options["fused_reads"] = fused_reads
                options.setdefault("shared_slot", residual_slot)  # rn11: sum over the residual
            lowered = lower_module(program.get_main_module(), torch.device("cpu"), options)
        release_weight_pages(program)
        conv_choices = lowered.ctx.cache.get("conv_choice")
        if conv_choices is not None:
            finish_conv_choice(conv_choices)
        announce_fallbacks(lowered.ctx.fallbacks)
        announce_slow_bf16(program.get_main_module())
        announce_threads(self.threads)
        return CpuExecutable(lowered, self.threads.n, self.step_policy)

    def threads_scope(self) -> RunScope:
        """This target's threads for work outside a run (prepare packs weights with them)."""
        return RunScope(self.threads.n, stall=False)
