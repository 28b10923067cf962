"""`quantizelinear`'s arithmetic as Triton functions, for generated kernels and hand-written ones.

A generated group kernel whose result is quantised (`kernels.QuantOutput`) calls `int8_code`
(a row kernel `int8_code_rows`) or `fp8_code` on the stored value; `targets/gpu/quant_kernels.py`
builds its quantise kernels from `int8_code`, `fp8_round` and `fp8_bits`. The numbers are the
reference's (`ops/quant.py`): `x / scale` in float32, correctly rounded (`div_rn`; in row
kernels' int8 `saturating_quotient`, the same quotient from one reciprocal), then

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
def saturating_quotient(x, scale, LIMIT: tl.constexpr):
    """`x / scale` correctly rounded to float32 (as `div_rn`) wherever its magnitude is below
    `LIMIT` (a power of two, at most 2**20), and some value of at least `LIMIT` / 2 with the
    quotient's sign where that is larger (a saturating quantise cannot tell the two apart);
    NaN `x` gives any value (callers select on `x != x`). One division a call, not one an
    element (an element's `div_rn` cost the int8 layer-norm kernel a third of its time):

    * a normal `scale` is brought into +-[1, 2) by a power of two p, and `x` multiplied by the
      same p (exact; where it overflows, or exceeds `LIMIT`, the clamp to +-`LIMIT` keeps the
      quotient beyond `LIMIT` / 2; where it underflows the quotient is below 2**-125 either way);
    * from the correctly rounded reciprocal y = RN(1 / s), q = RN(x * y) is within 1.5 ulps of
      x / s; one correction q + (x - q * s) * y (two fmas) makes it faithful, and a second one
      makes it correctly rounded (Markstein's theorem: y within half an ulp of 1 / s, q within
      one ulp of x / s, no underflow or overflow in between, which the scaling rules out);
    * a zero, subnormal, infinite or NaN `scale`, or one of 2**127 or more, divides each
      element (`div_rn`)."""
    e = (scale.to(tl.int32, bitcast=True) >> 23) & 0xFF
    if (e > 0) & (e < 254):
        p = ((254 - e) << 23).to(tl.float32, bitcast=True)  # 2**(127 - e): s in +-[1, 2)
        s = scale * p
        y = tl.math.div_rn(tl.full((), 1.0, tl.float32), s)
        xs = tl.minimum(tl.maximum(x * p, -LIMIT), LIMIT)
        q = xs * y
        q = tl.fma(tl.fma(-q, s, xs), y, q)
        v = tl.fma(tl.fma(-q, s, xs), y, q)
    else:
        v = tl.math.div_rn(x, scale)
    return v


@triton.jit
def _int8_of_quotient(v, x, MAGIC: tl.constexpr):
    """The int8 code of the quotient `v` of `x`: the clamped quotient plus MAGIC is
    1.5 * 2**23 + k for the rounded k in [-128, 127], whose float32 bits are 0x4B400000 + k:
    their low byte is k's two's complement, so the code is the bits truncated to int8 (no
    float -> int conversion, a quarter-rate instruction on NVIDIA GPUs); NaN gives -128."""
    r = tl.minimum(tl.maximum(v, -128.0), 127.0)
    k = (r + MAGIC).to(tl.int32, bitcast=True)
    return tl.where((x != x) | (v != v), -128, k).to(tl.int8)


@triton.jit
def int8_code(x, scale, MAGIC: tl.constexpr):
    """`saturate(rint(x / scale))` as int8 for float32 `x` and `scale` (NaN to -128), one
    `div_rn` an element: the quicker form in element-wise kernels and GEMM epilogues (H200,
    BERT-base batch 32: 11.2 against 14.3 us for `int8_code_rows`' at [4096, 3072])."""
    return _int8_of_quotient(tl.math.div_rn(x, scale), x, MAGIC)


@triton.jit
def int8_code_rows(x, scale, MAGIC: tl.constexpr):
    """`int8_code` with the quotient from `saturating_quotient` (one division a call): the
    quicker form in row-reduction kernels (H200: BERT-base's int8 layer norm at batch 32, 9.5
    against 11.2 us with `int8_code`'s division an element)."""
    return _int8_of_quotient(saturating_quotient(x, scale, 1024.0), x, MAGIC)


@triton.jit
def fp8_code(x, scale, MAGIC: tl.constexpr):
    """The fp8 e4m3fn byte (uint8) of `x / scale` saturated to +-448, for float32 `x`, `scale`."""
    v = tl.math.div_rn(x, scale)
    r = fp8_round(tl.minimum(tl.maximum(v, -448.0), 448.0), MAGIC)
    r = tl.where(v != v, v, r)  # NaN stays NaN
    return fp8_bits(r, v.to(tl.int32, bitcast=True) < 0)


__all__ = [
    "MAGIC",
    "fp8_bits",
    "fp8_code",
    "fp8_round",
    "int8_code",
    "int8_code_rows",
    "saturating_quotient",
]
