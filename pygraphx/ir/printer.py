"""Text form of modules and programs, in MIGraphX's format (as `migraphx-driver read` prints).

    module: "main"
    input = @param:input -> float_type, {1, 3, 224, 224}, {150528, 50176, 224, 1}
    main:@1 = @literal{ ... } -> float_type, {64, 3, 7, 7}, {147, 49, 7, 1}
    main:@2 = convolution[padding={3, 3, 3, 3},...](input,main:@1) -> float_type, {...}, {...}
    main:@3 = @return(main:@2)

Instruction names are `<module>:@<index>`; parameters are named by their parameter name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pygraphx.ir.argument import format_values
from pygraphx.ir.instruction import Instruction

if TYPE_CHECKING:
    from pygraphx.ir.module import Module
    from pygraphx.ir.program import Program

LITERAL_PRINT_LIMIT = 10


def instruction_names(module: Module, names: dict[int, str] | None = None) -> dict[int, str]:
    """Map `id(instruction)` to its printed name (parent modules' names are kept)."""
    names = dict(names or {})
    for k, ins in enumerate(module.instructions):
        if ins.is_param():
            names[id(ins)] = ins.op.parameter
        else:
            names[id(ins)] = f"{module.name}:@{k}"
    return names


def format_instruction(ins: Instruction, names: dict[int, str]) -> str:
    """One instruction line without the trailing newline."""
    name = names.get(id(ins), "?")
    if ins.is_param():
        return f"{name} = @param:{ins.op.parameter} -> {ins.op.dynamic_shape or ins.shape}"
    if ins.is_literal():
        arr = ins.get_literal().array
        if arr.size <= LITERAL_PRINT_LIMIT:
            body = format_values(arr)
        else:
            body = " ... "
        return f"{name} = @literal{{{body}}} -> {ins.shape}"
    args = ",".join(names.get(id(i), "?") for i in ins.inputs)
    mods = ""
    if ins.module_inputs:
        mods = ", [" + ", ".join(m.name for m in ins.module_inputs) + "]"
    if ins.is_return():
        return f"{name} = @return({args}){mods}"
    return f"{name} = {ins.op}({args}){mods} -> {ins.shape}"


def print_module(
    module: Module,
    annotate: Callable[[Instruction], str] | None = None,
    names: dict[int, str] | None = None,
) -> str:
    """The module's text; `annotate(ins)` may append e.g. a timing to each line."""
    names = instruction_names(module, names)
    lines = [f'module: "{module.name}"']
    for ins in module.instructions:
        line = format_instruction(ins, names)
        if annotate is not None:
            line += annotate(ins)
        lines.append(line)
    return "\n".join(lines) + "\n"


def print_program(program: Program, annotate: Callable[[Instruction], str] | None = None) -> str:
    """Every module of `program`, main first (what `print(program)` shows); sub-modules name
    their parents' instructions as the parents print them."""
    out = []
    names: dict[int, str] = {}
    for mod in program.modules_in_print_order():
        parent_names = names if mod.parent is not None else {}
        out.append(print_module(mod, annotate, parent_names))
        names.update(instruction_names(mod, parent_names))
    return "\n".join(out)


def source_annotation(ins: Instruction) -> str:
    """`  # 'layer1/conv2' Conv`: the ONNX node(s) of `ins` (`annotate` for `print_program`)."""
    return "  # " + ", ".join(ins.source) if ins.source else ""
