"""com.microsoft MatMulNBits (block-quantised packed weights) on pygraphx `ref` against
ONNX Runtime.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import run_pgx
from tests.onnx.contrib_check import (
    MS,
    RNG,
    check_ort,
    node_model,
    rand,
)

# --- MatMulNBits ------------------------------------------------------------------------------


def pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """LSB-first bit packing of the last axis of `values` into uint8."""
    stream = ((values[..., None] >> np.arange(bits)) & 1).astype(np.uint8)
    return np.packbits(stream.reshape(*values.shape[:-1], -1), axis=-1, bitorder="little")


@pytest.mark.parametrize(
    ("k", "n", "bits", "block", "zero_points", "bias", "a_lens"),
    [
        (40, 6, 4, 16, "packed", False, (2, 3)),
        (40, 6, 4, 16, None, False, (2, 3)),
        (40, 6, 4, 16, "float", True, (2, 3)),
        (32, 6, 4, 32, "packed", False, (5,)),
        (64, 7, 4, 16, "packed", True, (1, 2, 64)[:2]),
        (40, 6, 8, 16, "packed", False, (2, 3)),
        (40, 6, 8, 16, None, True, (2, 3)),
        (40, 6, 2, 16, "packed", False, (2, 3)),
        (40, 6, 4, 16, "flat_scales", False, (2, 3)),
    ],
)
def test_matmul_nbits(
    k: int, n: int, bits: int, block: int, zero_points: str | None, bias: bool, a_lens: tuple
) -> None:
    blocks = -(-k // block)
    quantized = RNG.integers(0, 2**bits, (n, blocks, block))
    scales = (RNG.random((n, blocks)) * 0.1 + 0.01).astype(np.float32)
    zp: np.ndarray | None = None
    if zero_points in ("packed", "flat_scales"):
        zp = pack_bits(RNG.integers(0, 2**bits, (n, blocks)), bits)
    elif zero_points == "float":
        zp = (RNG.random((n, blocks)) * 2**bits).astype(np.float32)
    inputs = [
        ("a", rand(*a_lens, k), False),
        ("b", pack_bits(quantized, bits), True),
        ("scales", scales.reshape(-1) if zero_points == "flat_scales" else scales, True),
        ("zero_points", zp, True),
        ("g_idx", None, True),
        ("bias", rand(n) if bias else None, True),
    ]
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block}
    check_ort("MatMulNBits", inputs, attrs, domain=MS, rtol=1e-5, atol=2e-5)


def test_matmul_nbits_needs_constant_weights() -> None:
    inputs = [
        ("a", rand(2, 32), False),
        ("b", pack_bits(RNG.integers(0, 16, (4, 1, 32)), 4), False),
        ("scales", rand(4, 1), True),
    ]
    model, feeds = node_model("MatMulNBits", inputs, {"K": 32, "N": 4, "block_size": 32}, domain=MS)
    with pytest.raises(Exception, match="must be known at compile time"):
        run_pgx(model, feeds, specialize_on_input_values=False)
