"""pygraphx: a graph compiler and inference engine for ONNX models (after AMD MIGraphX).

The public API follows MIGraphX's Python module, so a script written for `import migraphx` runs
with `import pygraphx as migraphx`:

    prog = pygraphx.parse_onnx("resnet50.onnx")
    prog.compile(pygraphx.get_target("ref"))
    out = np.array(prog.run({"input": image})[0])
"""

from __future__ import annotations

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
from pygraphx.quantize import QuantizeError, quantize_bf16, quantize_fp16
from pygraphx.targets import Target, get_target
from pygraphx.targets.cpu import configure_openmp
from pygraphx.version import __version__

# before torch loads GNU OpenMP, which reads its spin setting once (targets/cpu/__init__.py)
configure_openmp()

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
    "ExternalDataError",
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
    "argument",
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
    "quantize_fp16",
    "save",
    "shape",
    "target",
]
