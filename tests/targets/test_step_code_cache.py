"""Generated step code is compiled once per source text and shared by every step using it.

Fused element-wise groups of the same structure (ResNet-50's 50 groups have 4 distinct
sources) reuse one code object, each step with its own bound names: two such groups with
different constants must still give ONNX Runtime's answers. A release step (drop dead values
after a step) takes its slot indices as arguments, so its source depends on their count only,
and it must drop exactly its slots.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

import onnx  # noqa: E402
from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets.torch_lowering import lower, pointwise  # noqa: E402
from tests.helpers import make_model, run_ort  # noqa: E402


def _twin_groups() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """relu(x * a + b) and relu(y * c + d): two groups of one structure, other constants."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 8, 5, 5)).astype(np.float32)
    y = rng.standard_normal((2, 8, 5, 5)).astype(np.float32)
    consts = {k: rng.standard_normal((1, 8, 1, 1)).astype(np.float32) for k in "abcd"}
    nodes = [
        helper.make_node("Mul", ["x", "a"], ["xa"]),
        helper.make_node("Add", ["xa", "b"], ["xb"]),
        helper.make_node("Relu", ["xb"], ["rx"]),
        helper.make_node("Mul", ["y", "c"], ["yc"]),
        helper.make_node("Add", ["yc", "d"], ["yd"]),
        helper.make_node("Relu", ["yd"], ["ry"]),
    ]
    return make_model(nodes, {"x": x, "y": y}, ["rx", "ry"], consts), {"x": x, "y": y}


def test_groups_of_one_source_share_the_code_and_keep_their_constants() -> None:
    model, feeds = _twin_groups()
    pointwise.compiled_code.cache_clear()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("cpu"))
    info = pointwise.compiled_code.cache_info()
    assert info.hits >= 1  # the second group's source was the first's
    got = prog.run(feeds)
    for g, want in zip(got, run_ort(model, feeds), strict=True):
        np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-6)
    assert not np.allclose(got[0], got[1])  # (the groups did compute different things)


@pytest.mark.parametrize("idxs", [[], [2], [0, 3, 5]])
def test_release_step_drops_exactly_its_slots(idxs: list[int]) -> None:
    env: list[object] = list(range(6))
    calls: list[int] = []
    step = lower._with_release(lambda: calls.append(1), env, idxs)
    step()
    assert calls == [1]
    assert [k for k, v in enumerate(env) if v is None] == idxs
    other: list[object] = list(range(6))
    lower._with_release(lambda: None, other, [1])()  # a second step of another source count
    assert other[1] is None
    assert (env[1] is None) == (1 in idxs)  # the first step's slots only
