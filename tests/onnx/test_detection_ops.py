"""Detection ops (RoiAlign, NonMaxSuppression, NonZero, Unique) against ONNX Runtime, or ONNX's
reference evaluator where ONNX Runtime has no kernel or disagrees with the specification (each
such case says why).

NonMaxSuppression, NonZero and Unique have data-dependent output lengths: with no declared
output shape they run with the IR's bounded shapes (`Op.data_dependent`) on `ref`; an op that
consumes such a result (GatherND) and the cpu target are marked
`xfail(strict=True, reason="needs data-dependent shapes")` until the dynamic-shape work lands.

ONNX's own node tests for them run in test_signal_detection_node_suite.py.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.helpers import assert_outputs_match, check_node, make_model, run_pgx
from tests.onnx.reference_check import RNG, check_reference

# --- RoiAlign ---------------------------------------------------------------------------------
ROI_X = RNG.standard_normal((2, 3, 10, 12)).astype(np.float32)
ROIS = np.array(
    [[0, 0, 9, 9], [0, 0, 4, 4], [4, 4, 9, 9], [-3, -2, 14, 5], [2.3, 1.1, 7.7, 8.2]], np.float32
)
ROI_BATCH = np.array([0, 1, 0, 1, 0], np.int64)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("sampling_ratio", [0, 1, 2])
@pytest.mark.parametrize("spatial_scale", [1.0, 0.5])
@pytest.mark.parametrize(
    ("opset", "ctm"), [(10, None), (16, "half_pixel"), (16, "output_half_pixel"), (16, None)]
)
def test_roi_align(mode, sampling_ratio, spatial_scale, opset, ctm):
    attrs = {
        "mode": mode,
        "sampling_ratio": sampling_ratio,
        "spatial_scale": spatial_scale,
        "output_height": 3,
        "output_width": 4,
    }
    if ctm:
        attrs["coordinate_transformation_mode"] = ctm
    feeds = {"X": ROI_X, "rois": ROIS}
    check_node(
        "RoiAlign", feeds, attrs, initializers={"b": ROI_BATCH}, opset=opset, rtol=1e-4, atol=1e-5
    )


def test_roi_align_degenerate_regions_against_onnx_reference():
    # empty and inverted regions with sampling_ratio 0: ONNX Runtime fails on an integer
    # overflow; ONNX's reference averages no samples (0)
    rois = np.array([[5, 5, 5, 5], [8, 1, 2, 9]], np.float32)
    node = helper.make_node("RoiAlign", ["X", "rois", "b"], ["y"], output_height=2, output_width=2)
    feeds = {"X": ROI_X, "rois": rois}
    model = make_model([node], feeds, ["y"], {"b": np.array([0, 1], np.int64)}, opset=16)
    check_reference(model, feeds, 1e-4, 1e-5)


# --- NonMaxSuppression, NonZero, Unique -------------------------------------------------------
BOXES = RNG.uniform(0, 10, (2, 20, 4)).astype(np.float32)
BOXES[..., 2:] = BOXES[..., :2] + RNG.uniform(1, 5, (2, 20, 2)).astype(np.float32)
SCORES = RNG.uniform(0, 1, (2, 3, 20)).astype(np.float32)
SCORES[0, 0, 3] = SCORES[0, 0, 5]  # a tie: the lower box index goes first


@pytest.mark.parametrize("center_point_box", [0, 1])
@pytest.mark.parametrize(
    ("max_boxes", "iou", "score"), [(5, 0.3, 0.2), (100, 0.5, None), (0, 0.5, 0.1), (3, 0.0, None)]
)
@pytest.mark.parametrize("runtime", [False, True], ids=["const_params", "runtime_params"])
def test_non_max_suppression(center_point_box, max_boxes, iou, score, runtime):
    params = {"m": np.array([max_boxes], np.int64), "i": np.array([iou], np.float32)}
    if score is not None:
        params["s"] = np.array([score], np.float32)
    feeds = {"boxes": BOXES, "scores": SCORES}
    attrs = {"center_point_box": center_point_box}
    if runtime:
        check_node("NonMaxSuppression", {**feeds, **params}, attrs, opset=11)
    else:
        check_node("NonMaxSuppression", feeds, attrs, initializers=params, opset=11)


def _program(model: onnx.ModelProto):
    import pygraphx

    return pygraphx.parse_onnx_buffer(model.SerializeToString())


def test_non_max_suppression_constant_inputs_fold_to_a_literal():
    inits = {
        "b": BOXES,
        "s": SCORES,
        "m": np.array([4], np.int64),
        "i": np.array([0.4], np.float32),
    }
    ours = check_node("NonMaxSuppression", {}, initializers=inits, opset=11)
    node = helper.make_node("NonMaxSuppression", list("bsmi"), ["y"])
    program = _program(make_model([node], {}, ["y"], inits, opset=11))
    assert "nonmaxsuppression" not in str(program)
    assert ours[0].shape[1] == 3 and 0 < ours[0].shape[0] <= 2 * 3 * 4


def test_non_max_suppression_without_max_output_selects_nothing():
    out = check_node("NonMaxSuppression", {"boxes": BOXES, "scores": SCORES}, opset=11)
    assert out[0].shape == (0, 3)


@pytest.mark.parametrize(
    "x",
    [
        RNG.integers(0, 2, (3, 4)).astype(np.float32),
        np.zeros((2, 3), np.int32),
        np.ones(5, bool),
        RNG.integers(-1, 2, (2, 3, 4)).astype(np.int64),
    ],
    ids=["float", "all_zero", "all_true", "rank3"],
)
def test_non_zero(x):
    check_node("NonZero", {"x": x}, opset=13)


def test_non_zero_declared_count_is_checked():
    x = np.array([[1, 0], [1, 1]], np.float32)
    model = make_model([helper.make_node("NonZero", ["x"], ["y"])], {"x": x}, ["y"], opset=13)
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 3
    assert "nonzero[count=3]" in str(_program(model))
    np.testing.assert_array_equal(run_pgx(model, {"x": x})[0], [[0, 1, 1], [0, 0, 1]])
    with pytest.raises(Exception, match="declares 3"):
        run_pgx(model, {"x": np.ones((2, 2), np.float32)})


@pytest.mark.xfail(strict=True, reason="needs data-dependent shapes")
def test_non_zero_feeding_gathernd():
    # the usual exported pattern: GatherND(x, Transpose(NonZero(x))); gathernd's compute
    # reshapes to its (bound) output lens, so the chain needs the dynamic-shape work
    x = np.array([[1, 0, 3], [0, 5, 6]], np.float32)
    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"]),
        helper.make_node("Transpose", ["nz"], ["t"]),
        helper.make_node("GatherND", ["x", "t"], ["y"]),
    ]
    model = make_model(nodes, {"x": x}, ["y"], opset=13)
    assert_outputs_match(run_pgx(model, {"x": x}), [x[x != 0]], 0, 0)


@pytest.mark.parametrize("op", ["NonZero", "Unique"])
def test_data_dependent_ops_on_cpu_target(op):
    """Output lengths that depend on the data: Unique is lowered with torch.unique, NonZero's open
    length runs through the announced numpy fallback with its real shape."""
    pytest.importorskip("torch")
    x = np.array([[1, 0, 3], [0, 3, 6]], np.float32)
    model = make_model([helper.make_node(op, ["x"], ["y"])], {"x": x}, ["y"], opset=13)
    from tests.helpers import run_ort

    assert_outputs_match(run_pgx(model, {"x": x}, target="cpu"), run_ort(model, {"x": x}), 0, 0)


UNIQUE_INPUTS = [
    np.array([2, 1, 1, 3, 4, 3, 1], np.float32),
    RNG.integers(0, 3, (4, 3)).astype(np.int64),
    RNG.integers(0, 2, (3, 4, 2)).astype(np.float32),
]


UNIQUE_CASES = [
    (k, axis)
    for k, x in enumerate(UNIQUE_INPUTS)
    for axis in (None, 0, 1, -1)
    if axis is None or axis < x.ndim
]


@pytest.mark.parametrize(("k", "axis"), UNIQUE_CASES)
@pytest.mark.parametrize("sort", [0, 1])
def test_unique(k, axis, sort):
    x = UNIQUE_INPUTS[k]
    attrs = {"sorted": sort} | ({} if axis is None else {"axis": axis})
    check_node("Unique", {"x": x}, attrs, num_outputs=4, opset=11)


def test_unique_some_outputs():
    x = UNIQUE_INPUTS[0]
    node = helper.make_node("Unique", ["x"], ["y", "", "inverse"])
    model = make_model([node], {"x": x}, ["y", "inverse"], opset=11)
    y, inverse = run_pgx(model, {"x": x})
    np.testing.assert_array_equal(y[inverse], x)
