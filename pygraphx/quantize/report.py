"""The accuracy cost of `quantize_int8`, per quantised layer and on the final outputs.

`int8_report(prog, target, calibration, samples)` quantises a copy of the float program with
the given calibration data and runs both copies over `samples` (inputs the user cares about,
ideally not the calibration ones), with every quantised layer's output exposed:

* per layer (`dot` / `convolution`, in program order): the signal-to-quantisation-noise ratio
  `10 log10(sum(f^2) / sum((q - f)^2))` of its int8 output `q` against the float output `f`, in
  dB over all samples (infinite when they agree exactly);
* per program output: the relative RMS error `sqrt(sum((q - f)^2) / sum(f^2))`, and, for
  outputs shaped (batch, classes), the fraction of rows whose arg-max (top-1 class) agrees.

`prog` itself is neither quantised nor compiled. The driver can print `Int8Report.to_dict()`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pygraphx.ir.program import Program
from pygraphx.quantize.calibrate import expose
from pygraphx.quantize.int8 import quantize_int8, quantized_inputs
from pygraphx.quantize.truncate_float import QuantizeError

__all__ = ["Int8Report", "LayerAccuracy", "OutputAccuracy", "int8_report", "sqnr_db"]


@dataclass(frozen=True)
class LayerAccuracy:
    name: str  # "main:@<position> <op>" in the float program
    op: str
    sqnr_db: float


@dataclass(frozen=True)
class OutputAccuracy:
    index: int
    rel_rms: float
    top1_agreement: float | None  # None: not a (batch, classes) output


@dataclass(frozen=True)
class Int8Report:
    layers: list[LayerAccuracy]
    outputs: list[OutputAccuracy]
    samples: int

    def worst(self, k: int = 5) -> list[LayerAccuracy]:
        """The `k` layers with the lowest SQNR."""
        return sorted(self.layers, key=lambda layer: layer.sqnr_db)[:k]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sqnr_db(reference: np.ndarray, approx: np.ndarray) -> float:
    """10 log10(signal power / noise power) of `approx` against `reference`."""
    ref = np.asarray(reference, dtype=np.float64)
    noise = float(np.sum((np.asarray(approx, dtype=np.float64) - ref) ** 2))
    signal = float(np.sum(ref**2))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def _run(prog: Program, target: Any, samples: Sequence[Mapping[str, Any]]) -> list[list]:
    prog.compile(target)
    return [[np.asarray(v) for v in prog.run(dict(s))] for s in samples]


def int8_report(
    prog: Program,
    target: Any = "ref",
    calibration: Sequence[Mapping[str, Any]] | None = None,
    samples: Sequence[Mapping[str, Any]] = (),
    ins_names: Iterable[str] = ("dot", "convolution"),
    method: str = "max",
) -> Int8Report:
    """Measure what `quantize_int8` costs: per-layer SQNR and the outputs' errors.

    `prog` (float, uncompiled) is copied twice and left as it is.

    Example:
        >>> report = int8_report(prog, "cpu", calibration_samples, test_samples)
        >>> [(layer.name, layer.sqnr_db) for layer in report.worst(3)]
        >>> report.outputs[0].top1_agreement
    """
    if not samples:
        raise QuantizeError("int8_report needs at least one sample input to compare on")
    names = tuple([ins_names] if isinstance(ins_names, str) else ins_names)
    main = prog.get_main_module()
    layers = list({id(o.ins): o.ins for o in quantized_inputs(prog, names)}.values())
    positions = [main.position(ins) for ins in layers]
    float_copy, n_out = expose(prog, positions)
    int8_copy, _ = expose(prog, positions)
    quantize_int8(int8_copy, target, calibration, names, method)
    floats, ints = _run(float_copy, target, samples), _run(int8_copy, target, samples)

    def joined(runs: list[list], k: int) -> np.ndarray:
        return np.concatenate([np.asarray(r[k], dtype=np.float64).ravel() for r in runs])

    layer_acc = [
        LayerAccuracy(
            f"main:@{p} {ins.op.name}",
            ins.op.name,
            sqnr_db(joined(floats, n_out + k), joined(ints, n_out + k)),
        )
        for k, (p, ins) in enumerate(zip(positions, layers, strict=True))
    ]
    outputs = [
        _output_accuracy(k, [r[k] for r in floats], [r[k] for r in ints]) for k in range(n_out)
    ]
    return Int8Report(layer_acc, outputs, len(samples))


def _output_accuracy(k: int, floats: list[np.ndarray], ints: list[np.ndarray]) -> OutputAccuracy:
    f = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in floats])
    q = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in ints])
    power = float(np.sum(f**2))
    rel = math.sqrt(float(np.sum((q - f) ** 2)) / power) if power else float(np.any(q != f))
    top1 = None
    if floats[0].ndim == 2 and floats[0].shape[1] > 1:
        agree = [
            np.argmax(a, axis=1) == np.argmax(b, axis=1) for a, b in zip(floats, ints, strict=True)
        ]
        top1 = float(np.mean(np.concatenate(agree)))
    return OutputAccuracy(k, rel, top1)
