"""What the tests of the driver's commands (test_driver_compile.py, test_driver_perf.py,
test_driver_verify.py) share: a small model and its expected outputs, running `main([...])`
in-process, and the deliberately broken candidates that `verify` must find (a test-only pass
that turns every `relu` into `abs`, one that scales a literal, and a test-only target whose
relu kernel is wrong)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper

import pygraphx
from pygraphx.driver.main import main
from pygraphx.ir.program import Program
from pygraphx.ops import make_op
from pygraphx.runtime.evaluator import Evaluator
from pygraphx.targets.ref.target import RefExecutable, RefTarget
from tests.helpers import make_model

C = np.array([0.5, -1.0, 2.0, -0.25], np.float32)
X = np.linspace(-1.5, 1.5, 12, dtype=np.float32).reshape(3, 4)
SHAPE = "float_type, {3, 4}, {4, 1}"
NUMBER = r"-?[\d.]+(?:e[-+]\d+)?"


# --- helpers ----------------------------------------------------------------------------------
def small_model() -> onnx.ModelProto:
    """x: float[3, 4]; s = x + C; y = s * s; z = relu(s)."""
    nodes = [
        helper.make_node("Add", ["x", "c"], ["s"]),
        helper.make_node("Mul", ["s", "s"], ["y"]),
        helper.make_node("Relu", ["s"], ["z"]),
    ]
    return make_model(nodes, {"x": X}, ["y", "z"], {"c": C})


def parse() -> Program:
    return pygraphx.parse_onnx_buffer(small_model().SerializeToString())


def expected(x: np.ndarray) -> list[np.ndarray]:
    s = x + C
    return [s * s, np.maximum(s, 0)]


def drive(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def relu_to_abs(program: Program) -> Program:
    """The deliberately broken pass: every relu (in every module) becomes abs."""
    for mod in program.modules.values():
        for ins in list(mod.instructions):
            if ins.op.name == "relu":
                mod.replace_op(ins, make_op("abs"))
    return program


def scale_literal(program: Program, factor: float = 1.5) -> Program:
    """Another broken pass: the literal C is replaced by C * factor."""
    main_mod = program.get_main_module()
    lit = next(i for i in main_mod.instructions if i.is_literal() and i.shape.elements() == 4)
    new = main_mod.insert_literal(lit, np.asarray(lit.get_literal().array) * np.float32(factor))
    main_mod.replace_instruction(lit, new)
    main_mod.remove_instruction(lit)
    return program


class _BrokenReluEvaluator(Evaluator):
    def _step(self, ins: Any, params: Any, values: Any) -> np.ndarray:
        out = super()._step(ins, params, values)
        return -out if ins.op.name == "relu" else out


class BrokenReluTarget(RefTarget):
    """A test-only target whose relu kernel returns -relu(x)."""

    name = "broken_relu"

    def prepare(self, program: Program, options: dict[str, Any]) -> RefExecutable:
        exe = RefExecutable(program)
        exe.evaluator = _BrokenReluEvaluator(program.get_main_module())
        return exe
