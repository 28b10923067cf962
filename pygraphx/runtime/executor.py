"""The lean executor: runs a compiled program as a straight loop over pre-bound steps.

A target's lowering turns every instruction into a zero-argument closure that already holds its
input and output slots, its constants and the function it calls, so a run is

    bind the parameters;  for step in steps: step();  collect the outputs

with no dictionary lookups and no decisions per step. The executor knows nothing of tensors:
the target hands it the steps and three callables (bind the parameters, collect the outputs,
show a value as a numpy array) plus an optional context to run under (torch's inference mode).

With an `observer`, the run takes the profiling path: every instruction of `main`, in program
order, is timed with `time.perf_counter` and reported as `observer(instruction, value, seconds)`
(instructions with no run-time work, such as literals and views fixed at prepare, are reported
with 0 seconds), so `perf`-style reports and value traces work on compiled programs unchanged.
The profiling path runs producers that the lowering fused with their users as separate steps.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from pygraphx.ir.instruction import Instruction

#: called with (instruction, its value, seconds it took) after each instruction runs
Observer = Callable[[Instruction, np.ndarray, float], None]
#: (instruction, the step computing it or None, the slot its value is in)
ProfileEntry = tuple[Instruction, Callable[[], None] | None, int]


class Executor:
    """Runs `steps` in order; see the module docstring."""

    __slots__ = ("steps", "bind", "collect", "profile", "show", "context")

    def __init__(
        self,
        steps: Sequence[Callable[[], None]],
        bind: Callable[[Mapping[str, np.ndarray]], None],
        collect: Callable[[], list[np.ndarray]],
        profile: Sequence[ProfileEntry] = (),
        show: Callable[[int], np.ndarray] | None = None,
        context: Callable[[], AbstractContextManager[Any]] | None = None,
    ) -> None:
        self.steps = tuple(steps)
        self.bind = bind
        self.collect = collect
        self.profile = tuple(profile)
        self.show = show
        self.context = context or contextlib.nullcontext

    def run(
        self, params: Mapping[str, np.ndarray], observer: Observer | None = None
    ) -> list[np.ndarray]:
        """Run once; returns the outputs (arrays no later run overwrites)."""
        self.bind(params)
        with self.context():
            if observer is None:
                for step in self.steps:
                    step()
            else:
                self._run_profiled(observer)
            return self.collect()

    def _run_profiled(self, observer: Observer) -> None:
        show = self.show
        clock = time.perf_counter
        for ins, fn, slot in self.profile:
            start = clock()
            if fn is not None:
                fn()
            elapsed = clock() - start if fn is not None else 0.0
            value = show(slot) if show is not None and slot >= 0 else None
            observer(ins, value, elapsed)

    def __len__(self) -> int:
        return len(self.steps)
