"""The Triton ops handler: every `OpsHandler` primitive written as a `tl.` expression.

`TritonOps` does not compute: each call appends one line `vN = <expr>` to `lines` and returns a
`TExpr` (the name and the numpy dtype it holds). Running a group's description
(`codegen.trace.run_steps`) through it writes the kernel body. Values are held in their compute
dtype (`compute_dtype`: half/bf16/fp8 loads are widened to float32 by the kernel template).

Only core `tl` functions are used (no vendor libdevice), so the same source compiles for CUDA
and ROCm and runs in the interpreter (`TRITON_INTERPRET=1`). Functions without a core form are
written from ones that have: tanh/sinh/cosh from exp, the inverse hyperbolics from log and sqrt,
atan by argument halving and its odd series, round-half-to-even from floor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
from numpy.typing import DTypeLike

from pygraphx.ops.handler import accumulation_dtype, compute_dtype, finite_max

_TL_NAMES = {
    "bool": "tl.int1", "int8": "tl.int8", "int16": "tl.int16", "int32": "tl.int32",
    "int64": "tl.int64", "uint8": "tl.uint8", "uint16": "tl.uint16", "uint32": "tl.uint32",
    "uint64": "tl.uint64", "float16": "tl.float16", "bfloat16": "tl.bfloat16",
    "float32": "tl.float32", "float64": "tl.float64",
}  # fmt: skip
# fp8 is left to the torch path: ONNX's fp8 casts (saturate, NaN/Inf of the FNUZ formats) differ
# from Triton's conversions, which the H100 node suite showed (60 Cast/CastLike cases)
_FP8 = frozenset({"float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"})


class UnsupportedGroup(Exception):
    """The group (or a type in it) has no Triton form yet; the message says what."""


def tl_dtype(dtype: DTypeLike) -> str:
    """The `tl.` name of a numpy (or ml_dtypes) dtype."""
    name = np.dtype(dtype).name
    if name in _FP8:
        raise UnsupportedGroup(f"{name} casts are not generated (ONNX's fp8 rounding rules)")
    if name not in _TL_NAMES:
        raise UnsupportedGroup(f"dtype {name} has no Triton type")
    return _TL_NAMES[name]


def _is_float(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind == "f" or np.dtype(dtype) == ml_dtypes.bfloat16


@dataclass(frozen=True)
class TExpr:
    """A Triton value in generated code: a name (or literal) and the numpy dtype it holds."""

    text: str
    dtype: np.dtype
    literal: bool = False


def literal(value: Any, dtype: DTypeLike) -> TExpr:
    """A scalar constant: a Python literal where Triton keeps the type (float32, int32,
    bool), else a typed `tl.full([], ...)`."""
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return TExpr(repr(bool(value)), dt, True)
    if _is_float(dt):
        v = float(value)
        text = f"float('{v}')" if not math.isfinite(v) else repr(v)
    else:
        text = repr(int(value))
    if dt != np.float32 and dt != np.int32:
        text = f"tl.full([], {text}, {tl_dtype(dt)})"
    return TExpr(text, dt, True)


def _one_line(template: str, dtype: DTypeLike | None = None) -> Callable[..., TExpr]:
    """A primitive written as one line of Triton: `template` with the operands' text for
    {0}, {1}, ...; the result holds `dtype`, or the first operand's dtype when None."""

    def primitive(self: TritonOps, *xs: TExpr) -> TExpr:
        texts = [x.text for x in xs]
        return self.emit(template.format(*texts), xs[0].dtype if dtype is None else dtype)

    return primitive


