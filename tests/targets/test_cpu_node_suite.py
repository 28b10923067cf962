"""The official ONNX backend node suite on the `cpu` target (torch on the CPU).

It mirrors `tests/onnx/test_backend_node.py` (the `ref` target) with the same exclusions, so
the two pass counts compare directly; `CPU_EXCLUDE` lists what fails on `cpu` alone, and why.
"""

from __future__ import annotations

from typing import Any

import onnx
import onnx.backend.test
import pytest

pytest.importorskip("torch")

from pygraphx.onnx.backend import PygraphxBackend, PygraphxBackendRep  # noqa: E402
from tests.onnx.test_backend_node import EXCLUDE  # noqa: E402

# regex (matched at the start of the test name) -> why it fails on cpu but not on ref
# (none today: Unique, once listed here, is lowered to torch.unique with its data-dependent lens)
CPU_EXCLUDE: dict[str, str] = {}


class CpuBackend(PygraphxBackend):
    """The pygraphx backend compiling for the `cpu` target."""

    @classmethod
    def prepare(
        cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any
    ) -> PygraphxBackendRep:
        kwargs.setdefault("target", "cpu")
        return super().prepare(model, device, **kwargs)


_backend_test = onnx.backend.test.BackendTest(CpuBackend, __name__)
for _pattern in {**EXCLUDE, **CPU_EXCLUDE}:
    _backend_test.exclude(f"^(?:{_pattern})")

globals().update(
    {
        name: case
        for name, case in _backend_test.enable_report().test_cases.items()
        if name == "OnnxBackendNodeModelTest"
    }
)
