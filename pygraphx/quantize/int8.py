"""quantize_int8: calibrated symmetric int8 quantisation of `dot` and `convolution` (MIGraphX's).

`quantize_int8(prog, target, calibration)` rewrites an uncompiled float program in place:

1. calibration: the float program (a copy, compiled for `target`, `ref` by default) runs over
   the calibration samples (a list of {input name: array or argument}); for every non-constant
   input of a selected `dot` / `convolution` it records max |x| (or a percentile of |x|);
2. each such activation gets `quantizelinear` -> `dequantizelinear` with one scale per tensor,
   `scale = max|x| / 127`, int8, no zero point (symmetric);
   (`dot`s with constant weights that share their input, Q/K/V, are first merged into one
   product, `simplify_algebra.fuse_horizontal_dots`, except with run-time scales);
3. each constant right operand (weights) is quantised now, per output channel (the last axis
   of a `dot`'s right operand, axis 0 of a convolution's weights): an int8 literal and a
   `dequantizelinear` with `scale[c] = max|w[c]| / 127` (a constant left operand of a `dot`
   gets one scale); a broadcast weight (MatMul's batch multibroadcast) is quantised before
   the broadcast, so no repeated copy is stored;
   (a `batch_norm_inference` after a convolution is first folded into its weights and a bias
   add, `batch_norm.py`, so the folded weights are what is quantised);
4. the `fold_qdq` pass turns these into `quant_dot` / `quant_convolution` (exact int32
   accumulation) followed by one `dequantizelinear` with the two scales folded.

Without calibration data the activations take MIGraphX's default parameters (a quantisation
step of 1/64, i.e. values beyond about +-1.98 saturate) and a warning says that accuracy can be
badly lost. Rounding is half to even with saturation to [-127, 127]: with these scales -128 is
never produced by an in-range value, and symmetric ranges keep weights' negation exact.

The steps are shared with `quantize_fp8` (`fp8.py`) through `quantize_qdq` and a `QuantFormat`
(the quantised type, its largest magnitude and the default step): fp8 differs only in the type
(e4m3, `scale = max|x| / 448`) and in that no integer product is folded.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pygraphx.ir.argument import Literal
from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ir.program import Program
from pygraphx.ops.base import make_op
from pygraphx.ops.quant import quantize
from pygraphx.passes.fold_qdq import fold_qdq
from pygraphx.passes.propagate_constant import evaluate_constant
from pygraphx.passes.simplify_algebra import fuse_horizontal_dots
from pygraphx.quantize.batch_norm import fold_batch_norms
from pygraphx.quantize.calibrate import AbsStatistic, observe
from pygraphx.quantize.residual import residual_adds
from pygraphx.quantize.smooth import smoothable, smoothing_factors
from pygraphx.quantize.truncate_float import QuantizeError

__all__ = [
    "DEFAULT_ACTIVATION_SCALE",
    "INT8",
    "QuantFormat",
    "QuantizedInput",
    "quantize_int8",
    "quantize_qdq",
    "quantized_inputs",
]

#: MIGraphX's default activation parameters without calibration data: q = round(64 * x)
DEFAULT_ACTIVATION_SCALE = 1.0 / 64.0
QMAX = 127
#: the smallest max |x| a run-time (dynamic) scale is computed from: an all-zero row's floor
TINY = 1e-30
SUPPORTED = frozenset({"dot", "convolution"})


@dataclass(frozen=True)
class QuantFormat:
    """What a QDQ quantisation rounds to: `scale = max|x| / qmax`, values of `type_name`."""

    name: str  # "int8", "fp8": how messages and the API name it
    type_name: str  # the IR type of the quantised values
    dtype: np.dtype
    qmax: float  # the largest magnitude a calibrated max|x| maps to
    default_scale: float = DEFAULT_ACTIVATION_SCALE  # the activations' step without calibration


INT8 = QuantFormat("int8", "int8_type", np.dtype(np.int8), QMAX)


class QuantizedInput:
    """One operand of a selected instruction: (instruction, input index, is it constant)."""

    def __init__(self, ins: Instruction, index: int, constant: bool) -> None:
        self.ins, self.index, self.constant = ins, index, constant

    @property
    def value(self) -> Instruction:
        return self.ins.inputs[self.index]


def _is_constant(ins: Instruction) -> bool:
    stack, seen = [ins], set()
    while stack:
        top = stack.pop()
        if id(top) not in seen:
            seen.add(id(top))
            if top.is_param() or top.module_inputs or top.op.name == "unknown":
                return False
            stack.extend(top.inputs)
    return True


def quantized_inputs(
    prog: Program,
    ins_names: Iterable[str],
    fmt: QuantFormat = INT8,
    activation_products: bool = True,
) -> list[QuantizedInput]:
    """The operands `quantize_int8` / `quantize_fp8` quantise: both inputs of every float32
    `dot` / `convolution` of `main` named in `ins_names` (not both constant; with
    `activation_products=False`, not both non-constant either)."""
    names = set(ins_names)
    unknown = names - SUPPORTED
    if unknown:
        raise QuantizeError(
            f"quantize_{fmt.name} quantises {sorted(SUPPORTED)}; cannot quantise {sorted(unknown)}"
        )
    found = []
    for ins in prog.get_main_module().instructions:
        if ins.op.name not in names or len(ins.inputs) != 2:
            continue
        if any(x.shape.type() != "float_type" for x in ins.inputs):
            continue
        constant = [_is_constant(x) for x in ins.inputs]
        if all(constant):
            continue  # folded at compile time anyway
        if not activation_products and not any(constant):
            continue  # attention's Q.K^T and P.V: left in float when asked
        found.extend(QuantizedInput(ins, k, constant[k]) for k in range(2))
    return found


def quantize_int8(
    prog: Program,
    target: Any = "ref",
    calibration: Sequence[Mapping[str, Any]] | None = None,
    ins_names: Iterable[str] = ("dot", "convolution"),
    method: str = "max",
    percentile: float = 99.99,
    smooth: float | None = None,
    keep_float: int = 0,
    dynamic: bool = False,
    activation_products: bool = True,
    residuals: bool = False,
) -> None:
    """Quantise the uncompiled float `prog` in place to int8 `dot` / `convolution`.

    The float program is run over `calibration` to choose the activations' scales; weights
    are quantised per output channel; the products become `quant_dot` / `quant_convolution`
    with exact int32 sums (see the module docstring for the rules).

    Args:
        prog: a parsed, not yet compiled program with static input shapes.
        target: where the calibration runs (a target or its name; `ref` by default).
        calibration: sample inputs, each a {input name: array or argument}; empty or None uses
            MIGraphX's default parameters, with a warning (accuracy can be lost badly).
        ins_names: operators to quantise, among "dot" and "convolution".
        method: the activation statistic, "max" (max |x|) or "percentile".
        percentile: the percentile of |x| for `method="percentile"`.
        smooth: None, or the alpha in [0, 1] of activation smoothing (`smooth.py`: the
            activations feeding `dot`s with constant weights are divided per input channel by
            factors the weights' rows take on, so outlier channels stop costing the others
            their precision; 0.5 is usual for transformers; needs `method="max"`).
        keep_float: how many of the selected instructions to leave in float: those whose
            activation input has the largest crest factor max|x| / rms(x) over the
            calibration (per-tensor quantisation's SQNR falls by 20 log10(crest) dB; in BERT-like
            encoders these are the feed-forward layers). Needs calibration data.
        dynamic: run-time per-row scales for the `dot`s' activations.
        activation_products: False leaves products of two activations (no constant operand:
            attention's Q.K^T and P.V) in float, as TensorRT does by default: quantising both
            operands at run time costs two quantise passes per product, and in float the
            target's fused attention can run them (on the gpu target, measured on BERT-base,
            int8 attention was slower than half; see benchmarks/quant_gpu.py).
        residuals: also quantise the residual operand of adds that follow a quantised product
            (`residual.py`: a block's input added to its last convolution), as TensorRT's
            Q/DQ placement and ONNX Runtime's static quantiser do: the gpu target then reads
            and writes those tensors as 8-bit values only (ResNet-50 at batch 32 on an H100:
            see benchmarks/quant_gpu.py); one more rounding of the residual. Needs static
            scales (not `dynamic`).

    Raises:
        QuantizeError: `prog` is compiled or dynamic, or an argument is not valid.

    Example:
        >>> prog = pygraphx.parse_onnx("resnet50.onnx")
        >>> samples = [{"data": image} for image in calibration_images]
        >>> pygraphx.quantize_int8(prog, pygraphx.get_target("cpu"), samples)
        >>> prog.compile(pygraphx.get_target("cpu"))
    """
    quantize_qdq(
        prog, target, calibration, ins_names, method, percentile, INT8, smooth, keep_float, dynamic,
        activation_products, residuals,
    )  # fmt: skip


def quantize_qdq(
    prog: Program,
    target: Any,
    calibration: Sequence[Mapping[str, Any]] | None,
    ins_names: Iterable[str],
    method: str,
    percentile: float,
    fmt: QuantFormat,
    smooth: float | None = None,
    keep_float: int = 0,
    dynamic: bool = False,
    activation_products: bool = True,
    residuals: bool = False,
) -> None:
    """The work of `quantize_int8` / `quantize_fp8` in format `fmt`: calibrate, leave the
    `keep_float` layers with the most peaked inputs in float, insert the QDQ pairs (after
    smoothing the activations that allow it, when `smooth` is an alpha; with run-time per-row
    scales for the `dot`s' activations when `dynamic`), quantise the weights, fold integer
    products (see the module docstring); products of two activations only when
    `activation_products`; the residual adds' other operands too when `residuals`."""
    _check_program(prog, fmt)
    _check_smooth(smooth, method, fmt)
    if residuals and dynamic:
        raise QuantizeError(f"quantize_{fmt.name}: residuals=True needs static scales, not dynamic")
    if isinstance(ins_names, str):
        ins_names = (ins_names,)
    if "convolution" in ins_names:
        fold_batch_norms(prog.get_main_module())  # the folded weights are quantised
    if "dot" in ins_names and not dynamic:
        # Q/K/V (gate/up) products of one input become one product first, as the pipeline
        # would merge them: one quantised GEMM, not three (one activation scale, per-column
        # weight scales, so the numbers are those of the separate products)
        fuse_horizontal_dots(prog.get_main_module())
    operands = quantized_inputs(prog, ins_names, fmt, activation_products)
    adds = _residual_adds(prog, operands) if residuals else []
    activations = _unique([op.value for op in operands if not op.constant] + _operands_of(adds))
    groups = smoothable(operands) if smooth is not None and calibration else {}
    static = {id(op.value) for op in operands if not op.constant and not _is_dynamic(op, dynamic)}
    static |= {id(x) for x in _operands_of(adds)}
    stats: dict[int, AbsStatistic] = {}
    if static or (calibration and (keep_float or smooth is not None)):
        stats = _calibrate(prog, target, calibration, activations, method, percentile, fmt, groups)
    if keep_float and stats:
        operands = _drop_peaked(operands, stats, keep_float)
        adds = [a for a in _residual_adds(prog, operands) if id(_operands_of([a])[0]) in stats]
        activations = _unique([op.value for op in operands if not op.constant] + _operands_of(adds))
        groups = smoothable(operands) if groups else {}
    main = prog.get_main_module()
    dq_of: dict[Any, Instruction] = {}  # id(activation) or (id, index) when dynamic -> its DQ
    row_scales: dict[int, np.ndarray] = {}  # id(weight operand's dot) -> its rows' factors
    for x in activations:
        stat, quantised = stats.get(id(x)), x
        magnitude = stat.result() if stat is not None else fmt.default_scale * fmt.qmax
        if id(x) in groups and stat is not None:
            factors, magnitude = _smoothing(stat, groups[id(x)], smooth or 0.0)
            quantised = _divide_channels(main, x, factors)
            row_scales.update({id(w.ins): factors for w in groups[id(x)]})
        for op in operands:
            if op.value is x and _is_dynamic(op, dynamic) and (id(x), op.index) not in dq_of:
                dq_of[id(x), op.index] = _insert_dynamic_qdq(main, quantised, op.index, fmt)
        if id(x) in static:
            dq_of[id(x)] = _insert_qdq(main, quantised, magnitude / fmt.qmax or 1.0, fmt)
    for op in operands:
        if op.constant:
            dq = _quantise_weight(main, op, op.index == 1, fmt, row_scales.get(id(op.ins)))
        else:
            dq = dq_of[(id(op.value), op.index) if _is_dynamic(op, dynamic) else id(op.value)]
        inputs = list(op.ins.inputs)
        inputs[op.index] = dq
        main.replace_op(op.ins, op.ins.op, inputs)
    for add, index in adds:
        inputs = list(add.inputs)
        inputs[index] = dq_of[id(inputs[index])]
        main.replace_op(add, add.op, inputs)
    fold_qdq(main)  # folds the int8 products only; fp8 ones stay dot(dequantizelinear(...))
    for mod in prog.modules.values():
        mod.memory_plan = None
    prog.validate()


def _residual_adds(prog: Program, operands: list[QuantizedInput]) -> list[tuple[Instruction, int]]:
    """The residual adds after the products of `operands` (`residual.py`)."""
    products = _unique([op.ins for op in operands])
    return residual_adds(prog.get_main_module(), products, _is_constant)


def _operands_of(adds: list[tuple[Instruction, int]]) -> list[Instruction]:
    return [add.inputs[index] for add, index in adds]


def _is_dynamic(op: QuantizedInput, dynamic: bool) -> bool:
    """Whether activation operand `op` takes run-time per-row (per-column) scales."""
    return dynamic and not op.constant and op.ins.op.name == "dot"


def _insert_dynamic_qdq(main: Module, x: Instruction, index: int, fmt: QuantFormat) -> Instruction:
    """quantizelinear -> dequantizelinear of `x` (after it) with scales computed at run time:
    max |x| / qmax over the reduced axis of a `dot` operand, the last one for the left operand
    (`index` 0: one scale per row) and the one before it for the right (one per column).
    A row of zeros gets a tiny scale (its values quantise to 0)."""
    after = main.instructions[main.position(x) + 1]
    lens = x.shape.lens()
    axis = len(lens) - 1 if index == 0 else len(lens) - 2
    magnitude = main.insert_instruction(after, make_op("abs"), [x])
    magnitude = main.insert_instruction(after, make_op("reduce_max", axes=(axis,)), [magnitude])
    small = magnitude.shape.lens()
    floor = _scale_view(main, after, np.float32([TINY]), small, 0)
    magnitude = main.insert_instruction(after, make_op("max"), [magnitude, floor])
    qmax = _scale_view(main, after, np.float32([fmt.qmax]), small, 0)
    scale = main.insert_instruction(after, make_op("div"), [magnitude, qmax])
    spread = main.insert_instruction(
        after, make_op("multibroadcast", out_lens=tuple(lens)), [scale]
    )
    q = main.insert_instruction(
        after, make_op("quantizelinear", out_type=fmt.type_name), [x, spread]
    )
    return main.insert_instruction(after, make_op("dequantizelinear"), [q, spread])


def _drop_peaked(
    operands: list[QuantizedInput], stats: Mapping[int, AbsStatistic], keep: int
) -> list[QuantizedInput]:
    """`operands` without those of the `keep` instructions whose activation input has the
    largest crest factor max|x| / rms(x) (they stay float: per-tensor scales cost them most)."""
    crest: dict[int, float] = {}
    for op in operands:
        if not op.constant:
            crest[id(op.ins)] = max(crest.get(id(op.ins), 0.0), stats[id(op.value)].crest())
    worst = set(sorted(crest, key=crest.__getitem__, reverse=True)[:keep])
    return [op for op in operands if id(op.ins) not in worst]


def _check_smooth(smooth: float | None, method: str, fmt: QuantFormat) -> None:
    if smooth is None:
        return
    if not 0.0 <= smooth <= 1.0:
        raise QuantizeError(f"quantize_{fmt.name}: smooth={smooth} must be in [0, 1]")
    if method != "max":
        raise QuantizeError(
            f"quantize_{fmt.name}: smoothing works with method='max' (the smoothed maxima follow "
            f"from the channels' maxima), not {method!r}"
        )


def _smoothing(stat: AbsStatistic, weights: list[QuantizedInput], alpha: float):
    """(factors s, max |x / s|) of a smoothed activation from its channels' maxima and its
    weights' rows (the K axis, -2, of each dot's right operand)."""
    rows = [np.abs(_weight_value(w)[0]) for w in weights]
    rows_max = np.max(
        [r.max(axis=tuple(a for a in range(r.ndim) if a != r.ndim - 2)) for r in rows], axis=0
    )
    act = stat.channel_max if stat.channel_max is not None else np.zeros_like(rows_max)
    factors = smoothing_factors(act, rows_max, alpha)
    return factors, float(np.max(act / factors, initial=0.0))


def _divide_channels(main: Module, x: Instruction, factors: np.ndarray) -> Instruction:
    """`x * (1 / factors)` along x's last axis, inserted after `x`."""
    after = main.instructions[main.position(x) + 1]
    inverse = (np.float32(1.0) / factors).astype(np.float32)
    view = _scale_view(main, after, inverse, x.shape.lens(), x.shape.ndim() - 1)
    return main.insert_instruction(after, make_op("mul"), [x, view])


def _check_program(prog: Program, fmt: QuantFormat) -> None:
    if not isinstance(prog, Program):
        raise QuantizeError(f"expected a pygraphx Program, got {type(prog).__name__}")
    if prog.is_compiled() or prog.target is not None:
        raise QuantizeError(
            f"the program is already compiled; call quantize_{fmt.name}(prog, ...) on the "
            "parsed program before prog.compile(...), as MIGraphX does"
        )
    if prog.is_dynamic():
        raise QuantizeError(
            f"quantize_{fmt.name} needs static input shapes (parse with fixed lens)"
        )


def _unique(values: list[Instruction]) -> list[Instruction]:
    return list({id(v): v for v in values}.values())


def _calibrate(
    prog: Program,
    target: Any,
    calibration: Sequence[Mapping[str, Any]] | None,
    activations: list[Instruction],
    method: str,
    percentile: float,
    fmt: QuantFormat,
    channels: Mapping[int, Any] = {},  # noqa: B006 (read only)
) -> dict[int, AbsStatistic]:
    """The |x| statistics of each activation over the samples (per channel too for the ids in
    `channels`); {} without samples."""
    if not calibration:
        message = (
            f"quantize_{fmt.name}: no calibration data; using MIGraphX's default {fmt.name} "
            f"parameters (activation step {fmt.default_scale}, saturating beyond "
            f"+-{fmt.qmax * fmt.default_scale:.3g}): accuracy can be lost badly. Pass a "
            "list of sample inputs as `calibration`."
        )
        warnings.warn(message, UserWarning, stacklevel=4)
        return {}
    main = prog.get_main_module()
    positions = [main.position(x) for x in activations]
    stats = [AbsStatistic(method, percentile, channels=id(x) in channels) for x in activations]
    for outputs in observe(prog, target, positions, calibration):
        for stat, value in zip(stats, outputs[len(outputs) - len(positions) :], strict=True):
            stat.add(value)
    return {id(x): s for x, s in zip(activations, stats, strict=True)}


def _scale_view(main: Module, before: Instruction, scale: np.ndarray, lens: list[int], axis: int):
    """A literal of per-channel `scale` (or a scalar one) broadcast to `lens` before `before`."""
    lit = main.insert_literal(before, Literal(np.asarray(scale, dtype=np.float32).reshape(-1)))
    if scale.size == 1:
        op = make_op("multibroadcast", out_lens=tuple(lens))
    elif axis == len(lens) - 1:
        op = make_op("multibroadcast", out_lens=tuple(lens))
    else:
        op = make_op("broadcast", axis=axis, out_lens=tuple(lens))
    return main.insert_instruction(before, op, [lit])


def _insert_qdq(main: Module, x: Instruction, scale: float, fmt: QuantFormat) -> Instruction:
    """quantizelinear -> dequantizelinear of activation `x` with one scale (after `x`)."""
    after = main.instructions[main.position(x) + 1]
    lens = x.shape.lens()
    s = _scale_view(main, after, np.float32([scale]), lens, 0)
    q = main.insert_instruction(after, make_op("quantizelinear", out_type=fmt.type_name), [x, s])
    return main.insert_instruction(after, make_op("dequantizelinear"), [q, s])


def _weight_value(operand: QuantizedInput) -> tuple[np.ndarray, Any]:
    """(the constant operand's value, the MatMul batch multibroadcast to re-apply or None):
    a broadcast weight is quantised before the broadcast."""
    w, user = operand.value, operand.ins
    base, rebroadcast = w, None
    if user.op.name == "dot" and w.op.name == "multibroadcast" and w.inputs[0].shape.ndim() >= 1:
        if w.inputs[0].shape.lens()[-1] == w.shape.lens()[-1]:
            base, rebroadcast = w.inputs[0], w.op
    return np.asarray(evaluate_constant(base, {}), dtype=np.float32), rebroadcast


def _quantise_weight(
    main: Module,
    operand: QuantizedInput,
    per_channel: bool,
    fmt: QuantFormat,
    row_scale: np.ndarray | None = None,
) -> Instruction:
    """A quantised (`fmt`) literal of constant operand `w` (its rows, axis -2, multiplied by
    `row_scale` first when smoothing) and its dequantizelinear (before the user): per output
    channel when `per_channel`, else one scale; a MatMul's batch multibroadcast is re-applied
    to the quantised literal instead of storing a repeated copy."""
    w, user = operand.value, operand.ins
    is_dot = user.op.name == "dot"
    axis = (w.shape.ndim() - 1 if is_dot else 0) if per_channel else None
    value, rebroadcast = _weight_value(operand)
    if row_scale is not None:
        value = value * row_scale.reshape(-1, 1)
    if axis is None:
        mags, shape = np.array([np.abs(value).max(initial=0.0)]), (1,) * value.ndim
    else:
        local = value.ndim - 1 if is_dot else 0
        others = tuple(a for a in range(value.ndim) if a != local)
        mags = np.abs(value).max(axis=others, initial=0.0).reshape(-1)
        shape = tuple(-1 if a == local else 1 for a in range(value.ndim))
    scales = np.where(mags > 0, mags / np.float32(fmt.qmax), 1.0).astype(np.float32)
    q = quantize(value, scales.reshape(shape), None, fmt.dtype)
    qw = main.insert_literal(user, Literal(q))
    if rebroadcast is not None:
        qw = main.insert_instruction(user, rebroadcast, [qw])
    s = _scale_view(main, user, scales, w.shape.lens(), 0 if axis is None else axis)
    return main.insert_instruction(user, make_op("dequantizelinear"), [qw, s])
