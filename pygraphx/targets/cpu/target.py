"""The `cpu` target: the optimised program lowered to torch calls on the CPU.

Compiling runs the target-independent pipeline (`optimize_passes()`: constant folding, algebra,
pointwise and reduce fusion, memory colouring); `prepare` then lowers `main` through
`targets/torch_lowering` into pre-bound steps over torch tensors (oneDNN convolutions with
packed weights and fused epilogues, MKL GEMMs, generated in-place code for fused element-wise
groups, one arena for the intermediates) and wraps them in the lean executor.

Threads: `torch.set_num_threads` is set to the number of cores this process may use, or to
`PGX_CPU_THREADS`. Runs happen under `torch.inference_mode()`. Parameters and outputs are
exchanged as numpy arrays that share memory with the tensors (`torch.from_numpy`,
`Tensor.numpy()`); outputs are fresh arrays that a later run does not overwrite.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pygraphx.passes.manager import Pass
from pygraphx.passes.pipeline import optimize_passes
from pygraphx.runtime.executor import Executor, Observer
from pygraphx.targets.base import Target
from pygraphx.targets.torch_lowering import Lowered, lower_module
from pygraphx.targets.torch_lowering.dtypes import from_numpy, to_numpy

if TYPE_CHECKING:
    from pygraphx.ir.program import Program

THREADS_ENV = "PGX_CPU_THREADS"


def cpu_threads() -> int:
    """Threads for torch's CPU kernels: `PGX_CPU_THREADS`, else the cores this process may use."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if value:
        try:
            n = int(value)
        except ValueError:
            raise ValueError(f"{THREADS_ENV}={value!r} is not a whole number of threads") from None
        if n < 1:
            raise ValueError(f"{THREADS_ENV}={n} must be at least 1")
        return n
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class CpuExecutable:
    """A program lowered to torch on the CPU (see the module docstring)."""

    def __init__(self, lowered: Lowered) -> None:
        self.lowered = lowered
        ctx = lowered.ctx
        env = ctx.env
        params = list(lowered.params)
        outputs = list(lowered.outputs)
        fresh = ctx.cache.get("fresh", set())

        def bind(values: Mapping[str, np.ndarray]) -> None:
            for name, idx in params:
                env[idx] = from_numpy(values[name])

        def take(idx: int) -> np.ndarray:
            t = env[idx]
            if idx in fresh and t.is_contiguous():
                return to_numpy(t)
            return to_numpy(t.clone(memory_format=torch.contiguous_format))

        def collect() -> list[np.ndarray]:
            return [take(i) for i in outputs]

        def show(idx: int) -> np.ndarray | None:
            t = env[idx]
            if isinstance(t, np.ndarray):
                return t
            return to_numpy(t) if t is not None else None

        self.executor = Executor(
            [s.fn for s in lowered.steps],
            bind,
            collect,
            lowered.profile,
            show,
            torch.inference_mode,
        )

    def run(
        self, params: dict[str, np.ndarray], observer: Observer | None = None
    ) -> list[np.ndarray]:
        return self.executor.run(params, observer)

    @property
    def fallbacks(self) -> dict[str, int]:
        """Op name -> instructions that run through numpy `compute()` (no torch lowering)."""
        return dict(self.lowered.ctx.fallbacks)

    def __len__(self) -> int:
        return len(self.executor)


class CpuTarget(Target):
    """`get_target("cpu")`: torch on the CPU.

    Keyword settings tune the lowering (they apply to this target object, not to saved
    programs): `conv_output="torch" | "arena"` (where convolution and GEMM results live, see
    `torch_lowering/conv_fusion.py`), `mkldnn=False` (no oneDNN convolutions),
    `mkl_linear=False` (no packed MKL GEMMs).
    """

    name = "cpu"

    def __init__(self, **settings: Any) -> None:
        unknown = set(settings) - {"conv_output", "mkldnn", "mkl_linear"}
        if unknown:
            raise ValueError(f"unknown cpu target settings {sorted(unknown)}")
        self.settings = settings

    def get_passes(self, options: dict[str, Any]) -> list[Pass]:
        return optimize_passes()

    def prepare(self, program: Program, options: dict[str, Any]) -> CpuExecutable:
        torch.set_num_threads(cpu_threads())
        with torch.inference_mode():
            options = {**options, **self.settings}
            lowered = lower_module(program.get_main_module(), torch.device("cpu"), options)
        return CpuExecutable(lowered)
