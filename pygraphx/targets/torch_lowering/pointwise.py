"""Fused element-wise groups as generated Python over torch: one step per `pointwise` group.

A group's body (a sub-module of `Pointwise` instructions) is traced once into a flat list of
handler primitives (`add`, `exp`, `where`, ...) with constants folded, by the torch-free tracer
of `pygraphx.codegen.trace` (the description the Triton generator compiles too). Registers are
then assigned: the result and every temporary of the output's dtype go to the output buffer
itself whenever it is free (the first primitive writes it with `out=`, later ones update it in
place), other temporaries to pooled scratch buffers, each reused as soon as its value is dead.
Finally a small Python function calling the torch handler's functions with `out=` is generated
and compiled, so a run executes straight-line torch calls with no per-primitive dispatch or
allocation. Activation operators (`ops/activation.py`) that the torch handler runs natively
(`gelu`, `silu`, ...) are traced as one primitive each, so torch makes one pass over memory for
them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pygraphx.codegen import trace as _codegen_trace
from pygraphx.codegen.trace import Node, NotTraceable, Trace, Tracer, Value
from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ops.activation import NATIVE_ACTIVATIONS
from pygraphx.targets.torch_lowering.dtypes import (
    computable,
    numpy_dtype,
    python_scalar,
    torch_dtype,
)
from pygraphx.targets.torch_lowering.handler import TORCH, TorchOps

__all__ = ["NotTraceable", "Node", "Trace", "Tracer", "Value", "trace_body", "compile_group"]

# activations the torch handler runs natively: traced as one primitive each
NATIVE = frozenset(n for n in NATIVE_ACTIVATIONS if hasattr(TorchOps, n))


def trace_body(
    body: Module,
    stop: Instruction | None = None,
    consts: dict[int, np.ndarray] | None = None,
    reductions: bool = False,
) -> tuple[Trace, Value]:
    """`codegen.trace.trace_body` with torch's native activations kept whole."""
    return _codegen_trace.trace_body(body, stop, consts, reductions, native=NATIVE)


# the scalar forms torch takes
_SCALAR_OK = frozenset(
    "add sub mul div pow fmod mod equal less greater less_equal greater_equal".split()
)


_COMMUTATIVE = frozenset(["add", "mul", "equal"])


def _is_const(a: Any) -> bool:
    return isinstance(a, Value) and a.kind == "const"


def traceable_dtypes(trace: Trace) -> bool:
    dts = [v.dtype for v in trace.inputs] + [n.dtype for n in trace.nodes]
    return all(computable(d) for d in dts)


# --- code generation ------------------------------------------------------------------------


@dataclass
class Compiled:
    """A generated step: `fn()` runs the group; `source` is the generated code (for tracing)."""

    fn: Callable[[], None]
    source: str


