"""`PGX_TRACE_EVAL`: print every instruction of `main` as it runs (MIGraphX's MIGRAPHX_TRACE_EVAL).

`Program.run` asks `with_eval_trace(main_module, observer)` for its observer on every run, so the
variable is read at run time. With `PGX_TRACE_EVAL=1` each instruction prints, on stdout as
migraphx does, its line in the program's text format and its time (this instruction's, then
the run's so far, both in ms):

    Run instruction: main:@151 = add(main:@147,main:@150) -> float_type, {8, 6, 4, 96}, {...}
    Time: 0.008117ms, 0.160552ms

`PGX_TRACE_EVAL=2` adds, for every instruction that is not a `@param` / `@literal`, which kinds
of values its output holds (`zero`, `normal`, `subnormal`, `inf`, `nan`, classified in the
output's own type) and its first and last five values:

    Output has normal, zero
    Output: 0.932655, 0.78008, 0.455646, 0.490867, 0.500787, ..., -1.57317, -1.5806, ...

The trace wraps the caller's observer (perf, verify), which still sees every instruction.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from pygraphx.ir.argument import format_values
from pygraphx.ir.printer import format_instruction, instruction_names

if TYPE_CHECKING:
    from pygraphx.ir.instruction import Instruction
    from pygraphx.ir.module import Module

ENV = "PGX_TRACE_EVAL"
VALUES_SHOWN = 5  # first and last values of `Output:`
#: the order `Output has` lists the kinds in
KINDS = ("zero", "normal", "subnormal", "inf", "nan")


#: the mapping `os.environ` keeps its (encoded) variables in and `ENV`'s key there, so that a
#: run with the variable unset pays one dict lookup (`os.environ.get` encodes the name and goes
#: through `Mapping.get`: 8-10 us a run, cold after the steps, on the 2-core EPYC); None where
#: `os.environ` is no CPython `_Environ` (then the general path, as before)
_ENVIRON_DATA = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey(ENV) if hasattr(os.environ, "encodekey") else None


def trace_level() -> int:
    """The level `PGX_TRACE_EVAL` asks for: 0 (off, unset or empty), 1, 2 (or more)."""
    if _ENV_KEY is not None and _ENVIRON_DATA is not None and _ENV_KEY not in _ENVIRON_DATA:
        return 0  # (os.environ writes through to this mapping: set or unset, it is current)
    text = os.environ.get(ENV, "").strip()
    if not text:
        return 0
    try:
        return max(int(text), 0)
    except ValueError:
        return 1  # any other value (`yes`, `on`) turns the basic trace on


def classify(arr: np.ndarray) -> list[str]:
    """The kinds of values in `arr`, in `KINDS` order (integers and bools: zero / normal)."""
    arr = np.asarray(arr)
    if arr.size == 0:
        return []
    if arr.dtype.kind in "biu":  # not a float type: the value is 0 or it is not
        flat = arr.reshape(-1)
        kinds = {"zero": not flat.all(), "normal": bool(np.any(flat != 0))}
        return [k for k in KINDS if kinds.get(k)]
    info = ml_dtypes.finfo(arr.dtype)  # numpy's floats and ml_dtypes' bf16 / fp8 alike
    wide = arr.astype(np.float64).reshape(-1)
    magnitude = np.abs(wide)
    finite = np.isfinite(wide)
    kinds = {
        "zero": bool(np.any(wide == 0)),
        "normal": bool(np.any(finite & (magnitude >= float(info.tiny)))),
        "subnormal": bool(np.any((magnitude > 0) & (magnitude < float(info.tiny)))),
        "inf": bool(np.any(np.isinf(wide))),
        "nan": bool(np.any(np.isnan(wide))),
    }
    return [k for k in KINDS if kinds[k]]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:g}ms"


class EvalTracer:
    """An observer that prints each instruction (level 1) and its output (level 2)."""

    def __init__(
        self,
        module: Module,
        level: int,
        inner: Callable[..., None] | None = None,
        write: Callable[[str], Any] | None = None,
    ) -> None:
        self.level = level
        self.inner = inner
        self.write = write
        self.names = instruction_names(module)
        self.elapsed = 0.0

    def _print(self, text: str) -> None:
        if self.write is not None:
            self.write(text)
            return
        out = sys.stdout  # looked up per call, so redirection (and pytest's capsys) applies
        out.write(text)
        out.flush()

    def __call__(self, ins: Instruction, value: np.ndarray, seconds: float) -> None:
        self.elapsed += seconds
        lines = [
            f"Run instruction: {format_instruction(ins, self.names)}",
            f"Time: {_ms(seconds)}, {_ms(self.elapsed)}",
        ]
        arr = np.asarray(value)
        if self.level >= 2 and not ins.op.name.startswith("@") and arr.size:
            lines.append(f"Output has {', '.join(classify(arr))}")
            lines.append(f"Output: {format_values(arr, VALUES_SHOWN)}")
        self._print("\n".join(lines) + "\n")
        if self.inner is not None:
            self.inner(ins, value, seconds)


def with_eval_trace(module: Module, observer: Callable[..., None] | None) -> Any:
    """The observer a run uses: `observer` itself when tracing is off, else a tracer that
    prints and then calls it."""
    level = trace_level()
    if level <= 0:
        return observer
    return EvalTracer(module, level, observer)
