"""The `cpu` target's numpy fallback for values torch cannot hold and lengths the data decides,
the torch lowering of Unique, and the first run's report of what the fallback cost.

The oracle is ONNX's reference implementation (`onnx.reference.ReferenceEvaluator`) for the
types ONNX Runtime lacks, ONNX Runtime for Unique (the reference mishandles unsorted Unique of a
2-D input), and sleeps of known length for the timing helpers.
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Mapping, Sequence

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.ir.program import Program  # noqa: E402
from pygraphx.targets.torch_lowering.fallback_cost import cost_message, timed_steps  # noqa: E402

RNG = np.random.default_rng(7)


def model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Mapping[str, tuple[int, list[int]]],
    outputs: Mapping[str, int],
    opset: int = 23,
) -> onnx.ModelProto:
    """A model with typed inputs (ONNX element type, lens) and outputs of unknown lens."""
    graph = helper.make_graph(
        list(nodes),
        "t",
        [helper.make_tensor_value_info(n, t, lens) for n, (t, lens) in inputs.items()],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def cpu_program(m: onnx.ModelProto) -> Program:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the compile-time announcement
        prog = pygraphx.parse_onnx_buffer(m.SerializeToString())
        prog.compile(pygraphx.get_target("cpu"))
    return prog


def run_quiet(prog: Program, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the first run's cost report
        return [np.array(a) for a in prog.run(dict(feeds))]


def ort_run(m: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, dict(feeds))


def assert_like_reference(
    m: onnx.ModelProto, prog: Program, feeds: Mapping[str, np.ndarray], ort: bool = False
) -> None:
    if ort:
        want = ort_run(m, feeds)
    else:
        want = ReferenceEvaluator(m).run(None, dict(feeds))
    got = run_quiet(prog, feeds)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        w = np.asarray(w)
        assert g.dtype == w.dtype, f"output {k}: {g.dtype}, expected {w.dtype}"
        assert g.shape == w.shape, f"output {k}: {g.shape}, expected {w.shape}"
        if w.dtype == object:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_array_equal(g.astype(np.float64), w.astype(np.float64))


# --- values torch cannot hold ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("onnx_type", "np_type"),
    [
        (TensorProto.INT4, ml_dtypes.int4),
        (TensorProto.UINT4, ml_dtypes.uint4),
        (TensorProto.INT2, ml_dtypes.int2),
        (TensorProto.FLOAT4E2M1, ml_dtypes.float4_e2m1fn),
        (TensorProto.FLOAT8E8M0, ml_dtypes.float8_e8m0fnu),
    ],
)
def test_sub_byte_values_run_through_numpy(onnx_type: int, np_type: type) -> None:
    """A T parameter (T has no torch storage) cast to float, and float -> T -> float with the T
    value returned (not for e8m0: pygraphx converts only from it, see the node suite)."""
    nodes = [helper.make_node("Cast", ["p"], ["z"], to=TensorProto.FLOAT)]
    inputs = {"p": (onnx_type, [3])}
    outputs = {"z": TensorProto.FLOAT}
    if onnx_type != TensorProto.FLOAT8E8M0:
        nodes += [helper.make_node("Cast", ["x"], ["q"], to=onnx_type),
                  helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT)]  # fmt: skip
        inputs["x"] = (TensorProto.FLOAT, [2, 5])
        outputs |= {"q": onnx_type, "y": TensorProto.FLOAT}
    m = model(nodes, inputs, outputs)
    prog = cpu_program(m)
    assert prog._executable.fallbacks  # the casts (alone or in fused groups)
    x = RNG.uniform(0.5, 6.0, (2, 5)).astype(np.float32)
    p = np.array([1, 2, 4], np.float32).astype(np_type)
    for scale in (1.0, -1.0):  # the same program, new values
        feeds = {"p": p} | ({"x": x * scale} if "x" in inputs else {})
        assert_like_reference(m, prog, feeds)


def test_string_tensors_run_through_numpy() -> None:
    nodes = [
        helper.make_node("StringConcat", ["a", "b"], ["c"]),
        helper.make_node("Equal", ["c", "a"], ["e"]),
    ]
    m = model(
        nodes,
        {"a": (TensorProto.STRING, [3]), "b": (TensorProto.STRING, [3])},
        {"c": TensorProto.STRING, "e": TensorProto.BOOL},
    )
    prog = cpu_program(m)
    assert prog._executable.fallbacks  # counted (and announced at compile)
    a = np.array(["x", "héllo", ""], dtype=object)
    b = np.array(["1", "", ""], dtype=object)
    assert_like_reference(m, prog, {"a": a, "b": b})


# --- lengths the data decides ------------------------------------------------------------------


def unique_model(
    attrs: Mapping[str, int], lens: list[int], then_add: bool = False
) -> onnx.ModelProto:
    outs = {"y": TensorProto.FLOAT, "i": TensorProto.INT64, "inv": TensorProto.INT64,
            "c": TensorProto.INT64}  # fmt: skip
    nodes = [helper.make_node("Unique", ["x"], list(outs), **attrs)]
    if then_add:  # instructions computed from the open-length values
        nodes += [helper.make_node("Add", ["y", "y"], ["y2"]),
                  helper.make_node("Mul", ["c", "i"], ["ci"])]  # fmt: skip
        outs |= {"y2": TensorProto.FLOAT, "ci": TensorProto.INT64}
    return model(nodes, {"x": (TensorProto.FLOAT, lens)}, outs, opset=17)


@pytest.mark.parametrize("sort", [0, 1])
@pytest.mark.parametrize(("lens", "axis"), [([12], None), ([4, 3], None), ([5, 3], 0),
                                            ([2, 4, 2], -1), ([3, 4], 1)])  # fmt: skip
def test_unique_is_lowered_with_its_real_length(
    sort: int, lens: list[int], axis: int | None
) -> None:
    attrs = {"sorted": sort} | ({} if axis is None else {"axis": axis})
    m = unique_model(attrs, lens)
    prog = cpu_program(m)
    assert prog._executable.fallbacks == {}, "Unique runs through torch.unique"
    for hi in (2, 3, 5):  # different numbers of unique values through the same program
        x = RNG.integers(0, hi, lens).astype(np.float32)
        assert_like_reference(m, prog, {"x": x}, ort=True)


def test_values_computed_from_an_open_length_run_through_numpy() -> None:
    m = unique_model({"sorted": 0}, [10], then_add=True)
    prog = cpu_program(m)
    assert sum(prog._executable.fallbacks.values()) == 2  # add and mul (maybe fused)
    for hi in (2, 7):
        x = RNG.integers(0, hi, [10]).astype(np.float32)
        assert_like_reference(m, prog, {"x": x}, ort=True)


def test_unique_of_nan_matches_the_reference_with_a_warning() -> None:
    m = unique_model({"sorted": 1}, [6])
    prog = cpu_program(m)
    x = np.array([3, np.nan, 1, np.nan, 1, 2], np.float32)
    want = ReferenceEvaluator(m).run(None, {"x": x})  # NaNs as one value, as numpy has it
    with pytest.warns(RuntimeWarning, match="holds NaN"):
        got = prog.run({"x": x})
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.array(g), w)


# --- what the fallback costs ---------------------------------------------------------------------


@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_first_run_reports_the_fallback_cost_once(target: str) -> None:
    """cpu, and the gpu target's uncaptured runs (here its lowering on the CPU device)."""
    nodes = [helper.make_node("Cast", ["x"], ["q"], to=TensorProto.INT4),
             helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT),
             helper.make_node("Relu", ["y"], ["r"])]  # fmt: skip
    m = model(nodes, {"x": (TensorProto.FLOAT, [4])}, {"r": TensorProto.FLOAT})
    if target == "cpu":
        prog = cpu_program(m)
    else:
        from pygraphx.targets.gpu.target import GpuTarget

        prog = pygraphx.parse_onnx_buffer(m.SerializeToString())
        prog.compile(GpuTarget(device="cpu"))
    feeds = {"x": np.arange(4, dtype=np.float32)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prog.run(feeds)
        prog.run(feeds)
    reports = [str(w.message) for w in caught if "took" in str(w.message)]
    assert len(reports) == 1, reports
    n = sum(prog._executable.fallbacks.values())
    number = r"[\d.e+-]+"
    pattern = (
        rf"{target} target: numpy fallback: {n} instruction\(s\) took {number} ms of {number} ms "
        r"\(\d+%\) of this run"
    )
    assert re.fullmatch(pattern, reports[0]), reports[0]


def test_no_cost_report_without_fallbacks() -> None:
    m = model([helper.make_node("Relu", ["x"], ["r"])], {"x": (TensorProto.FLOAT, [4])},
              {"r": TensorProto.FLOAT})  # fmt: skip
    prog = cpu_program(m)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prog.run({"x": np.ones(4, np.float32)})


def test_timed_steps_time_only_the_fallback_steps() -> None:
    calls: list[str] = []

    def slow() -> None:
        calls.append("slow")
        time.sleep(0.02)

    def fast() -> None:
        calls.append("fast")
        time.sleep(0.5)  # far longer: the timer must not hold it even on a loaded machine

    fns, timer = timed_steps([slow, fast], [True, False])
    assert fns[1] is fast
    for fn in fns:
        fn()
    assert calls == ["slow", "fast"]
    assert 0.02 <= timer.seconds < 0.5


def test_cost_message_gives_the_share() -> None:
    assert cost_message(3, 0.002, 0.008) == (
        "cpu target: numpy fallback: 3 instruction(s) took 2 ms of 8 ms (25%) of this run"
    )


def test_timed_steps_synchronise_around_a_device_fallback() -> None:
    """With a device sync, queued work finishes before the fallback's clock starts and the
    fallback's own device work before it stops."""
    order: list[str] = []
    fns, timer = timed_steps(
        [lambda: order.append("device"), lambda: order.append("fallback")],
        [False, True],
        sync=lambda: order.append("sync"),
    )
    for fn in fns:
        fn()
    assert order == ["device", "sync", "fallback", "sync"]
    assert timer.seconds >= 0
