"""ONNX's own node tests for the signal, detection and other default-domain ops of
test_signal_ops.py, test_detection_ops.py and test_misc_default_ops.py (and the quantize
linear ops), run through the backend adapter (the backend suite in test_backend_node.py still
excludes them).
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from pygraphx.onnx.backend import PygraphxBackend

# --- ONNX's node tests ------------------------------------------------------------------------
NODE_TESTS = re.compile(
    r"test_(quantizelinear|dequantizelinear|dynamicquantizelinear|dft|stft|melweightmatrix|"
    r"blackmanwindow|hammingwindow|hannwindow|nonmaxsuppression|roialign|nonzero|unique|col2im|"
    r"gridsample|affine_grid|cumprod|tensorscatter|bitcast)"
)
# sub-byte types have no pygraphx shape type; the expanded forms need other ops' run-time shapes
NODE_SKIP = re.compile(
    r".*(int4|int2|uint4|uint2|float4e2m1)$|test_(\w*window|affine_grid)\w*_expanded$"
)


def _node_cases():
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    return [c for c in cases if NODE_TESTS.match(c.name) and not NODE_SKIP.match(c.name)]


@pytest.mark.parametrize("case", _node_cases(), ids=lambda c: c.name)
def test_onnx_node_suite(case):
    rep = PygraphxBackend.prepare(case.model)
    for inputs, expected in case.data_sets:
        inputs = [
            numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x for x in inputs
        ]
        outputs = rep.run(inputs)
        assert len(outputs) == len(expected)
        for got, want in zip(outputs, expected, strict=True):
            want = (
                numpy_helper.to_array(want)
                if isinstance(want, onnx.TensorProto)
                else np.asarray(want)
            )
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_allclose(
                got.astype(np.float64), want.astype(np.float64), rtol=case.rtol, atol=case.atol
            )
