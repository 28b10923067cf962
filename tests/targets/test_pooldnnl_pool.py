"""Pooling steps of CNNs on oneDNN's pooling primitive (`onednn_pool.py`).

A convolution (channels-last output) followed by a pooling, compiled for the cpu target,
against ONNX Runtime; each case also says whether the oneDNN primitive ran it (counted on
`Primitive.execute`) or, where oneDNN's semantics would differ, the torch lowering did. The
primitive alone, float32 and bf16, against torch's pooling in float64 of the same values.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets.torch_lowering import onednn_conv, onednn_pool  # noqa: E402
from pygraphx.targets.torch_lowering.gemm_kernels import cpu_has_bf16  # noqa: E402
from pygraphx.targets.torch_lowering.onednn_capi import (  # noqa: E402
    POOLING_AVG_EXCLUDE,
    POOLING_AVG_INCLUDE,
    POOLING_MAX,
    runtime,
)

pytestmark = pytest.mark.skipif(
    not onednn_conv.available(), reason="needs oneDNN's C API library (onednn-cpu-gomp)"
)
RNG = np.random.default_rng(7)

# name -> (ONNX op, attributes, input lens, whether oneDNN runs it)
CASES: dict[str, tuple[str, dict, list[int], bool]] = {
    "global_avg": ("GlobalAveragePool", {}, [1, 8, 7, 7], True),
    "global_max": ("GlobalMaxPool", {}, [2, 8, 5, 6], True),
    "resnet_stem_max": (
        "MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        [1, 8, 16, 16], True,
    ),
    "sppf_max5": (
        "MaxPool", {"kernel_shape": [5, 5], "strides": [1, 1], "pads": [2, 2, 2, 2]},
        [2, 8, 10, 10], True,
    ),
    "max_ceil": (
        "MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, [1, 8, 12, 11],
        True,
    ),
    "max_dilated_asym": (  # oneDNN 3.2 offers its reference kernel only: not taken
        "MaxPool", {"kernel_shape": [3, 2], "strides": [1, 2], "dilations": [2, 1],
                    "pads": [0, 1, 2, 0]},
        [1, 8, 9, 9], False,
    ),
    "max_asym": (  # torch's lowering declines asymmetric padding (numpy fallback)
        "MaxPool", {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [0, 1, 2, 0]},
        [1, 8, 9, 9], True,
    ),
    "avg_asym_exclude": (
        "AveragePool", {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [1, 0, 0, 2]},
        [2, 8, 9, 8], True,
    ),
    "avg_exclude_pad_ceil": (
        "AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                        "ceil_mode": 1},
        [1, 8, 12, 12], True,
    ),
    "avg_include_pad": (
        "AveragePool", {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1],
                        "count_include_pad": 1},
        [2, 8, 6, 7], True,
    ),
    "avg_include_pad_ceil_overhang": (  # oneDNN would count the overhang: torch lowering
        "AveragePool", {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1,
                        "count_include_pad": 1},
        [1, 8, 7, 7], False,
    ),
    "avg_whole_window": ("AveragePool", {"kernel_shape": [5, 5]}, [1, 8, 5, 5], True),
}  # fmt: skip


def _model(op: str, attrs: dict, x_lens: list[int], conv_after: bool = False) -> onnx.ModelProto:
    """x -> Conv 3x3 (pad 1, 8 channels) -> Relu -> the pooling -> y (`conv_after`: then a
    1x1 Conv to 4 channels -> y)."""
    n, c, h, w = x_lens
    weight = RNG.standard_normal((c, 3, 3, 3)).astype(np.float32)
    weights = [onnx.numpy_helper.from_array(weight, "w")]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node(op, ["r"], ["p" if conv_after else "y"], **attrs),
    ]
    if conv_after:
        w2 = RNG.standard_normal((4, c, 1, 1)).astype(np.float32)
        weights.append(onnx.numpy_helper.from_array(w2, "w2"))
        nodes.append(helper.make_node("Conv", ["p", "w2"], ["y"]))
    graph = helper.make_graph(
        nodes, "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 3, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], weights,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


def _count_executes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = onednn_pool.Primitive.execute

    def spy(self: onednn_pool.Primitive, x: int, y: int) -> None:
        calls[0] += 1
        real(self, x, y)

    monkeypatch.setattr(onednn_pool.Primitive, "execute", spy)
    return calls


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_pooling_matches_onnxruntime(
    case: str, threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    op, attrs, x_lens, onednn = CASES[case]
    model = _model(op, attrs, x_lens)
    x = RNG.standard_normal([x_lens[0], 3, *x_lens[2:]]).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    calls = _count_executes(monkeypatch)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("cpu", threads=threads))
    for _ in range(2):  # the second run: the pointers as the first left them
        got = np.array(prog.run({"x": x})[0])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert (calls[0] == 2) == onednn, f"oneDNN ran {calls[0]} times"


def test_torch_kernel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """`PGX_CPU_POOL=torch` keeps torch's kernels (same numbers)."""
    monkeypatch.setenv(onednn_pool.KERNEL_ENV, "torch")
    op, attrs, x_lens, _ = CASES["resnet_stem_max"]
    model = _model(op, attrs, x_lens)
    x = RNG.standard_normal([x_lens[0], 3, *x_lens[2:]]).astype(np.float32)
    calls = _count_executes(monkeypatch)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("cpu", threads=1))
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(np.array(prog.run({"x": x})[0]), want, rtol=1e-5, atol=1e-5)
    assert calls[0] == 0


