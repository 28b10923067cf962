"""Tests of `pygraphx.ir.module`: building, editing (insert / replace / remove) with use lists
kept right, queries, and `validate()` catching broken invariants.

"""

from __future__ import annotations

import numpy as np
import pytest

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module, ModuleError
from pygraphx.ir.shape import Shape
from pygraphx.ops import make_op
from pygraphx.ops.base import ShapeError

F23 = Shape("float_type", [2, 3])
#: module, x, relu, neg, @return
Chain = tuple[Module, Instruction, Instruction, Instruction, Instruction]


def users(ins: Instruction) -> list[Instruction]:
    """Distinct users of `ins`, in first-use order."""
    out: list[Instruction] = []
    for u in ins.outputs:
        if not any(u is v for v in out):
            out.append(u)
    return out


def same(a: list[Instruction], b: list[Instruction]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def check_use_lists(m: Module) -> None:
    """Every input edge has a matching use entry and every use entry a matching input edge."""
    for ins in m.instructions:
        for i in ins.inputs:
            assert any(u is ins for u in i.outputs), (ins, i)
        for u in ins.outputs:
            assert any(i is ins for i in u.inputs), (ins, u)
            assert any(u is v for v in m.instructions), (ins, u)


@pytest.fixture
def chain() -> Chain:
    """x -> relu -> neg -> @return."""
    m = Module()
    x = m.add_parameter("x", F23)
    r = m.add_instruction(make_op("relu"), [x])
    n = m.add_instruction(make_op("neg"), [r])
    ret = m.add_return([n])
    return m, x, r, n, ret


# --- building -------------------------------------------------------------------------------
def test_build_keeps_use_lists(chain: Chain) -> None:
    m, x, r, n, ret = chain
    assert [i.name() for i in m] == ["@param", "relu", "neg", "@return"]
    assert len(m) == 4
    assert same(users(x), [r]) and same(users(r), [n]) and same(users(n), [ret])
    assert ret.outputs == []
    assert r.get_shape() == F23 and r.module is m
    m.validate()
    check_use_lists(m)


def test_queries(chain: Chain) -> None:
    m, x, r, n, ret = chain
    assert m.get_parameter_names() == ["x"]
    assert m.get_parameter_shapes() == {"x": F23}
    assert m.get_parameter("x") is x
    with pytest.raises(KeyError, match="no parameter 'y'"):
        m.get_parameter("y")
    assert same(m.get_returns(), [n])
    assert m.get_output_shapes() == [F23]
    assert m.position(n) == 2
    assert x.is_param() and ret.is_return() and not r.is_literal()


def test_returns_without_return_instruction() -> None:
    m = Module()
    x = m.add_parameter("x", F23)
    r = m.add_instruction(make_op("relu"), [x])
    assert same(m.get_returns(), [r])
    assert Module("empty").get_returns() == []


def test_literal() -> None:
    m = Module()
    lit = m.add_literal(np.array([1.0, 2.0], np.float32))
    assert lit.is_literal()
    assert lit.get_shape() == Shape("float_type", [2])
    np.testing.assert_array_equal(np.asarray(lit.get_literal()), [1.0, 2.0])
    with pytest.raises(ValueError, match="not a literal"):
        m.add_parameter("p", F23).get_literal()


def test_building_errors(chain: Chain) -> None:
    m, x, *_ = chain
    with pytest.raises(ModuleError, match="already has a parameter named 'x'"):
        m.add_parameter("x", F23)
    with pytest.raises(ModuleError, match="already ends with @return"):
        m.add_return([x])
    with pytest.raises(ModuleError, match="already ends with @return; use insert_instruction"):
        m.add_instruction(make_op("relu"), [x])
    ret = m.instructions[-1]
    with pytest.raises(ModuleError, match="is not an instruction"):
        m.insert_instruction(ret, make_op("relu"), ["x"])  # type: ignore[list-item]
    y = m.add_parameter("y", Shape("float_type", [3]))
    before = [list(i.outputs) for i in m.instructions]
    with pytest.raises(ShapeError, match="different lens"):
        m.insert_instruction(ret, make_op("add"), [x, y])
    assert [list(i.outputs) for i in m.instructions] == before  # a failed add leaves no trace


# --- insert ---------------------------------------------------------------------------------
def test_insert_instruction(chain: Chain) -> None:
    m, x, r, n, ret = chain
    e = m.insert_instruction(n, make_op("exp"), [r])
    assert m.position(e) == 2 and m.position(n) == 3
    assert same(users(r), [n, e])
    lit = m.insert_literal(e, np.ones((2, 3), np.float32))
    assert m.position(lit) == 2
    a = m.insert_instruction(n, make_op("add"), [e, lit])
    assert same(users(e), [a]) and same(users(lit), [a])
    m.validate()
    check_use_lists(m)


def test_failed_insert_leaves_no_trace(chain: Chain) -> None:
    m, x, r, n, ret = chain
    elsewhere = Module("other").add_parameter("y", F23)
    with pytest.raises(ModuleError, match="not in module"):
        m.insert_instruction(elsewhere, make_op("neg"), [x])
    assert same(users(x), [r])
    m.validate()


# --- replace --------------------------------------------------------------------------------
def test_replace_instruction_moves_users(chain: Chain) -> None:
    m, x, r, n, ret = chain
    s = m.insert_instruction(n, make_op("sigmoid"), [x])
    assert m.replace_instruction(r, s) is s
    assert same(n.inputs, [s])
    assert r.outputs == []
    assert same(users(s), [n])
    assert same(users(x), [r, s])
    m.remove_instruction(r)  # no users left: removable
    assert same(users(x), [s])
    m.validate()
    check_use_lists(m)


def test_replace_instruction_checks_shapes(chain: Chain) -> None:
    m, x, r, n, ret = chain
    other = m.insert_instruction(n, make_op("convert", target_type="half_type"), [r])
    with pytest.raises(ModuleError, match="cannot replace"):
        m.replace_instruction(r, other)
    assert same(n.inputs, [r])
    assert m.replace_instruction(r, r) is r


def test_replace_with_a_user_of_itself(chain: Chain) -> None:
    m, x, r, n, ret = chain
    wrapped = m.insert_instruction(n, make_op("abs"), [r])
    m.replace_instruction(r, wrapped)
    assert same(wrapped.inputs, [r])
    assert same(n.inputs, [wrapped])
    m.validate()


def test_replace_op(chain: Chain) -> None:
    m, x, r, n, ret = chain
    y = m.insert_instruction(r, make_op("exp"), [x])
    m.replace_op(r, make_op("sigmoid"), [y])
    assert r.name() == "sigmoid"
    assert same(r.inputs, [y])
    assert same(users(x), [y]) and same(users(y), [r])
    assert same(users(r), [n])
    m.replace_op(r, make_op("tanh"))  # inputs kept
    assert same(r.inputs, [y])
    with pytest.raises(ModuleError, match="changes the shape"):
        m.replace_op(r, make_op("convert", target_type="int8_type"))
    m.validate()
    check_use_lists(m)


def test_replace_op_with_repeated_input() -> None:
    m = Module()
    x = m.add_parameter("x", F23)
    y = m.add_parameter("y", F23)
    a = m.add_instruction(make_op("add"), [x, x])
    m.add_return([a])
    m.replace_op(a, make_op("mul"), [y, y])
    assert users(x) == [] and same(users(y), [a])
    m.validate()
    check_use_lists(m)


def test_one_use_entry_per_user() -> None:
    """As in MIGraphX, a user appears once in a use list however many times it uses the value."""
    m = Module()
    x = m.add_parameter("x", F23)
    y = m.add_parameter("y", F23)
    built = m.add_instruction(make_op("add"), [y, y])
    edited = m.add_instruction(make_op("add"), [x, x])
    assert same(y.outputs, [built]) and same(x.outputs, [edited])
    m.replace_instruction(x, y)  # now edited = add(y, y) too
    assert same(y.outputs, [built, edited])
    m.replace_op(edited, make_op("mul"), [x, y])
    assert same(x.outputs, [edited]) and same(y.outputs, [built, edited])
    m.validate()
    check_use_lists(m)


def test_replace_instruction_rederives_view_shapes() -> None:
    """Users whose strides follow their input's (views) get their shapes recomputed."""
    m = Module()
    a = m.add_parameter("a", F23)
    v = m.add_parameter("v", Shape("float_type", [3]))
    b = m.add_instruction(make_op("multibroadcast", out_lens=[2, 3]), [v])
    c = m.add_instruction(make_op("multibroadcast", out_lens=[2, 3]), [a])
    m.add_return([c])
    assert c.shape == Shape("float_type", [2, 3], [3, 1])
    m.replace_instruction(a, b)
    assert c.shape == Shape("float_type", [2, 3], [0, 1])
    m.validate()
    check_use_lists(m)


# --- remove ---------------------------------------------------------------------------------
def test_remove_instruction_with_users_raises(chain: Chain) -> None:
    m, x, r, n, ret = chain
    with pytest.raises(ModuleError, match="still has users"):
        m.remove_instruction(r)
    assert len(m) == 4
    m.validate()


def test_remove_instruction_updates_inputs(chain: Chain) -> None:
    m, x, r, n, ret = chain
    dead = m.insert_instruction(ret, make_op("add"), [r, r])
    m.remove_instruction(dead)
    assert same(users(r), [n])
    assert all(u is not dead for u in r.outputs)
    with pytest.raises(ModuleError, match="not in module"):
        m.position(dead)
    m.validate()
    check_use_lists(m)


def test_remove_instructions(chain: Chain) -> None:
    m, x, r, n, ret = chain
    a = m.insert_instruction(ret, make_op("exp"), [r])
    b = m.insert_instruction(ret, make_op("log"), [a])
    m.remove_instructions({a, b})
    assert len(m) == 4
    assert same(users(r), [n])
    m.validate()
    check_use_lists(m)


# --- validate -------------------------------------------------------------------------------
def test_validate_catches_use_before_define(chain: Chain) -> None:
    m, x, r, n, ret = chain
    m.insert_instruction(r, make_op("exp"), [n])  # n is defined after the insertion point
    with pytest.raises(ModuleError, match=r"instruction 1 \(exp\): input neg is not defined"):
        m.validate()


def test_validate_catches_a_wrong_stored_shape(chain: Chain) -> None:
    m, x, r, n, ret = chain
    n.shape = Shape("float_type", [3, 2])
    with pytest.raises(ModuleError, match=r"instruction 2 \(neg\): stored shape"):
        m.validate()


def test_validate_rechecks_what_changed_since_the_last_validate(chain: Chain) -> None:
    """validate() skips re-deriving shapes that cannot have changed, but still catches a shape,
    an operator or an input shape edited behind the module's back after a passing validate."""
    m, x, r, n, ret = chain
    m.validate()
    m.validate()  # the unchanged module passes again
    n.shape = Shape("float_type", [3, 2])
    with pytest.raises(ModuleError, match=r"instruction 2 \(neg\): stored shape"):
        m.validate()
    n.shape = Shape("float_type", [2, 3])
    m.validate()
    n.op = make_op("convert", target_type="half_type")
    with pytest.raises(ModuleError, match=r"instruction 2 \(convert\): stored shape"):
        m.validate()
    n.op = make_op("neg")
    m.validate()
    r.shape = Shape("float_type", [3, 2])  # relu's stored shape and neg's input shape change
    with pytest.raises(ModuleError, match=r"instruction 1 \(relu\): stored shape"):
        m.validate()


def test_validate_catches_a_stale_user(chain: Chain) -> None:
    m, x, r, n, ret = chain
    n.inputs = [x]  # edited behind the module's back: r still lists n as a user
    with pytest.raises(ModuleError, match="stale user neg|missing from the users"):
        m.validate()


def test_validate_catches_return_not_last(chain: Chain) -> None:
    m, x, r, n, ret = chain
    m.instructions.append(m.instructions.pop(m.position(ret) - 1))  # reordered behind its back
    with pytest.raises(ModuleError, match="@return is not the last|not defined before it"):
        m.validate()


def test_validate_catches_a_foreign_instruction(chain: Chain) -> None:
    m, x, r, n, ret = chain
    other = Module("other")
    y = other.add_parameter("y", F23)
    m.instructions.insert(0, y)
    with pytest.raises(ModuleError, match="belongs to another module"):
        m.validate()


def test_submodule_may_use_parent_values() -> None:
    main = Module("main")
    x = main.add_parameter("x", F23)
    r = main.add_instruction(make_op("relu"), [x])
    sub = Module("sub")
    sub.parent = main
    n = sub.add_instruction(make_op("neg"), [r])
    sub.add_return([n])
    sub.validate()  # r is defined in the parent
    main.validate()  # n is a user in another module
    orphan = Module("orphan")
    orphan.add_instruction(make_op("neg"), [r])
    with pytest.raises(ModuleError, match="not defined before it"):
        orphan.validate()
