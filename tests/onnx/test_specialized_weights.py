"""Programs specialised per input value share the model's weights (issue 16, case 4): TopK with
K fed as an input builds one program per K; each must hold the same read-only weight array, not
a fresh copy, so memory stays near one copy of the weights however many K values come (the
cache of specialisations is bounded too: tests/onnx/test_max_input_dims.py)."""

from __future__ import annotations

import tracemalloc

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import pygraphx
from tests.helpers import run_ort

N = 512  # a 512 x 512 float32 weight: 1 MiB


def _topk_model():
    w = np.random.default_rng(0).standard_normal((N, N)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("TopK", ["h", "k"], ["v", "i"], axis=-1),
        ],
        "topk",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, N]),
            helper.make_tensor_value_info("k", TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info("v", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("i", TensorProto.INT64, None),
        ],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _weights(prog: pygraphx.Program) -> list[np.ndarray]:
    found = []
    for spec in prog._specialized.values():
        for ins in spec.get_main_module().instructions:
            if ins.is_literal() and ins.get_literal().array.size == N * N:
                found.append(ins.get_literal().array)
    return found


def test_specialisations_share_the_weights() -> None:
    model = _topk_model()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("ref"))
    x = np.random.default_rng(1).standard_normal((2, N)).astype(np.float32)
    feeds = {"x": x, "k": np.array([1], np.int64)}
    prog.run(feeds)  # the first specialisation decodes the weights
    tracemalloc.start()
    try:
        for k in range(2, 10):
            feeds = {"x": x, "k": np.array([k], np.int64)}
            values, indices = (np.array(r) for r in prog.run(feeds))
            want_v, want_i = run_ort(model, feeds)
            np.testing.assert_allclose(values, want_v, rtol=1e-5, atol=1e-4)
            np.testing.assert_array_equal(indices, want_i)
        grown, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    weights = _weights(prog)
    assert len(weights) == 9
    assert all(np.shares_memory(weights[0], w) for w in weights[1:])
    assert not weights[0].flags.writeable
    assert grown < 4 * N * N, grown  # 8 more programs: far less than 8 copies of 1 MiB
