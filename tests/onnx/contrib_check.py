"""What the attention and com.microsoft contrib-op tests share: random inputs, one-node models
importing both the default and the com.microsoft domain, the comparison of pygraphx `ref`
with ONNX Runtime (or the ONNX reference evaluator), and RotaryEmbedding's inputs (used by
the ONNX and the com.microsoft op)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from tests import helpers
from tests.helpers import NodeInput, run_ort, run_pgx

MS = "com.microsoft"
# (name, value or None for an omitted input, is an initializer)
RNG = np.random.default_rng(0)


def rand(*lens: int, dtype: type = np.float32, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(lens) * scale).astype(dtype)


def node_model(
    op_type: str,
    inputs: Sequence[NodeInput],
    attrs: dict[str, Any] | None = None,
    outputs: Sequence[int] = (0,),
    *,
    opset: int = 23,
    domain: str = "",
    out_types: dict[int, type] | None = None,
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node model importing both the default and the com.microsoft domain, outputs
    typed (ONNX Runtime wants a type for every graph output)."""
    return helpers.node_model(
        op_type, inputs, attrs, outputs, opset=opset, domain=domain,
        extra_opsets=((MS, 1),), typed=True, out_types=out_types,
    )  # fmt: skip


def run_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    return [np.asarray(r) for r in ReferenceEvaluator(model).run(None, feeds)]


def compare(
    ours: Sequence[np.ndarray],
    ref: Sequence[np.ndarray],
    rtol: float = 1e-5,
    atol: float = 1e-6,
    masked_floor: bool = False,
) -> None:
    assert len(ours) == len(ref)
    for k, (a, b) in enumerate(zip(ours, ref, strict=True)):
        b = np.asarray(b)
        assert a.dtype == b.dtype, f"output {k}: dtype {a.dtype}, expected {b.dtype}"
        assert a.shape == b.shape, f"output {k}: shape {a.shape}, expected {b.shape}"
        if masked_floor:  # ONNX Runtime masks with the lowest float, the ONNX spec with -inf
            lowest = np.finfo(a.dtype).min
            a, b = np.maximum(a, lowest), np.maximum(b, lowest)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {k}")


def check_ort(
    op_type: str,
    inputs: Sequence[NodeInput],
    attrs: dict[str, Any] | None = None,
    outputs: Sequence[int] = (0,),
    *,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    **kw: Any,
) -> list[np.ndarray]:
    masked_floor = kw.pop("masked_floor", False)
    model, feeds = node_model(op_type, inputs, attrs, outputs, **kw)
    ours = run_pgx(model, feeds)
    compare(ours, run_ort(model, feeds), rtol, atol, masked_floor)
    return ours


def rotary_inputs(
    *,
    batch: int = 2,
    seq: int = 3,
    heads: int = 2,
    size: int = 8,
    rank: int = 4,
    positions: str | None = "2d",
    positions_const: bool = False,
    max_pos: int = 10,
    rotary_dim: int = 0,
    contrib: bool = False,
    dtype: type = np.float32,
) -> list[NodeInput]:
    x = rand(batch, heads, seq, size, dtype=dtype) if rank == 4 else rand(batch, seq, heads * size)
    half = (rotary_dim or size) // 2
    if positions is None:
        cos, sin, pos = (
            rand(batch, seq, half, dtype=dtype),
            rand(batch, seq, half, dtype=dtype),
            None,
        )
    else:
        cos, sin = rand(max_pos, half, dtype=dtype), rand(max_pos, half, dtype=dtype)
        if positions == "2d":
            pos = RNG.integers(0, max_pos - seq, (batch, seq)).astype(np.int64)
        else:
            pos = np.array([max_pos - seq - 1], dtype=np.int64)
    if contrib:
        return [
            ("x", x, False),
            ("pos", pos, positions_const),
            ("cos", cos, True),
            ("sin", sin, True),
        ]
    return [("x", x, False), ("cos", cos, True), ("sin", sin, True), ("pos", pos, positions_const)]
