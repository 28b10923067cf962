"""ONNX Scan (opsets 8 and 9) as a program sub-module, checked against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.helpers import make_model
from tests.onnx.control_flow_models import (
    F,
    check,
    vi,
)

# --- Scan -------------------------------------------------------------------------------------


def scan_body() -> onnx.GraphProto:
    return helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "xt"], ["s_out"]),
            helper.make_node("Mul", ["s_out", "w"], ["y"]),
        ],
        "scan_body",
        [vi("s_in", F, [3]), vi("xt", F, [3])],
        [vi("s_out", F, [3]), vi("y", F, [3])],
    )


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"scan_input_axes": [1], "scan_input_directions": [1]},
        {"scan_output_axes": [1], "scan_output_directions": [1]},
        {"scan_input_axes": [-1], "scan_output_axes": [-1], "scan_input_directions": [1]},
    ],
)
def test_scan9(attrs: dict) -> None:
    rng = np.random.default_rng(4)
    lens = (3, 4) if attrs.get("scan_input_axes", [0])[0] != 0 else (4, 3)
    feeds = {
        "s0": rng.standard_normal(3).astype(np.float32),
        "x": rng.standard_normal(lens).astype(np.float32),
        "w": rng.standard_normal(3).astype(np.float32),
    }
    node = helper.make_node(
        "Scan", ["s0", "x"], ["s", "ys"], num_scan_inputs=1, body=scan_body(), **attrs
    )
    check(make_model([node], feeds, ["s", "ys"], opset=16), feeds)


def test_scan8_with_a_batch_axis() -> None:
    rng = np.random.default_rng(5)
    feeds = {
        "s0": rng.standard_normal((2, 3)).astype(np.float32),
        "x": rng.standard_normal((2, 4, 3)).astype(np.float32),
        "w": rng.standard_normal(3).astype(np.float32),
    }
    node = helper.make_node(
        "Scan", ["", "s0", "x"], ["s", "ys"], num_scan_inputs=1, body=scan_body(), directions=[1]
    )
    check(make_model([node], feeds, ["s", "ys"], opset=8), feeds)
