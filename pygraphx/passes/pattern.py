"""A small pattern language for rewrite rules: rules are declarations, not matching code.

A pattern describes an instruction tree. `op("mul", x, y)` matches a `mul` whose inputs match the
sub-patterns `x` and `y` (either way round for commutative ops: add, mul, max, min, equal, ...);
`any_("x")` matches anything and captures it as `x` (a name used twice must match the same
instruction, so `op("mul", any_("x"), op("sigmoid", any_("x")))` is x * sigmoid(x)); `const()`
matches a literal or a broadcast view of one, `scalar(v)` a constant whose elements all equal `v`
(within a relative tolerance when one is given). `.where(pred)` adds a predicate on the matched
instruction (`is_float`, `single_use`, `rank(n)` or any function of the instruction).

A `Rule(name, pattern, rewrite)` pairs a pattern with `rewrite(module, ins, captures)`, which
returns the replacement instruction or None (declined). A `RuleSet` applies its rules to a fixed
point; `PGX_TRACE_REWRITE=1` prints every rule as it fires. `passes/simplify_algebra.py` and
`passes/recognize_activations.py` are written in it; `passes/rules_example.py` is the file to
copy when adding rules.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from pygraphx.ir.instruction import Instruction, folded_sources
from pygraphx.ir.module import Module
from pygraphx.ir.printer import format_instruction, instruction_names
from pygraphx.passes.dead_code_elimination import dead_code_elimination

#: ops whose two inputs may be swapped
COMMUTATIVE = frozenset(["add", "mul", "max", "min", "equal", "logical_and", "logical_or"])
_BROADCASTS = ("multibroadcast", "broadcast")

Captures = dict[str, Instruction]
Predicate = Callable[[Instruction], bool]


# --- constants ------------------------------------------------------------------------------
def const_value(ins: Instruction) -> np.ndarray | None:
    """The value of a literal or of a broadcast view of one, else None."""
    if ins.is_literal():
        return ins.get_literal().array
    if ins.op.name in _BROADCASTS and ins.inputs[0].is_literal():
        return ins.op.compute(ins.shape, [ins.inputs[0].get_literal().array])
    return None


def const_source(ins: Instruction) -> Instruction:
    """The literal behind a constant (itself, or the literal a broadcast views)."""
    return ins.inputs[0] if ins.op.name in _BROADCASTS else ins


def scalar_value(ins: Instruction) -> float | None:
    """The single value of a constant whose elements are all equal, else None."""
    src = const_source(ins)
    if not src.is_literal():
        return None
    arr = src.get_literal().array
    if arr.size == 0:
        return None
    first = arr.reshape(-1)[0]
    if arr.size > 1 and not np.all(arr == first):
        return None
    return first.item()


# --- predicates -----------------------------------------------------------------------------
def is_float(ins: Instruction) -> bool:
    return np.issubdtype(ins.shape.dtype(), np.floating) or ins.shape.type() == "bf16_type"


def single_use(ins: Instruction) -> bool:
    return len(ins.outputs) == 1


def rank(n: int) -> Predicate:
    return lambda ins: ins.shape.ndim() == n


# --- patterns -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pat:
    """One node of a pattern; build them with `op`, `any_`, `const` and `scalar`."""

    ops: frozenset[str] | None = None  # None: any op
    inputs: tuple[Pat, ...] | None = None  # None: inputs are not looked at
    capture: str | None = None
    preds: tuple[Predicate, ...] = ()
    commutative: bool = False

    def named(self, capture: str) -> Pat:
        """The same pattern, capturing what it matches as `capture`."""
        return Pat(self.ops, self.inputs, capture, self.preds, self.commutative)

    def where(self, *preds: Predicate) -> Pat:
        """The same pattern, with predicates on the matched instruction."""
        return Pat(self.ops, self.inputs, self.capture, self.preds + preds, self.commutative)

    def match(self, ins: Instruction, caps: Captures | None = None) -> Iterator[Captures]:
        """Every way `ins` matches (commutative inputs give up to two), as captures."""
        caps = {} if caps is None else caps
        if self.ops is not None and ins.op.name not in self.ops:
            return
        if self.capture is not None:
            bound = caps.get(self.capture)
            if bound is not None and bound is not ins:
                return
        if not all(p(ins) for p in self.preds):
            return
        if self.capture is not None:
            caps = {**caps, self.capture: ins}
        if self.inputs is None:
            yield caps
            return
        if len(ins.inputs) != len(self.inputs):
            return
        orders = [ins.inputs]
        if self.commutative and len(ins.inputs) == 2 and ins.inputs[0] is not ins.inputs[1]:
            orders.append(ins.inputs[::-1])
        for order in orders:
            yield from _match_all(self.inputs, order, caps)


def _match_all(pats: Sequence[Pat], inss: Sequence[Instruction], caps: Captures):
    if not pats:
        yield caps
        return
    for got in pats[0].match(inss[0], caps):
        yield from _match_all(pats[1:], inss[1:], got)


def op(names: str | Sequence[str], *inputs: Pat, capture: str | None = None) -> Pat:
    """An instruction of op `names` (one name or several) with inputs matching `inputs`
    (no inputs given: any inputs)."""
    ops = frozenset([names] if isinstance(names, str) else names)
    commutative = bool(inputs) and ops <= COMMUTATIVE
    return Pat(ops, tuple(inputs) if inputs else None, capture, (), commutative)


def any_(capture: str | None = None) -> Pat:
    """Any instruction (captured as `capture`)."""
    return Pat(capture=capture)


def const(capture: str | None = None) -> Pat:
    """A constant: a literal or a broadcast view of one."""
    return Pat(capture=capture, preds=(lambda i: const_value(i) is not None,))


def scalar(value: float, capture: str | None = None, rtol: float = 0.0) -> Pat:
    """A constant whose elements all equal `value` (to `rtol` when given)."""

    def pred(ins: Instruction) -> bool:
        v = scalar_value(ins)
        if v is None:
            return False
        return v == value if rtol == 0 else bool(abs(v - value) <= rtol * abs(value))

    return Pat(capture=capture, preds=(pred,))


# --- rules ----------------------------------------------------------------------------------
Rewrite = Callable[[Module, Instruction, Captures], Instruction | None]


@dataclass(frozen=True)
class Rule:
    """`pattern` -> `rewrite(module, ins, captures)`; `name` is what traces and tests call it."""

    name: str
    pattern: Pat
    rewrite: Rewrite

    def apply(self, module: Module, ins: Instruction) -> Instruction | None:
        """The replacement of `ins`, trying every match of the pattern, or None."""
        for caps in self.pattern.match(ins):
            rep = self.rewrite(module, ins, caps)
            if rep is not None and rep is not ins:
                return rep
        return None


@dataclass
class RuleSet:
    """Rules applied to a fixed point, the rules of an op in the order given."""

    name: str
    rules: list[Rule]
    max_sweeps: int = 8
    _by_op: dict[str | None, list[Rule]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for rule in self.rules:
            for key in rule.pattern.ops or (None,):
                self._by_op.setdefault(key, []).append(rule)

    def rules_for(self, op_name: str) -> list[Rule]:
        return self._by_op.get(op_name, []) + self._by_op.get(None, [])

    def sweep(self, module: Module) -> bool:
        """One sweep over `module`; True when a rule fired."""
        trace = os.environ.get("PGX_TRACE_REWRITE", "") not in ("", "0")
        changed = False
        for ins in list(module.instructions):
            if not ins.outputs or ins.module is not module:
                continue
            for rule in self.rules_for(ins.op.name):
                rep = rule.apply(module, ins)
                if rep is None:
                    continue
                if trace:
                    line = f"rewrite: {self.name}.{rule.name}: {_describe(module, ins, rep)}"
                    print(line, file=sys.stderr)
                if not rep.outputs:  # made by the rewrite: it computes what the match folds
                    rep.source = tuple(dict.fromkeys((*folded_sources(ins), *rep.source)))
                module.replace_instruction(ins, rep)
                changed = True
                break
        dead_code_elimination(module)
        return changed

    def apply(self, module: Module) -> int:
        """Sweep to a fixed point (at most `max_sweeps`); returns the number of sweeps."""
        for k in range(self.max_sweeps):
            if not self.sweep(module):
                return k + 1
        return self.max_sweeps


def _describe(module: Module, ins: Instruction, rep: Instruction) -> str:
    names = instruction_names(module)
    return f"{format_instruction(ins, names)}  =>  {names.get(id(rep), '?')} = {rep.op}"
