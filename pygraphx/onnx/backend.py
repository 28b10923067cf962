"""An `onnx.backend.base.Backend` for pygraphx, so ONNX's official backend tests can run it.

`PygraphxBackend.prepare(model, device)` parses and compiles the model for a target (`ref` by
default; pass `target="cpu"` later) and returns a rep whose `run(inputs)` takes the inputs in
graph-input order, as the ONNX test runner gives them. Models whose shapes depend on input
values are compiled per value at run time (`specialize_on_input_values`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from pygraphx.ir.program import Program
from pygraphx.onnx import parse_onnx_buffer
from pygraphx.targets import get_target


class PygraphxBackendRep(BackendRep):
    def __init__(self, program: Program) -> None:
        self.program = program
        self.names = program.get_parameter_names()

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        if isinstance(inputs, dict):
            params = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            if len(inputs) != len(self.names):
                raise ValueError(f"expected {len(self.names)} inputs, got {len(inputs)}")
            params = dict(zip(self.names, inputs, strict=True))
        return tuple(np.array(r) for r in self.program.run(params))


class PygraphxBackend(Backend):
    """The ONNX backend protocol over pygraphx (CPU device; target chosen by keyword)."""

    @classmethod
    def prepare(
        cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any
    ) -> PygraphxBackendRep:
        target = kwargs.pop("target", "ref")
        # test models feed Reshape shapes, Reduce axes, TopK's K, ... as graph inputs
        kwargs.setdefault("specialize_on_input_values", True)
        program = parse_onnx_buffer(model.SerializeToString(), **kwargs)
        program.compile(get_target(target))
        return PygraphxBackendRep(program)

    @classmethod
    def run_model(
        cls,
        model: onnx.ModelProto,
        inputs: Sequence[np.ndarray],
        device: str = "CPU",
        **kwargs: Any,
    ) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"
