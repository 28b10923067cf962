"""A stem and the depthwise block after it (review15b): where the stem's own native block cannot
be taken (its output is also the block's residual, as in MobileNetV3-Large's first block, or
its activation is no clip form: hardswish), the depthwise block still runs on the native kernel;
where it can, the stem's block takes both. Every case gives ONNX Runtime's answer."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import pygraphx
from pygraphx.targets.torch_lowering import native_mbconv
from tests.helpers import run_ort

pytest.importorskip("torch")
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402


def _model(act: str, residual: bool) -> tuple:
    rng = np.random.default_rng(0)

    def w(*s: int) -> np.ndarray:
        return (rng.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32)

    x = rng.standard_normal((1, 3, 40, 40)).astype(np.float32)
    inits = {"w0": w(16, 3, 3, 3), "b0": w(16), "wd": w(16, 1, 3, 3), "bd": w(16),
             "wp": w(16, 16, 1, 1), "bp": w(16), "lo": np.array(0, np.float32),
             "hi": np.array(6, np.float32)}  # fmt: skip
    n = helper.make_node
    act_node = (n("HardSwish", ["s"], ["a"]) if act == "hardswish"
                else n("Clip", ["s", "lo", "hi"], ["a"]))  # fmt: skip
    nodes = [n("Conv", ["x", "w0", "b0"], ["s"], pads=[1] * 4, strides=[2, 2]), act_node,
             n("Conv", ["a", "wd", "bd"], ["d"], group=16, pads=[1] * 4), n("Relu", ["d"], ["r"]),
             n("Conv", ["r", "wp", "bp"], ["p"]),
             n("Add", ["a", "p"], ["y"]) if residual else n("Relu", ["p"], ["y"])]  # fmt: skip
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("x", 1, list(x.shape))],
        [helper.make_tensor_value_info("y", 1, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), {"x": x}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("act", "residual"), [("clip", True), ("clip", False),
                                               ("hardswish", True), ("hardswish", False)])
def test_the_first_block_stays_native(act: str, residual: bool, threads: int) -> None:
    if not native_mbconv.available():
        pytest.skip("no native mbconv kernel on this machine")
    model, feeds = _model(act, residual)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=threads))
    low = prog._executable.lowered
    assert low.ctx.cache.get("native_mbconv", 0) == 1
    steps = [[i.op.name for i in s.instructions] for s in low.steps]
    if act == "clip" and not residual:  # the stem's own block: one step for all
        assert len(steps) == 1
    else:  # the stem apart, the depthwise block as one native step
        assert ["convolution", "pointwise", "convolution", "pointwise"] in steps
    want = run_ort(model, feeds)[0]
    got = np.asarray(prog.run(feeds)[0])
    assert np.max(np.abs(got - want)) <= 1e-4 * max(1.0, float(np.max(np.abs(want))))
