"""Timing the cpu target's steps as they run (for `perf --cpu`).

The observer path of a run (`program.run(params, observer=...)`) reports every IR instruction,
so it runs a fused step's parts one by one (a convolution, then its epilogue group). This
times the fast path's own steps instead: a convolution with its fused epilogue, a GEMM with its
bias and GELU, an attention block or a layer normalisation is one step, timed as one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.cpu.target import CpuExecutable
from pygraphx.targets.torch_lowering.conv_chain import Chain
from pygraphx.targets.torch_lowering.native_mbchain import MbChain


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
    `time.thread_time` gives the running thread's CPU time). A chain runs as in `run` and
    times each of its members, reported as the steps they are (its per-run guard and inputs
    counted in its first member's time): `conv_chain.Chain` calls its oneDNN primitives one by
    one as `run` does, `native_mbchain.MbChain` makes `run`'s one C call, stamped after each
    member."""
    fns = exe.executor.steps
    chains = exe.chained.chains
    totals = [0.0] * len(exe.lowered.steps)
    with exe._lock:
        for chain in chains:
            if chain is not None:
                chain.clock = clock
        try:
            for _ in range(n):
                exe.executor.bind(params)
                with exe.scope():
                    _time_run(fns, chains, totals, clock)
                exe.executor.collect()
        finally:
            for chain in chains:
                if chain is not None:
                    chain.clock = None
    steps = exe.lowered.steps
    return [StepTime(s.instructions, t / n) for s, t in zip(steps, totals, strict=True)]


def _time_run(
    fns: Sequence[Callable[[], None]],
    chains: Sequence[Chain | MbChain | None],
    totals: list[float],
    clock: Callable[[], float],
) -> None:
    """One run of `fns`, adding each lowered step's seconds to `totals` (a chain's members:
    the times it measured itself)."""
    k = 0
    for fn, chain in zip(fns, chains, strict=True):
        start = clock()
        fn()
        if chain is None:
            totals[k] += clock() - start
            k += 1
            continue
        for t in chain.seconds:
            totals[k] += t
            k += 1
