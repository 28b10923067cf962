"""eliminate_pad: fold a zero `pad` in front of a convolution into the convolution's padding.

`convolution(pad(x, zeros on spatial dims), w)` is `convolution(x, w)` with the pads added to
its padding (begin values then end values), so the padded copy of the input disappears. Pads
on the batch or channel dimensions, non-zero pad values and non-constant modes are left alone.
"""

from __future__ import annotations

import dataclasses

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.passes.dead_code_elimination import dead_code_elimination


def _fold(module: Module, conv: Instruction) -> bool:
    pad = conv.inputs[0]
    if pad.op.name != "pad" or pad.op.mode != "constant" or pad.op.value != 0:
        return False
    rank = pad.shape.ndim()
    pads = list(pad.op.pads)
    begins, ends = pads[:rank], pads[rank:]
    if begins[:2] != [0, 0] or ends[:2] != [0, 0] or any(p < 0 for p in pads):
        return False
    nspatial = rank - 2
    padding = list(conv.op.padding)
    if len(padding) == nspatial:
        padding = padding + padding
    if len(padding) != 2 * nspatial:
        return False
    new_padding = tuple(
        [padding[k] + begins[2 + k] for k in range(nspatial)]
        + [padding[nspatial + k] + ends[2 + k] for k in range(nspatial)]
    )
    op = dataclasses.replace(conv.op, padding=new_padding)
    module.replace_op(conv, op, [pad.inputs[0]] + conv.inputs[1:])
    return True


def eliminate_pad(module: Module) -> None:
    """Absorb zero pads into the convolutions that read them."""
    changed = False
    for ins in list(module.instructions):
        if ins.op.name == "convolution" and ins.inputs and ins.inputs[0].op.name == "pad":
            changed |= _fold(module, ins)
    if changed:
        dead_code_elimination(module)
