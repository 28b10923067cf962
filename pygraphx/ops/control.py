"""Control flow: `if`, `loop` and `scan`, whose bodies are sub-modules of the program.

The ONNX frontend (onnx/handlers/control.py) parses each sub-graph into a module named like
MIGraphX's (`main:if0_then`, `main:loop0_body`, ...). An instruction carries its bodies as
`module_inputs`; the operators hold no modules themselves, so programs save and load like any
other. Sub-module instructions read values of the enclosing modules directly; the frontend also
lists those captured values as trailing inputs of the control instruction, so that every pass
and the evaluators that reason about liveness and order (schedule, memory_coloring, the
evaluator's release of dead values) see them without knowing about sub-modules.

The IR is tensor-only (no tuple shapes), so a node with several outputs becomes one instruction
per output, `if[output=k]`, all sharing the same bodies. In the reference evaluator the first
of them to run stores every output in the evaluator's value map, keyed by the body and checked
against the very same argument arrays, and its siblings take theirs from there instead of
running the body again (a cache local to one evaluation; nothing outlives the run).

Semantics (ONNX's, with static shapes):
  if    (cond, captured...)                    [then, else]: both bodies return the same shapes.
  loop  (trip_count, cond, v_init..., captured...)   [body]: body(iter, cond, v...) ->
        (cond, v..., scan...). Loop-carried values keep their shapes; scan outputs are stacked
        along a new axis 0 of static length `max_iterations` (the frontend says how it is
        chosen); when a run stops early the rows after the last iteration are zero, as in
        MIGraphX, and a run that needs more rows fails with an error.
  scan  (state_init..., scan_in..., captured...)      [body]: body(state..., slice...) ->
        (state..., scan_out...), with per-input axes and directions (opset 9); `batched` is the
        opset-8 form whose inputs and outputs all have a leading batch axis.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from pygraphx.ir.shape import Shape
from pygraphx.ops.base import BodyCall, ModuleOp, Op, ShapeError, register_op

_STASH = "pygraphx.control"


def _all_outputs(call: BodyCall, compute: Callable[[], list[np.ndarray]]) -> list[np.ndarray]:
    """Every output of a multi-output control node, computed once per evaluation (see the
    module docstring): sibling instructions get the same argument objects in one run."""
    args, outer = call.args, call.outer
    key = (_STASH, id(call.modules[0]))
    entry = outer.get(key) if isinstance(outer, MutableMapping) else None  # type: ignore[call-overload]
    if entry is not None:
        old_args, results = entry
        if len(old_args) == len(args) and all(a is b for a, b in zip(old_args, args, strict=True)):
            return results
    results = compute()
    if isinstance(outer, MutableMapping):
        outer[key] = (list(args), results)  # type: ignore[index]
    return results


def _single_bool(op: Op, s: Shape, what: str) -> None:
    if s.type() != "bool_type" or s.elements() != 1:
        raise ShapeError(f"{op.name}: {what} must be one bool value, got {s}")


def _same(a: Shape, b: Shape) -> bool:
    return a.lens() == b.lens() and a.type() == b.type()


def _scalar(x: np.ndarray) -> Any:
    arr = np.asarray(x)
    if arr.size != 1:
        raise ValueError(f"expected a single value, got an array of shape {list(arr.shape)}")
    return arr.reshape(-1)[0]


def _check_modules(op: Op, modules: Sequence[Any], count: int) -> None:
    if len(modules) != count:
        raise ShapeError(f"{op.name}: needs {count} sub-module(s), got {len(modules)}")


@register_op
class If(ModuleOp):
    """Output `output` of the branch `cond` selects (inputs: cond, then captured values)."""

    name = "if"
    output: int = 0

    def compute_shape(self, inputs: Sequence[Shape], modules: Sequence[Any] = ()) -> Shape:
        _check_modules(self, modules, 2)
        if not inputs:
            raise ShapeError("if: needs the condition as its first input")
        _single_bool(self, inputs[0], "the condition")
        then_s, else_s = modules[0].get_output_shapes(), modules[1].get_output_shapes()
        if len(then_s) != len(else_s):
            raise ShapeError(
                f"if: {modules[0].name} returns {len(then_s)} values, "
                f"{modules[1].name} returns {len(else_s)}"
            )
        for k, (a, b) in enumerate(zip(then_s, else_s, strict=True)):
            if not _same(a, b):
                raise ShapeError(
                    f"if: output {k} is {a} in {modules[0].name} but {b} in {modules[1].name}"
                )
        if not 0 <= self.output < len(then_s):
            raise ShapeError(f"if: output {self.output} of {len(then_s)}")
        return then_s[self.output].as_standard()

    def evaluate(self, call: BodyCall) -> np.ndarray:
        def compute() -> list[np.ndarray]:
            branch = call.modules[0] if bool(_scalar(call.args[0])) else call.modules[1]
            return [np.array(r, order="C") for r in call.run(branch, [])]

        return _all_outputs(call, compute)[self.output]


@register_op
class Loop(ModuleOp):
    """ONNX Loop: inputs (trip_count, cond, v_init..., captured...); body (iter, cond, v...) ->
    (cond, v..., scan...). Output k < N is the final v[k], else scan output k - N stacked along
    a new axis 0 of static length `max_iterations`."""

    name = "loop"
    max_iterations: int = 0
    output: int = 0

    def _layout(self, modules: Sequence[Any]) -> tuple[int, int]:
        body = modules[0]
        n = len(body.get_parameters()) - 2
        k = len(body.get_output_shapes()) - 1 - n
        if n < 0 or k < 0:
            raise ShapeError(
                f"loop: body {body.name} needs parameters (iter, cond, v...) and returns "
                f"(cond, v..., scan...)"
            )
        return n, k

    def compute_shape(self, inputs: Sequence[Shape], modules: Sequence[Any] = ()) -> Shape:
        _check_modules(self, modules, 1)
        body = modules[0]
        n, k = self._layout(modules)
        if len(inputs) < 2 + n:
            raise ShapeError(f"loop: {len(inputs)} inputs for {n} loop-carried values")
        m = inputs[0]
        if m.type() != "int64_type" or m.elements() != 1:
            raise ShapeError(f"loop: the trip count must be one int64 value, got {m}")
        _single_bool(self, inputs[1], "the condition")
        params = body.get_parameters()
        outs = body.get_output_shapes()
        _single_bool(self, outs[0], "the body's condition output")
        for j in range(n):
            init, param, out = inputs[2 + j], params[2 + j].shape, outs[1 + j]
            if not (_same(init, param) and _same(param, out)):
                raise ShapeError(
                    f"loop: loop-carried value {j} is {init} initially, {param} in the body "
                    f"and {out} after an iteration; they must agree"
                )
        if not 0 <= self.output < n + k:
            raise ShapeError(f"loop: output {self.output} of {n + k}")
        if self.output < n:
            return inputs[2 + self.output].as_standard()
        if self.max_iterations < 0:
            raise ShapeError(f"loop: max_iterations {self.max_iterations} is negative")
        s = outs[1 + self.output]
        return Shape(s.type(), [self.max_iterations] + s.lens())

    def evaluate(self, call: BodyCall) -> np.ndarray:
        args, body = call.args, call.modules[0]
        n, k = self._layout(call.modules)

        def compute() -> list[np.ndarray]:
            params = body.get_parameters()
            names = [p.op.parameter for p in params]
            iter_lens, cond_lens = params[0].shape.lens(), params[1].shape.lens()
            outs = body.get_output_shapes()
            length = self.max_iterations
            scans = [np.zeros([length] + s.lens(), dtype=s.dtype()) for s in outs[1 + n :]]
            trip = int(_scalar(args[0]))
            cond = bool(_scalar(args[1]))
            carried = list(args[2 : 2 + n])
            body_evaluator = call.evaluator(body)
            i = 0
            while i < trip and cond:
                if k and i >= length:
                    raise RuntimeError(
                        f"loop: iteration {i + 1} needs row {i} of the scan outputs, which "
                        f"have {length} rows (their static length, fixed at parse time); "
                        "parse with a larger max_loop_iterations"
                    )
                bound = [np.full(iter_lens, i, dtype=np.int64), np.full(cond_lens, cond)]
                res = body_evaluator.run(
                    dict(zip(names, bound + carried, strict=True)), outer=call.outer
                )
                cond = bool(_scalar(res[0]))
                carried = list(res[1 : 1 + n])
                for s, r in zip(scans, res[1 + n :], strict=True):
                    s[i] = r
                i += 1
            return [np.array(c, order="C") for c in carried] + scans

        return _all_outputs(call, compute)[self.output]


def _norm(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"scan: {what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


@register_op
class Scan(ModuleOp):
    """ONNX Scan: inputs (state_init..., scan_in..., captured...); body (state..., slice...) ->
    (state..., scan_out...). Opset-8 models set `batched` (a leading batch axis everywhere)."""

    name = "scan"
    num_scan_inputs: int = 0
    scan_input_axes: tuple[int, ...] = ()
    scan_input_directions: tuple[int, ...] = ()
    scan_output_axes: tuple[int, ...] = ()
    scan_output_directions: tuple[int, ...] = ()
    batched: bool = False
    output: int = 0

    def _layout(self, inputs: Sequence[Shape], modules: Sequence[Any]) -> tuple[int, int, int]:
        """(states, scan outputs, sequence length)."""
        _check_modules(self, modules, 1)
        body = modules[0]
        m = self.num_scan_inputs
        n = len(body.get_parameters()) - m
        k = len(body.get_output_shapes()) - n
        if n < 0 or k < 0 or m < 1:
            raise ShapeError(f"scan: body {body.name} does not fit {m} scan inputs")
        if len(inputs) < n + m:
            raise ShapeError(f"scan: {len(inputs)} inputs for {n} states and {m} scan inputs")
        for name, values, count in (
            ("scan_input_axes", self.scan_input_axes, m),
            ("scan_input_directions", self.scan_input_directions, m),
            ("scan_output_axes", self.scan_output_axes, k),
            ("scan_output_directions", self.scan_output_directions, k),
        ):
            if len(values) != count:
                raise ShapeError(f"scan: {name} has {len(values)} entries, needs {count}")
        lengths = set()
        for j in range(m):
            s = inputs[n + j].lens()[1:] if self.batched else inputs[n + j].lens()
            lengths.add(s[_norm(self.scan_input_axes[j], len(s), "scan input axis")])
        if len(lengths) != 1:
            raise ShapeError(f"scan: scan inputs have different lengths {sorted(lengths)}")
        return n, k, lengths.pop()

    def compute_shape(self, inputs: Sequence[Shape], modules: Sequence[Any] = ()) -> Shape:
        n, k, length = self._layout(inputs, modules)
        body = modules[0]
        params = body.get_parameters()
        outs = body.get_output_shapes()
        batch = [inputs[0].lens()[0]] if self.batched and inputs else []
        for j in range(n + self.num_scan_inputs):
            lens = inputs[j].lens()
            if self.batched:
                if not lens or lens[0] != batch[0]:
                    raise ShapeError(f"scan: input {j} ({inputs[j]}) lacks batch axis {batch}")
                lens = lens[1:]
            if j >= n:
                lens.pop(_norm(self.scan_input_axes[j - n], len(lens), "scan input axis"))
            if lens != params[j].shape.lens() or inputs[j].type() != params[j].shape.type():
                raise ShapeError(f"scan: input {j} ({inputs[j]}) does not fit {params[j].shape}")
        for j in range(n):
            if not _same(params[j].shape, outs[j]):
                raise ShapeError(
                    f"scan: state {j} is {params[j].shape} but the body gives {outs[j]}"
                )
        if not 0 <= self.output < n + k:
            raise ShapeError(f"scan: output {self.output} of {n + k}")
        if self.output < n:
            return Shape(outs[self.output].type(), batch + outs[self.output].lens())
        s = outs[self.output]
        lens = s.lens()
        axis = _norm(self.scan_output_axes[self.output - n], len(lens) + 1, "scan output axis")
        lens.insert(axis, length)
        return Shape(s.type(), batch + lens)

    def evaluate(self, call: BodyCall) -> np.ndarray:
        args, body = call.args, call.modules[0]
        shapes = [Shape(a.dtype, a.shape) for a in args]
        n, k, length = self._layout(shapes, call.modules)
        m = self.num_scan_inputs

        def one(states: list[np.ndarray], xs: list[np.ndarray]) -> list[np.ndarray]:
            names = body.get_parameter_names()
            body_evaluator = call.evaluator(body)
            axes = [
                _norm(a, x.ndim, "scan input axis")
                for a, x in zip(self.scan_input_axes, xs, strict=True)
            ]
            per_step: list[list[np.ndarray]] = [[] for _ in range(k)]
            for t in range(length):
                slices = [
                    np.take(x, length - 1 - t if d else t, axis=a)
                    for x, a, d in zip(xs, axes, self.scan_input_directions, strict=True)
                ]
                res = body_evaluator.run(
                    dict(zip(names, states + slices, strict=True)), outer=call.outer
                )
                states = list(res[:n])
                for acc, r in zip(per_step, res[n:], strict=True):
                    acc.append(np.asarray(r))
            outs = [np.array(s, order="C") for s in states]
            body_outs = body.get_output_shapes()[n:]
            for j, (acc, s) in enumerate(zip(per_step, body_outs, strict=True)):
                if self.scan_output_directions[j]:
                    acc.reverse()
                axis = _norm(self.scan_output_axes[j], s.ndim() + 1, "scan output axis")
                if acc:
                    outs.append(np.stack(acc, axis=axis))
                else:
                    lens = s.lens()
                    lens.insert(axis, 0)
                    outs.append(np.zeros(lens, dtype=s.dtype()))
            return outs

        def compute() -> list[np.ndarray]:
            states, xs = list(args[:n]), list(args[n : n + m])
            if not self.batched:
                return one(states, xs)
            batch = args[0].shape[0]
            if batch == 0:
                return [
                    np.zeros(s.lens(), dtype=s.dtype())
                    for s in (
                        replace(self, output=j).compute_shape(shapes, call.modules)
                        for j in range(n + k)
                    )
                ]
            per_batch = [one([s[b] for s in states], [x[b] for x in xs]) for b in range(batch)]
            return [np.stack([r[j] for r in per_batch]) for j in range(n + k)]

        return _all_outputs(call, compute)[self.output]
