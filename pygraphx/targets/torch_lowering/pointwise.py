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

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import CodeType
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

__all__ = [
    "NotTraceable",
    "Node",
    "Trace",
    "Tracer",
    "Value",
    "compile_group",
    "compiled_code",
    "trace_body",
]

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
    out_dtype = numpy_dtype(out.dtype)
    trace = _ending_in(trace, result, out_dtype)
    gen = _StepWriter(inputs, scratch, bindings, device or out.device, out_dtype)
    if out_expr is None:
        gen.ns["_out"] = out
    else:
        gen.lines.append(f"_out = {out_expr}")
    if aliased_input is not None:
        gen.busy["_out"] = ("in", aliased_input)
    last_use = _last_uses(trace.nodes)
    for j, n in enumerate(trace.nodes):
        gen.emit(j, n, last_use, is_last=j == len(trace.nodes) - 1)
    return gen.build()


def _ending_in(trace: Trace, result: Value, out_dtype: np.dtype) -> Trace:
    """`trace` whose last primitive computes `result`: where the result is an input, a constant
    or not the last primitive, a copy (`cast`) to the output's dtype is appended."""
    if result.kind == "node" and result.index == len(trace.nodes) - 1:
        return trace
    return Trace(trace.inputs, [*trace.nodes, Node("cast", [result, out_dtype], out_dtype)])


def _last_uses(nodes: Sequence[Node]) -> dict[tuple[str, int], int]:
    """For every input and node value: the index of the last primitive that reads it."""
    last_use: dict[tuple[str, int], int] = {}
    for j, n in enumerate(nodes):
        for a in n.args:
            if isinstance(a, Value) and a.kind in ("node", "in"):
                last_use[(a.kind, a.index)] = j
    return last_use


class _StepWriter:
    """Writes the straight-line step of one group: assigns registers (the output buffer `_out`
    or pooled scratch buffers `_s<k>`), names constants and functions in the namespace `ns`,
    and collects the generated lines."""

    def __init__(
        self,
        inputs: Sequence[str],
        scratch: Callable[[int, torch.dtype], torch.Tensor],
        bindings: dict[str, Any],
        device: torch.device,
        out_dtype: np.dtype,
    ) -> None:
        self.inputs = inputs
        self.scratch = scratch
        self.device = device
        self.out_dtype = out_dtype
        self.ns: dict[str, Any] = dict(bindings)
        self.lines: list[str] = []
        self.reg_of: dict[int, str] = {}  # node index -> the register holding its value
        self.busy: dict[str, tuple[str, int]] = {}  # register -> the value that occupies it
        self.free_scratch: dict[torch.dtype, list[str]] = {}
        self.n_scratch = 0
        self.fn_names: dict[str, str] = {}
        self.const_names: dict[int, str] = {}

    def emit(self, j: int, n: Node, last_use: dict[tuple[str, int], int], is_last: bool) -> None:
        """Append the call for primitive `j`."""
        operands = list(n.args)
        if n.fn in _COMMUTATIVE and _is_const(operands[0]) and not _is_const(operands[1]):
            operands.reverse()  # the constant second, where torch takes a Python scalar
        args = [self.expr(a, pos, n.fn) for pos, a in enumerate(operands)]
        # free the registers of values whose last use is this node (in-place is safe here)
        for a in n.args:
            if isinstance(a, Value) and a.kind in ("node", "in"):
                if last_use.get((a.kind, a.index)) == j:
                    self.release((a.kind, a.index))
        reg = self.register(n.dtype, is_last)
        self.busy[reg] = ("node", j)
        self.reg_of[j] = reg
        if n.fn not in self.fn_names:
            self.fn_names[n.fn] = f"_f_{n.fn}"
            self.ns[self.fn_names[n.fn]] = getattr(TORCH, n.fn)
        self.lines.append(f"{self.fn_names[n.fn]}({', '.join(args)}, out={reg})")

    def release(self, key: tuple[str, int]) -> None:
        for reg, holder in list(self.busy.items()):
            if holder == key:
                del self.busy[reg]
                if reg != "_out":
                    self.free_scratch.setdefault(self.ns[reg].dtype, []).append(reg)

    def register(self, dtype: np.dtype, is_last: bool) -> str:
        """The output buffer when it is free and of this dtype (always for the result), else a
        free scratch buffer of this dtype, else a new one."""
        if is_last or ("_out" not in self.busy and dtype == self.out_dtype):
            return "_out"
        dt = torch_dtype(dtype)
        pool = self.free_scratch.get(dt, [])
        if pool:
            return pool.pop()
        reg = f"_s{self.n_scratch}"
        self.ns[reg] = self.scratch(self.n_scratch, dt)
        self.n_scratch += 1
        return reg

    def expr(self, a: Any, pos: int, fn: str) -> str:
        """The Python expression for operand `a` at position `pos` of a call to `fn`."""
        if isinstance(a, Value):
            if a.kind == "in":
                return self.inputs[a.index]
            if a.kind == "node":
                return self.reg_of[a.index]
            return self.const_expr(a, pos, fn)
        if isinstance(a, np.dtype | type):
            return self.bind(f"_dt{len(self.ns)}", torch_dtype(a))
        return repr(a)

    def const_expr(self, a: Value, pos: int, fn: str) -> str:
        """A constant: a Python scalar where torch takes one, else a bound 0-d tensor."""
        dt = torch_dtype(a.dtype)
        if pos == 1 and fn in _SCALAR_OK:
            scalar = python_scalar(a.const, dt)
            if isinstance(scalar, float) and not math.isfinite(scalar):
                return self.bind(f"_k{len(self.ns)}", scalar)  # inf and nan have no literal
            return repr(scalar)
        key = id(a)
        if key not in self.const_names:
            value = torch.tensor(python_scalar(a.const, dt), dtype=dt, device=self.device)
            self.const_names[key] = self.bind(f"_c{len(self.const_names)}", value)
        return self.const_names[key]

    def bind(self, name: str, value: Any) -> str:
        self.ns[name] = value
        return name

    def build(self) -> Compiled:
        """Compile the collected lines into a closure over the bound names."""
        src = "def _make():\n"
        src += "".join(f"    {k} = _ns[{k!r}]\n" for k in self.ns)
        src += "    def step():\n"
        src += "".join(f"        {line}\n" for line in self.lines)
        src += "    return step\n"
        glb: dict[str, Any] = {"_ns": self.ns}
        exec(compiled_code(src, "<pygraphx pointwise>"), glb)  # noqa: S102 - our own code
        return Compiled(glb["_make"](), src)


@functools.lru_cache(maxsize=4096)
def compiled_code(src: str, filename: str) -> CodeType:
    """`compile(src, filename, "exec")`, once per process for each text: the steps of one
    network share a handful of sources (ResNet-50's 50 fused groups have 4), and compiling
    was 70 ms of MobileNetV2's compile. The code object is immutable; each `exec` of it makes
    new functions over the caller's own names."""
    return compile(src, filename, "exec")


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
