"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss handlers against ONNX Runtime.

Every reduction, with and without class weights, with `ignore_index` inside and outside
[0, C) (negative, too large), for (N, C) and (N, C, d1, ..., dk) inputs, int32 and int64
labels, float / double / float16 inputs, and SoftmaxCrossEntropyLoss's optional log_prob output.
bf16 (which ONNX Runtime does not run) is checked against ONNX's reference evaluator.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from tests.helpers import check_node, make_model, run_pgx

RNG = np.random.default_rng(0)
C = 5
OPS = ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"]
WEIGHT = RNG.random(C).astype(np.float32) + 0.1


def _inputs(lens: tuple[int, ...], ignore_index: int | None, dtype=np.float32) -> dict:
    """Scores (N, C, *lens[1:]) and labels (N, *lens[1:]), with a few labels ignored."""
    x = RNG.standard_normal((lens[0], C, *lens[1:])).astype(dtype)
    t = RNG.integers(0, C, lens).astype(np.int64)
    if ignore_index is not None:
        t.reshape(-1)[::3] = ignore_index
    return {"x": x, "t": t}


def _num_outputs(op: str) -> int:
    return 2 if op == "SoftmaxCrossEntropyLoss" else 1


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [None, 1, -1, 10])
def test_loss_2d_and_3d(op: str, reduction: str, weighted: bool, ignore_index: int | None) -> None:
    for lens in [(4,), (3, 2)]:
        inputs = _inputs(lens, ignore_index)
        if weighted:
            inputs["w"] = WEIGHT
        attrs = {"reduction": reduction}
        if ignore_index is not None:
            attrs["ignore_index"] = ignore_index
        check_node(op, inputs, attrs, num_outputs=_num_outputs(op), opset=13, rtol=1e-5)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_loss_nd(op: str, reduction: str) -> None:
    inputs = {**_inputs((2, 3, 2, 4), -5), "w": WEIGHT}
    attrs = {"reduction": reduction, "ignore_index": -5}
    check_node(op, inputs, attrs, num_outputs=_num_outputs(op), opset=13)


@pytest.mark.parametrize("op", OPS)
def test_default_reduction_is_mean(op: str) -> None:
    check_node(op, _inputs((3, 2), None), num_outputs=_num_outputs(op), opset=13)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("opset", [12, 22])
def test_opsets(op: str, opset: int) -> None:
    if op == "SoftmaxCrossEntropyLoss" and opset == 22:
        opset = 13  # its latest version
    inputs = {**_inputs((3, 2), 2), "w": WEIGHT}
    check_node(op, inputs, {"ignore_index": 2}, opset=opset)


@pytest.mark.parametrize("op", OPS)
def test_int32_labels(op: str) -> None:
    inputs = _inputs((3, 2), 0)
    inputs["t"] = inputs["t"].astype(np.int32)
    check_node(op, inputs, {"reduction": "sum", "ignore_index": 0}, opset=13)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("weighted", [False, True])
def test_mean_with_every_label_ignored_is_nan(op: str, weighted: bool) -> None:
    inputs = _inputs((3, 2), None)
    inputs["t"][...] = 2
    if weighted:
        inputs["w"] = WEIGHT
    (loss,) = check_node(op, inputs, {"ignore_index": 2}, opset=13)
    assert np.isnan(loss)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_other_float_types(op: str, dtype: type) -> None:
    inputs = {**_inputs((3, 2), 1, dtype), "w": WEIGHT.astype(dtype)}
    tol = 1e-3 if dtype == np.float16 else 1e-7
    check_node(op, inputs, {"ignore_index": 1}, opset=13, rtol=tol, atol=tol)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_bf16_matches_reference(op: str, reduction: str) -> None:
    inputs = _inputs((3, 2), 1, ml_dtypes.bfloat16)
    inputs["w"] = WEIGHT.astype(ml_dtypes.bfloat16)
    outs = ["loss", "log_prob"][: _num_outputs(op)]
    node = helper.make_node(op, ["x", "t", "w"], outs, reduction=reduction, ignore_index=1)
    model = make_model([node], inputs, outs, opset=13)
    ours = run_pgx(model, inputs)
    ref = ReferenceEvaluator(model).run(None, inputs)
    for a, b in zip(ours, ref, strict=True):
        assert a.dtype == ml_dtypes.bfloat16
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=2e-2)


@pytest.mark.parametrize(
    ("inputs", "attrs", "message"),
    [
        ({"x": np.zeros((3, 5), np.float32), "t": np.zeros((4,), np.int64)}, {}, "labels lens"),
        ({"x": np.zeros((3, 5), np.float32), "t": np.zeros((3,), np.int64)},
         {"reduction": "max"}, "reduction 'max'"),
        ({"x": np.zeros((3, 5), np.float32), "t": np.zeros((3,), np.int64),
          "w": np.ones((4,), np.float32)}, {}, "weight must have lens"),
    ],
)  # fmt: skip
def test_errors(inputs: dict, attrs: dict, message: str) -> None:
    import pygraphx
    from pygraphx.onnx.errors import OnnxParseError

    node = helper.make_node("NegativeLogLikelihoodLoss", list(inputs), ["loss"], **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for k, v in inputs.items()
        ],
        [helper.make_tensor_value_info("loss", 1, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(OnnxParseError, match=message):
        pygraphx.parse_onnx_buffer(model.SerializeToString())
