"""Activation smoothing (SmoothQuant, Xiao et al. 2023) for `quantize_int8` / `quantize_fp8`.

Transformers' activations have a few input channels far larger than the rest (the outputs of
LayerNorm and GELU in BERT-like encoders), so one scale per tensor leaves the ordinary channels
with a handful of int8 steps. Smoothing moves that range into the weights, exactly in float:

    x @ W = (x / s) @ (s[:, None] * W),   s[k] = max|x[..., k]|^alpha / max|W[k, :]|^(1 - alpha)

`x / s` (a `mul` by the constant `1 / s` inserted after `x`) is then quantised per tensor and
`s * W` per output channel as usual. It applies to an activation whose every quantised use is
the left operand of a `dot` with constant weights (all such dots, e.g. attention's Q, K and V
projections of one LayerNorm output, share one `s` from all their weights' rows); `max|x[k]|`
is the largest magnitude of input channel `k` over the calibration samples. `alpha` = 0 leaves
the activation as it is, 1 moves all of its range into the weights; 0.5 is the paper's default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["smoothable", "smoothing_factors"]

#: the factors are kept within [1/LIMIT, LIMIT] (an all-zero channel or row gets 1)
LIMIT = 1e4


def smoothable(operands: Sequence[Any]) -> dict[int, list[Any]]:
    """{id(activation): its weight operands} for the activations every quantised use of which
    is the left operand of a `dot` whose right operand is constant (`operands` are
    `int8.QuantizedInput`s)."""
    uses: dict[int, list[Any]] = {}
    for op in operands:
        if not op.constant:
            uses.setdefault(id(op.value), []).append(op)
    groups: dict[int, list[Any]] = {}
    for key, group in uses.items():
        if all(_left_of_weights(op, operands) for op in group):
            groups[key] = [_partner(op, operands) for op in group]
    return groups


def _left_of_weights(op: Any, operands: Sequence[Any]) -> bool:
    if op.ins.op.name != "dot" or op.index != 0 or op.value.shape.ndim() < 2:
        return False
    partner = _partner(op, operands)
    return partner is not None and partner.constant


def _partner(op: Any, operands: Sequence[Any]) -> Any:
    return next((o for o in operands if o.ins is op.ins and o.index != op.index), None)


def smoothing_factors(act_max: np.ndarray, weight_rows_max: np.ndarray, alpha: float) -> np.ndarray:
    """s[k] = act_max[k]^alpha / weight_rows_max[k]^(1 - alpha), float32, 1 where either is 0."""
    a = np.asarray(act_max, dtype=np.float64)
    w = np.asarray(weight_rows_max, dtype=np.float64)
    ok = (a > 0) & (w > 0) & np.isfinite(a) & np.isfinite(w)
    with np.errstate(all="ignore"):
        s = np.where(ok, a**alpha / w ** (1.0 - alpha), 1.0)
    return np.clip(s, 1.0 / LIMIT, LIMIT).astype(np.float32)
