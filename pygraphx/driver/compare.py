"""How `verify` judges one output: tolerances per precision, array comparison, the result.

The driver's `verify` command (`verify.py`) runs a candidate program and a reference program on
the same inputs and hands every pair of outputs to `compare` here, under the `Tolerance` that
`tolerance_for` picks; each gives a `Comparison` (passed or not, the errors, the worst element)
that the report prints. The per-instruction search in `verify.py` judges intermediate values with
the same functions.

Tolerances follow the least precise float type the candidate computes in (its `precision`,
`program_precision`), with `scale` = the RMS of the reference output (1 when that is 0), so
`atol` tracks the output's magnitude (rounding error is relative to the values being summed, not
to each element):
* double: element-wise `np.isclose`, rtol 1e-6, atol 1e-8 * scale;
* float:  element-wise, rtol 1e-4, atol 1e-5 * scale;
* half / bf16 / fp8: RMS-based, relative RMS error rms(a-b)/rms(b) at most 1e-2 (half),
  3e-2 (bf16), 0.15 (fp8): reduced precision errors add up over a network, so single elements
  are judged loosely; the element-wise count (rtol 1e-2, atol 1e-3 * scale) is still shown;
* integer and bool outputs: exact.
`--rtol` / `--atol` replace these with an element-wise check for every float output, atol then
taken as is (not scaled). Values that are nan in both, or the same inf, are equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pygraphx.ir.program import Program
from pygraphx.ir.shape import from_dtype

FP8_TYPES = ("fp8e4m3fnuz_type", "fp8e4m3fn_type", "fp8e5m2_type", "fp8e5m2fnuz_type")
#: float types from least to most precise; a program's precision is the first one it uses
PRECISION_ORDER = (*FP8_TYPES, "bf16_type", "half_type", "float_type", "double_type")
#: (rtol, atol per unit of scale, max relative RMS error or None for element-wise)
DEFAULT_TOLERANCES: dict[str, tuple[float, float, float | None]] = {
    "double_type": (1e-6, 1e-8, None),
    "float_type": (1e-4, 1e-5, None),
    "half_type": (1e-2, 1e-3, 1e-2),
    "bf16_type": (1e-2, 1e-3, 3e-2),
    **{t: (1e-1, 1e-2, 0.15) for t in FP8_TYPES},
}


# --- comparing two arrays -------------------------------------------------------------------
@dataclass(frozen=True)
class Tolerance:
    """How two arrays are judged: `exact`, `elementwise` (isclose) or `rms`."""

    mode: str
    rtol: float = 0.0
    atol: float = 0.0
    rms: float | None = None

    def describe(self) -> str:
        if self.mode == "exact":
            return "exact"
        text = f"rtol {self.rtol:g}, atol {self.atol:g}"
        return f"relative RMS error <= {self.rms:g} ({text} shown)" if self.rms else text


def tolerance_for(
    precision: str, ref: np.ndarray, rtol: float | None = None, atol: float | None = None
) -> Tolerance:
    """The tolerance for comparing with `ref` when the candidate computes in `precision`."""
    if np.asarray(ref).dtype.kind in "biu":
        return Tolerance("exact")
    if rtol is not None or atol is not None:
        default_rtol, _, _ = DEFAULT_TOLERANCES.get(precision, DEFAULT_TOLERANCES["float_type"])
        return Tolerance("elementwise", default_rtol if rtol is None else rtol, atol or 0.0)
    rt, at, rms = DEFAULT_TOLERANCES.get(precision, DEFAULT_TOLERANCES["float_type"])
    scale = _rms(np.asarray(ref, np.float64))
    scale = scale if math.isfinite(scale) and scale > 0 else 1.0
    return Tolerance("rms" if rms else "elementwise", rt, at * scale, rms)


def _rms(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(np.sqrt(np.mean(np.square(x)))) if x.size else 0.0


@dataclass
class Comparison:
    """How far `candidate` is from `reference`; errors in float64, worst element by index."""

    passed: bool
    tolerance: str
    elements: int = 0
    not_close: int = 0
    rms_error: float = 0.0  # relative: rms(a - b) / rms(b) (absolute when rms(b) is 0)
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    worst_index: list[int] = field(default_factory=list)
    worst_values: list[float] = field(default_factory=list)  # [candidate, reference]
    problem: str = ""  # lens or kinds that differ: no values compared
    name: str = ""  # the output's name and shapes, set by verify_programs
    shape: str = ""
    reference_shape: str = ""

    def lines(self) -> list[str]:
        """`name: PASSED (shape; tolerance)` and the errors, as `verify` prints them."""
        shape = self.shape
        if self.reference_shape != shape:
            shape += f" (reference {self.reference_shape})"
        head = f"{self.name}: {'PASSED' if self.passed else 'FAILED'} ({shape}"
        if self.problem:
            return [f"{head})", f"  cannot compare: {self.problem}"]
        lines = [
            f"{head}; {self.tolerance})",
            f"  rms error: {self.rms_error:g} (relative), max abs error: {self.max_abs_error:g},"
            f" max rel error: {self.max_rel_error:g}, not close: {self.not_close} of "
            f"{self.elements}",
        ]
        if self.elements:
            worst = ", ".join(map(str, self.worst_index))
            a, b = self.worst_values
            lines.append(f"  worst element [{worst}]: {a:g} (reference {b:g})")
        return lines


def compare(candidate: np.ndarray, reference: np.ndarray, tol: Tolerance) -> Comparison:
    """Compare two arrays of equal lens (any dtypes) under `tol`."""
    a, b = np.asarray(candidate), np.asarray(reference)
    if a.shape != b.shape:
        return Comparison(False, tol.describe(), problem=f"lens {list(a.shape)} != {list(b.shape)}")
    if (a.dtype.kind in "biu") != (b.dtype.kind in "biu"):
        problem = f"type {from_dtype(a.dtype)} != {from_dtype(b.dtype)}"
        return Comparison(False, tol.describe(), problem=problem)
    if a.size == 0:
        return Comparison(True, tol.describe())
    x, y = a.astype(np.float64), b.astype(np.float64)
    same = (x == y) | (np.isnan(x) & np.isnan(y))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.where(same, 0.0, np.abs(x - y))
        diff = np.where(np.isnan(diff), np.inf, diff)
        nonzero = np.abs(y) > 0  # the relative error of an element whose reference is 0 is
        rel = np.where(nonzero, diff / np.where(nonzero, np.abs(y), 1.0), 0.0)  # left out
        if tol.mode == "exact":
            close = same
            excess = diff
        else:
            budget = tol.atol + tol.rtol * np.abs(y)
            close = same | (np.isfinite(diff) & (diff <= budget))
            excess = diff / budget  # the worst element is the one furthest past its budget
        excess = np.where(same, -np.inf, np.nan_to_num(excess, nan=np.inf, posinf=np.inf))
        err_rms = float(np.sqrt(np.mean(np.square(diff))))
    ref_rms = _rms(y)
    rms_error = err_rms / ref_rms if ref_rms > 0 else err_rms
    if tol.mode == "rms":
        passed = rms_error <= (tol.rms or 0.0) and bool(np.all(np.isfinite(diff)))
    else:
        passed = bool(close.all())
    worst = np.unravel_index(int(np.argmax(excess)), a.shape) if a.ndim else ()
    return Comparison(
        passed,
        tol.describe(),
        int(a.size),
        int(a.size - close.sum()),
        rms_error,
        float(diff.max()),
        float(rel.max()),
        [int(i) for i in worst],
        [float(x[worst]), float(y[worst])],
    )


def program_precision(program: Program) -> str:
    """The least precise float type any instruction of `program` produces (float by default)."""
    used = {ins.shape.type() for mod in program.modules.values() for ins in mod.instructions}
    return next((t for t in PRECISION_ORDER if t in used), "float_type")


def finite_json(obj: Any) -> Any:
    """JSON has no inf/nan: write them as strings (in dicts, lists and tuples)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_json(v) for v in obj]
    return obj
