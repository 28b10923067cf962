"""pygraphx: a graph compiler and inference engine for ONNX models (after AMD MIGraphX).

The public API follows MIGraphX's Python module, so a script written for `import migraphx` runs
with `import pygraphx as migraphx`:

    prog = pygraphx.parse_onnx("resnet50.onnx")
    prog.compile(pygraphx.get_target("ref"))
    out = np.array(prog.run({"input": image})[0])
"""

from __future__ import annotations

from typing import Any

# first: importing targets.cpu bounds how long GNU OpenMP's idle workers spin, which it reads
# once, when torch loads it (targets/cpu/__init__.py); `generate` below imports torch
from pygraphx.targets import cpu as _cpu  # noqa: F401  # isort: skip

# isort: split
from pygraphx import generate  # a package that is also callable: pygraphx.generate(...)
from pygraphx.ir.argument import Argument, Literal, generate_argument, generate_literal
from pygraphx.ir.instruction import Instruction
from pygraphx.ir.module import Module
from pygraphx.ir.program import Program, ProgramError
from pygraphx.ir.serialize import SerializationError, load, save
from pygraphx.ir.shape import Shape
from pygraphx.onnx import (
    ExternalDataError,
    OnnxParseError,
    UnsupportedOperatorError,
    get_onnx_operators,
    parse_onnx,
    parse_onnx_buffer,
)
from pygraphx.ops import make_op
from pygraphx.passes.pipeline import optimize
from pygraphx.quantize import (
    QuantizeError,
    quantize_bf16,
    quantize_fp8,
    quantize_fp16,
    quantize_int8,
)
from pygraphx.runtime.evaluator import EvaluationError
from pygraphx.targets import Target, get_target
from pygraphx.targets.gpu import GpuUnavailableError, check_gpu
from pygraphx.version import __version__


# --- MIGraphX's device API (torch is imported on first use) ---------------------------------
def to_gpu(arg: Any, device_id: int = 0) -> Any:
    """Copy an argument or array to GPU `device_id` (a `GpuArgument`)."""
    check_gpu(device_id)
    from pygraphx.targets.gpu.device_api import to_gpu as upload

    return upload(arg, device_id)


def from_gpu(arg: Any) -> Argument:
    """Copy a `GpuArgument` (or torch tensor) back to the host as an `argument`."""
    from pygraphx.targets.gpu.device_api import from_gpu as download

    return download(arg)


def allocate_gpu(s: Shape, device_id: int = 0) -> Any:
    """Device memory for shape `s` on GPU `device_id` (uninitialised)."""
    check_gpu(device_id)
    from pygraphx.targets.gpu.device_api import allocate_gpu as allocate

    return allocate(s, device_id)


# MIGraphX's lower-case names
shape = Shape
argument = Argument
literal = Literal
program = Program
module = Module
instruction = Instruction
target = Target
op = make_op

__all__ = [
    "Argument",
    "EvaluationError",
    "ExternalDataError",
    "GpuUnavailableError",
    "Instruction",
    "Literal",
    "Module",
    "OnnxParseError",
    "Program",
    "ProgramError",
    "QuantizeError",
    "SerializationError",
    "Shape",
    "Target",
    "UnsupportedOperatorError",
    "__version__",
    "allocate_gpu",
    "argument",
    "from_gpu",
    "generate",
    "generate_argument",
    "generate_literal",
    "get_onnx_operators",
    "get_target",
    "instruction",
    "literal",
    "load",
    "make_op",
    "module",
    "op",
    "optimize",
    "parse_onnx",
    "parse_onnx_buffer",
    "program",
    "quantize_bf16",
    "quantize_fp8",
    "quantize_fp16",
    "quantize_int8",
    "save",
    "shape",
    "target",
    "to_gpu",
]
