"""Signal-processing operators: `fft` (ONNX DFT) and `mel_weight_matrix`.

Complex tensors are real tensors whose last dimension is 2 (real, imaginary); a last dimension
of 1 is a real signal. `fft[axis, length, inverse, onesided]` transforms along `axis` (never the
last dimension) with `length` points (the input is cut or zero-padded to it):

- forward: `X[k] = sum_n x[n] exp(-2 pi i k n / length)`; `onesided` keeps the first
  `length // 2 + 1` bins (the others are conjugates for a real signal);
- inverse: `x[n] = 1/length sum_k X[k] exp(2 pi i k n / length)`; `onesided` takes the one-sided
  spectrum of a real signal and returns that real signal (last dimension 1, numpy's irfft).

The axis may instead come at run time (input 1, as DFT's axis input in opset 20): the output
lens are then given (`out_lens`, the lens the model declares) and the evaluator checks them.
Transforms run through numpy's pocketfft in the input's precision: complex64 for float32 and
narrower types (as ONNX Runtime computes in float, and as numpy computes the values ONNX's node
tests expect), complex128 for double; the result is rounded once to the input type.

`mel_weight_matrix` is ONNX's MelWeightMatrix with its five scalars given at run time (inputs);
the output lens are `out_lens`. With constant inputs the frontend makes a literal instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pygraphx.ir.shape import FLOAT_TYPES, Shape
from pygraphx.ops.base import Op, ShapeError, check_arity, register_op


def fft_lens(
    lens: Sequence[int], axis: int, length: int, inverse: bool, onesided: bool
) -> list[int]:
    """The output lens of `fft` (the axis normalised, the input's last dimension 1 or 2)."""
    out = list(lens)
    n = fft_length(lens[axis], length, inverse, onesided)
    if inverse and onesided:
        out[axis], out[-1] = n, 1
    else:
        out[axis], out[-1] = (n // 2 + 1 if onesided else n), 2
    return out


def fft_length(in_len: int, length: int, inverse: bool, onesided: bool) -> int:
    """The number of transform points: `length`, or by default the input's (2 (n - 1) for the
    inverse of a one-sided spectrum)."""
    if length > 0:
        return length
    return 2 * (in_len - 1) if inverse and onesided else in_len


def fft(x: np.ndarray, axis: int, length: int, inverse: bool, onesided: bool) -> np.ndarray:
    """The reference semantics of `fft` (see the module docstring)."""
    x = np.asarray(x)
    real, ctype = (
        (np.float64, np.complex128) if x.dtype == np.float64 else (np.float32, np.complex64)
    )
    x = x.astype(real)
    rank = x.ndim
    axis = axis + rank if axis < 0 else axis
    signal = x[..., 0] + 1j * x[..., 1] if x.shape[-1] == 2 else x[..., 0]
    signal = signal.astype(ctype, copy=False)
    n = fft_length(x.shape[axis], length, inverse, onesided)
    if inverse and onesided:
        return np.fft.irfft(signal, n=n, axis=axis)[..., np.newaxis]
    if inverse:
        out = np.fft.ifft(signal, n=n, axis=axis)
    else:
        out = np.fft.fft(signal, n=n, axis=axis)
        if onesided:
            out = np.take(out, np.arange(n // 2 + 1), axis=axis)
    return np.stack([out.real, out.imag], axis=-1)


@register_op
class Fft(Op):
    """The discrete Fourier transform along `axis` of a real ([..., 1]) or complex ([..., 2])
    tensor; see the module docstring for `length`, `inverse` and `onesided`."""

    name = "fft"
    axis: int = 1
    length: int = 0
    inverse: bool = False
    onesided: bool = False
    out_lens: tuple[int, ...] = ()

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 1, 2)
        x = inputs[0]
        lens = x.lens()
        if x.type() not in FLOAT_TYPES:
            raise ShapeError(f"fft: input type {x.type()} is not a float type")
        if len(lens) < 2 or lens[-1] not in (1, 2):
            raise ShapeError(
                f"fft: input {lens} must end in a dimension of 1 (real) or 2 (complex)"
            )
        if self.inverse and self.onesided and lens[-1] != 2:
            raise ShapeError("fft: the inverse of a one-sided spectrum needs a complex input")
        if len(inputs) == 2:
            if inputs[1].type() not in ("int32_type", "int64_type") or inputs[1].elements() != 1:
                raise ShapeError(f"fft: the axis input must be one integer, got {inputs[1]}")
            if len(self.out_lens) != len(lens):
                raise ShapeError(f"fft: a run-time axis needs out_lens of rank {len(lens)}")
            return Shape(x.type(), self.out_lens)
        rank = len(lens)
        if not -rank <= self.axis < rank - 1 or self.axis == -1:
            raise ShapeError(f"fft: axis {self.axis} is not a signal axis of {lens}")
        axis = self.axis % rank
        n = fft_length(lens[axis], self.length, self.inverse, self.onesided)
        if n < 1:
            raise ShapeError(f"fft: {n} transform points along axis {axis} of {lens}")
        return Shape(x.type(), fft_lens(lens, axis, self.length, self.inverse, self.onesided))

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = np.asarray(args[0])
        axis = self.axis
        if len(args) == 2:
            axis = int(np.asarray(args[1]).reshape(-1)[0])
            if not -x.ndim <= axis < x.ndim - 1 or axis == -1:
                raise ValueError(f"fft: run-time axis {axis} is not a signal axis of {x.shape}")
        out = fft(x, axis, self.length, self.inverse, self.onesided)
        return out.astype(output_shape.dtype())


# --- MelWeightMatrix ----------------------------------------------------------------------------
def mel_weight_matrix(
    num_mel_bins: int, dft_length: int, sample_rate: int, lower_hz: float, upper_hz: float
) -> np.ndarray:
    """ONNX MelWeightMatrix in float64: [dft_length // 2 + 1, num_mel_bins] triangular filters
    whose edges are evenly spaced on the mel scale, at integer frequency bins. As in ONNX's
    reference and ONNX Runtime, the mel range is cut into num_mel_bins + 2 steps (of which the
    edges use num_mel_bins + 1)."""
    num_bins = dft_length // 2 + 1
    points = np.arange(num_mel_bins + 2, dtype=np.float64)
    low_mel = 2595.0 * np.log1p(lower_hz / 700.0) / np.log(10.0)
    high_mel = 2595.0 * np.log1p(upper_hz / 700.0) / np.log(10.0)
    step = (high_mel - low_mel) / (num_mel_bins + 2)  # sic: ONNX's reference and ORT
    hz = 700.0 * np.expm1((points * step + low_mel) / 2595.0 * np.log(10.0))
    bins = np.floor_divide((dft_length + 1) * hz, sample_rate).astype(np.int64)
    if bins[0] < 0 or bins[-1] >= num_bins:
        raise ValueError(
            f"the mel filters reach frequency bins {bins[0]}..{bins[-1]}, outside the "
            f"{num_bins} bins of a {dft_length}-point DFT at {sample_rate} Hz (check the edges)"
        )
    out = np.zeros((num_bins, num_mel_bins))
    for i in range(num_mel_bins):
        left, center, right = bins[i], bins[i + 1], bins[i + 2]
        if center == left:
            out[center, i] = 1.0
        else:
            j = np.arange(left, center + 1)
            out[j, i] = (j - left) / (center - left)
        if right > center:
            j = np.arange(center, right)
            out[j, i] = (right - j) / (right - center)
    return out


@register_op
class MelWeightMatrix(Op):
    """ONNX MelWeightMatrix from its five run-time scalars (num_mel_bins, dft_length,
    sample_rate, lower_edge_hertz, upper_edge_hertz); `out_lens` are the declared lens."""

    name = "mel_weight_matrix"
    out_type: str = "float_type"
    out_lens: tuple[int, ...] = ()

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, 5)
        if any(s.elements() != 1 for s in inputs):
            raise ShapeError("mel_weight_matrix: every input must be a scalar")
        if len(self.out_lens) != 2:
            raise ShapeError(f"mel_weight_matrix: out_lens {list(self.out_lens)} is not 2-D")
        return Shape(self.out_type, self.out_lens)

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        mel, dft, rate = (int(np.asarray(a).reshape(-1)[0]) for a in args[:3])
        low, high = (float(np.asarray(a).reshape(-1)[0]) for a in args[3:])
        out = mel_weight_matrix(mel, dft, rate, low, high)
        return out.astype(output_shape.dtype())
