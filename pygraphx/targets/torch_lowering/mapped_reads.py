"""The bytes of mapped model files that a lowered module reads at run time, copied out of them.

Weights parsed from a file are views of the mapped file (`onnx/mapped_model.py`). Most of them
are read only while lowering (packed into oneDNN / MKL layouts, uploaded to a device); the
rest, e.g. an embedding table a gather indexes, a bias an element-wise step adds, a weight a
numpy fallback reads, are read by the steps on every run. If the model file is rewritten in
place while the program lives, such a read would see other weights or, past the file's new end,
kill the process with SIGBUS. `detach_run_time_weights` finds those bytes and has
`ir/mapped.py`'s `detach_ranges` copy them into private memory at the same addresses, so the
steps, whatever they hold, keep reading the weights they were compiled with.

What a step reads is found from what its function holds: the tensors and arrays its closure,
defaults, generated globals, partial arguments, pygraphx objects and sub-graphs (the literals of
an If / Loop body a numpy fallback evaluates) reach, and, when it reaches
the value list `env`, the env slots of constants whose index appears among the integers it holds
(closure cells, containers, constants of its code: `env[7]` in generated source). Integers that
only look like such an index copy a weight more than needed, never less.
"""

from __future__ import annotations

import functools
import types
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pygraphx.ir.instruction import Instruction, reachable
from pygraphx.ir.mapped import any_mapped, array_span, detach_ranges
from pygraphx.ir.module import Module
from pygraphx.ir.program import Program
from pygraphx.ir.shape import Shape

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from pygraphx.targets.torch_lowering.context import LoweringContext

#: held objects not walked into: what they hold is not read by a step through them
_OPAQUE = (
    torch.Tensor, np.ndarray, str, bytes, bool, int, float, complex, type, types.ModuleType,
    types.BuiltinFunctionType, Instruction, Program, Shape, torch.dtype, torch.device,
)  # fmt: skip


def _span(x: Any) -> tuple[int, int] | None:
    """(address, nbytes) of the host memory a tensor or array views, else None."""
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu" or x.layout != torch.strided or x.is_mkldnn:
            return None
        storage = x.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    if isinstance(x, np.ndarray) and x.size:
        return array_span(x)
    return None


def _code_ints(code: types.CodeType) -> list[Any]:
    """The constants of `code` and of the functions defined in it (ints among them)."""
    return [c for c in code.co_consts if isinstance(c, (int, types.CodeType, tuple))]


def _function_parts(fn: types.FunctionType) -> list[Any]:
    parts: list[Any] = [*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values(), fn.__code__]
    for cell in fn.__closure__ or ():
        try:
            parts.append(cell.cell_contents)
        except ValueError:  # a cell not filled yet holds nothing
            continue
    if "__name__" not in fn.__globals__:  # source generated with exec: its bound names
        parts += list(fn.__globals__.values())
    return parts


def _children(stops: set[int]) -> Callable[[Any], Iterable[Any]]:
    """What a held object holds, for `reachable` (`stops`: ids not walked into)."""

    def children(x: Any) -> Iterable[Any]:
        if id(x) in stops or isinstance(x, _OPAQUE):
            return ()
        if isinstance(x, (list, tuple, set, frozenset)):
            return list(x)
        if isinstance(x, dict):
            return list(x.values())
        if isinstance(x, types.FunctionType):
            return _function_parts(x)
        if isinstance(x, Module):  # a sub-graph a step evaluates: its literals, its sub-graphs
            held = [i.get_literal().array for i in x.instructions if i.is_literal()]
            return held + [m for i in x.instructions for m in i.module_inputs]
        if isinstance(x, types.CodeType):
            return _code_ints(x)
        if isinstance(x, types.MethodType):
            return [x.__self__, x.__func__]
        if isinstance(x, functools.partial):
            return [x.func, *x.args, *x.keywords.values()]
        if type(x).__module__.startswith("pygraphx."):  # a plan object of a lowering
            held = list(getattr(x, "__dict__", {}).values())
            slots = getattr(type(x), "__slots__", ())
            return held + [getattr(x, s) for s in slots if hasattr(x, s)]
        return ()

    return children


def run_time_spans(ctx: LoweringContext, outputs: list[int]) -> list[tuple[int, int]]:
    """(address, nbytes) of the host memory the steps of `ctx` (and the outputs, copied out of
    `env` after each run) may read at run time (see the module docstring)."""
    consts = {i: s for i, t in enumerate(ctx.env) if ctx.const[i] and (s := _span(t)) is not None}
    spans = [consts[i] for i in outputs if i in consts]
    children = _children({id(ctx.env), id(ctx)})
    fns = [fn for step in ctx.steps for fn in [step.fn, *(s.fn for s in step.unfused or ())]]
    for fn in fns:
        ints: set[int] = set()
        reads_env = False
        for x in reachable([fn], children):
            if x is ctx.env or x is ctx:
                reads_env = True
            elif isinstance(x, int) and not isinstance(x, bool):
                ints.add(x)
            elif (span := _span(x)) is not None:
                spans.append(span)
        if reads_env:
            spans += [consts[i] for i in ints if i in consts]
    return spans


def detach_run_time_weights(ctx: LoweringContext, outputs: list[int]) -> int:
    """Copy the mapped-file bytes the lowered steps read at run time out of the file (see the
    module docstring); returns the bytes copied. Nothing to search when no model file is
    mapped in the process (a model parsed from bytes: 17 ms of ResNet-50's compile)."""
    if not any_mapped():
        return 0
    return detach_ranges(run_time_spans(ctx, outputs), "lowering")


__all__ = ["detach_run_time_weights", "run_time_spans"]
