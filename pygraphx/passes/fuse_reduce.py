"""fuse_reduce: merge a reduction with the element-wise work that feeds it into one sub-module.

After fuse_pointwise, a `pointwise` instruction whose only user is a reduction-like instruction
(softmax, logsoftmax, reduce_*) is inlined with it into a module `main:fused_reduceN`, called by
one `fused_reduce(...)` instruction: e.g. attention's scale, mask-add and softmax become one
kernel. The body keeps the original instructions, so ref evaluates it unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ops.fused import FusedReduce

if TYPE_CHECKING:
    from pygraphx.ir.program import Program

REDUCE_LIKE = frozenset(
    ["softmax", "logsoftmax", "reduce_sum", "reduce_mean", "reduce_max", "reduce_min",
     "reduce_prod"]
)  # fmt: skip


def fuse_reduce(module: Module, program: Program) -> None:
    """Fuse each reduction with its single-use `pointwise` producers."""
    if module.parent is not None:
        return
    counter = sum(1 for name in program.modules if name.startswith(f"{module.name}:fused_reduce"))
    returned = {id(i) for i in module.get_returns()}
    for ins in list(module.instructions):
        if ins.op.name not in REDUCE_LIKE:
            continue
        producers = [
            i
            for i in ins.inputs
            if i.op.name == "pointwise" and len(i.outputs) == 1 and id(i) not in returned
        ]
        if not producers:
            continue
        body = program.create_module(f"{module.name}:fused_reduce{counter}", parent=module)
        counter += 1
        external = _build_body(body, ins, producers)
        fused = module.insert_instruction(ins, FusedReduce(), external, [body])
        module.replace_instruction(ins, fused)
        module.remove_instruction(ins)
        for p in producers:
            module.remove_instruction(p)
            program.remove_module(p.module_inputs[0].name)


def _build_body(body: Module, ins: Instruction, producers: list[Instruction]) -> list[Instruction]:
    """Fill `body` with the producers' element-wise code and `ins`; returns the outer inputs."""
    external: list[Instruction] = []
    params: dict[int, Instruction] = {}

    def param_for(x: Instruction) -> Instruction:
        if id(x) not in params:
            params[id(x)] = body.add_parameter(f"x{len(external)}", x.shape)
            external.append(x)
        return params[id(x)]

    values: dict[int, Instruction] = {}
    for p in producers:
        sub = p.module_inputs[0]
        inner: dict[int, Instruction] = {}
        for k, sp in enumerate(sub.get_parameters()):
            inner[id(sp)] = param_for(p.inputs[k])
        for si in sub.instructions:
            if si.is_param():
                continue
            if si.is_return():
                values[id(p)] = inner[id(si.inputs[0])]
                break
            inner[id(si)] = body.add_instruction(si.op, [inner[id(i)] for i in si.inputs])
    args = [values[id(i)] if id(i) in values else param_for(i) for i in ins.inputs]
    body.add_return([body.add_instruction(ins.op, args)])
    return external
