"""recognize_activations: decomposed GELU (erf and tanh forms) and SiLU become one operator.

Exporters write GELU as five to nine element-wise nodes, in several orders: torch's
`Div(sqrt 2) -> Erf -> Add 1 -> Mul x -> Mul 0.5`, transformers' `x * 0.5 * (1 + erf(...))`,
GPT-2's `0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`. These rules find them by
structure (pattern.py; commutative ops either way, every association of the outer product) and
replace each by `gelu`, `gelu_tanh` or `silu` (ops/activation.py), which every backend runs from
one description and the torch handler as one kernel. It runs after simplify_algebra (so `x / c`
is already `x * (1 / c)`) and before fusion.
"""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ops import make_op
from pygraphx.ops.activation import GELU_TANH_CUBIC, SQRT_2_OVER_PI, SQRT_HALF
from pygraphx.passes.pattern import Captures, Pat, Rewrite, Rule, RuleSet, any_, is_float, op
from pygraphx.passes.pattern import scalar as _scalar

X = any_("x")
TOL = 1e-4  # relative tolerance on the constants (exporters round them to float32 or fewer)


def scalar(value: float) -> Pat:
    return _scalar(value, rtol=TOL)


def products(a: Pat, b: Pat, c: Pat) -> list[Pat]:
    """`a * b * c` in each association: (a b) c, (a c) b, (b c) a (each mul either way)."""
    return [op("mul", op("mul", p, q), r) for p, q, r in ((a, b, c), (a, c, b), (b, c, a))]


def _cube() -> list[Pat]:
    """x^3 as pow(x, 3), (x x) x or x (x x)."""
    return [op("pow", X, scalar(3.0)), op("mul", op("mul", X, X), X)]


def _erf_gelu() -> list[Pat]:
    # x * 0.5 * (1 + erf(x / sqrt 2))
    one_plus = op("add", op("erf", op("mul", X, scalar(SQRT_HALF))), scalar(1.0))
    return products(X, scalar(0.5), one_plus)


def _tanh_gelu() -> list[Pat]:
    # x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
    pats = []
    for cube in _cube():
        inner = op("add", X, op("mul", cube, scalar(GELU_TANH_CUBIC)))
        one_plus = op("add", op("tanh", op("mul", inner, scalar(SQRT_2_OVER_PI))), scalar(1.0))
        pats += products(X, scalar(0.5), one_plus)
    return pats


def _activation(name: str) -> Rewrite:
    def rewrite(m: Module, ins: Instruction, c: Captures) -> Instruction | None:
        if c["x"].shape.lens() != ins.shape.lens() or c["x"].shape.type() != ins.shape.type():
            return None
        return m.insert_instruction(ins, make_op(name), [c["x"]])

    return rewrite


def _rules() -> list[Rule]:
    rules = [
        Rule(f"gelu_erf_{k}", p.where(is_float), _activation("gelu"))
        for k, p in enumerate(_erf_gelu())
    ]
    rules += [
        Rule(f"gelu_tanh_{k}", p.where(is_float), _activation("gelu_tanh"))
        for k, p in enumerate(_tanh_gelu())
    ]
    # x * sigmoid(x)
    rules.append(Rule("silu", op("mul", X, op("sigmoid", X)).where(is_float), _activation("silu")))
    return rules


RULES = RuleSet("recognize_activations", _rules())


def recognize_activations(module: Module) -> None:
    """Replace decomposed GELU and SiLU sub-graphs by their operators."""
    RULES.apply(module)