# algorithm, kernel, stride, pad_l, pad_r, torch function and its arguments
PRIMITIVES = {
    "max3s2": (POOLING_MAX, (3, 3), (2, 2), (1, 1), (1, 1),
               lambda x: torch.nn.functional.max_pool2d(x, 3, 2, 1)),
    "avg3s1_include": (POOLING_AVG_INCLUDE, (3, 3), (1, 1), (1, 1), (1, 1),
                       lambda x: torch.nn.functional.avg_pool2d(x, 3, 1, 1)),
    "avg3s2_exclude": (POOLING_AVG_EXCLUDE, (3, 3), (2, 2), (1, 1), (1, 1),
                       lambda x: torch.nn.functional.avg_pool2d(x, 3, 2, 1,
                                                                count_include_pad=False)),
    "global_avg": (POOLING_AVG_EXCLUDE, (9, 9), (1, 1), (0, 0), (0, 0),
                   lambda x: x.mean((2, 3), keepdim=True)),
}  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(PRIMITIVES))
def test_primitive_matches_torch(name: str, dtype: torch.dtype) -> None:
    if dtype == torch.bfloat16 and not cpu_has_bf16():
        pytest.skip("bf16 pooling needs a CPU with bf16 instructions")
    alg, kernel, stride, pad_l, pad_r, oracle = PRIMITIVES[name]
    x = torch.randn(2, 16, 9, 9).to(dtype).contiguous(memory_format=torch.channels_last)
    want = oracle(x.double())
    plan = onednn_pool.PoolPlan(alg, tuple(x.shape), tuple(want.shape), kernel, stride,
                                (0, 0), pad_l, pad_r, dtype)  # fmt: skip
    rt = runtime()
    assert rt is not None
    pool = onednn_pool.Pool(rt, plan)
    y = torch.empty(want.shape, dtype=dtype).contiguous(memory_format=torch.channels_last)
    pool(x, y)
    tol = 1e-6 if dtype == torch.float32 else 2.0**-8
    torch.testing.assert_close(y.double(), want, rtol=tol, atol=tol)


