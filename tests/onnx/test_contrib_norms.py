"""com.microsoft activations and normalisations (and BiasAdd, against numpy) on pygraphx `ref`
against ONNX Runtime.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.helpers import NodeInput, run_pgx
from tests.onnx.contrib_check import (
    MS,
    RNG,
    check_ort,
    node_model,
    rand,
)

# --- com.microsoft activations and normalisations ---------------------------------------------


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "outputs"),
    [
        ("Gelu", [("x", rand(2, 3, 8), False)], {}, (0,)),
        ("BiasGelu", [("x", rand(2, 3, 8), False), ("b", rand(8), True)], {}, (0,)),
        ("FastGelu", [("x", rand(2, 3, 8), False)], {}, (0,)),
        ("FastGelu", [("x", rand(2, 3, 8), False), ("b", rand(8), True)], {}, (0,)),
        ("QuickGelu", [("x", rand(2, 3, 8), False)], {}, (0,)),
        ("QuickGelu", [("x", rand(2, 3, 8), False)], {"alpha": 1.3}, (0,)),
        (
            "SkipLayerNormalization",
            [
                ("x", rand(2, 3, 8), False),
                ("skip", rand(2, 3, 8), False),
                ("gamma", rand(8), True),
                ("beta", rand(8), True),
                ("bias", rand(8), True),
            ],
            {"epsilon": 1e-5},
            (0, 3),
        ),
        (
            "SkipLayerNormalization",
            [
                ("x", rand(2, 3, 8), False),
                ("skip", rand(3, 8), False),
                ("gamma", rand(8), True),
                ("beta", rand(8), True),
            ],
            {},
            (0, 1, 2, 3),
        ),
        (
            "SkipSimplifiedLayerNormalization",
            [
                ("x", rand(2, 3, 8), False),
                ("skip", rand(2, 3, 8), False),
                ("gamma", rand(8), True),
                ("bias", rand(8), True),
            ],
            {"epsilon": 1e-5},
            (0, 1, 2, 3),
        ),
    ],
)
def test_contrib_elementwise_and_norms(
    op: str, inputs: list[NodeInput], attrs: dict[str, Any], outputs: tuple[int, ...]
) -> None:
    check_ort(op, inputs, attrs, outputs, domain=MS)


@pytest.mark.parametrize(
    ("scale_lens", "attrs"), [((8,), {}), ((3, 8), {"axis": 1, "epsilon": 1e-3})]
)
def test_simplified_layer_normalization(scale_lens: tuple[int, ...], attrs: dict[str, Any]) -> None:
    # registered by ONNX Runtime in the default domain
    inputs = [("x", rand(2, 3, 8), False), ("scale", rand(*scale_lens), True)]
    check_ort("SimplifiedLayerNormalization", inputs, attrs, (0, 1), opset=17)


def test_layer_normalization_before_opset_17() -> None:
    inputs = [("x", rand(2, 3, 8), False), ("scale", rand(8), True), ("b", rand(8), True)]
    check_ort("LayerNormalization", inputs, {"epsilon": 1e-5}, opset=13)


def test_bias_add() -> None:
    # ONNX Runtime implements BiasAdd for CUDA only
    x, bias, skip = rand(2, 4, 8), rand(8), rand(2, 4, 8)
    model, feeds = node_model(
        "BiasAdd", [("x", x, False), ("b", bias, True), ("s", skip, False)], domain=MS
    )
    np.testing.assert_allclose(run_pgx(model, feeds)[0], x + bias + skip, rtol=1e-6)


@pytest.mark.parametrize(
    ("segments", "mask", "positions"),
    [(True, True, False), (True, False, False), (False, True, True)],
)
def test_embed_layer_normalization(segments: bool, mask: bool, positions: bool) -> None:
    batch, seq, hidden = 2, 5, 8
    ids = RNG.integers(0, 20, (batch, seq)).astype(np.int32)
    seg = RNG.integers(0, 2, (batch, seq)).astype(np.int32) if segments else None
    mask_value = np.array([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1]], np.int32) if mask else None
    pos = RNG.integers(0, 8, (batch, seq)).astype(np.int32) if positions else None
    inputs = [
        ("ids", ids, False),
        ("seg", seg, False),
        ("words", rand(20, hidden), True),
        ("pos_table", rand(8, hidden), True),
        ("seg_table", rand(2, hidden) if segments else None, True),
        ("gamma", rand(hidden), True),
        ("beta", rand(hidden), True),
        ("mask", mask_value, False),
        ("positions", pos, False),
    ]
    outputs = (0, 1, 2)
    check_ort(
        "EmbedLayerNormalization", inputs, {"epsilon": 1e-5}, outputs, domain=MS,
        out_types={0: np.float32, 1: np.int32, 2: np.float32},
    )  # fmt: skip
