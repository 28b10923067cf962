"""`resize` lowered to torch (`torch_lowering/lower_resize.py`) on the `cpu` target, and the gpu
lowering run on the CPU: ONNX's own Resize/Upsample node cases, with their scales / sizes / roi
made constants (the form exporters write, which the lowering takes), against the outputs ONNX's
reference implementation gives for them. Each case must be lowered (no numpy fallback), except
tf_crop_and_resize, which is declined on purpose and must still match through the fallback."""

from __future__ import annotations

import re
import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

pytest.importorskip("torch")
from onnx.backend.test.case.node import collect_testcases  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets.gpu.target import GpuTarget  # noqa: E402
from tests.onnx.test_backend_node import EXCLUDE  # noqa: E402


def _array(value: object) -> np.ndarray:
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    return np.asarray(value)


def _cases() -> dict[str, tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]]:
    """name -> (model with constant parameters, feeds of its data input, expected outputs)."""
    cases = {}
    # collect_testcases gathers once per process and then returns that list whatever the filter
    for case in collect_testcases():
        if not case.name.startswith(("test_resize", "test_upsample")) or not case.data_sets:
            continue
        if any(re.match(p, case.name) for p in EXCLUDE):
            continue  # ONNX's expected values there are known to be wrong (see EXCLUDE)
        model = onnx.ModelProto()
        model.CopyFrom(case.model)
        inputs, outputs = ([_array(v) for v in vs] for vs in case.data_sets[0])
        graph_inputs = list(model.graph.input)
        del model.graph.input[1:]
        for vi, value in zip(graph_inputs[1:], inputs[1:], strict=True):
            model.graph.initializer.append(numpy_helper.from_array(value, vi.name))
        cases[case.name] = (model, {graph_inputs[0].name: inputs[0]}, outputs)
    return cases


CASES = _cases()


@pytest.mark.parametrize("target", ["cpu", "gpu_on_cpu"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_resize_case(name: str, target: str) -> None:
    model, feeds, want = CASES[name]
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback announcement of the crop cases
        prog.compile(pygraphx.get_target("cpu") if target == "cpu" else GpuTarget(device="cpu"))
    fallbacks = prog._executable.fallbacks
    if "crop" in name:
        assert "resize" in fallbacks
    else:
        assert "resize" not in fallbacks, fallbacks
    got = prog.run(feeds)
    for g, w in zip(got, want, strict=True):
        g = np.asarray(g)
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_cases_cover_the_modes() -> None:
    """The collection is not empty and covers nearest, linear, cubic and antialias."""
    names = " ".join(CASES)
    assert len(CASES) >= 30
    for word in ("nearest", "linear", "cubic", "antialias", "align_corners", "exclude_outside"):
        assert word in names


def test_both_paths_are_exercised() -> None:
    """The cases above run through `F.interpolate` (the exporters' forms) and through the
    separable gathers (every other form), several of each."""
    from pygraphx.targets.torch_lowering.lower_resize import interpolate_args

    fast, gathers = set(), set()
    for name, (model, _, _) in CASES.items():
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        for ins in prog.get_main_module().instructions:
            if ins.op.name == "resize":
                (fast if interpolate_args(ins) is not None else gathers).add(name)
    assert {"test_resize_upsample_scales_linear", "test_resize_upsample_scales_cubic"} <= fast
    assert len(gathers) >= 20, sorted(fast)


@pytest.mark.parametrize("target", ["cpu", "gpu_on_cpu"])
@pytest.mark.parametrize("factors", [(2, 4), (1, 2), (3, 2), (2, 6)])
def test_nearest_integer_upsampling_is_repeat(factors: tuple[int, int], target: str) -> None:
    """`nn.Upsample(mode="nearest")`'s Resize (asymmetric, floor) by integer factors repeats
    each pixel: through F.interpolate for powers of two, through the gathers otherwise."""
    from onnx import TensorProto, helper

    from pygraphx.targets.torch_lowering.lower_resize import interpolate_args

    x = np.random.default_rng(3).standard_normal((2, 3, 5, 4)).astype(np.float32)
    scales = np.array([1, 1, *factors], np.float32)
    modes = {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest", **modes)
    out_shape = [2, 3, 5 * factors[0], 4 * factors[1]]
    graph = helper.make_graph(
        [node], "up", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(scales, "scales")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    resize = [i for i in prog.get_main_module().instructions if i.op.name == "resize"]
    powers = all(f & (f - 1) == 0 for f in factors)
    assert (interpolate_args(resize[0]) is not None) == powers
    prog.compile(pygraphx.get_target("cpu") if target == "cpu" else GpuTarget(device="cpu"))
    assert not prog._executable.fallbacks
    want = x.repeat(factors[0], axis=2).repeat(factors[1], axis=3)
    np.testing.assert_array_equal(np.asarray(prog.run({"x": x})[0]), want)
