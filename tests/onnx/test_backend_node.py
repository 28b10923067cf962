"""The official ONNX backend node suite on the `ref` target.

Every node test onnx ships runs, except the patterns in EXCLUDE; each exclusion says why. The
pass count shows in pytest's summary line.
"""

from __future__ import annotations

import onnx.backend.test

from pygraphx.runtime.onnx_backend import PygraphxBackend

# regex on the test name -> reason it is excluded
EXCLUDE: dict[str, str] = {}

_backend_test = onnx.backend.test.BackendTest(PygraphxBackend, __name__)
for _pattern in EXCLUDE:
    _backend_test.exclude(_pattern)

# the node suite only (the model suites need downloads or are run elsewhere)
globals().update(
    {
        name: case
        for name, case in _backend_test.enable_report().test_cases.items()
        if name == "OnnxBackendNodeModelTest"
    }
)
