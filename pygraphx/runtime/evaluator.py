"""The reference evaluator: walks a module in order and runs each operator's numpy `compute()`.

Used by the `ref` target and by the frontend to fold constant sub-graphs. Each result is checked
against the instruction's shape (lens and type), so an operator whose compute disagrees with its
compute_shape is caught at the instruction that did it; errors also name the ONNX node(s) the
instruction comes from (`Instruction.source`). Intermediate values are dropped after
their last use so large models run in bounded memory.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np

from pygraphx.ir.instruction import Instruction, with_sources
from pygraphx.ir.module import Module

#: called with (instruction, its value, seconds it took) after each instruction runs
Observer = Callable[[Instruction, np.ndarray, float], None]


class EvaluationError(RuntimeError):
    """An instruction failed or produced a value that does not match its shape."""


class Evaluator:
    """Runs one module with numpy; `run(params)` returns the module's outputs."""

    def __init__(self, module: Module) -> None:
        self.module = module
        self.instructions = list(module.instructions)
        last_use: dict[int, int] = {}
        for k, ins in enumerate(self.instructions):
            for i in ins.inputs:
                last_use[id(i)] = k
        self.returns = module.get_returns()
        # values whose lens are only bounded by their shape (downstream of data-dependent ops)
        self.bounded: set[int] = set()
        for ins in self.instructions:
            if ins.op.data_dependent or any(id(i) in self.bounded for i in ins.inputs):
                self.bounded.add(id(ins))
        keep = {id(i) for i in self.returns}
        # for each step, the instructions whose values can be dropped after it
        self.release: list[list[Instruction]] = [[] for _ in self.instructions]
        for ins in self.instructions:
            idx = last_use.get(id(ins))
            if idx is not None and id(ins) not in keep:
                self.release[idx].append(ins)

    def run(
        self,
        params: Mapping[str, np.ndarray],
        outer: Mapping[int, np.ndarray] | None = None,
        observer: Observer | None = None,
    ) -> list[np.ndarray]:
        """Evaluate the module; `observer(ins, value, seconds)` sees every instruction's result
        and time (profiling, PGX_TRACE_EVAL, per-instruction verification)."""
        values: dict[int, np.ndarray] = dict(outer or {})
        for k, ins in enumerate(self.instructions):
            if ins.is_return():
                break
            if observer is None:
                values[id(ins)] = self._step(ins, params, values)
            else:
                start = time.perf_counter()
                value = self._step(ins, params, values)
                observer(ins, value, time.perf_counter() - start)
                values[id(ins)] = value
            for dead in self.release[k]:
                values.pop(id(dead), None)
        return [values[id(i)] for i in self.returns]

    def _step(
        self, ins: Instruction, params: Mapping[str, np.ndarray], values: dict[int, np.ndarray]
    ) -> np.ndarray:
        op = ins.op
        if ins.is_param():
            try:
                return params[op.parameter]
            except KeyError:
                raise EvaluationError(f"missing parameter {op.parameter!r}") from None
        args = [values[id(i)] for i in ins.inputs]
        try:
            if ins.module_inputs:
                out = op.compute_with_modules(ins.shape, args, ins.module_inputs, values, Evaluator)
            else:
                out = op.compute(ins.shape, args)
        except EvaluationError as exc:  # from a sub-module: its nodes, else this one's
            exc.args = (with_sources(str(exc), ins.source), *exc.args[1:])
            raise
        except Exception as exc:  # re-raised with the instruction named, nothing lost
            raise self._error(ins, f"{type(exc).__name__}: {exc}") from exc
        out = np.asarray(out)
        expected = ins.shape
        if id(ins) in self.bounded:
            fits = out.ndim == expected.ndim() and all(
                n <= m for n, m in zip(out.shape, expected.lens(), strict=True)
            )
            if not fits or out.dtype != expected.dtype():
                raise self._error(
                    ins, f"computed {out.dtype}{list(out.shape)} outside its bound {expected}"
                )
            return out
        if list(out.shape) != expected.lens() or out.dtype != expected.dtype():
            raise self._error(
                ins, f"computed {out.dtype}{list(out.shape)} but its shape is {expected}"
            )
        return out

    def _error(self, ins: Instruction, what: str) -> EvaluationError:
        """`main:@7 gather[axis=0]: <what> (ONNX node 'g' Gather)`."""
        where = f"{self.module.name}:@{self.module.position(ins)} {ins.op}"
        return EvaluationError(with_sources(f"{where}: {what}", ins.source))


def evaluate(module: Module, params: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run `module` once with the reference semantics."""
    return Evaluator(module).run(params)
