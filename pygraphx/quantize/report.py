"""The accuracy cost of `quantize_int8` / `quantize_fp8`, per quantised layer and on the outputs.

`quant_report(prog, target, calibration, samples, precision="int8" or "fp8")` (and
`int8_report(...)`, its int8 form) quantises a copy of the float program with the given
calibration data and runs both copies over `samples` (inputs the user cares about, ideally not
the calibration ones), with every quantised layer's output exposed:

* per layer (`dot` / `convolution`, in program order): the signal-to-quantisation-noise ratio
  `10 log10(sum(f^2) / sum((q - f)^2))` of its int8 output `q` against the float output `f`, in
  dB over all samples (infinite when they agree exactly);
* per program output: the relative RMS error `sqrt(sum((q - f)^2) / sum(f^2))`, and, for
  outputs shaped (batch, classes), the fraction of rows whose arg-max (top-1 class) agrees.

`prog` itself is neither quantised nor compiled. `QuantReport.lines()` is the text the driver's
`verify --int8` prints (layers worst first), `to_dict()` its `--json`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pygraphx.ir.program import Program
from pygraphx.quantize.calibrate import expose
from pygraphx.quantize.fp8 import quantize_fp8
from pygraphx.quantize.int8 import quantize_int8, quantized_inputs
from pygraphx.quantize.truncate_float import QuantizeError

__all__ = [
    "QUANTIZERS",
    "Int8Report",
    "LayerAccuracy",
    "OutputAccuracy",
    "QuantReport",
    "int8_report",
    "quant_report",
    "sqnr_db",
]

#: the quantisers a report can measure, by precision name
QUANTIZERS: dict[str, Callable[..., None]] = {"int8": quantize_int8, "fp8": quantize_fp8}


@dataclass(frozen=True)
class LayerAccuracy:
    name: str  # "main:@<position> <op> <lens> x <lens>": its name in the float program (`read`)
    op: str
    sqnr_db: float
    quantized: bool = True  # False: left in float (`keep_float`); its SQNR is upstream noise


@dataclass(frozen=True)
class OutputAccuracy:
    index: int
    rel_rms: float
    top1_agreement: float | None  # None: not a (batch, classes) output


@dataclass(frozen=True)
class QuantReport:
    """Per-layer SQNR (program order) and per-output errors of a quantised program."""

    layers: list[LayerAccuracy]
    outputs: list[OutputAccuracy]
    samples: int
    precision: str = "int8"

    def worst(self, k: int | None = 5) -> list[LayerAccuracy]:
        """The `k` layers with the lowest SQNR (all of them, worst first, for None)."""
        return sorted(self.layers, key=lambda layer: layer.sqnr_db)[:k]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self, names: Sequence[str] = (), layers: int | None = None) -> list[str]:
        """The report as text: each output's relative RMS error (and top-1 agreement), then
        the quantised layers' SQNR, worst first (`layers` of them; all for None). `names`
        are the outputs' names."""
        out = [f"{self.precision} accuracy against float over {self.samples} sample(s):"]
        for o in self.outputs:
            name = names[o.index] if o.index < len(names) else f"output {o.index}"
            top1 = "" if o.top1_agreement is None else f", top-1 agreement {o.top1_agreement:.1%}"
            out.append(f"  {name}: relative RMS error {o.rel_rms:.4g}{top1}")
        shown = self.worst(layers)
        more = (
            f" ({len(shown)} worst of {len(self.layers)})" if len(shown) < len(self.layers) else ""
        )
        out.append(
            f"Quantised layers, worst first{more}: SQNR of the output against float (each "
            "includes the noise of the layers before it)"
        )
        kept = {False: " (kept in float)", True: ""}
        out += [f"  {x.sqnr_db:8.2f} dB  {x.name}{kept[x.quantized]}" for x in shown]
        return out


