"""Timing the cpu target's steps as they run (for `perf --cpu`).

The observer path of a run (`program.run(params, observer=...)`) reports every IR instruction,
so it runs a fused step's parts one by one (a convolution, then its epilogue group). This
times the fast path's own steps instead: a convolution with its fused epilogue, a GEMM with its
bias and GELU, an attention block or a layer normalisation is one step, timed as one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.cpu.target import CpuExecutable


@dataclass
class StepTime:
    """One step of the fast path: the instructions it computes and its mean seconds per run."""

    instructions: list[Instruction]
    seconds: float


def time_steps(
    exe: CpuExecutable,
    params: Mapping[str, np.ndarray],
    n: int,
    clock: Callable[[], float] = time.perf_counter,
) -> list[StepTime]:
    """Run the fast path `n` times timing each step (as `run` does: same threads, same
    inference mode); the steps in run order with their mean seconds of `clock` (wall time;
    `time.thread_time` gives the running thread's CPU time)."""
    fns = exe.executor.steps
    totals = [0.0] * len(fns)
    with exe._lock:
        for _ in range(n):
            exe.executor.bind(params)
            with exe.scope():
                for k, fn in enumerate(fns):
                    start = clock()
                    fn()
                    totals[k] += clock() - start
            exe.executor.collect()
    steps = exe.lowered.steps
    return [StepTime(s.instructions, t / n) for s, t in zip(steps, totals, strict=True)]
