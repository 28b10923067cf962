"""wide_constants: the float32 value of a small constant that `truncate_float` rounded to bf16 /
half, kept beside it so a kernel that adds a product's bias in float32 can read it unrounded.

Why: OpenVINO's bf16 CPU plugin computes a convolution or fully connected layer in bf16 but keeps
its bias in float32 (its runtime model: every `Convolution` / `FullyConnected` node runs bf16
with a float32 `Const` bias, added to the float32 accumulator inside the kernel before the one
rounding of the result). A bias rounded to bf16 costs more than its 2^-9 relative error
suggests where the product's result nearly cancels it: batch normalisation folded into a
convolution gives a bias `beta - mean * gamma / sigma` of the size of the products themselves
(ResNet-50 with its random weights: rounding only the folded biases, everything else float32,
is a 7-8e-3 relative error against float32; the whole bf16 program 1.7e-2, OpenVINO's 1.5e-2).
oneDNN's bf16 convolutions and matmuls take a float32 bias, at no cost.

`RoundedLiteral` lives in `ir.argument` (saved and loaded with its program) and `wide_vector` in
`ops.literal_views` (the targets' lowerings read it: they may not import this layer); both are
named here too.

The program's semantics do not change: the literal's value (what `ref` computes with, what the
printed program shows) is still the rounded one. `RoundedLiteral` only carries the float32
array it was rounded from (`wide`), for vectors (one axis of more than one value) of at most
`WIDE_ELEMENTS` values - biases, scales, never a product's weights - and `wide_vector(ins, n)`
gives it to a lowering that asks: the float32 form of the (n,) vector that a view of such a
literal (a broadcast bias) repeats, or None (no such literal, or a pass rebuilt it: then the
rounded value is used, as before). The cpu target's fused bf16 convolutions and matrix products
ask (`conv_epilogue_match._channel_constant`, `gemm_kernels.bias_vector`) and then take a float32 bias.

Two rounded literals with the same bytes may be merged by common-subexpression elimination,
keeping one `wide`: both round to the same low-precision values, so the float32 value used is
within one low-precision ulp of the other's (the rounded value: half of one).

Switch: `KEEP_WIDE` (None: the variable `PGX_BF16_WIDE_BIAS`, on unless 0 / off / false / no).
"""

from __future__ import annotations


import numpy as np

from pygraphx.ir.argument import Literal, RoundedLiteral
from pygraphx.ir.env import switch_on
from pygraphx.ops.literal_views import is_vector, wide_vector

__all__ = [
    "KEEP_WIDE",
    "WIDE_ELEMENTS",
    "RoundedLiteral",
    "is_vector",
    "keep_wide",
    "rounded",
    "wide_vector",
]

#: constants of at most this many values keep their float32 value (a bias, a scale)
WIDE_ELEMENTS = 1 << 16
#: whether `truncate_float` keeps them; None: `PGX_BF16_WIDE_BIAS` decides (on unless 0 / off /
#: false / no, which restores rounded biases in the kernels too)
KEEP_WIDE: bool | None = None
KEEP_WIDE_ENV = "PGX_BF16_WIDE_BIAS"


def keep_wide() -> bool:
    """Whether rounded constants keep their float32 value (`KEEP_WIDE`, else its variable)."""
    if KEEP_WIDE is not None:
        return KEEP_WIDE
    return switch_on(KEEP_WIDE_ENV)


def rounded(low: np.ndarray, wide: np.ndarray) -> Literal:
    """The literal holding `low` (the rounded copy of `wide`), with `wide` kept when it is a
    float vector of at most `WIDE_ELEMENTS` values and `keep_wide()`."""
    if keep_wide() and wide.dtype.kind == "f" and wide.size <= WIDE_ELEMENTS and is_vector(wide):
        return RoundedLiteral(low, wide)
    return Literal(low, copy=False)
