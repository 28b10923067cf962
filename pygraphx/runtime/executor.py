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

An exception raised by a step (torch's, numpy's, a lowering's own) leaves the run as an
`EvaluationError` naming the instruction(s) the step computes (`main:@12 gather[axis=0] ...`)
and the ONNX node(s) they come from (`... (ONNX node 'g' Gather)`), with the original
exception as its `__cause__`: the same error the `ref` evaluator raises.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from pygraphx.ir.instruction import Instruction, merge_sources, with_sources
from pygraphx.ir.printer import instruction_names
from pygraphx.runtime.evaluator import EvaluationError

#: called with (instruction, its value, seconds it took) after each instruction runs
Observer = Callable[[Instruction, np.ndarray, float], None]
#: (instruction, the step computing it or None, the slot its value is in)
ProfileEntry = tuple[Instruction, Callable[[], None] | None, int]


class Executor:
    """Runs `steps` in order; see the module docstring."""

    __slots__ = ("steps", "bind", "collect", "profile", "show", "context", "computes")

    def __init__(
        self,
        steps: Sequence[Callable[[], None]],
        bind: Callable[[Mapping[str, np.ndarray]], None],
        collect: Callable[[], list[np.ndarray]],
        profile: Sequence[ProfileEntry] = (),
        show: Callable[[int], np.ndarray] | None = None,
        context: Callable[[], AbstractContextManager[Any]] | None = None,
        computes: Sequence[Sequence[Instruction]] = (),
    ) -> None:
        """`computes[k]`: the instructions step `k` computes (named when the step fails)."""
        self.steps = tuple(steps)
        self.bind = bind
        self.collect = collect
        self.profile = tuple(profile)
        self.show = show
        self.context = context or contextlib.nullcontext
        self.computes = tuple(computes)

    def run(
        self, params: Mapping[str, np.ndarray], observer: Observer | None = None
    ) -> list[np.ndarray]:
        """Run once; returns the outputs (arrays no later run overwrites)."""
        self.bind(params)
        with self.context():
            if observer is None:
                step = None
                try:
                    for step in self.steps:  # the loop costs nothing more for the naming
                        step()
                except EvaluationError:
                    raise
                except Exception as exc:  # re-raised with the instruction named, nothing lost
                    raise step_error(self._computed_by(step), exc) from exc
            else:
                self._run_profiled(observer)
            return self.collect()

    def _computed_by(self, step: Callable[[], None] | None) -> Sequence[Instruction]:
        """The instructions `step` (the one that failed) computes; () when unknown."""
        for k, candidate in enumerate(self.steps):
            if candidate is step:
                return self.computes[k] if k < len(self.computes) else ()
        return ()

    def _run_profiled(self, observer: Observer) -> None:
        show = self.show
        clock = time.perf_counter
        for ins, fn, slot in self.profile:
            start = clock()
            if fn is not None:
                try:
                    fn()
                except EvaluationError:
                    raise
                except Exception as exc:  # as in `run`
                    raise step_error([ins], exc) from exc
            elapsed = clock() - start if fn is not None else 0.0
            value = show(slot) if show is not None and slot >= 0 else None
            observer(ins, value, elapsed)

    def __len__(self) -> int:
        return len(self.steps)


def step_error(instructions: Sequence[Instruction], exc: BaseException) -> EvaluationError:
    """The error for a step computing `instructions` (the last one is its result) that raised
    `exc`: `main:@7 gather[axis=0] (computed with main:@6 ...): IndexError: ... (ONNX node
    'g' Gather)`, naming the ONNX nodes of all of them."""
    if not instructions:
        return EvaluationError(f"a step failed: {type(exc).__name__}: {exc}")
    ins = instructions[-1]
    label = _label(ins)
    head = f"{label} {ins.op}"
    if len(instructions) > 1:
        head += " (computed with " + ", ".join(_label(i) for i in instructions[:-1]) + ")"
    message = str(exc)
    sources = merge_sources(instructions)
    if message.startswith(label):  # the step's own message names it already
        return EvaluationError(with_sources(f"{type(exc).__name__}: {message}", sources))
    return EvaluationError(with_sources(f"{head}: {type(exc).__name__}: {message}", sources))


def _label(ins: Instruction) -> str:
    if ins.module is None:
        return ins.op.name
    return instruction_names(ins.module).get(id(ins), ins.op.name)
