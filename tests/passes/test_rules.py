"""Every rewrite rule on its own: the program before and after (op names), and the values after
compared with numpy computing the original expression. Also the pattern language itself."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import pygraphx
from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ir.program import Program
from pygraphx.ir.shape import Shape
from pygraphx.ops import make_op
from pygraphx.passes import eliminate_contiguous, eliminate_identity, simplify_reshapes
from pygraphx.passes import simplify_algebra as sa
from pygraphx.passes.pattern import Rule, RuleSet, any_, const, op, scalar

RNG = np.random.default_rng(7)
_ALL = (sa.RULES, simplify_reshapes.RULES, eliminate_identity.RULES, eliminate_contiguous.RULES)
RULE_SETS = {rs.name: rs for rs in _ALL}


def _mk(name: str, **attrs) -> Callable[..., Instruction]:
    def add(m: Module, *inputs: Instruction) -> Instruction:
        return m.add_instruction(make_op(name, **attrs), list(inputs))

    return add


def _c(m: Module, value, lens) -> Instruction:
    """A constant operand as the frontend makes one: a small literal broadcast to `lens`."""
    lit = m.add_literal(np.asarray(value, np.float32))
    if list(lit.shape.lens()) == list(lens):
        return lit
    return m.add_instruction(make_op("multibroadcast", out_lens=tuple(lens)), [lit])


X = RNG.standard_normal((2, 4, 3, 3)).astype(np.float32)
XI = RNG.integers(-5, 5, (2, 4, 3, 3)).astype(np.int32)
W = RNG.standard_normal((4, 4, 1, 1)).astype(np.float32)
M = RNG.standard_normal((3, 5)).astype(np.float32)
L = [2, 4, 3, 3]
CH = np.arange(1, 5, dtype=np.float32).reshape(1, 4, 1, 1)
EYE = np.eye(5, dtype=np.float32)
COL = np.arange(1, 6, dtype=np.float32)
bn = (np.array([1.5, 0.5, 2, 1], np.float32), np.array([0.1, 0.2, 0.3, 0.4], np.float32),
      np.array([0.0, 1, -1, 0.5], np.float32), np.array([1.0, 2, 0.5, 4], np.float32))  # fmt: skip


def _conv(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.einsum("nchw,oc->nohw", x, w[:, :, 0, 0])


# rule -> (input, build(m, x) -> out, numpy of the original expression, ops after the rule)
CASES = {
    "mul_one": (X, lambda m, x: _mk("mul")(m, _c(m, 1, L), x), lambda x: x * 1, ["@param"]),
    "mul_zero": (XI, lambda m, x: _mk("mul")(m, x, m.add_literal(np.zeros(L, np.int32))),
                 lambda x: x * 0, ["@param", "@literal", "multibroadcast"]),
    "conv_mul": (X, lambda m, x: _mk("mul")(m, _mk("convolution")(m, x, m.add_literal(W)),
                                           _c(m, CH, L)),
                 lambda x: _conv(x, W) * CH, ["@param", "@literal", "convolution"]),
    "dot_mul": (M, lambda m, x: _mk("mul")(m, _c(m, COL, [3, 5]),
                                          _mk("dot")(m, x, m.add_literal(EYE))),
                lambda x: COL * (x @ np.eye(5)), ["@param", "@literal", "dot"]),
    "mul_add_const": (X, lambda m, x: _mk("mul")(
        m, _mk("add")(m, _c(m, CH, L), _mk("convolution")(m, x, m.add_literal(W))), _c(m, 2, L)),
        lambda x: (_conv(x, W) + CH) * 2, ["@param", "@literal", "convolution", "@literal",
                                            "multibroadcast", "@literal", "multibroadcast", "mul",
                                            "add"]),
    "add_zero": (X, lambda m, x: _mk("add")(m, x, _c(m, 0, L)), lambda x: x + 0, ["@param"]),
    "add_add_const": (X, lambda m, x: _mk("add")(m, _c(m, 2, L), _mk("add")(m, x, _c(m, CH, L))),
                      lambda x: 2 + (x + CH), ["@param", "@literal", "multibroadcast", "add"]),
    "sub_zero": (X, lambda m, x: _mk("sub")(m, x, _c(m, 0, L)), lambda x: x - 0, ["@param"]),
    "sub_const": (X, lambda m, x: _mk("sub")(m, x, _c(m, CH, L)), lambda x: x - CH,
                  ["@param", "@literal", "multibroadcast", "add"]),
    "div_one": (X, lambda m, x: _mk("div")(m, x, _c(m, 1, L)), lambda x: x / 1, ["@param"]),
    "one_div_sqrt": (np.abs(X), lambda m, x: _mk("div")(m, _c(m, 1, L), _mk("sqrt")(m, x)),
                     lambda x: 1 / np.sqrt(x), ["@param", "rsqrt"]),
    "div_const": (X, lambda m, x: _mk("div")(m, x, _c(m, CH, L)), lambda x: x / CH,
                  ["@param", "@literal", "multibroadcast", "mul"]),
    "neg_neg": (X, lambda m, x: _mk("neg")(m, _mk("neg")(m, x)), lambda x: x, ["@param"]),
    "recip_sqrt": (np.abs(X), lambda m, x: _mk("recip")(m, _mk("sqrt")(m, x)),
                   lambda x: 1 / np.sqrt(x), ["@param", "rsqrt"]),
    "pow_two": (X, lambda m, x: _mk("pow")(m, x, _c(m, 2, L)), lambda x: x**2, ["@param", "mul"]),
    "batch_norm_affine": (X, lambda m, x: _mk("batch_norm_inference")(
        m, x, *[m.add_literal(v) for v in bn]),
        lambda x: (x - bn[2].reshape(1, 4, 1, 1)) / np.sqrt(bn[3].reshape(1, 4, 1, 1) + 1e-5)
        * bn[0].reshape(1, 4, 1, 1) + bn[1].reshape(1, 4, 1, 1),
        ["@param", "@literal", "multibroadcast", "mul", "@literal", "multibroadcast", "add"]),
    "identity_transpose": (X, lambda m, x: _mk("transpose", permutation=(0, 1, 2, 3))(m, x),
                           lambda x: x, ["@param"]),
    "double_transpose": (X, lambda m, x: _mk("transpose", permutation=(0, 2, 3, 1))(
        m, _mk("transpose", permutation=(1, 0, 2, 3))(m, x)),
        lambda x: x.transpose(1, 0, 2, 3).transpose(0, 2, 3, 1), ["@param", "transpose"]),
    "same_lens": (X, lambda m, x: _mk("reshape", dims=tuple(L))(m, x), lambda x: x, ["@param"]),
    "double_reshape": (X, lambda m, x: _mk("reshape", dims=(8, 9))(
        m, _mk("reshape", dims=(2, 36))(m, x)), lambda x: x.reshape(8, 9), ["@param", "reshape"]),
    "identity": (X, lambda m, x: _mk("identity")(m, x), lambda x: x, ["@param"]),
    "contiguous_standard": (X, lambda m, x: _mk("contiguous")(m, x), lambda x: x, ["@param"]),
}  # fmt: skip


def _rule(name: str) -> tuple[RuleSet, Rule]:
    for rs in RULE_SETS.values():
        for rule in rs.rules:
            if rule.name == name:
                return rs, rule
    raise KeyError(name)


def test_every_rule_has_a_case() -> None:
    names = {rule.name for rs in RULE_SETS.values() for rule in rs.rules}
    assert names == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule(name: str, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    value, build, oracle, after = CASES[name]
    prog = Program()
    m = prog.get_main_module()
    dtype = "int32_type" if value.dtype == np.int32 else "float_type"
    x = m.add_parameter("x", Shape(dtype, list(value.shape)))
    m.add_return([build(m, x)])
    _, rule = _rule(name)
    monkeypatch.setenv("PGX_TRACE_REWRITE", "1")
    RuleSet("only", [rule]).apply(m)
    assert f"rewrite: only.{name}:" in capsys.readouterr().err
    assert [i.op.name for i in m.instructions][:-1] == after
    prog.compile(pygraphx.get_target("ref"))
    got = np.array(prog.run({"x": value})[0])
    np.testing.assert_allclose(got, oracle(value.astype(np.float64)), rtol=1e-5, atol=1e-5)


# --- the pattern language --------------------------------------------------------------------
def _module() -> tuple[Module, Instruction, Instruction]:
    prog = Program()
    m = prog.get_main_module()
    a = m.add_parameter("a", Shape("float_type", [3]))
    b = m.add_parameter("b", Shape("float_type", [3]))
    return m, a, b


def test_commutative_ops_match_either_way_and_captures_must_agree() -> None:
    m, a, b = _module()
    s = _mk("sigmoid")(m, a)
    pat = op("mul", any_("x"), op("sigmoid", any_("x")))
    assert [c["x"] for c in pat.match(_mk("mul")(m, a, s))] == [a]
    assert [c["x"] for c in pat.match(_mk("mul")(m, s, a))] == [a]
    assert list(pat.match(_mk("mul")(m, b, s))) == []  # x bound to b, sigmoid reads a
    assert list(op("sub", any_("x"), op("sigmoid")).match(_mk("sub")(m, s, a))) == []


def test_constant_and_scalar_predicates() -> None:
    m, a, _ = _module()
    half = _c(m, 0.5, [3])
    vec = m.add_literal(np.array([1, 2, 3], np.float32))
    assert list(scalar(0.5).match(half)) and not list(scalar(0.5).match(vec))
    assert list(scalar(0.50001, rtol=1e-4).match(half))
    assert list(const("c").match(vec))[0]["c"] is vec and not list(const().match(a))
    pat = op("add", any_("x").where(lambda i: i.shape.lens() == [3]), const("c"))
    assert list(pat.match(_mk("add")(m, vec, a)))[0]["x"] is a


def test_rule_set_reaches_a_fixed_point() -> None:
    m, a, _ = _module()
    y = a
    for _ in range(5):
        y = _mk("neg")(m, _mk("neg")(m, y))
    m.add_return([y])
    sweeps = sa.RULES.apply(m)
    assert [i.op.name for i in m.instructions] == ["@param", "@param", "@return"] and sweeps <= 8


def test_example_rule_file() -> None:
    from pygraphx.passes.rules_example import rules_example

    prog = Program()
    m = prog.get_main_module()
    a = m.add_parameter("a", Shape("float_type", [4]))
    b = m.add_parameter("b", Shape("float_type", [4]))
    y = _mk("mul")(m, _mk("exp")(m, a), _mk("exp")(m, b))
    m.add_return([_mk("abs")(m, _mk("abs")(m, y))])
    rules_example(m)
    assert [i.op.name for i in m.instructions] == ["@param", "@param", "add", "exp", "abs",
                                                   "@return"]  # fmt: skip
    prog.compile(pygraphx.get_target("ref"))
    va, vb = RNG.standard_normal(4).astype(np.float32), RNG.standard_normal(4).astype(np.float32)
    got = np.array(prog.run({"a": va, "b": vb})[0])
    np.testing.assert_allclose(got, np.abs(np.abs(np.exp(va) * np.exp(vb))), rtol=1e-6)
