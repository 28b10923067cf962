"""The `cpu` target's fusions against the `ref` target: convolution epilogues, GEMM bias and
activations, in-place pointwise code, activation sub-graphs as one kernel, scalar constants
in the generated code, and operands computed at run time. Tolerances as in test_cpu_ops.py.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from tests.helpers import make_model  # noqa: E402
from tests.targets.cpu_compare import (  # noqa: E402
    _conv_net,
    assert_profile_matches,
    compare,
    compile_both,
    f32,
)

# --- fusions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("act", ["none", "relu", "clip"])
@pytest.mark.parametrize("residual", ["none", "identity", "conv"])
def test_conv_epilogue_fusion(act: str, residual: str) -> None:
    model, feeds = _conv_net(act, residual)
    cpu = compare(model, feeds, rtol=1e-4, atol=1e-4)
    fused = [s for s in cpu._executable.lowered.steps if len(s.instructions) > 1]
    assert fused, "the convolution epilogue was not fused"
    assert_profile_matches(cpu, feeds)


@pytest.mark.parametrize("conv_output", ["torch", "arena"])
def test_conv_output_settings(conv_output: str) -> None:
    model, feeds = _conv_net("relu", "identity")
    ref, _ = compile_both(model)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(conv_output=conv_output))
    np.testing.assert_allclose(np.array(prog.run(feeds)[0]), np.array(ref.run(feeds)[0]),
                               rtol=1e-4, atol=1e-4)  # fmt: skip


def test_unknown_cpu_setting() -> None:
    with pytest.raises(ValueError, match="unknown cpu target settings"):
        CpuTarget(bogus=1)


def _mlp(gelu: bool) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    inits = {"w": f32(16, 32), "b": f32(32), "w2": f32(32, 16), "b2": f32(16),
             "half": np.float32(0.5), "one": np.float32(1.0),
             "r2": np.float32(0.70710677)}  # fmt: skip
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["h"]),
    ]
    if gelu:
        nodes += [
            helper.make_node("Mul", ["h", "r2"], ["t"]),
            helper.make_node("Erf", ["t"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["e1"]),
            helper.make_node("Mul", ["h", "e1"], ["g"]),
            helper.make_node("Mul", ["g", "half"], ["a"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["h"], ["a"]))
    nodes += [
        helper.make_node("MatMul", ["a", "w2"], ["m2"]),
        helper.make_node("Add", ["b2", "m2"], ["h2"]),
        helper.make_node("Add", ["h2", "x"], ["y"]),
    ]
    feeds = {"x": f32(2, 5, 16)}
    return make_model(nodes, feeds, ["y"], inits), feeds


@pytest.mark.parametrize("gelu", [False, True])
def test_gemm_epilogue_fusion(gelu: bool) -> None:
    model, feeds = _mlp(gelu)
    cpu = compare(model, feeds, rtol=1e-4, atol=1e-4)
    fused = [s for s in cpu._executable.lowered.steps if len(s.instructions) > 1]
    assert len(fused) == 2
    assert_profile_matches(cpu, feeds)


def test_pointwise_group_in_place_code() -> None:
    """A long element-wise chain with branches, mixed types and constants in one step."""
    x, y = f32(3, 7), f32(3, 7)
    nodes = [
        helper.make_node("Mul", ["x", "y"], ["a"]),
        helper.make_node("Exp", ["a"], ["b"]),
        helper.make_node("Greater", ["b", "x"], ["c"]),
        helper.make_node("Where", ["c", "a", "y"], ["d"]),
        helper.make_node("Cast", ["c"], ["ci"], to=TensorProto.INT32),
        helper.make_node("Cast", ["ci"], ["cf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["d", "cf"], ["e"]),
        helper.make_node("Sub", ["e", "b"], ["f"]),
        helper.make_node("Tanh", ["f"], ["z"]),
    ]
    model = make_model(nodes, {"x": x, "y": y}, ["z"])
    cpu = compare(model, {"x": x, "y": y})
    groups = [s for s in cpu._executable.lowered.steps if s.instructions[0].op.name == "pointwise"]
    assert len(groups) == 1


def test_computed_operands_are_not_taken_for_constants() -> None:
    """Weights, indices and biases that are computed at run time (arena slots) must be read at
    run time, never packed or folded at prepare."""
    x, w, i = f32(2, 3, 6, 6), f32(4, 3, 3, 3), np.array([[2, 0], [1, 1]], np.int64)
    one = {"one": np.array(1, np.int64)}
    nodes = [
        helper.make_node("Relu", ["w"], ["wr"]),
        helper.make_node("Conv", ["x", "wr"], ["c"]),
        helper.make_node("Add", ["i", "one"], ["ii"]),
        helper.make_node("Gather", ["c", "ii"], ["g"], axis=1),
        helper.make_node("Abs", ["m"], ["ma"]),
        helper.make_node("MatMul", ["g", "ma"], ["y"]),
    ]
    feeds = {"x": x, "w": w, "i": i, "m": f32(4, 5)}
    model = make_model(nodes, feeds, ["y"], one)
    compare(model, feeds, rtol=1e-4, atol=1e-4)
    compare(model, {k: v if v.dtype.kind == "i" else -v for k, v in feeds.items()},
            rtol=1e-4, atol=1e-4)  # fmt: skip


def _activation_model(kind: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    c = {"half": np.float32(0.5), "one": np.float32(1.0), "r2": np.float32(0.70710677),
         "s2": np.float32(1.4142135), "k": np.float32(0.044715), "three": np.float32(3.0),
         "c": np.float32(0.7978846), "near": np.float32(0.7)}  # fmt: skip
    mk = helper.make_node
    if kind == "gelu_erf":
        nodes = [mk("Div", ["x", "s2"], ["t"]), mk("Erf", ["t"], ["e"]),
                 mk("Add", ["e", "one"], ["e1"]), mk("Mul", ["x", "e1"], ["g"]),
                 mk("Mul", ["g", "half"], ["y"])]  # fmt: skip
    elif kind == "gelu_tanh":
        nodes = [mk("Pow", ["x", "three"], ["p"]), mk("Mul", ["k", "p"], ["kp"]),
                 mk("Add", ["x", "kp"], ["i"]), mk("Mul", ["i", "c"], ["ic"]),
                 mk("Tanh", ["ic"], ["t"]), mk("Add", ["one", "t"], ["t1"]),
                 mk("Mul", ["half", "x"], ["hx"]), mk("Mul", ["hx", "t1"], ["y"])]  # fmt: skip
    elif kind == "silu":
        nodes = [mk("Sigmoid", ["x"], ["s"]), mk("Mul", ["x", "s"], ["m"]),
                 mk("Mul", ["m", "one"], ["y"])]  # fmt: skip
    else:  # a near miss: erf(x * 0.7) instead of erf(x / sqrt 2)
        nodes = [mk("Mul", ["x", "near"], ["t"]), mk("Erf", ["t"], ["e"]),
                 mk("Add", ["e", "one"], ["e1"]), mk("Mul", ["x", "e1"], ["g"]),
                 mk("Mul", ["g", "half"], ["y"])]  # fmt: skip
    nodes = [mk("Add", ["a", "b"], ["x"])] + nodes + [mk("Add", ["y", "a"], ["z"])]
    feeds = {"a": f32(4, 6) * 3, "b": f32(4, 6)}
    return make_model(nodes, feeds, ["z"], c), feeds


@pytest.mark.parametrize(
    ("kind", "primitive"),
    [("gelu_erf", "gelu("), ("gelu_tanh", "gelu_tanh("), ("silu", "silu("), ("near", None)],
)
def test_activation_sub_graphs_become_one_kernel(kind: str, primitive: str | None) -> None:
    model, feeds = _activation_model(kind)
    cpu = compare(model, feeds, rtol=1e-5, atol=1e-5)
    code = "\n".join(cpu._executable.lowered.ctx.sources)
    if primitive is None:
        assert "_f_gelu" not in code and "_f_erf" in code
    else:
        assert f"_f_{primitive}" in code and "_f_tanh(" not in code and "_f_erf(" not in code


def test_scalar_constants_are_folded_into_the_code() -> None:
    x = f32(3, 5)
    nodes = [
        helper.make_node("Pow", ["x", "three"], ["p"]),
        helper.make_node("Mul", ["two", "p"], ["y"]),
    ]
    model = make_model(nodes, {"x": x}, ["y"], {"three": np.float32(3), "two": np.float32(2)})
    cpu = compare(model, {"x": x})
    code = "\n".join(cpu._executable.lowered.ctx.sources)
    assert "_f_pow(_env[" in code and ", 3.0, out=" in code and ", 2.0, out=" in code


def test_generated_group_writes_its_output_in_place() -> None:
    """The first primitive writes the slot with out=, later ones update it in place; only a
    value needed next to the running result takes a scratch buffer."""
    model, feeds = _activation_model("near")
    cpu = compare(model, feeds)
    code = [s for s in cpu._executable.lowered.ctx.sources if "_f_erf" in s][0]
    body = [line.strip() for line in code.splitlines() if "out=" in line]
    assert body[0].endswith("out=_out)")
    assert body[-1].endswith("out=_out)")
    assert sum("out=_s" in line for line in body) <= 3
