"""Layout, indexing and constant ONNX handlers against ONNX Runtime, old opsets included, and
the folding of exporters' shape-computing chains."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import pygraphx
from tests.helpers import assert_outputs_match, check_node, make_model, run_ort, run_pgx

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)
IMG = RNG.standard_normal((1, 2, 4, 6)).astype(np.float32)


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


# --- Reshape, Transpose, (Un)Squeeze, Flatten ------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "opset", "attrs"),
    [(i64(4, -1), 13, {}), (i64(0, -1), 13, {}), (i64(-1), 5, {}), (i64(2, 0, 2, 2), 14, {}),
     (i64(3, 2, 4), 14, {"allowzero": 1}), (i64(1, -1, 1), 7, {})],
)  # fmt: skip
def test_reshape(shape: np.ndarray, opset: int, attrs: dict) -> None:
    check_node("Reshape", {"x": X}, attrs, initializers={"shape": shape}, opset=opset)


def test_reshape_allowzero_keeps_zero_lengths() -> None:
    empty = np.zeros((0, 3, 4), np.float32)
    attrs = {"allowzero": 1}
    check_node("Reshape", {"x": empty}, attrs, initializers={"s": i64(3, 4, 0)}, opset=14)


def test_reshape_v1_attribute() -> None:
    node = helper.make_node("Reshape", ["x"], ["y"], shape=[4, -1])
    model = make_model([node], {"x": X}, ["y"], opset=1)
    np.testing.assert_array_equal(run_pgx(model, {"x": X})[0], X.reshape(4, -1))


@pytest.mark.parametrize("perm", [None, (1, 0, 2), (2, 0, 1)])
def test_transpose(perm) -> None:
    check_node("Transpose", {"x": X}, {} if perm is None else {"perm": perm})


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axes", [None, (0, 2), (-2,)])
def test_squeeze(opset: int, axes) -> None:
    x = RNG.standard_normal((1, 3, 1, 2)).astype(np.float32)
    if axes is None:
        check_node("Squeeze", {"x": x}, opset=opset)
    elif opset < 13:
        check_node("Squeeze", {"x": x}, {"axes": axes}, opset=opset)
    else:
        check_node("Squeeze", {"x": x}, initializers={"axes": i64(*axes)}, opset=opset)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axes", [(0,), (1, -1), (4, 0)])
def test_unsqueeze(opset: int, axes) -> None:
    if opset < 13:
        check_node("Unsqueeze", {"x": X}, {"axes": axes}, opset=opset)
    else:
        check_node("Unsqueeze", {"x": X}, initializers={"axes": i64(*axes)}, opset=opset)


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis: int) -> None:
    check_node("Flatten", {"x": X}, {"axis": axis}, opset=13)


def test_flatten_of_transposed_input_copies() -> None:
    t = helper.make_node("Transpose", ["x"], ["t"], perm=[2, 1, 0])
    f = helper.make_node("Flatten", ["t"], ["y"], axis=1)
    model = make_model([t, f], {"x": X}, ["y"])
    assert_outputs_match(run_pgx(model, {"x": X}), run_ort(model, {"x": X}), 0, 0)


# --- Concat, Split, Slice ---------------------------------------------------------------------


@pytest.mark.parametrize(("axis", "opset"), [(0, 13), (1, 4), (-1, 11)])
def test_concat(axis: int, opset: int) -> None:
    lens = list(X.shape)
    lens[axis] = 2
    y = RNG.standard_normal(lens).astype(np.float32)
    check_node("Concat", {"x": X, "y": y, "z": X}, {"axis": axis}, opset=opset)


@pytest.mark.parametrize(
    ("opset", "attrs", "split", "outputs"),
    [(11, {"axis": 2}, None, 2), (11, {"axis": 2, "split": [1, 3]}, None, 2),
     (13, {"axis": -1}, i64(3, 1), 2), (13, {"axis": 1}, None, 3),
     (18, {"axis": 1, "num_outputs": 2}, None, 2), (18, {"axis": 1}, i64(0, 3), 2)],
)  # fmt: skip
def test_split(opset: int, attrs: dict, split, outputs: int) -> None:
    inits = {} if split is None else {"split": split}
    check_node("Split", {"x": X}, attrs, num_outputs=outputs, initializers=inits, opset=opset)


SLICES = [
    (i64(1), i64(3), None, None),
    (i64(0, 1), i64(-1, 1000), i64(2, 0), None),
    (i64(-100), i64(100), i64(1), None),
    (i64(3, 2), i64(0, -100), i64(2, 1), i64(-2, -1)),
    (i64(-1), i64(-1000), i64(-1), i64(-3)),
    (i64(0, 1), i64(4, 3), i64(-1, 1), i64(3, 1)),
    (i64(2), i64(1), i64(1), i64(1)),
]


@pytest.mark.parametrize(("starts", "ends", "axes", "steps"), SLICES)
def test_slice(starts, ends, axes, steps) -> None:
    inits = {"starts": starts, "ends": ends}
    if axes is not None:
        inits["axes"] = axes
    if steps is not None:
        inits["steps"] = steps
    check_node("Slice", {"x": X}, initializers=inits, opset=13)


def test_slice_v1_attributes() -> None:
    attrs = {"starts": [1, -3], "ends": [2, 100], "axes": [0, 2]}
    check_node("Slice", {"x": X}, attrs, opset=9)


def test_slice_int32_parameters() -> None:
    inits = {"s": np.array([1], np.int32), "e": np.array([3], np.int32)}
    check_node("Slice", {"x": X}, initializers=inits, opset=11)


# --- gathers and scatters ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("axis", "idx"),
    [(0, i64(1, 0, -1)), (1, np.array([[0, 2], [-1, 1]], np.int32)), (-1, np.array(2))],
)
def test_gather(axis: int, idx: np.ndarray) -> None:
    check_node("Gather", {"x": X, "i": idx}, {"axis": axis})


def test_gather_elements_and_nd() -> None:
    idx = np.array([[[0, 2, -1, 1]], [[1, 1, 0, -3]]], np.int64)
    check_node("GatherElements", {"x": X, "i": idx}, {"axis": 1})
    check_node("GatherND", {"x": X, "i": np.array([[1, 2], [0, -1]], np.int64)})
    idx = np.array([[[2]], [[0]]], np.int64)
    check_node("GatherND", {"x": X, "i": idx}, {"batch_dims": 1}, opset=13)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements(reduction: str) -> None:
    idx = np.array([[[0, 2, 1, 1]], [[1, 0, -1, 2]]], np.int64)
    upd = RNG.standard_normal(idx.shape).astype(np.float32)
    attrs = {"axis": 1} if reduction == "none" else {"axis": 1, "reduction": reduction}
    check_node("ScatterElements", {"x": X, "i": idx, "u": upd}, attrs, opset=18)


def test_scatter_v9() -> None:
    idx = np.array([[1, 0, 2]], np.int64)
    upd = np.array([[7, 8, 9]], np.float32)
    check_node("Scatter", {"x": X[0], "i": idx, "u": upd}, {"axis": 1}, opset=10)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatternd(reduction: str) -> None:
    idx = np.array([[1, 2], [0, 0]], np.int64)
    upd = RNG.standard_normal((2, 4)).astype(np.float32)
    attrs = {} if reduction == "none" else {"reduction": reduction}
    check_node("ScatterND", {"x": X, "i": idx, "u": upd}, attrs, opset=18)


# --- Pad, Expand, Tile, DepthToSpace, SpaceToDepth, Trilu -------------------------------------


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad(mode: str) -> None:
    pads = i64(0, 1, 2, 1, 0, 3)
    inits = {"pads": pads, "v": np.array(2.5, np.float32)}
    check_node("Pad", {"x": X}, {"mode": mode}, initializers=inits, opset=19)


def test_pad_negative_and_axes() -> None:
    check_node("Pad", {"x": X}, initializers={"pads": i64(0, -1, 2, 1, -1, 0)}, opset=13)
    inits = {"pads": i64(1, 2, 3, 0), "v": np.array(1.0, np.float32), "axes": i64(-1, 0)}
    check_node("Pad", {"x": X}, initializers=inits, opset=18)


def test_pad_v2_attributes_and_integers() -> None:
    check_node("Pad", {"x": X}, {"pads": [1, 0, 0, 0, 2, 1], "value": -1.0}, opset=9)
    check_node("Pad", {"x": X[0]}, {"pads": [1, 1, 0, 2], "mode": "reflect"}, opset=9)
    xi = np.arange(6, dtype=np.int32).reshape(2, 3)
    inits = {"pads": i64(1, 1, 0, 2), "v": np.array(-3, np.int32)}
    check_node("Pad", {"x": xi}, initializers=inits, opset=13)
    check_node("Pad", {"x": xi}, {"mode": "edge"}, initializers={"pads": inits["pads"]}, opset=13)


@pytest.mark.parametrize("shape", [i64(2, 1, 1), i64(3, 1, 1, 1), i64(4), i64(1, 3, 1)])
def test_expand(shape: np.ndarray) -> None:
    x = RNG.standard_normal((2, 1, 4)).astype(np.float32)
    check_node("Expand", {"x": x}, initializers={"shape": shape}, opset=13)


@pytest.mark.parametrize("repeats", [i64(1, 1, 1), i64(2, 1, 3), i64(1, 0, 2)])
def test_tile(repeats: np.ndarray) -> None:
    check_node("Tile", {"x": X}, initializers={"r": repeats}, opset=13)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode: str) -> None:
    x = RNG.standard_normal((1, 8, 2, 3)).astype(np.float32)
    check_node("DepthToSpace", {"x": x}, {"blocksize": 2, "mode": mode}, opset=13)


def test_space_to_depth() -> None:
    check_node("SpaceToDepth", {"x": IMG}, {"blocksize": 2}, opset=13)


@pytest.mark.parametrize(("upper", "k"), [(1, 0), (0, 0), (1, 2), (0, -1), (1, -5)])
def test_trilu(upper: int, k: int) -> None:
    check_node("Trilu", {"x": X}, {"upper": upper}, initializers={"k": np.array(k)}, opset=14)


def test_trilu_runtime_k() -> None:
    check_node("Trilu", {"x": X, "k": np.array(-1, np.int64)}, {"upper": 0}, opset=14)


def test_center_crop_pad() -> None:
    inits = {"shape": i64(3, 5)}
    check_node("CenterCropPad", {"x": IMG}, {"axes": [2, 3]}, initializers=inits, opset=18)


# --- Resize, Upsample ---------------------------------------------------------------------------

SYMMETRIC = "half_pixel_symmetric"
RESIZE_CASES = [
    ({"mode": "nearest"}, [1, 1, 2, 1.5]),
    ({"mode": "nearest", "nearest_mode": "floor",
      "coordinate_transformation_mode": "asymmetric"}, [1, 1, 3, 2]),
    ({"mode": "nearest", "nearest_mode": "ceil",
      "coordinate_transformation_mode": "align_corners"}, [1, 1, 0.5, 0.5]),
    ({"mode": "nearest", "nearest_mode": "round_prefer_ceil",
      "coordinate_transformation_mode": "tf_half_pixel_for_nn"}, [1, 1, 1.5, 2]),
    ({"mode": "linear"}, [1, 1, 2, 2]),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, [1, 1, 2, 2]),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, [1, 1, 0.5, 0.5]),
    ({"mode": "linear", "coordinate_transformation_mode": "asymmetric"}, [1, 1, 0.75, 1.5]),
    ({"mode": "cubic"}, [1, 1, 2, 2]),
    ({"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}, [1, 1, 0.5, 1.5]),
    ({"mode": "cubic", "coordinate_transformation_mode": "align_corners"}, [1, 1, 1.5, 0.5]),
    # fractional output lengths: the integer length counts (the ONNX spec, ORT, MIGraphX)
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, [1, 1, 0.7, 1.3]),
    ({"mode": "cubic", "coordinate_transformation_mode": "pytorch_half_pixel"}, [1, 1, 0.3, 1.3]),
    ({"mode": "linear", "coordinate_transformation_mode": SYMMETRIC}, [1, 1, 0.7, 1.3]),
    ({"mode": "nearest", "coordinate_transformation_mode": SYMMETRIC}, [1, 1, 1.7, 0.45]),
    ({"mode": "linear", "antialias": 1}, [1, 1, 0.5, 0.4]),
    ({"mode": "cubic", "antialias": 1, "exclude_outside": 1}, [1, 1, 0.6, 0.3]),
]  # fmt: skip


@pytest.mark.parametrize(("attrs", "scales"), RESIZE_CASES)
def test_resize_scales(attrs: dict, scales: list) -> None:
    inits = {"roi": np.zeros(0, np.float32), "scales": np.array(scales, np.float32)}
    check_node("Resize", {"x": IMG}, attrs, initializers=inits, opset=19, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset", [11, 13, 19])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_sizes(opset: int, mode: str) -> None:
    inits = {
        "roi": np.zeros(0, np.float32),
        "scales": np.zeros(0, np.float32),
        "sizes": i64(1, 2, 7, 4),
    }
    check_node("Resize", {"x": IMG}, {"mode": mode}, initializers=inits, opset=opset, rtol=1e-4)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
def test_resize_axes_and_aspect_ratio(policy: str) -> None:
    attrs = {"mode": "nearest", "axes": [3, 2], "keep_aspect_ratio_policy": policy}
    inits = {"roi": np.zeros(0, np.float32), "scales": np.zeros(0, np.float32), "s": i64(9, 7)}
    check_node("Resize", {"x": IMG}, attrs, initializers=inits, opset=19)


def test_resize_tf_crop_and_resize() -> None:
    attrs = {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
             "extrapolation_value": 3.0}  # fmt: skip
    roi = np.array([0, 0, 0.2, -0.1, 1, 1, 0.9, 0.6], np.float32)
    inits = {"roi": roi, "scales": np.zeros(0, np.float32), "sizes": i64(1, 2, 3, 5)}
    check_node("Resize", {"x": IMG}, attrs, initializers=inits, opset=13, rtol=1e-4)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 3], [1, 1, 2.5, 1.5], [1, 1, 0.6, 0.7]])
def test_resize_v10_and_upsample(mode: str, scales: list) -> None:
    s = np.array(scales, np.float32)
    check_node("Resize", {"x": IMG}, {"mode": mode}, initializers={"s": s}, opset=10)
    if min(scales) >= 1:
        check_node("Upsample", {"x": IMG}, {"mode": mode}, initializers={"s": s}, opset=9)
        attrs = {"mode": mode, "scales": [float(f) for f in scales]}
        check_node("Upsample", {"x": IMG}, attrs, opset=7)


def test_resize_integer_input() -> None:
    x = RNG.integers(0, 255, (1, 1, 3, 4)).astype(np.uint8)
    inits = {"roi": np.zeros(0, np.float32), "scales": np.array([1, 1, 2, 2], np.float32)}
    check_node("Resize", {"x": x}, {"mode": "nearest"}, initializers=inits, opset=13)


# --- OneHot, Compress, ReverseSequence ----------------------------------------------------------


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_onehot(axis: int) -> None:
    idx = np.array([[0, 3, -1], [5, -7, 2]], np.int64)
    inits = {"depth": np.array(4, np.int64), "values": np.array([-1, 2], np.float32)}
    check_node("OneHot", {"i": idx}, {"axis": axis}, initializers=inits, opset=11)


@pytest.mark.parametrize("axis", [None, 0, 2, -1])
def test_compress(axis) -> None:
    cond = np.array([True, False, True], bool)
    if axis is not None:
        cond = cond[: X.shape[axis]]
    attrs = {} if axis is None else {"axis": axis}
    check_node("Compress", {"x": X}, attrs, initializers={"c": cond}, opset=11)


@pytest.mark.parametrize(("batch_axis", "time_axis"), [(1, 0), (0, 1)])
def test_reverse_sequence(batch_axis: int, time_axis: int) -> None:
    x = RNG.standard_normal((3, 3, 2)).astype(np.float32)
    lens = {"l": i64(3, 1, 2)}
    attrs = {"batch_axis": batch_axis, "time_axis": time_axis}
    check_node("ReverseSequence", {"x": x}, attrs, initializers=lens, opset=10)
    check_node("ReverseSequence", {"x": x, "l": lens["l"]}, attrs, opset=10)


# --- constants and shapes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "attrs",
    [{"value": numpy_helper.from_array(X)}, {"value_float": 1.5}, {"value_floats": [1.0, 2.0]},
     {"value_int": 3}, {"value_ints": [4, 5, 6]}],
)  # fmt: skip
def test_constant(attrs: dict) -> None:
    node = helper.make_node("Constant", [], ["y"], **attrs)
    model = make_model([node], {}, ["y"], opset=13)
    assert_outputs_match(run_pgx(model, {}), run_ort(model, {}), 0, 0)


def test_sparse_constant() -> None:
    values = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "v")
    indices = numpy_helper.from_array(i64(1, 5), "i")
    sparse = helper.make_sparse_tensor(values, indices, [2, 3])
    node = helper.make_node("Constant", [], ["y"], sparse_value=sparse)
    model = make_model([node], {}, ["y"], opset=13)
    np.testing.assert_array_equal(run_pgx(model, {})[0], [[0, 1, 0], [0, 0, 2]])


@pytest.mark.parametrize("value", [None, np.array([7], np.int32), np.array([0.5], np.float32)])
def test_constant_of_shape(value) -> None:
    attrs = {} if value is None else {"value": numpy_helper.from_array(value)}
    check_node("ConstantOfShape", {}, attrs, initializers={"s": i64(2, 3)}, opset=13)


@pytest.mark.parametrize(
    ("start", "limit", "delta"),
    [(0, 5, 1), (10, 2, -3), (1.0, 2.0, 0.25), (3, 3, 1), (-2.5, 3.1, 1.7)],
)
def test_range(start, limit, delta) -> None:
    dtype = np.float32 if isinstance(start, float) else np.int64
    inits = {k: np.array(v, dtype) for k, v in zip("sld", (start, limit, delta), strict=True)}
    check_node("Range", {}, initializers=inits, opset=13)


@pytest.mark.parametrize("attrs", [{}, {"k": 1}, {"k": -2, "dtype": TensorProto.INT32}])
def test_eye_like(attrs: dict) -> None:
    check_node("EyeLike", {"x": X[0]}, attrs, opset=13)


@pytest.mark.parametrize(
    ("opset", "attrs"),
    [(13, {}), (15, {"start": 1}), (15, {"end": -1}), (15, {"start": -2, "end": 10}),
     (15, {"start": 2, "end": 1})],
)  # fmt: skip
def test_shape_and_size(opset: int, attrs: dict) -> None:
    check_node("Shape", {"x": X}, attrs, opset=opset)
    check_node("Size", {"x": X}, opset=opset)


# --- folding of shape-computing chains ----------------------------------------------------------


def _chain_model() -> onnx.ModelProto:
    """x [2,3,4] -> Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])), plus Expand,
    ConstantOfShape, Range and Slice driven by int64 arithmetic on Shape, as torch exports."""
    n = helper.make_node
    nodes = [
        n("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0, np.int64))),
        n("Shape", ["x"], ["shape"]),
        n("Gather", ["shape", "zero"], ["batch"], axis=0),
        n("Unsqueeze", ["batch", "axes0"], ["batch1"]),
        n("Concat", ["batch1", "minus1"], ["target"], axis=0),
        n("Reshape", ["x", "target"], ["flat"]),
        n("Shape", ["flat"], ["flat_shape"], start=1),
        n("Cast", ["flat_shape"], ["flat_shape32"], to=TensorProto.INT32),
        n("Cast", ["flat_shape32"], ["flat_shape64"], to=TensorProto.INT64),
        n("Div", ["flat_shape64", "two"], ["half"]),
        n("Squeeze", ["half", "axes0"], ["half0"]),
        n("Range", ["zero", "half0", "one"], ["positions"]),
        n("Mul", ["half", "two"], ["full"]),
        n("Concat", ["batch1", "full"], ["expand_to"], axis=0),
        n("ConstantOfShape", ["expand_to"], ["ones"], value=numpy_helper.from_array(
            np.array([1.0], np.float32))),
        n("Add", ["flat", "ones"], ["plus"]),
        n("Slice", ["plus", "zero1", "half", "one1"], ["left"]),
        # Expand's shape comes from the chain too: [batch, 1] broadcast with positions [half]
        n("Concat", ["batch1", "one1"], ["expand_half"], axis=0),
        n("Expand", ["positions", "expand_half"], ["pos2"]),
        n("Cast", ["pos2"], ["pos2f"], to=TensorProto.FLOAT),
        n("Add", ["left", "pos2f"], ["y"]),
    ]  # fmt: skip
    inits = {
        "one": np.array(1, np.int64), "axes0": i64(0),
        "minus1": i64(-1), "two": i64(2), "zero1": i64(0), "one1": i64(1),
    }  # fmt: skip
    return make_model(nodes, {"x": X}, ["y"], inits, opset=15)


def test_shape_chain_folds_to_literals() -> None:
    model = _chain_model()
    onnx.checker.check_model(model)
    ours, ref = run_pgx(model, {"x": X}), run_ort(model, {"x": X})
    assert_outputs_match(ours, ref, 1e-6, 1e-6)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    names = [ins.name() for ins in prog.get_main_module()]
    # the shape arithmetic folded away: no shape_guard, no integer arithmetic at run time
    for gone in ("shape_guard", "gather", "div", "concat", "dynamic_slice"):
        assert gone not in names, names


# --- run-time shape inputs (the declared output shape is used and checked) ----------------------


def _declared(node: onnx.NodeProto, inputs: dict, out_lens: list[int], opset: int = 17):
    model = make_model([node], inputs, ["y"], opset=opset)
    out = model.graph.output[0]
    out.type.tensor_type.elem_type = TensorProto.FLOAT
    out.type.tensor_type.shape.Clear()
    for d in out_lens:
        out.type.tensor_type.shape.dim.add().dim_value = d
    return model


@pytest.mark.parametrize(
    ("op", "extra", "lens"),
    [("Reshape", {"s": i64(4, -1)}, [4, 6]), ("Expand", {"s": i64(2, 2, 3, 4)}, [2, 2, 3, 4]),
     ("Tile", {"s": i64(1, 2, 1)}, [2, 6, 4]), ("Unsqueeze", {"s": i64(0)}, [1, 2, 3, 4])],
)  # fmt: skip
def test_runtime_shape_input_uses_declared_shape(op: str, extra: dict, lens: list) -> None:
    inputs = {"x": X, **extra}
    model = _declared(helper.make_node(op, ["x", "s"], ["y"]), inputs, lens)
    assert_outputs_match(run_pgx(model, inputs), run_ort(model, inputs), 0, 0)


def test_runtime_shape_input_is_checked() -> None:
    inputs = {"x": X, "s": i64(4, -1)}
    model = _declared(helper.make_node("Reshape", ["x", "s"], ["y"]), inputs, [4, 6])
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("ref"))
    with pytest.raises(Exception, match="compiled for \\[4, 6\\]"):
        prog.run({"x": X, "s": i64(6, -1)})


def test_runtime_slice_and_resize() -> None:
    inputs = {"x": X, "b": i64(2, 0), "e": i64(-100, 2), "a": i64(2, 1), "st": i64(-1, 1)}
    node = helper.make_node("Slice", ["x", "b", "e", "a", "st"], ["y"])
    model = _declared(node, inputs, [2, 2, 3])
    assert_outputs_match(run_pgx(model, inputs), run_ort(model, inputs), 0, 0)
    inputs = {"x": IMG, "roi": np.zeros(0, np.float32), "s": np.array([1, 1, 2, 0.5], np.float32)}
    node = helper.make_node("Resize", ["x", "roi", "s"], ["y"], mode="linear")
    model = _declared(node, inputs, [1, 2, 8, 3], opset=13)
    assert_outputs_match(run_pgx(model, inputs), run_ort(model, inputs), 1e-5, 1e-6)


def test_runtime_value_without_declared_shape_is_an_error() -> None:
    node = helper.make_node("Reshape", ["x", "s"], ["y"])
    model = make_model([node], {"x": X, "s": i64(4, -1)}, ["y"])
    with pytest.raises(pygraphx.OnnxParseError, match="'shape' must be known at compile time"):
        pygraphx.parse_onnx_buffer(model.SerializeToString(), specialize_on_input_values=False)


def test_scalar_initializer_index_keeps_rank() -> None:
    check_node("Gather", {"x": X}, {"axis": 1}, initializers={"i": np.array(2, np.int64)})
