"""Which later step reads an instruction's inputs while it writes its own slot.

A lowering that computes an instruction inside a later instruction's step (a convolution's
fused group, an upsample deferred into its concat, a concat's 1x1 convolution run as a sum over
its parts, a 1x1 + depthwise pair) reads the earlier one's inputs while that step writes its
result; the memory plan must keep the two apart (`memory_coloring.plan_memory(...,
fused_reads=)`, the lowering option `fused_reads`). Each fusion says which instructions it
takes (its `*_reader`); `fused_reads` asks them all, so a new fusion adds its reader here and
no target lists them.
"""

from __future__ import annotations

from pygraphx.ir.instruction import Instruction
from pygraphx.targets.torch_lowering.conv_concat import sum_reader
from pygraphx.targets.torch_lowering.conv_dw_fusion import dw_reader
from pygraphx.targets.torch_lowering.conv_fusion import fused_user
from pygraphx.targets.torch_lowering.deconv_bf16 import fused_reader as deconv_reader
from pygraphx.targets.torch_lowering.lower_resize import concat_reader

#: the fusions' readers, asked in order (the depthwise pair before the convolution's own group)
READERS = (dw_reader, fused_user, deconv_reader, sum_reader, concat_reader)


def fused_reads(ins: Instruction) -> Instruction | None:
    """The later instruction whose step also computes `ins`, else None."""
    for reader in READERS:
        user = reader(ins)
        if user is not None:
            return user
    return None


__all__ = ["READERS", "fused_reads"]
