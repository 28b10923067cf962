"""`quantizelinear`'s arithmetic as Triton functions, for generated kernels and hand-written ones.

A generated group kernel whose result is quantised (`kernels.QuantOutput`) calls `int8_code` or
`fp8_code` on the stored value; `targets/gpu/quant_kernels.py` builds its quantise kernels from
`fp8_round` and `fp8_bits`. The numbers are the reference's (`ops/quant.py`): `x / scale` in
float32, correctly rounded (`div_rn`), then

* int8: clamped to [-128, 127] and rounded half to even without libdevice (adding
  1.5 * 2**23 rounds a float32 of magnitude below 2**22 to an integer, half to even, which
  the sum's low mantissa bits then hold; clamping first commutes with rounding to integers);
  NaN gives -128;
* fp8 e4m3fn: clamped to +-448 (saturate) and rounded half to even to the e4m3 grid, written
  as its byte (NaN stays NaN as 0x7F, -0 keeps its sign); the byte is built from float32 bits
  because the interpreter's fp8 cast is not exact.
"""

from __future__ import annotations

import triton
import triton.language as tl

from pygraphx.codegen.triton.kernels import MAGIC


@triton.jit
def fp8_round(v, MAGIC: tl.constexpr):
    """|v| <= 448 (float32) rounded to the nearest fp8 e4m3 value, half to even: a step of
    2**(e - 3) in binade e (e >= -6; the subnormals share binade -6's step, 2**-9)."""
    mag = tl.abs(v)
    e = ((mag.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.maximum(e, -6)
    step = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)
    q = (tl.math.div_rn(mag, step) + MAGIC) - MAGIC  # < 16: exact, half to even
    return tl.where(v.to(tl.int32, bitcast=True) < 0, -q * step, q * step)  # -0 stays -0


@triton.jit
def fp8_bits(r, neg):
    """The e4m3fn byte of `r`, a float32 that is an fp8 e4m3 value (NaN as 0x7F), with the sign
    bit set where `neg` (taken from the unrounded value's bits: the GPU compile does not keep
    the sign of a zero through min/max and negation, so -0 would come out as +0)."""
    bits = r.to(tl.int32, bitcast=True)
    sign = tl.where(neg, 0x80, 0)
    mag = tl.abs(r)
    normal = (((bits >> 23) & 0xFF) - 120) * 8 + ((bits >> 20) & 7)  # exponent bias 7
    sub = (tl.where(mag < 0.015625, mag, 0.0) * 512.0).to(tl.int32)  # k * 2**-9 below 2**-6
    code = tl.where(mag < 0.015625, sub, normal)
    return tl.where(r != r, 0x7F, sign | code).to(tl.uint8)


@triton.jit
def int8_code(x, scale, MAGIC: tl.constexpr):
    """`saturate(rint(x / scale))` as int8 for float32 `x` and `scale` (NaN to -128). The
    clamped quotient plus MAGIC is 1.5 * 2**23 + k for the rounded k in [-128, 127], whose
    float32 bits are 0x4B400000 + k: their low byte is k's two's complement, so the code is
    the bits truncated to int8 (no float -> int conversion, which is a quarter-rate
    instruction on NVIDIA GPUs)."""
    v = tl.math.div_rn(x, scale)
    r = tl.minimum(tl.maximum(v, -128.0), 127.0)
    k = (r + MAGIC).to(tl.int32, bitcast=True)
    return tl.where(v != v, -128, k).to(tl.int8)


@triton.jit
def fp8_code(x, scale, MAGIC: tl.constexpr):
    """The fp8 e4m3fn byte (uint8) of `x / scale` saturated to +-448, for float32 `x`, `scale`."""
    v = tl.math.div_rn(x, scale)
    r = fp8_round(tl.minimum(tl.maximum(v, -448.0), 448.0), MAGIC)
    r = tl.where(v != v, v, r)  # NaN stays NaN
    return fp8_bits(r, v.to(tl.int32, bitcast=True) < 0)


__all__ = ["MAGIC", "fp8_bits", "fp8_code", "fp8_round", "int8_code"]
