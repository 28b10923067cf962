"""An example rule file: copy it to add rewrite rules (it is not in the optimise pipeline).

A rule is three things:
1. the algebra, as a comment: `exp(x) * exp(y) -> exp(x + y)`;
2. a pattern (pattern.py): `op(name, *inputs)` with sub-patterns, `any_("x")` to capture a value,
   `const("c")` / `scalar(1.0)` for constants, `.where(pred)` for shape/dtype conditions;
   add, mul, max, min are commutative and match either way round;
3. a rewrite `(module, ins, captures) -> Instruction | None`: insert the new instructions before
   `ins` and return the one that replaces it, or None to decline (the next rule is tried).

Put the rules in a `RuleSet(name, [...])`; `RuleSet.apply(module)` runs them to a fixed point,
`PGX_TRACE_REWRITE=1` prints `rewrite: <set>.<rule>: <instruction> => <replacement>` as each fires.
To make a pass of it, call `RULES.apply` from a function `my_pass(module)` and list it in
`pipeline.py`. Test each rule on its own (see tests/passes/test_rules.py: the program after the
rule, and its values against numpy).
"""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ops import make_op
from pygraphx.passes.pattern import Captures, Rule, RuleSet, any_, is_float, op, single_use


def exp_product(m: Module, ins: Instruction, c: Captures) -> Instruction | None:
    total = m.insert_instruction(ins, make_op("add"), [c["x"], c["y"]])
    return m.insert_instruction(ins, make_op("exp"), [total])


def abs_abs(m: Module, ins: Instruction, c: Captures) -> Instruction | None:
    return ins.inputs[0]


# the exp(...) inputs must have no other users, or the rule would add work instead of saving it
_EXP_X = op("exp", any_("x")).where(single_use)
_EXP_Y = op("exp", any_("y")).where(single_use)

RULES = RuleSet("rules_example", [
    # exp(x) * exp(y) -> exp(x + y)     (floats; one exp instead of two)
    Rule("exp_product", op("mul", _EXP_X, _EXP_Y).where(is_float), exp_product),
    # |(|x|)| -> |x|
    Rule("abs_abs", op("abs", op("abs", any_("x"))), abs_abs),
])  # fmt: skip


def rules_example(module: Module) -> None:
    """Apply the example rules to a fixed point."""
    RULES.apply(module)
