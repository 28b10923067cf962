"""`quantizelinear`'s arithmetic as Triton functions, for generated kernels and hand-written ones.

A generated group kernel whose result is quantised (`kernels.QuantOutput`) calls `int8_code`
(a row kernel `int8_code_rows`) or `fp8_code` (`fp8_code_rows`) on the stored value;
`targets/gpu/quantise_kernels.py` builds its quantise kernels from `int8_code`, `fp8_round` and
`fp8_bits`. The numbers are the reference's (`ops/quant.py`): `x / scale` in float32,
correctly rounded (`div_rn`; in row kernels `saturating_quotient`, the same quotient from one
reciprocal), then

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
    2**(e - 3) in binade e (e >= -6; the subnormals share binade -6's step, 2**-9). The
    quotient by the step is a product with its inverse, also a power of two (exact, and no
    division an element)."""
    mag = tl.abs(v)
    e = ((mag.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.maximum(e, -6)
    step = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)
    inverse = ((3 - e + 127) << 23).to(tl.float32, bitcast=True)  # 1 / step, exact
    q = (mag * inverse + MAGIC) - MAGIC  # < 16: exact, half to even
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
def quotient(x, s, r):
    """`x / s` correctly rounded (`tl.math.div_rn`'s value) for float32 `x` and one `s`, given
    `r` = div_rn(1, s), without a branch per element: `x * r`, then two corrections by its
    exact residual (`fma(-q, s, x)`; Markstein: with r correctly rounded and q within an ulp,
    `q + e * r` rounds to the quotient). div_rn's fast path does the same, but checks each
    element's range and calls a slow path (a branch and a reconvergence per element of a
    tile: most of a GEMM epilogue's time). Infinite or NaN `x`, or an overflowing quotient,
    give `x * r`; a zero keeps its sign. Exact while `s`, `r`, `x` and `x / s` are normal
    floats (`normalised_quotient` for any scale)."""
    q = x * r
    e = tl.fma(-q, s, x)
    q1 = tl.fma(e, r, q)
    e1 = tl.fma(-q1, s, x)
    q2 = tl.fma(e1, r, q1)
    return tl.where((q2 != q2) | (q2 == 0.0), q, q2)


@triton.jit
def normalised_quotient(x, scale):
    """`quotient(x, scale)` for any float32 `scale`, exact wherever the int8 / fp8 code of the
    quotient depends on it, still without a branch (per element or per program): the scale
    is brought to s = scale * p in [1, 2) by a power of two p = 2**(127 - e) for exponent
    field e in [1, 253] (s in [2, 4) for e = 254; for a subnormal scale p = 2**127 gives
    s >= 2**-22), and `x` multiplied by the same p, so the quotient is unchanged and r = 1 / s
    normal. An overflowing `x * p` gives an infinite quotient (saturated after); an
    underflowing one a quotient below 2**-125 either way. A zero scale keeps p = 2**127 (x / 0:
    +-inf, NaN for 0 / 0); an infinite or NaN one p = 1."""
    e = (scale.to(tl.int32, bitcast=True) >> 23) & 0xFF
    p = tl.where(e == 255, 1.0, (tl.maximum(254 - e, 1) << 23).to(tl.float32, bitcast=True))
    s = scale * p
    return quotient(x * p, s, tl.math.div_rn(1.0, s))


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
        v = quotient(tl.minimum(tl.maximum(x * p, -LIMIT), LIMIT), s, y)
    else:
        v = tl.math.div_rn(x, scale)
    return v


@triton.jit
def int8_of_quotient(v, x, MAGIC: tl.constexpr):
    """The int8 code of the quotient `v` of `x`: the clamped quotient plus MAGIC is
    1.5 * 2**23 + k for the rounded k in [-128, 127], whose float32 bits are 0x4B400000 + k:
    their low byte is k's two's complement, so the code is the bits truncated to int8 (no
    float -> int conversion, a quarter-rate instruction on NVIDIA GPUs); NaN gives -128."""
    r = tl.minimum(tl.maximum(v, -128.0), 127.0)
    k = (r + MAGIC).to(tl.int32, bitcast=True)
    return tl.where((x != x) | (v != v), -128, k).to(tl.int8)


@triton.jit
def int8_code(x, scale, MAGIC: tl.constexpr):
    """`saturate(rint(x / scale))` as int8 for float32 `x` and `scale` (NaN to -128), the
    quotient from `normalised_quotient` (no division an element, no branch)."""
    return int8_of_quotient(normalised_quotient(x, scale), x, MAGIC)


@triton.jit
def int8_code_rows(x, scale, MAGIC: tl.constexpr):
    """`int8_code` with the quotient from `saturating_quotient` (one division a call): the
    quicker form in row-reduction kernels (H200: BERT-base's int8 layer norm at batch 32, 9.5
    against 11.2 us with `int8_code`'s division an element)."""
    return int8_of_quotient(saturating_quotient(x, scale, 1024.0), x, MAGIC)


@triton.jit
def e4m3_byte(v):
    """The fp8 e4m3fn byte of float32 `v` by the hardware conversion (`cvt.rn.satfinite.e4m3x2.f32`:
    half to even, +-448 for larger magnitudes and infinities, NaN as 0x7F), one value an
    instruction: the packed pair's other half converts `v` again and is dropped. Not Triton's
    `.to(tl.float8e4nv)`, which converts values in pairs and on an H100 wrote wrong bytes
    (one element of a pair twice) where its layout gives a thread a single element: a 64-wide
    float32 layer-norm row (tiny BERT fp8 came out NaN; `tests/codegen/test_quantise.py`
    checks narrow blocks). NVIDIA sm_89+ only, compiled (not interpreted)."""
    pair = tl.inline_asm_elementwise(
        "{ .reg .b16 t; cvt.rn.satfinite.e4m3x2.f32 t, $1, $1; cvt.u32.u16 $0, t; }",
        "=r,f",
        [v],
        dtype=tl.int32,
        is_pure=True,
        pack=1,
    )
    return (pair & 0xFF).to(tl.uint8)


@triton.jit
def fp8_of_quotient(v, x, scale, MAGIC: tl.constexpr, CAST: tl.constexpr):
    """The fp8 e4m3fn byte of the quotient `v` of `x / scale`: saturated to +-448, rounded,
    NaN where `x` or `v` is (0x7F); the sign from `x` and `scale` (a -0 quotient keeps it,
    whatever the quotient's arithmetic did to the zero's sign). `CAST` (compiled for an NVIDIA
    GPU of sm_89 or later only): the hardware conversion rounds and saturates
    (`cvt.rn.satfinite.e4m3x2.f32`: half to even, +-448 for larger magnitudes, NaN kept), two
    values an instruction where `fp8_round` and `fp8_bits` take some thirty operations an
    element; the interpreter's fp8 cast is not exact, so it takes those."""
    neg = (x.to(tl.int32, bitcast=True) ^ scale.to(tl.int32, bitcast=True)) < 0
    if CAST:
        b = e4m3_byte(tl.where(x != x, x, v))
        code = tl.where(neg, b | 0x80, b)
    else:
        r = fp8_round(tl.minimum(tl.maximum(v, -448.0), 448.0), MAGIC)
        r = tl.where(x != x, x, tl.where(v != v, v, r))  # NaN stays NaN
        code = fp8_bits(r, neg)
    return code


@triton.jit
def fp8_code(x, scale, MAGIC: tl.constexpr, CAST: tl.constexpr = False):
    """The fp8 e4m3fn byte (uint8) of `x / scale` saturated to +-448, for float32 `x`, `scale`
    (the quotient from `normalised_quotient`, as `int8_code`); `CAST`: the byte from the
    hardware conversion (`fp8_of_quotient`)."""
    return fp8_of_quotient(normalised_quotient(x, scale), x, scale, MAGIC, CAST)


@triton.jit
def fp8_code_rows(x, scale, MAGIC: tl.constexpr, CAST: tl.constexpr = False):
    """`fp8_code` with the quotient from `saturating_quotient` (one division a call), for row
    kernels as `int8_code_rows`: exact below 1024, and beyond it at least 512, which the
    saturation to 448 cannot tell apart."""
    return fp8_of_quotient(saturating_quotient(x, scale, 1024.0), x, scale, MAGIC, CAST)


__all__ = [
    "MAGIC",
    "e4m3_byte",
    "fp8_bits",
    "fp8_code",
    "fp8_code_rows",
    "fp8_of_quotient",
    "fp8_round",
    "int8_code",
    "int8_code_rows",
    "int8_of_quotient",
    "normalised_quotient",
    "quotient",
    "saturating_quotient",
]