#: the int8 report's former name
Int8Report = QuantReport


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
) -> QuantReport:
    """Measure what `quantize_int8` costs: `quant_report(..., precision="int8")`.

    Example:
        >>> report = int8_report(prog, "cpu", calibration_samples, test_samples)
        >>> [(layer.name, layer.sqnr_db) for layer in report.worst(3)]
        >>> report.outputs[0].top1_agreement
    """
    return quant_report(prog, target, calibration, samples, ins_names, method)


def quant_report(
    prog: Program,
    target: Any = "ref",
    calibration: Sequence[Mapping[str, Any]] | None = None,
    samples: Sequence[Mapping[str, Any]] = (),
    ins_names: Iterable[str] = ("dot", "convolution"),
    method: str = "max",
    percentile: float = 99.99,
    precision: str = "int8",
    transform: Callable[[Program], Any] | None = None,
    smooth: float | None = None,
    keep_float: int = 0,
    dynamic: bool = False,
    residuals: bool = False,
    quant_transform: Callable[[Program], Any] | None = None,
) -> QuantReport:
    """Measure what `quantize_int8` / `quantize_fp8` costs: per-layer SQNR and the outputs'
    errors, the quantised copy against the float copy, both compiled for `target`.

    `prog` (float, uncompiled) is copied twice and left as it is. `transform` (e.g. the
    optimisation passes) is applied to both copies after quantising, before compiling;
    `quant_transform` (e.g. `quantize_fp16` for the rest of the program, as MIGraphX combines
    them) is applied to the quantised copy alone, first; `method`, `percentile`, `smooth`,
    `keep_float`, `dynamic` and `residuals` are the quantiser's.

    Example:
        >>> report = quant_report(prog, "cpu", calibration_samples, test_samples, precision="fp8")
        >>> print("\n".join(report.lines(layers=5)))
    """
    if precision not in QUANTIZERS:
        raise QuantizeError(f"unknown precision {precision!r}; use one of {sorted(QUANTIZERS)}")
    if not samples:
        raise QuantizeError(f"the {precision} report needs at least one sample input to compare on")
    names = tuple([ins_names] if isinstance(ins_names, str) else ins_names)
    main = prog.get_main_module()
    layers = list({id(o.ins): o.ins for o in quantized_inputs(prog, names)}.values())
    positions = [main.position(ins) for ins in layers]
    float_copy, n_out = expose(prog, positions)
    quant_copy, _ = expose(prog, positions)
    QUANTIZERS[precision](
        quant_copy, target, calibration, names, method, percentile, smooth, keep_float, dynamic,
        residuals=residuals,
    )  # fmt: skip
    returned = quant_copy.get_main_module().get_returns()[n_out:]
    quantized = [_is_quantized(ins) for ins in returned]
    if quant_transform is not None:
        converted = quant_transform(quant_copy)
        quant_copy = converted if isinstance(converted, Program) else quant_copy
    if transform is not None:
        transform(float_copy)
        transform(quant_copy)
    floats, quants = _run(float_copy, target, samples), _run(quant_copy, target, samples)

    def joined(runs: list[list], k: int) -> np.ndarray:
        return np.concatenate([np.asarray(r[k], dtype=np.float64).ravel() for r in runs])

    layer_acc = [
        LayerAccuracy(
            f"main:@{p} {ins.op.name} " + " x ".join(str(x.shape.lens()) for x in ins.inputs),
            ins.op.name,
            sqnr_db(joined(floats, n_out + k), joined(quants, n_out + k)),
            quantized[k],
        )
        for k, (p, ins) in enumerate(zip(positions, layers, strict=True))
    ]
    outputs = [
        _output_accuracy(k, [r[k] for r in floats], [r[k] for r in quants]) for k in range(n_out)
    ]
    return QuantReport(layer_acc, outputs, len(samples), precision)


def _is_quantized(ins: Any) -> bool:
    """Whether a layer's value in the quantised copy comes from quantised maths: a folded
    product's dequantizelinear, or a product of dequantised values (fp8)."""
    if ins.op.name == "dequantizelinear":
        return True
    return any(x.op.name == "dequantizelinear" for x in ins.inputs)


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
