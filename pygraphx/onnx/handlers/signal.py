"""Handlers of ONNX signal ops: DFT (opsets 17 and 20), STFT, the Hann, Hamming and Blackman
windows and MelWeightMatrix.

DFT maps to the IR `fft` op (its axis is an attribute in opset 17 and an input from opset 20;
`dft_length` must be a compile-time constant). STFT is decomposed: the frames are a `gather` of
the signal with a constant [frames, frame_length] index table, multiplied by the window, then
an `fft` along the frame axis. Windows and the mel matrix depend on their scalar inputs only, so
with constant inputs they are literals computed here.

Inputs that decide an output shape but arrive at run time (a window size, DFT's axis, STFT's
frame_step and frame_length, MelWeightMatrix's scalars) are taken from the lens the model
declares for the output and checked at run time: a window literal is guarded by `shape_guard`,
`fft` reads a run-time axis itself, STFT's step and length are solved from the declared lens
(when only one pair fits) and guarded, and `mel_weight_matrix` computes from its inputs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pygraphx.ir.instruction import Instruction
from pygraphx.ir.shape import to_dtype
from pygraphx.onnx.context import NodeContext, onnx_type_to_shape_type
from pygraphx.onnx.handlers._runtime_shapes import guard, runtime_lens
from pygraphx.onnx.handlers.layout import arg
from pygraphx.onnx.registry import onnx_op
from pygraphx.ops import make_op
from pygraphx.ops.broadcast import Broadcast
from pygraphx.ops.indexing import Gather
from pygraphx.ops.signal import Fft, MelWeightMatrix, mel_weight_matrix

Args = list[Instruction | None]


def _const_int(ctx: NodeContext, ins: Instruction | None) -> int | None:
    value = ctx.const(ins)
    if value is None:
        return None
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1:
        raise ctx.error(f"expected a scalar, got {flat.size} values")
    return int(flat[0])


def _check_signal(ctx: NodeContext, x: Instruction) -> None:
    lens = x.shape.lens()
    if len(lens) < 2 or lens[-1] not in (1, 2):
        raise ctx.error(
            f"input {lens} must end in a dimension of 1 (real) or 2 (complex: real, imaginary)"
        )


def _signal_axis(ctx: NodeContext, axis: int, rank: int) -> int:
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise ctx.error(f"axis {axis} is not a signal axis of a rank-{rank} input")
    return axis % rank


def _dft(
    ctx: NodeContext, x: Instruction, length_ins: Instruction | None, axis: Instruction | int
) -> Instruction:
    _check_signal(ctx, x)
    length = 0
    if length_ins is not None:
        ctx.require_const(length_ins, "dft_length")
        length = _const_int(ctx, length_ins)
        if length < 1:
            raise ctx.error(f"dft_length {length} must be positive")
    inverse = bool(ctx.attr("inverse", 0))
    onesided = bool(ctx.attr("onesided", 0))
    if inverse and onesided and x.shape.lens()[-1] != 2:
        raise ctx.error("the inverse of a one-sided spectrum needs a complex input [..., 2]")
    if onesided and not inverse and x.shape.lens()[-1] != 1:
        raise ctx.error("a one-sided forward DFT needs a real input [..., 1]")
    rank = x.shape.ndim()
    if isinstance(axis, int):
        a = _signal_axis(ctx, axis, rank)
        return ctx.add(Fft(axis=a, length=length, inverse=inverse, onesided=onesided), x)
    lens = runtime_lens(ctx, axis, "axis")
    op = Fft(length=length, inverse=inverse, onesided=onesided, out_lens=tuple(lens))
    return ctx.add(op, x, axis)


@onnx_op("DFT", since=17)
def parse_dft_17(ctx: NodeContext, args: Args) -> Instruction:
    return _dft(ctx, args[0], arg(args, 1), ctx.attr("axis", 1))


@onnx_op("DFT", since=20)
def parse_dft(ctx: NodeContext, args: Args) -> Instruction:
    axis_ins = arg(args, 2)
    axis = -2 if axis_ins is None else _const_int(ctx, axis_ins)
    return _dft(ctx, args[0], arg(args, 1), axis_ins if axis is None else axis)


# --- STFT -----------------------------------------------------------------------------------
def _stft_candidates(
    signal_len: int, frames: int, bins: int, onesided: bool, fixed_length: int | None
) -> list[tuple[int, int]]:
    """The (frame_length, frame_step) pairs that give `frames` x `bins` from the signal."""
    lengths = [fixed_length] if fixed_length else [bins]
    if onesided and not fixed_length:
        lengths = [2 * (bins - 1), 2 * (bins - 1) + 1]
    out = []
    for fl in lengths:
        if not 1 <= fl <= signal_len or (fl // 2 + 1 if onesided else fl) != bins:
            continue
        if frames == 1:  # one frame: the step does not matter
            out.append((fl, 1))
            continue
        out += [(fl, s) for s in range(1, signal_len + 1) if 1 + (signal_len - fl) // s == frames]
    return out


@onnx_op("STFT", since=17)
def parse_stft(ctx: NodeContext, args: Args) -> Instruction:
    signal, step_ins, window, length_ins = (arg(args, k) for k in range(4))
    lens = signal.shape.lens()
    if len(lens) != 3 or lens[-1] not in (1, 2):
        raise ctx.error(f"signal {lens} must be [batch, length, 1 or 2]")
    onesided = bool(ctx.attr("onesided", 1))
    step, length = _const_int(ctx, step_ins), _const_int(ctx, length_ins)
    if window is not None:
        if window.shape.ndim() != 1:
            raise ctx.error(f"window {window.shape.lens()} must be 1-D")
        wlen = window.shape.lens()[0]
        if length is not None and length != wlen:
            raise ctx.error(f"frame_length {length} differs from the window's length {wlen}")
        if length is None and length_ins is not None:  # a run-time frame_length: check it
            signal = guard(ctx, signal, length_ins, "equal", [wlen])
        length = wlen
    elif length is None and length_ins is None:
        length = lens[1]
    if step is None or length is None:
        declared = runtime_lens(ctx, step_ins if step is None else length_ins, "frame_step")
        found = _stft_candidates(lens[1], declared[1], declared[2], onesided, length)
        if len(found) != 1:
            raise ctx.error(
                f"frame_step/frame_length are run-time values and the declared output "
                f"{declared} fits {len(found)} (frame_length, frame_step) pairs; make them "
                "constants"
            )
        fl, s = found[0]
        if step is None and declared[1] > 1:
            signal = guard(ctx, signal, step_ins, "equal", [s])
        if length is None:
            signal = guard(ctx, signal, length_ins, "equal", [fl])
        step, length = s, fl
    if step < 1 or not 1 <= length <= lens[1]:
        raise ctx.error(f"frame_step {step} and frame_length {length} for a signal of {lens[1]}")
    frames = 1 + (lens[1] - length) // step
    index = np.arange(frames)[:, None] * step + np.arange(length)[None, :]
    x = ctx.add(Gather(axis=1), signal, ctx.literal(index.astype(np.int64)))
    if window is not None:
        w = ctx.convert(window, x.shape.type())
        w = ctx.add(Broadcast(axis=2, out_lens=tuple(x.shape.lens())), w)
        x = ctx.add(make_op("mul"), x, w)
    return ctx.add(Fft(axis=2, length=length, onesided=onesided), x)


# --- windows --------------------------------------------------------------------------------
def _window(ctx: NodeContext, args: Args, fn: Callable[[np.ndarray], np.ndarray]) -> Instruction:
    out_type = onnx_type_to_shape_type(ctx.attr("output_datatype", 1))
    size = _const_int(ctx, args[0])
    checked = None
    if size is None:
        (size,) = runtime_lens(ctx, args[0], "size")
        checked = args[0]
    if size < 0:
        raise ctx.error(f"window size {size} is negative")
    n = np.arange(size, dtype=np.float64)
    denom = size if ctx.attr("periodic", 1) else size - 1
    with np.errstate(all="ignore"):
        values = fn(2.0 * np.pi * n / denom) if size else n
    out = ctx.literal(values.astype(to_dtype(out_type)))
    return guard(ctx, out, checked, "equal", [size]) if checked is not None else out


@onnx_op("HannWindow", since=17)
def parse_hann_window(ctx: NodeContext, args: Args) -> Instruction:
    return _window(ctx, args, lambda t: 0.5 - 0.5 * np.cos(t))


@onnx_op("HammingWindow", since=17)
def parse_hamming_window(ctx: NodeContext, args: Args) -> Instruction:
    alpha = 25.0 / 46.0
    return _window(ctx, args, lambda t: alpha - (1.0 - alpha) * np.cos(t))


@onnx_op("BlackmanWindow", since=17)
def parse_blackman_window(ctx: NodeContext, args: Args) -> Instruction:
    return _window(ctx, args, lambda t: 0.42 - 0.5 * np.cos(t) + 0.08 * np.cos(2.0 * t))


# --- MelWeightMatrix ------------------------------------------------------------------------
@onnx_op("MelWeightMatrix", since=17)
def parse_mel_weight_matrix(ctx: NodeContext, args: Args) -> Instruction:
    out_type = onnx_type_to_shape_type(ctx.attr("output_datatype", 1))
    values = [ctx.const(a) for a in args[:5]]
    if all(v is not None for v in values):
        mel, dft, rate = (int(np.asarray(v).reshape(-1)[0]) for v in values[:3])
        low, high = (float(np.asarray(v).reshape(-1)[0]) for v in values[3:])
        if mel < 1 or dft < 1 or rate < 1 or not 0 <= low < high:
            raise ctx.error(
                f"num_mel_bins {mel}, dft_length {dft}, sample_rate {rate} and edges "
                f"[{low}, {high}] Hz do not make a mel filter bank"
            )
        try:
            matrix = mel_weight_matrix(mel, dft, rate, low, high)
        except ValueError as exc:
            raise ctx.error(str(exc)) from None
        return ctx.literal(matrix.astype(to_dtype(out_type)))
    lens = runtime_lens(
        ctx, next(a for a, v in zip(args, values, strict=False) if v is None), "num_mel_bins"
    )
    return ctx.add(MelWeightMatrix(out_type=out_type, out_lens=tuple(lens)), *args[:5])