@pytest.mark.skipif(not cpu_has_bf16(), reason="bf16 pooling needs a CPU with bf16 instructions")
@pytest.mark.parametrize("case", ["resnet_stem_max", "avg_exclude_pad_ceil", "global_avg"])
def test_bf16_program_pools_in_bf16(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """After `quantize_bf16` the pooling between bf16 convolutions runs on a bf16 primitive;
    the program's output is within bf16's error of ONNX Runtime's float32 one."""
    op, attrs, x_lens, _ = CASES[case]
    model = _model(op, attrs, x_lens, conv_after=True)
    x = RNG.standard_normal([x_lens[0], 3, *x_lens[2:]]).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    plans: list[onednn_pool.PoolPlan] = []
    real = onednn_pool.Pool.__init__

    def spy(self: onednn_pool.Pool, rt: object, plan: onednn_pool.PoolPlan) -> None:
        plans.append(plan)
        real(self, rt, plan)  # type: ignore[arg-type]

    monkeypatch.setattr(onednn_pool.Pool, "__init__", spy)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_bf16(prog)
    prog.compile(pygraphx.get_target("cpu", threads=1))
    got = np.asarray(prog.run({"x": x})[0], dtype=np.float32)
    assert [p.dtype for p in plans] == [torch.bfloat16]
    np.testing.assert_allclose(got, want, rtol=2.0**-6, atol=2.0**-6 * float(np.abs(want).max()))


def test_sppf_chain_matches_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    """YOLOv8's SPPF: three 5x5 stride-1 max pools in a chain, each reading the last one's
    output, concatenated with their input and fed to a 1x1 convolution."""
    c = 8
    w1 = RNG.standard_normal((c, 3, 3, 3)).astype(np.float32)
    w2 = RNG.standard_normal((4, 4 * c, 1, 1)).astype(np.float32)
    pool = {"kernel_shape": [5, 5], "strides": [1, 1], "pads": [2, 2, 2, 2]}
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p1"], **pool),
        helper.make_node("MaxPool", ["p1"], ["p2"], **pool),
        helper.make_node("MaxPool", ["p2"], ["p3"], **pool),
        helper.make_node("Concat", ["r", "p1", "p2", "p3"], ["cat"], axis=1),
        helper.make_node("Conv", ["cat", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "sppf", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 10, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(w2, "w2")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    x = RNG.standard_normal([1, 3, 10, 10]).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    calls = _count_executes(monkeypatch)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("cpu", threads=1))
    np.testing.assert_allclose(np.array(prog.run({"x": x})[0]), want, rtol=1e-5, atol=1e-4)
    assert calls[0] == 3


def _random_pool(rng: np.random.Generator) -> tuple[str, dict, list[int]]:
    """A random max / average pooling ONNX Runtime accepts: kernel 1-4, stride 1-3, padding
    below the kernel on each side, ceil_mode, count_include_pad, dilation for max pools."""
    op = str(rng.choice(["MaxPool", "AveragePool"]))
    kernel = [int(k) for k in rng.integers(1, 5, 2)]
    attrs: dict = {"kernel_shape": kernel, "strides": [int(s) for s in rng.integers(1, 4, 2)]}
    attrs["pads"] = [int(rng.integers(0, k)) for k in kernel + kernel]
    attrs["ceil_mode"] = int(rng.integers(0, 2))
    if op == "AveragePool":
        attrs["count_include_pad"] = int(rng.integers(0, 2))
    elif rng.random() < 0.3:
        attrs["dilations"] = [int(d) for d in rng.integers(1, 3, 2)]
    return op, attrs, [int(rng.integers(1, 3)), 8, *(int(n) for n in rng.integers(5, 12, 2))]


def test_random_geometries_match_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    """40 random geometries after a convolution: the cpu target (oneDNN where it takes them)
    against ONNX Runtime; most of them must run on oneDNN."""
    rng, taken = np.random.default_rng(11), 0
    calls = _count_executes(monkeypatch)
    for _ in range(40):
        op, attrs, x_lens = _random_pool(rng)
        model = _model(op, attrs, x_lens)
        x = rng.standard_normal([x_lens[0], 3, *x_lens[2:]]).astype(np.float32)
        want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        prog.compile(pygraphx.get_target("cpu", threads=1))
        got = np.array(prog.run({"x": x})[0])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{op} {attrs}")
        taken += calls[0] > 0
        calls[0] = 0
    assert taken >= 20, f"oneDNN took {taken} of 40"
