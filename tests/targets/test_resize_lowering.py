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
