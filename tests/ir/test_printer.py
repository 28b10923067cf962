"""Tests of `pygraphx.ir.printer`: modules and programs print exactly in MIGraphX's text format
(seed 003): `module: "main"`, parameters by name, `main:@k` names, `@literal{...}` (elided past
ten values), operator attributes in brackets, `-> type, {lens}, {strides}`, and `@return(...)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from pygraphx.ir.module import Module
from pygraphx.ir.printer import format_instruction, instruction_names, print_module
from pygraphx.ir.program import Program
from pygraphx.ir.shape import Shape
from pygraphx.ops import make_op
from pygraphx.ops.base import Op


def small_module() -> Module:
    m = Module("main")
    x = m.add_parameter("x", Shape("float_type", [2, 3]))
    bias = m.add_literal(np.array([1.0, -2.5, 3.0], np.float32))
    big = m.add_literal(np.arange(12, dtype=np.float32).reshape(2, 6))
    b = m.add_instruction(make_op("multibroadcast", out_lens=[2, 3]), [bias])
    a = m.add_instruction(make_op("add"), [x, b])
    r = m.add_instruction(make_op("relu"), [a])
    c = m.add_instruction(make_op("convert", target_type="half_type"), [r])
    m.add_return([c, big])
    return m


SMALL_TEXT = """\
module: "main"
x = @param:x -> float_type, {2, 3}, {3, 1}
main:@1 = @literal{1, -2.5, 3} -> float_type, {3}, {1}
main:@2 = @literal{ ... } -> float_type, {2, 6}, {6, 1}
main:@3 = multibroadcast[out_lens={2, 3}](main:@1) -> float_type, {2, 3}, {0, 1}
main:@4 = add(x,main:@3) -> float_type, {2, 3}, {3, 1}
main:@5 = relu(main:@4) -> float_type, {2, 3}, {3, 1}
main:@6 = convert[target_type=half_type](main:@5) -> half_type, {2, 3}, {3, 1}
main:@7 = @return(main:@6,main:@2)
"""


def test_small_module_prints_exactly() -> None:
    m = small_module()
    assert print_module(m) == SMALL_TEXT
    assert str(m) == SMALL_TEXT


def test_literal_values() -> None:
    m = Module("lits")
    ten = m.add_literal(np.arange(10, dtype=np.int32))
    eleven = m.add_literal(np.arange(11, dtype=np.int32))
    flags = m.add_literal(np.array([True, False]))
    scalar = m.add_literal(np.float64(0.25))
    names = instruction_names(m)
    assert format_instruction(ten, names) == (
        "lits:@0 = @literal{0, 1, 2, 3, 4, 5, 6, 7, 8, 9} -> int32_type, {10}, {1}"
    )
    assert format_instruction(eleven, names) == "lits:@1 = @literal{ ... } -> int32_type, {11}, {1}"
    assert format_instruction(flags, names) == "lits:@2 = @literal{1, 0} -> bool_type, {2}, {1}"
    assert format_instruction(scalar, names) == "lits:@3 = @literal{0.25} -> double_type, {}, {}"


def test_parameters_are_named_by_name() -> None:
    m = Module("main")
    a = m.add_parameter("input_ids", Shape("int64_type", [1, 8]))
    b = m.add_parameter("attention.mask", Shape("int64_type", [1, 8]))
    s = m.add_instruction(make_op("mul"), [a, b])
    text = print_module(m).splitlines()
    assert text[1] == "input_ids = @param:input_ids -> int64_type, {1, 8}, {8, 1}"
    assert text[2] == "attention.mask = @param:attention.mask -> int64_type, {1, 8}, {8, 1}"
    assert text[3] == "main:@2 = mul(input_ids,attention.mask) -> int64_type, {1, 8}, {8, 1}"
    assert instruction_names(m)[id(s)] == "main:@2"


def test_annotate_appends_to_each_line() -> None:
    m = small_module()
    text = print_module(m, annotate=lambda ins: f" # {ins.name()}")
    lines = text.splitlines()
    assert lines[0] == 'module: "main"'
    assert lines[1] == "x = @param:x -> float_type, {2, 3}, {3, 1} # @param"
    assert lines[-1] == "main:@7 = @return(main:@6,main:@2) # @return"


@dataclasses.dataclass(frozen=True)
class CallModule(Op):
    """A test-only op that calls a sub-module (like If/Loop); not registered."""

    name = "test_call"

    def compute_shape(self, inputs: Sequence[Shape], modules: Sequence[Module] = ()) -> Shape:
        return modules[0].get_output_shapes()[0] if modules else inputs[0]


def test_program_prints_sub_modules_with_parent_names() -> None:
    p = Program()
    main = p.get_main_module()
    x = main.add_parameter("x", Shape("float_type", [4]))
    r = main.add_instruction(make_op("relu"), [x])
    sub = p.create_module("body", parent=main)
    n = sub.add_instruction(make_op("neg"), [r])
    sub.add_return([n])
    call = main.add_instruction(CallModule(), [r], module_inputs=[sub])
    main.add_return([call])
    p.validate()
    assert str(p) == (
        'module: "main"\n'
        "x = @param:x -> float_type, {4}, {1}\n"
        "main:@1 = relu(x) -> float_type, {4}, {1}\n"
        "main:@2 = test_call(main:@1), [body] -> float_type, {4}, {1}\n"
        "main:@3 = @return(main:@2)\n"
        "\n"
        'module: "body"\n'
        "body:@0 = neg(main:@1) -> float_type, {4}, {1}\n"
        "body:@1 = @return(body:@0)\n"
    )


def test_empty_module() -> None:
    assert print_module(Module("empty")) == 'module: "empty"\n'
