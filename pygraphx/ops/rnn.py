"""Recurrent layers: `rnn`, `gru` and `lstm`, one operator per layer, as MIGraphX has them.

Each operator runs a whole layer (every time step, one or both directions) in numpy and returns
one of its results, chosen by the `output` attribute: `hidden_states` (every step's hidden state,
`[seq, num_directions, batch, hidden]`), `last_hidden` (`[num_directions, batch, hidden]`) or,
for `lstm`, `last_cell`. The ONNX frontend emits the operator once per requested result (MIGraphX
has `rnn_last_hs_output` / `rnn_last_cell_output` for this; `rewrite_rnn` later unrolls them).

Inputs come in ONNX's layout 0 with every optional input made explicit by the frontend:

    rnn/gru: X [seq, batch, input], W [D, G*H, input], R [D, G*H, H], B [D, 2*G*H],
             sequence_lens [batch] (int32), initial_h [D, batch, H]
    lstm:    the same, then initial_c [D, batch, H] and P [D, 3*H] (peepholes i, o, f)

with gates `G` = 1 (rnn), 3 (gru: z, r, h) or 4 (lstm: i, o, f, c). `sequence_lens` masks steps:
batch entry `b` runs steps `t < sequence_lens[b]` only (a reverse direction starts from its
last valid step), its hidden state is frozen afterwards and `hidden_states` is zero there; an
empty sequence has zero final states (as in ONNX Runtime), not its initial ones.

`actv_funcs` holds the activation names (ONNX's, lower case) for every direction in order,
with `actv_alphas` / `actv_betas` resolved per function. `clip` > 0 clips every gate's input to
`[-clip, clip]` before its activation (LSTM's cell state, the input of `h`, is not clipped, as in
ONNX Runtime). Half and bf16 inputs are computed in float32.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np

from pygraphx.ir.shape import FLOAT_TYPES, Shape
from pygraphx.ops.base import Op, ShapeError, check_arity, register_op
from pygraphx.ops.handler import NUMPY

Activation = Callable[[np.ndarray, float, float], np.ndarray]


def _softplus(x: np.ndarray, a: float, b: float) -> np.ndarray:
    return np.logaddexp(0, x).astype(x.dtype)


# ONNX activation name (lower case) -> f(x, alpha, beta)
ACTIVATIONS: dict[str, Activation] = {
    "sigmoid": lambda x, a, b: NUMPY.sigmoid(x),
    "tanh": lambda x, a, b: np.tanh(x),
    "relu": lambda x, a, b: np.maximum(x, 0),
    "affine": lambda x, a, b: x * x.dtype.type(a) + x.dtype.type(b),
    "leakyrelu": lambda x, a, b: np.where(x >= 0, x, x * x.dtype.type(a)),
    "thresholdedrelu": lambda x, a, b: np.where(x > a, x, 0).astype(x.dtype),
    "scaledtanh": lambda x, a, b: x.dtype.type(a) * np.tanh(x * x.dtype.type(b)),
    "hardsigmoid": lambda x, a, b: np.clip(x * x.dtype.type(a) + x.dtype.type(b), 0, 1),
    "elu": lambda x, a, b: np.where(x >= 0, x, x.dtype.type(a) * np.expm1(np.minimum(x, 0))),
    "softsign": lambda x, a, b: x / (1 + np.abs(x)),
    "softplus": _softplus,
}

# activations that take (alpha, beta) -> their defaults, as ONNX Runtime has them (None: the
# activation takes no such argument); activations missing here take neither
ACTIVATION_PARAMETERS: dict[str, tuple[float | None, float | None]] = {
    "affine": (0.0, 0.0),
    "leakyrelu": (0.01, None),
    "thresholdedrelu": (0.0, None),
    "scaledtanh": (0.0, 0.0),
    "hardsigmoid": (0.2, 0.5),
    "elu": (1.0, None),
}

DIRECTIONS = ("forward", "reverse", "bidirectional")


@dataclasses.dataclass(frozen=True)
class _Recurrent(Op):
    """Shared shape checks and the time loop of `rnn`, `gru` and `lstm`."""

    hidden_size: int = 0
    actv_funcs: tuple[str, ...] = ()
    actv_alphas: tuple[float, ...] = ()
    actv_betas: tuple[float, ...] = ()
    direction: str = "forward"
    clip: float = 0.0
    output: str = "hidden_states"

    num_gates: ClassVar[int] = 1
    num_activations: ClassVar[int] = 1
    outputs: ClassVar[tuple[str, ...]] = ("hidden_states", "last_hidden")
    num_inputs: ClassVar[int] = 6

    def num_directions(self) -> int:
        return 2 if self.direction == "bidirectional" else 1

    def compute_shape(self, inputs: Sequence[Shape]) -> Shape:
        check_arity(self, inputs, self.num_inputs)
        if self.direction not in DIRECTIONS:
            raise ShapeError(
                f"{self.name}: direction {self.direction!r} is not one of {DIRECTIONS}"
            )
        if self.output not in self.outputs:
            raise ShapeError(f"{self.name}: output {self.output!r} is not one of {self.outputs}")
        d, h = self.num_directions(), self.hidden_size
        want = self.num_activations * d
        if len(self.actv_funcs) != want:
            raise ShapeError(
                f"{self.name}: {want} activation functions expected for {self.direction}, "
                f"got {list(self.actv_funcs)}"
            )
        unknown = [f for f in self.actv_funcs if f not in ACTIVATIONS]
        if unknown:
            raise ShapeError(f"{self.name}: unknown activation(s) {unknown}")
        if len(self.actv_alphas) != want or len(self.actv_betas) != want:
            raise ShapeError(f"{self.name}: one alpha and one beta per activation expected")
        x = inputs[0]
        if x.type() not in FLOAT_TYPES:
            raise ShapeError(f"{self.name}: X must be a floating-point tensor, got {x.type()}")
        if x.ndim() != 3:
            raise ShapeError(f"{self.name}: X must be [seq, batch, input], got {x.lens()}")
        seq, batch, size = x.lens()
        g = self.num_gates
        expected = {
            "W": [d, g * h, size],
            "R": [d, g * h, h],
            "B": [d, 2 * g * h],
            "sequence_lens": [batch],
            "initial_h": [d, batch, h],
        }
        if self.num_inputs == 8:
            expected.update({"initial_c": [d, batch, h], "P": [d, 3 * h]})
        for (what, lens), s in zip(expected.items(), inputs[1:], strict=True):
            if s.lens() != lens:
                raise ShapeError(f"{self.name}: {what} must have lens {lens}, got {s.lens()}")
            if what == "sequence_lens":
                if s.type() != "int32_type":
                    raise ShapeError(f"{self.name}: sequence_lens must be int32, got {s.type()}")
            elif s.type() != x.type():
                raise ShapeError(f"{self.name}: {what} has type {s.type()}, X has {x.type()}")
        if self.output == "hidden_states":
            return Shape(x.type(), [seq, d, batch, h])
        return Shape(x.type(), [d, batch, h])

    # --- numerics ---------------------------------------------------------------------------
    def activation(self, direction: int, k: int) -> Callable[[np.ndarray], np.ndarray]:
        """Activation `k` of `direction`, with `clip` applied to its input."""
        i = direction * self.num_activations + k
        fn = ACTIVATIONS[self.actv_funcs[i]]
        alpha, beta, clip = self.actv_alphas[i], self.actv_betas[i], self.clip

        def apply(x: np.ndarray) -> np.ndarray:
            if clip > 0:
                x = np.clip(x, -clip, clip)
            return fn(x, alpha, beta)

        return apply

    def init_state(self, d: int, args: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [args[5][d]]

    def step(
        self, d: int, xw: np.ndarray, state: list[np.ndarray], args: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """One time step: `xw` is `x_t @ W^T + Wb` for the direction; returns the new state."""
        raise NotImplementedError

    def compute(self, output_shape: Shape, args: Sequence[np.ndarray]) -> np.ndarray:
        x = args[0]
        work = np.float64 if x.dtype == np.float64 else np.float32
        args = [a if k == 4 else np.asarray(a, dtype=work) for k, a in enumerate(args)]
        x, w, b, seq_lens = args[0], args[1], args[3], np.asarray(args[4])
        seq, batch, _ = x.shape
        g, h = self.num_gates, self.hidden_size
        d_count = self.num_directions()
        hidden = np.zeros((seq, d_count, batch, h), dtype=work)
        last = [np.zeros((d_count, batch, h), dtype=work) for _ in range(2)]
        for d in range(d_count):
            reverse = self.direction == "reverse" or d == 1
            # the input projection of every step at once, as ONNX Runtime does it
            xw = np.matmul(x, w[d].T) + b[d, : g * h]
            state = self.init_state(d, args)
            steps = range(seq - 1, -1, -1) if reverse else range(seq)
            for t in steps:
                active = (t < seq_lens)[:, None]
                new = self.step(d, xw[t], state, args)
                state = [np.where(active, n, s) for n, s in zip(new, state, strict=True)]
                hidden[t, d] = np.where(active, state[0], 0)
            # ONNX Runtime reports zero final states for empty sequences, not the initial ones
            empty = (seq_lens == 0)[:, None]
            for k, s in enumerate(state):
                last[k][d] = np.where(empty, 0, s)
        result = {"hidden_states": hidden, "last_hidden": last[0], "last_cell": last[1]}
        return result[self.output].astype(output_shape.dtype())


@register_op
class Rnn(_Recurrent):
    """Elman RNN: `H = f(X W^T + H R^T + Wb + Rb)`."""

    name = "rnn"

    def step(
        self, d: int, xw: np.ndarray, state: list[np.ndarray], args: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        r, b = args[2][d], args[3][d]
        h = self.hidden_size
        return [self.activation(d, 0)(xw + state[0] @ r.T + b[h:])]


@register_op
class Gru(_Recurrent):
    """GRU with gates z, r, h; `linear_before_reset` applies r after the recurrent product."""

    name = "gru"
    linear_before_reset: bool = False

    num_gates = 3
    num_activations = 2

    def step(
        self, d: int, xw: np.ndarray, state: list[np.ndarray], args: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        r_w, b = args[2][d], args[3][d]
        h = self.hidden_size
        f, g = self.activation(d, 0), self.activation(d, 1)
        rb = b[3 * h :]
        prev = state[0]
        zr = xw[:, : 2 * h] + prev @ r_w[: 2 * h].T + rb[: 2 * h]
        z, r = f(zr[:, :h]), f(zr[:, h:])
        if self.linear_before_reset:
            candidate = g(xw[:, 2 * h :] + r * (prev @ r_w[2 * h :].T + rb[2 * h :]))
        else:
            candidate = g(xw[:, 2 * h :] + (r * prev) @ r_w[2 * h :].T + rb[2 * h :])
        return [(1 - z) * candidate + z * prev]


@register_op
class Lstm(_Recurrent):
    """LSTM with gates i, o, f, c, optional peepholes and coupled input/forget gates."""

    name = "lstm"
    input_forget: bool = False

    num_gates = 4
    num_activations = 3
    outputs = ("hidden_states", "last_hidden", "last_cell")
    num_inputs = 8

    def init_state(self, d: int, args: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [args[5][d], args[6][d]]

    def step(
        self, d: int, xw: np.ndarray, state: list[np.ndarray], args: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        r_w, b, p = args[2][d], args[3][d], args[7][d]
        h = self.hidden_size
        f, g = self.activation(d, 0), self.activation(d, 1)
        prev_h, prev_c = state
        gates = xw + prev_h @ r_w.T + b[4 * h :]
        pi, po, pf = p[:h], p[h : 2 * h], p[2 * h :]
        i = f(gates[:, :h] + pi * prev_c)
        if self.input_forget:
            forget = 1 - i
        else:
            forget = f(gates[:, 2 * h : 3 * h] + pf * prev_c)
        cell = forget * prev_c + i * g(gates[:, 3 * h :])
        o = f(gates[:, h : 2 * h] + po * cell)
        # ONNX Runtime clips every gate's input, but not the cell state that h is applied to
        k = d * 3 + 2
        hidden = o * ACTIVATIONS[self.actv_funcs[k]](cell, self.actv_alphas[k], self.actv_betas[k])
        return [hidden, cell]