class TritonOps:
    """Writes each primitive as one line of Triton; see the module docstring."""

    def __init__(self, prefix: str = "v") -> None:
        self.lines: list[str] = []
        self.prefix = prefix
        self.count = 0
        #: the lanes that hold data (a reduction reads only these); None: all lanes
        self.mask: str | None = None
        #: how many elements a reduction covers (for the mean)
        self.count_reduced = 0

    def emit(self, text: str, dtype: DTypeLike) -> TExpr:
        name = f"{self.prefix}{self.count}"
        self.count += 1
        self.lines.append(f"{name} = {text}")
        return TExpr(name, np.dtype(dtype))

    def _bin(self, op: str, x: TExpr, y: TExpr, dtype: DTypeLike | None = None) -> TExpr:
        return self.emit(f"{x.text} {op} {y.text}", x.dtype if dtype is None else dtype)

    def _call(self, fn: str, *xs: TExpr, dtype: DTypeLike | None = None) -> TExpr:
        args = ", ".join(x.text for x in xs)
        return self.emit(f"{fn}({args})", xs[0].dtype if dtype is None else dtype)

    def _k(self, value: float, like: TExpr) -> TExpr:
        return literal(value, like.dtype)

    # primitives that are one Triton expression over the operands
    add = _one_line("{0} + {1}")
    sub = _one_line("{0} - {1}")
    mul = _one_line("{0} * {1}")
    neg = _one_line("-{0}")
    abs = _one_line("tl.abs({0})")
    recip = _one_line("1.0 / {0}")
    exp = _one_line("tl.exp({0})")
    log = _one_line("tl.log({0})")
    sqrt = _one_line("tl.sqrt({0})")
    rsqrt = _one_line("1.0 / tl.sqrt({0})")
    erf = _one_line("tl.erf({0})")
    sin = _one_line("tl.sin({0})")
    cos = _one_line("tl.cos({0})")
    tan = _one_line("tl.sin({0}) / tl.cos({0})")
    sinh = _one_line("(tl.exp({0}) - tl.exp(-{0})) * 0.5")
    cosh = _one_line("(tl.exp({0}) + tl.exp(-{0})) * 0.5")
    atanh = _one_line("0.5 * tl.log((1.0 + {0}) / (1.0 - {0}))")
    bitwise_and = _one_line("{0} & {1}")
    bitwise_or = _one_line("{0} | {1}")
    bitwise_xor = _one_line("{0} ^ {1}")
    bitwise_not = _one_line("~{0}")
    # core ops only: tl.sigmoid is a @jit library function, which the interpreter cannot
    # call once triton was imported before TRITON_INTERPRET was set (torch imports it)
    sigmoid = _one_line("1.0 / (1.0 + tl.exp(-{0}))")
    # classification, comparison and logic: bool results
    isnan = _one_line("{0} != {0}", np.bool_)
    isinf = _one_line("tl.abs({0}) == float('inf')", np.bool_)
    equal = _one_line("{0} == {1}", np.bool_)
    less = _one_line("{0} < {1}", np.bool_)
    greater = _one_line("{0} > {1}", np.bool_)
    less_equal = _one_line("{0} <= {1}", np.bool_)
    greater_equal = _one_line("{0} >= {1}", np.bool_)
    logical_and = _one_line("({0} != 0) & ({1} != 0)", np.bool_)
    logical_or = _one_line("({0} != 0) | ({1} != 0)", np.bool_)
    logical_xor = _one_line("({0} != 0) ^ ({1} != 0)", np.bool_)
    logical_not = _one_line("{0} == 0", np.bool_)

    # arithmetic in several steps or by dtype
    def div(self, x: TExpr, y: TExpr) -> TExpr:
        # Triton's `//` on integers truncates toward zero (C), as ONNX wants
        return self._bin("/" if _is_float(x.dtype) else "//", x, y)

    def fmod(self, x: TExpr, y: TExpr) -> TExpr:
        if not _is_float(x.dtype):
            return self._bin("%", x, y)  # C remainder: the dividend's sign
        q = self.emit(f"{x.text} / {y.text}", x.dtype)
        t = self.emit(f"tl.where({q.text} < 0, tl.ceil({q.text}), tl.floor({q.text}))", x.dtype)
        r = self.emit(f"{x.text} - {t.text} * {y.text}", x.dtype)
        # C's fmod(x, +-inf) is x for a finite x (x - 0 * inf would be NaN)
        keep = f"(tl.abs({y.text}) == float('inf')) & (tl.abs({x.text}) < float('inf'))"
        return self.emit(f"tl.where({keep}, {x.text}, {r.text})", x.dtype)

    def mod(self, x: TExpr, y: TExpr) -> TExpr:
        r = self.fmod(x, y)
        zero = self._k(0, x)
        fix = f"({r.text} != {zero.text}) & (({r.text} < {zero.text}) != ({y.text} < {zero.text}))"
        return self.emit(f"tl.where({fix}, {r.text} + {y.text}, {r.text})", x.dtype)

    def pow(self, x: TExpr, y: TExpr) -> TExpr:
        if y.literal and _is_float(x.dtype):
            small = {"1.0": x.text, "2.0": f"{x.text} * {x.text}", "0.5": f"tl.sqrt({x.text})"}
            small["3.0"] = f"{x.text} * {x.text} * {x.text}"
            if y.text in small:
                return self.emit(small[y.text], x.dtype)
        if not _is_float(x.dtype):
            raise UnsupportedGroup("pow of integers has no Triton form yet")
        # |x|^y, negative for an odd integer y; nan for a negative x and a non-integer y
        mag = self.emit(f"tl.exp2({y.text} * tl.log2(tl.abs({x.text})))", x.dtype)
        whole = self.emit(f"tl.floor({y.text}) == {y.text}", np.bool_)
        odd = self.emit(f"{whole.text} & (tl.floor({y.text} * 0.5) * 2.0 != {y.text})", np.bool_)
        signed = self.emit(f"tl.where({odd.text}, -{mag.text}, {mag.text})", x.dtype)
        neg = f"({x.text} < 0) & ({whole.text} == 0)"
        return self.emit(f"tl.where({neg}, float('nan'), tl.where({x.text} < 0, "
                         f"{signed.text}, {mag.text}))", x.dtype)  # fmt: skip

    def sign(self, x: TExpr) -> TExpr:
        one, zero = self._k(1, x), self._k(0, x)
        s = f"tl.where({x.text} > {zero.text}, {one.text}, tl.where({x.text} < {zero.text}, "
        s += f"-{one.text}, {zero.text}))"
        r = self.emit(s, x.dtype)
        if _is_float(x.dtype):  # sign(nan) is nan
            r = self.emit(f"tl.where({x.text} != {x.text}, {x.text}, {r.text})", x.dtype)
        return r

    def maximum(self, x: TExpr, y: TExpr) -> TExpr:
        return self._extremum(">", x, y, ignore_nan=False)

    def minimum(self, x: TExpr, y: TExpr) -> TExpr:
        return self._extremum("<", x, y, ignore_nan=False)

    def fmax(self, x: TExpr, y: TExpr) -> TExpr:
        return self._extremum(">", x, y, ignore_nan=True)

    def fmin(self, x: TExpr, y: TExpr) -> TExpr:
        return self._extremum("<", x, y, ignore_nan=True)

    def _extremum(self, cmp: str, x: TExpr, y: TExpr, ignore_nan: bool) -> TExpr:
        r = self.emit(f"tl.where({x.text} {cmp} {y.text}, {x.text}, {y.text})", x.dtype)
        if not _is_float(x.dtype):
            return r
        if ignore_nan:  # fmax / fmin: a nan operand gives the other one
            r = self.emit(f"tl.where({y.text} != {y.text}, {x.text}, {r.text})", x.dtype)
            return self.emit(f"tl.where({x.text} != {x.text}, {y.text}, {r.text})", x.dtype)
        # nan propagates (either operand), as numpy's maximum / minimum
        return self.emit(f"tl.where({x.text} != {x.text}, {x.text}, {r.text})", x.dtype)

    def floor(self, x: TExpr) -> TExpr:
        return self._call("tl.floor", x) if _is_float(x.dtype) else x

    def ceil(self, x: TExpr) -> TExpr:
        return self._call("tl.ceil", x) if _is_float(x.dtype) else x

    def round(self, x: TExpr) -> TExpr:
        if not _is_float(x.dtype):
            return x
        r = self.emit(f"tl.floor({x.text} + 0.5)", x.dtype)
        # a tie (x + 0.5 whole) that landed on an odd number goes down to the even one
        odd = f"(tl.floor({r.text} * 0.5) * 2.0 != {r.text})"
        r = self.emit(f"tl.where(({r.text} - {x.text} == 0.5) & {odd}, {r.text} - 1.0, {r.text})",
                      x.dtype)  # fmt: skip
        big = 2.0 ** (52 if x.dtype == np.float64 else 23)  # from here on every float is whole
        return self.emit(f"tl.where(tl.abs({x.text}) >= {big!r}, {x.text}, {r.text})", x.dtype)

    # transcendental functions without a core form
    def tanh(self, x: TExpr) -> TExpr:
        # (1 - e^-2|x|) / (1 + e^-2|x|) with x's sign: no overflow in either tail
        e = self.emit(f"tl.exp(-2.0 * tl.abs({x.text}))", x.dtype)
        t = self.emit(f"(1.0 - {e.text}) / (1.0 + {e.text})", x.dtype)
        return self.emit(f"tl.where({x.text} < 0, -{t.text}, {t.text})", x.dtype)

    def asinh(self, x: TExpr) -> TExpr:
        a = self.emit(f"tl.abs({x.text})", x.dtype)
        r = self.emit(f"tl.log({a.text} + tl.sqrt({a.text} * {a.text} + 1.0))", x.dtype)
        big = f"tl.log({a.text}) + {math.log(2.0)!r}"  # as acosh: no overflow of a^2
        r = self.emit(f"tl.where({a.text} > 1e8, {big}, {r.text})", x.dtype)
        return self.emit(f"tl.where({x.text} < 0, -{r.text}, {r.text})", x.dtype)

    def acosh(self, x: TExpr) -> TExpr:
        r = self.emit(f"tl.log({x.text} + tl.sqrt({x.text} * {x.text} - 1.0))", x.dtype)
        # past 1e8, x^2 - 1 is x^2 (and x^2 may overflow): acosh(x) = log(2x)
        big = f"tl.log({x.text}) + {math.log(2.0)!r}"
        r = self.emit(f"tl.where({x.text} > 1e8, {big}, {r.text})", x.dtype)
        return self.emit(f"tl.where({x.text} < 1.0, float('nan'), {r.text})", x.dtype)

    def atan(self, x: TExpr) -> TExpr:
        # fold |x| > 1 onto 1/|x| (atan(a) = pi/2 - atan(1/a)), halve the angle twice
        # (atan(t) = 2 atan(t / (1 + sqrt(1 + t^2)))), leaving |t| <= tan(pi/16) < 0.2, where
        # the odd series t - t^3/3 + t^5/5 - ... to t^17 is exact to float64 rounding
        a = self.emit(f"tl.abs({x.text})", x.dtype)
        inv = self.emit(f"{a.text} > 1.0", np.bool_)
        t = self.emit(f"tl.where({inv.text}, 1.0 / {a.text}, {a.text})", x.dtype)
        for _ in range(2):
            t = self.emit(f"{t.text} / (1.0 + tl.sqrt(1.0 + {t.text} * {t.text}))", x.dtype)
        t2 = self.emit(f"{t.text} * {t.text}", x.dtype)
        poly = "0.0"
        for k in range(17, 0, -2):
            coeff = (1.0 if (k // 2) % 2 == 0 else -1.0) / k
            poly = f"({coeff!r} + {t2.text} * {poly})" if k < 17 else repr(coeff)
        r = self.emit(f"4.0 * {t.text} * {poly}", x.dtype)
        r = self.emit(f"tl.where({inv.text}, {math.pi / 2!r} - {r.text}, {r.text})", x.dtype)
        r = self.emit(f"tl.where({x.text} < 0, -{r.text}, {r.text})", x.dtype)
        return self.emit(f"tl.where({x.text} != {x.text}, {x.text}, {r.text})", x.dtype)

    def asin(self, x: TExpr) -> TExpr:
        q = self.emit(f"{x.text} / tl.sqrt(1.0 - {x.text} * {x.text})", x.dtype)
        r = self.atan(q)
        return self.emit(f"tl.where(tl.abs({x.text}) > 1.0, float('nan'), {r.text})", x.dtype)

    def acos(self, x: TExpr) -> TExpr:
        q = self.emit(f"tl.sqrt((1.0 - {x.text}) / (1.0 + {x.text}))", x.dtype)
        r = self.atan(q)
        return self.emit(f"2.0 * {r.text}", x.dtype)

    # selection
    def where(self, c: TExpr, x: TExpr, y: TExpr) -> TExpr:
        r = self.emit(f"tl.where({c.text}, {x.text}, {y.text})", x.dtype)
        if x.literal and y.literal and x.dtype not in (np.float32, np.int32):
            r = self.cast(r, x.dtype)
        return r

    # values and types
    def constant(self, value: Any, like: Any) -> TExpr:
        return literal(np.asarray(value).reshape(()).item(), like.dtype)

    def cast(self, x: TExpr, dtype: DTypeLike) -> TExpr:
        dt = np.dtype(dtype)
        if dt == x.dtype:
            return x
        if dt == np.bool_:
            return self.emit(f"{x.text} != 0", dt)
        return self.emit(f"{x.text}.to({tl_dtype(dt)})", dt)

    def cast_finite(self, x: TExpr, dtype: DTypeLike) -> TExpr:
        """Finite values clamped to `dtype`'s finite range first (infinities and NaN pass),
        then cast."""
        top = self._k(finite_max(dtype), x)
        clamped = f"tl.minimum(tl.maximum({x.text}, -{top.text}), {top.text})"
        keep = f"({x.text} != {x.text}) | (tl.abs({x.text}) == float('inf'))"
        return self.cast(self.emit(f"tl.where({keep}, {x.text}, {clamped})", x.dtype), dtype)

    compute_dtype = staticmethod(compute_dtype)

    # reductions: over the whole block a kernel holds (its reduced axis is axis 0 of a row
    # block); lanes outside `mask` read the operation's identity
    def _masked(self, x: TExpr, identity: str) -> str:
        return x.text if self.mask is None else f"tl.where({self.mask}, {x.text}, {identity})"

    def reduce_sum(self, x: TExpr, axes: Sequence[int]) -> TExpr:
        acc = accumulation_dtype(x.dtype)
        src = self.cast(x, acc)
        return self.emit(f"tl.sum({self._masked(src, '0')}, axis=0)", acc)

    def reduce_prod(self, x: TExpr, axes: Sequence[int]) -> TExpr:
        acc = accumulation_dtype(x.dtype)
        src = self.cast(x, acc)
        return self.emit(f"tl.reduce({self._masked(src, '1')}, 0, _mul)", acc)

    def reduce_max(self, x: TExpr, axes: Sequence[int]) -> TExpr:
        src = self.emit(self._masked(x, lowest_literal(x.dtype)), x.dtype)
        return self.emit(nan_propagating("tl.max", src.text, x.dtype), x.dtype)

    def reduce_min(self, x: TExpr, axes: Sequence[int]) -> TExpr:
        src = self.emit(self._masked(x, highest_literal(x.dtype)), x.dtype)
        return self.emit(nan_propagating("tl.min", src.text, x.dtype), x.dtype)

    def reduce_mean(self, x: TExpr, axes: Sequence[int]) -> TExpr:
        total = self.reduce_sum(x, axes)
        if self.count_reduced == 0:
            return total  # the mean of nothing is 0, as the reference gives
        return self.emit(f"{total.text} / {float(self.count_reduced)!r}", total.dtype)


def nan_propagating(fn: str, block: str, dtype: DTypeLike) -> str:
    """`fn` (`tl.max` / `tl.min`) over axis 0 of `block`, nan if any lane is nan (as numpy;
    Triton's own max and min drop nan)."""
    if not _is_float(np.dtype(dtype)):
        return f"{fn}({block}, axis=0)"
    any_nan = f"tl.max(({block} != {block}).to(tl.int32), axis=0) > 0"
    return f"tl.where({any_nan}, float('nan'), {fn}({block}, axis=0))"


def lowest_literal(dtype: DTypeLike) -> str:
    """The identity of max over `dtype` as Triton text: its lowest value (-inf for floats)."""
    return _end_literal(dtype, low=True)


def highest_literal(dtype: DTypeLike) -> str:
    """The identity of min over `dtype` as Triton text: its highest value (+inf for floats)."""
    return _end_literal(dtype, low=False)


def _end_literal(dtype: DTypeLike, low: bool) -> str:
    dt = np.dtype(dtype)
    if _is_float(dt):
        return "float('-inf')" if low else "float('inf')"
    if dt == np.bool_:
        return "0" if low else "1"
    info = np.iinfo(dt)
    return literal(info.min if low else info.max, dt).text