def compile_group(
    trace: Trace,
    result: Value,
    inputs: Sequence[str],
    out: torch.Tensor,
    scratch: Callable[[int, torch.dtype], torch.Tensor],
    bindings: dict[str, Any],
    aliased_input: int | None = None,
    out_expr: str | None = None,
    device: torch.device | None = None,
) -> Compiled:
    """Generate the step that computes `result` into `out`.

    `inputs[k]` is the Python expression that reads input k at run time (bound names come from
    `bindings`); `scratch(k, dtype)` gives the k-th temporary buffer. `aliased_input`: an input
    that lives in `out` itself (a producer wrote it there), so `out` is busy until its last use.
    `out_expr`: the output is the tensor this expression reads at run time (shaped like `out`,
    which may then be a meta tensor; `device` says where constants go).
    """
    device = device or out.device
    out_dtype = numpy_dtype(out.dtype)
    if result.kind != "node" or (result.kind == "node" and result.index != len(trace.nodes) - 1):
        # the result is an input or a constant (or not the last primitive): end with a copy
        trace = Trace(trace.inputs, list(trace.nodes))
        trace.nodes.append(Node("cast", [result, out_dtype], out_dtype))
        result = Value("node", out_dtype, index=len(trace.nodes) - 1)
    nodes = trace.nodes
    last_use: dict[tuple[str, int], int] = {}
    for j, n in enumerate(nodes):
        for a in n.args:
            if isinstance(a, Value) and a.kind in ("node", "in"):
                last_use[(a.kind, a.index)] = j
    ns: dict[str, Any] = dict(bindings)
    lines: list[str] = []
    if out_expr is None:
        ns["_out"] = out
    else:
        lines.append(f"_out = {out_expr}")
    # register file: "out" or ("s", k); which value occupies it
    reg_of: dict[int, str] = {}
    busy: dict[str, tuple[str, int]] = {}
    if aliased_input is not None:
        busy["_out"] = ("in", aliased_input)
    free_scratch: dict[torch.dtype, list[str]] = {}
    n_scratch = 0
    fn_names: dict[str, str] = {}
    const_names: dict[int, str] = {}

    def expr(a: Any, pos: int, fn: str) -> str:
        if isinstance(a, Value):
            if a.kind == "in":
                return inputs[a.index]
            if a.kind == "node":
                return reg_of[a.index]
            # a constant: a Python scalar where torch takes one, else a 0-d tensor
            dt = torch_dtype(a.dtype)
            if pos == 1 and fn in _SCALAR_OK:
                scalar = python_scalar(a.const, dt)
                if isinstance(scalar, float) and not math.isfinite(scalar):
                    name = f"_k{len(ns)}"  # inf and nan have no literal: bind them
                    ns[name] = scalar
                    return name
                return repr(scalar)
            key = id(a)
            if key not in const_names:
                name = f"_c{len(const_names)}"
                ns[name] = torch.tensor(python_scalar(a.const, dt), dtype=dt, device=device)
                const_names[key] = name
            return const_names[key]
        if isinstance(a, np.dtype | type):
            name = f"_dt{len(ns)}"
            ns[name] = torch_dtype(a)
            return name
        return repr(a)

    for j, n in enumerate(nodes):
        # free the registers of values whose last use is this node (in-place is safe here)
        dying = [
            (a.kind, a.index)
            for a in n.args
            if isinstance(a, Value)
            and a.kind in ("node", "in")
            and last_use.get((a.kind, a.index)) == j
        ]
        operands = list(n.args)
        if n.fn in _COMMUTATIVE and _is_const(operands[0]) and not _is_const(operands[1]):
            operands.reverse()  # the constant second, where torch takes a Python scalar
        args = [expr(a, pos, n.fn) for pos, a in enumerate(operands)]
        for key in dying:
            for reg, holder in list(busy.items()):
                if holder == key:
                    del busy[reg]
                    if reg != "_out":
                        free_scratch.setdefault(_scratch_dtype(reg, ns), []).append(reg)
        dt = torch_dtype(n.dtype)
        if j == len(nodes) - 1 or ("_out" not in busy and n.dtype == out_dtype):
            reg = "_out"
        else:
            pool = free_scratch.get(dt, [])
            if pool:
                reg = pool.pop()
            else:
                reg = f"_s{n_scratch}"
                ns[reg] = scratch(n_scratch, dt)
                n_scratch += 1
        busy[reg] = ("node", j)
        reg_of[j] = reg
        if n.fn not in fn_names:
            fn_names[n.fn] = f"_f_{n.fn}"
            ns[fn_names[n.fn]] = getattr(TORCH, n.fn)
        call = f"{fn_names[n.fn]}({', '.join(args)}, out={reg})"
        lines.append(call)
    src = "def _make():\n"
    src += "".join(f"    {k} = _ns[{k!r}]\n" for k in ns)
    src += "    def step():\n"
    src += "".join(f"        {line}\n" for line in lines)
    src += "    return step\n"
    glb: dict[str, Any] = {"_ns": ns}
    exec(compile(src, "<pygraphx pointwise>", "exec"), glb)  # noqa: S102 - our own generated code
    return Compiled(glb["_make"](), src)


def _scratch_dtype(reg: str, ns: dict[str, Any]) -> torch.dtype:
    return ns[reg].dtype


def peel_add(
    trace: Trace, result: Value, k: int, candidates: set[int]
) -> tuple[Trace, Value, int] | None:
    """Take `add(input k, input b)` out of the trace (b in `candidates`, input k used only
    there): the producer of input k adds b itself (a GEMM's bias). Returns the trace with that
    add replaced by input k, its result, and b."""
    uses = [
        (j, n)
        for j, n in enumerate(trace.nodes)
        for a in n.args
        if isinstance(a, Value) and a.kind == "in" and a.index == k
    ]
    if len(uses) != 1 or uses[0][1].fn != "add" or len(uses[0][1].args) != 2:
        return None
    j, node = uses[0]
    x, y = node.args
    other = y if (isinstance(x, Value) and x.kind == "in" and x.index == k) else x
    if not isinstance(other, Value) or other.kind != "in" or other.index not in candidates:
        return None
    if other.index == k or node.dtype != trace.inputs[k].dtype:
        return None
    remap: dict[int, Value] = {j: trace.inputs[k]}
    nodes: list[Node] = []

    def sub(a: Any) -> Any:
        return remap[a.index] if isinstance(a, Value) and a.kind == "node" else a

    for jj, n in enumerate(trace.nodes):
        if jj == j:
            continue
        nodes.append(Node(n.fn, [sub(a) for a in n.args], n.dtype))
        remap[jj] = Value("node", n.dtype, index=len(nodes) - 1)
    return Trace(trace.inputs, nodes), sub(result), other.index
