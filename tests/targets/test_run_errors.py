"""Every exception raised while running is a pygraphx error naming the instruction (issue 16).

Indices out of range at run time (Gather, GatherElements, ScatterElements, ScatterND) make
numpy (ref) and torch (cpu) raise their own errors; both targets must turn them into
`pygraphx.EvaluationError` whose message names the instruction (`main:@k op`) and whose
`__cause__` is the original exception. The cpu executor's plain and profiled paths are checked,
and a failure forced into a step shows the executor wraps any exception, not just these.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import helper

import pygraphx
from pygraphx.runtime.evaluator import EvaluationError
from tests.helpers import make_model, plant_cpu_step_failure

pytest.importorskip("torch")

DATA = np.arange(12, dtype=np.float32).reshape(3, 4)


def _case(name: str):
    """(model, feeds, IR op name) for an index out of range fed at run time."""
    if name == "gather":
        idx = np.array([0, 7], np.int64)
        node = helper.make_node("Gather", ["x", "i"], ["y"], axis=1)
    elif name == "gather_elements":
        idx = np.array([[0, 9, 1, 2]] * 3, np.int64)
        node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)
    elif name == "scatter_elements":
        idx = np.array([[5, 0, 1, 2]] * 3, np.int64)
        node = helper.make_node("ScatterElements", ["x", "i", "x"], ["y"], axis=0)
    else:
        idx = np.array([[1], [8]], np.int64)
        upd = np.ones((2, 4), np.float32)
        node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"])
        feeds = {"x": DATA, "i": idx, "u": upd}
        return make_model([node], feeds, ["y"]), feeds, "scatternd"
    feeds = {"x": DATA, "i": idx}
    return make_model([node], feeds, ["y"]), feeds, name


@pytest.mark.parametrize("profiled", [False, True], ids=["plain", "profiled"])
@pytest.mark.parametrize("target", ["ref", "cpu"])
@pytest.mark.parametrize("case", ["gather", "gather_elements", "scatter_elements", "scatternd"])
def test_run_time_index_errors_name_the_instruction(case: str, target: str, profiled: bool) -> None:
    model, feeds, op = _case(case)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target(target))
    observer = (lambda ins, value, seconds: None) if profiled else None
    with pytest.raises(pygraphx.EvaluationError) as err:
        prog.run(feeds, observer=observer)
    message = str(err.value)
    assert re.search(rf"main:@\d+ {op}\b", message), message
    assert err.value.__cause__ is not None
    assert type(err.value.__cause__).__name__ in message  # what went wrong, not only where
    # the program stays usable: in-range indices run and give numpy's answer
    if case == "gather":
        good = {"x": DATA, "i": np.array([0, 3], np.int64)}
        np.testing.assert_array_equal(np.array(prog.run(good)[0]), DATA[:, [0, 3]])


def test_forced_failure_in_a_cpu_step_is_wrapped() -> None:
    """Whatever a step raises (here a ZeroDivisionError planted in the Exp step) leaves the run
    as an EvaluationError naming that step's instruction, with the original as __cause__."""
    x = np.ones((2, 3), np.float32)
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("MatMul", ["e", "w"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], {"w": np.ones((3, 2), np.float32)})
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("cpu"))
    plant_cpu_step_failure(prog, "dot")
    with pytest.raises(EvaluationError, match=r"main:@\d+ dot: ZeroDivisionError: planted") as err:
        prog.run({"x": x})
    assert isinstance(err.value.__cause__, ZeroDivisionError)


def test_forced_failure_in_a_gpu_step_is_wrapped() -> None:
    """The gpu target's step loop (uncaptured runs; here its lowering on the CPU device) names
    the failing step's instruction the same way."""
    from pygraphx.targets.gpu.target import GpuTarget

    x = np.ones((2, 3), np.float32)
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("MatMul", ["e", "w"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], {"w": np.ones((3, 2), np.float32)})
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(GpuTarget(device="cpu"))
    ex = prog._executable
    victim = next(k for k, s in enumerate(ex.lowered.steps) if s.instructions[-1].op.name == "dot")

    def broken() -> None:
        raise ZeroDivisionError("planted")

    ex.steps[victim] = broken
    with pytest.raises(EvaluationError, match=r"main:@\d+ dot: ZeroDivisionError: planted") as err:
        prog.run({"x": x})
    assert isinstance(err.value.__cause__, ZeroDivisionError)
