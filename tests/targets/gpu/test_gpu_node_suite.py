"""The official ONNX backend node suite on the `gpu` target (needs a CUDA/ROCm GPU).

It mirrors `tests/targets/test_cpu_node_suite.py` with the same exclusions, so the pass counts
of ref, cpu and gpu compare directly; `GPU_EXCLUDE` lists what fails on `gpu` alone, and why.
"""

from __future__ import annotations

from typing import Any

import onnx
import onnx.backend.test
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("the gpu node suite needs a GPU", allow_module_level=True)

from pygraphx.onnx.backend import PygraphxBackend, PygraphxBackendRep  # noqa: E402
from tests.onnx.test_backend_node import EXCLUDE  # noqa: E402
from tests.targets.test_cpu_node_suite import CPU_EXCLUDE  # noqa: E402

# regex (matched at the start of the test name) -> why it fails on gpu but not on cpu
GPU_EXCLUDE: dict[str, str] = {}


class GpuBackend(PygraphxBackend):
    """The pygraphx backend compiling for the `gpu` target."""

    @classmethod
    def prepare(
        cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any
    ) -> PygraphxBackendRep:
        kwargs.setdefault("target", "gpu")
        return super().prepare(model, device, **kwargs)


_backend_test = onnx.backend.test.BackendTest(GpuBackend, __name__)
for _pattern in {**EXCLUDE, **CPU_EXCLUDE, **GPU_EXCLUDE}:
    _backend_test.exclude(f"^(?:{_pattern})")

globals().update(
    {
        name: case
        for name, case in _backend_test.enable_report().test_cases.items()
        if name == "OnnxBackendNodeModelTest"
    }
)
