"""The official ONNX backend model suites on the `ref` target.

`simple`, `pytorch-converted`, `pytorch-operator`, and `real`: onnx ships the "light" versions
of the real zoo models (ResNet-50, Inception v1/v2, DenseNet-121, ShuffleNet, SqueezeNet, VGG-19,
ZFNet-512, AlexNet) with their weights replaced, and the runner compares against ONNX's
reference evaluator on generated inputs. The node suite is in test_backend_node.py.
"""

from __future__ import annotations

import onnx.backend.test

from pygraphx.onnx.backend import PygraphxBackend

# regex (matched at the start of the test name) -> why those tests are excluded
EXCLUDE: dict[str, str] = {
    r"test_strnorm_model": "string tensors are not supported (no string shape type)",
    r"test_gradient_of_": "Gradient (ai.onnx.preview.training) is a training op: out of scope",
    r"test_sequence_model8": "a sequence graph output: sequences are resolved at compile time",
}

SUITES = (
    "OnnxBackendSimpleModelTest",
    "OnnxBackendPyTorchConvertedModelTest",
    "OnnxBackendPyTorchOperatorModelTest",
    "OnnxBackendRealModelTest",
)

_backend_test = onnx.backend.test.BackendTest(PygraphxBackend, __name__)
for _pattern in EXCLUDE:
    _backend_test.exclude(f"^(?:{_pattern})")

globals().update(
    {
        name: case
        for name, case in _backend_test.enable_report().test_cases.items()
        if name in SUITES
    }
)
