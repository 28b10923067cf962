"""The `cpu` target's word on bf16 programs (`quantize_bf16`, the driver's `--bf16`).

On a processor with bf16 instructions (avx512_bf16, AMX) oneDNN runs a bf16 program's GEMMs and
convolutions natively, with their weights packed once in bf16 (`torch_lowering/lower_gemm.py`,
`conv_fusion.py`). Elsewhere those products are computed by converting to float32 at every
step, slower than the float32 program it came from: compiling says so, once.
"""

from __future__ import annotations

import warnings

from pygraphx.ir.module import Module
from pygraphx.targets.torch_lowering import gemm_kernels

#: the products whose speed bf16 is for
HEAVY_OPS = frozenset({"dot", "convolution"})


def bf16_products(module: Module) -> int:
    """How many bf16 matrix products and convolutions `module` computes."""
    return sum(
        1
        for ins in module.instructions
        if ins.op.name in HEAVY_OPS and ins.shape.type() == "bf16_type"
    )


def announce_slow_bf16(module: Module) -> bool:
    """Warn (one RuntimeWarning) when `module` computes in bf16 on a processor without bf16
    instructions; True when it warned."""
    count = bf16_products(module)
    if not count or gemm_kernels.cpu_has_bf16():
        return False
    warnings.warn(
        f"cpu target: this processor has no bf16 instructions (avx512_bf16 / AMX) that oneDNN "
        f"can use, so the program's {count} bf16 matrix product(s) and convolution(s) run by "
        "converting to float32 at every step, slower than the float32 program; compile "
        "without --bf16 / quantize_bf16 here",
        RuntimeWarning,
        stacklevel=4,
    )
    return True
