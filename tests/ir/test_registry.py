"""The IR reaches targets and the memory planner through `pygraphx.ir.registry` (it may not
import the layers above it): compiling by name, `Target.compile`, errors, memory usage."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import pygraphx
from pygraphx.ir import registry
from pygraphx.ops import make_op
from pygraphx.passes.memory_coloring import plan_memory
from tests.helpers import make_model


def _relu_add_program() -> tuple[pygraphx.Program, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    feeds = {
        "x": rng.standard_normal((3, 5)).astype(np.float32),
        "y": rng.standard_normal((3, 5)).astype(np.float32),
    }
    nodes = [helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("Relu", ["s"], ["z"])]
    model = make_model(nodes, feeds, ["z"])
    return pygraphx.parse_onnx_buffer(model.SerializeToString()), feeds


@pytest.mark.parametrize("name", ["ref", "cpu"])
def test_compile_by_name_matches_numpy(name: str) -> None:
    if name == "cpu":
        pytest.importorskip("torch")
    prog, feeds = _relu_add_program()
    prog.compile(name)
    assert prog.target.name == name
    out = np.array(prog.run(feeds)[0])
    np.testing.assert_allclose(out, np.maximum(feeds["x"] + feeds["y"], 0), rtol=1e-6)


def test_target_compile_runs_passes_then_prepare() -> None:
    prog, feeds = _relu_add_program()
    target = pygraphx.get_target("cpu") if _has_torch() else pygraphx.get_target("ref")
    prog.compile(target, fast_math=False)
    assert [name for name, _ in prog.pass_times] == [
        p.name for p in target.get_passes(prog.compile_options)
    ]
    assert prog.compile_options["fast_math"] is False


def test_unknown_target_lists_registered_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown target 'tpu'; available targets: ref, cpu"):
        pygraphx.get_target("tpu")
    prog, _ = _relu_add_program()
    with pytest.raises(ValueError, match="unknown target 'tpu'"):
        prog.compile("tpu")
    assert registry.target_names()[:2] == ("ref", "cpu")


def test_memory_usage_plans_through_the_registry() -> None:
    prog, _ = _relu_add_program()
    main = prog.get_main_module()
    assert main.memory_plan is None
    expected = plan_memory(main).arena_bytes
    # x + y and relu: two float32 [3, 5] buffers, each 60 bytes aligned up
    assert expected >= 2 * 60
    assert prog.get_memory_usage() == expected


def test_subgraph_ops_take_the_evaluator_as_an_argument() -> None:
    """`pointwise` runs its body with whatever evaluator it is handed (the runtime's
    `Evaluator` in every caller); here a stub evaluator proves it imports none itself."""
    prog = pygraphx.Program()
    body = prog.create_module("body")
    a = body.add_parameter("a", pygraphx.Shape("float_type", [2]))
    body.add_return([body.add_instruction(make_op("relu"), [a])])
    op = make_op("pointwise")
    calls = []

    class Stub:
        def __init__(self, module: object) -> None:
            calls.append(module)

        def run(self, params: dict, outer: object = None) -> list[np.ndarray]:
            return [np.maximum(params["a"], 0)]

    arg = np.array([-1.0, 2.0], dtype=np.float32)
    out = op.compute_with_modules(pygraphx.Shape("float_type", [2]), [arg], [body], {}, Stub)
    np.testing.assert_array_equal(out, [0.0, 2.0])
    assert calls == [body]


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True
