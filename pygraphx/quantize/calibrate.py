"""Calibration: run a float program over sample inputs and observe chosen intermediate values.

`expose(prog, positions)` copies a program (through its serialised form, so the original is
left alone) and appends the instructions at the given positions of `main` to its outputs;
`observe(...)` compiles that copy for a target and runs it over calibration samples, handing
each observed value to a statistic. The statistics: `max` (the largest |x| seen) and
`percentile` (that percentile of |x| over every sample, from a bounded random subsample of each
value so memory stays small); with `channels`, also max |x| per index of the last axis (for
smoothing, `smooth.py`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.program import Program
from pygraphx.ir.serialize import dumps, loads
from pygraphx.quantize.truncate_float import QuantizeError

__all__ = ["AbsStatistic", "expose", "observe"]

#: values kept per observed tensor and sample for the percentile statistic
SUBSAMPLE = 1 << 18


class AbsStatistic:
    """Accumulates |x| of one tensor over samples: its maximum, or a percentile of it."""

    def __init__(
        self, method: str = "max", percentile: float = 99.99, seed: int = 0, channels: bool = False
    ) -> None:
        if method not in ("max", "percentile"):
            raise QuantizeError(f"unknown calibration method {method!r}; use 'max' or 'percentile'")
        if not 0.0 < percentile <= 100.0:
            raise QuantizeError(f"percentile {percentile} must be in (0, 100]")
        self.method, self.percentile = method, percentile
        self.max = 0.0
        self.sum_sq, self.count = 0.0, 0  # for the crest factor
        self.kept: list[np.ndarray] = []
        self.rng = np.random.default_rng(seed)
        #: with `channels`: the largest |x| per index of the last axis (input channel of a dot)
        self.channel_max: np.ndarray | None = None
        self.channels = channels

    def add(self, value: np.ndarray) -> None:
        mag, finite = _magnitudes(value)
        if self.channels and mag.ndim >= 1:
            per = mag.reshape(-1, mag.shape[-1]).max(axis=0).astype(np.float64)
            self.channel_max = (
                per if self.channel_max is None else np.maximum(self.channel_max, per)
            )
        mag = mag.ravel() if finite is None else finite
        if mag.size == 0:
            return
        self.max = max(self.max, float(mag.max()))
        self.sum_sq += float(np.dot(mag, mag))
        self.count += mag.size
        if self.method == "percentile":
            if mag.size > SUBSAMPLE:
                mag = self.rng.choice(mag, SUBSAMPLE, replace=False)
            self.kept.append(mag.astype(np.float64))

    def crest(self) -> float:
        """max |x| / rms(x) over every value seen (1.0 when nothing or only zeros were seen):
        per-tensor quantisation's SQNR falls by 20 log10(crest) dB."""
        rms = (self.sum_sq / self.count) ** 0.5 if self.count else 0.0
        return self.max / rms if rms > 0 else 1.0

    def result(self) -> float:
        """The calibrated magnitude (0.0 when nothing was seen)."""
        if self.method == "max" or not self.kept:
            return self.max
        return float(np.percentile(np.concatenate(self.kept), self.percentile))


def _magnitudes(value: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """(|value| in float32 (float64 stays) with non-finite values as 0, the finite magnitudes
    flattened or None when all are finite): one pass over memory in the common case (float64
    copies of every activation made calibration slow)."""
    arr = np.asarray(value)
    if arr.dtype != np.float64:
        arr = arr.astype(np.float32, copy=False)
    mag = np.abs(arr)
    if mag.size == 0 or np.isfinite(mag.max()):
        return mag, None
    finite = np.isfinite(mag)
    kept = mag[finite]
    mag[~finite] = 0.0
    return mag, kept


def expose(prog: Program, positions: Sequence[int]) -> tuple[Program, int]:
    """A copy of `prog` whose outputs are its own followed by `main`'s instructions at
    `positions`; returns (copy, number of original outputs)."""
    copy = loads(dumps(prog), source="<calibration copy>")
    main = copy.get_main_module()
    instructions: list[Instruction] = list(main.instructions)
    outputs = main.get_returns()
    if instructions and instructions[-1].is_return():
        main.remove_instruction(instructions[-1])
    main.add_return(outputs + [instructions[p] for p in positions])
    copy.output_names = [*copy.output_names, *(f"@observed{k}" for k in range(len(positions)))]
    copy.output_structure = None
    return copy, len(outputs)


def observe(
    prog: Program, target: Any, positions: Sequence[int], samples: Sequence[Mapping[str, Any]]
) -> Iterator[list[np.ndarray]]:
    """For each sample in turn, [the program's outputs..., the values at `positions`...] as
    arrays, computed by `prog` compiled for `target` (a copy; `prog` itself is not compiled).
    One sample's values at a time: every activation of a large model over all samples does not
    fit in memory."""
    copy, _ = expose(prog, positions)
    copy.compile(target)
    for k, sample in enumerate(samples):
        if not isinstance(sample, Mapping):
            raise QuantizeError(
                f"calibration sample {k} is a {type(sample).__name__}; each sample must map "
                "input names to arrays/arguments"
            )
        yield [np.asarray(v) for v in copy.run(dict(sample))]
