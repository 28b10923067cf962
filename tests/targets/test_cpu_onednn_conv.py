"""The `dnnl` convolution kernel: oneDNN's own C API through ctypes (`onednn_conv.py`).

Each layer form (plain, grouped, depthwise, strided, dilated, asymmetric padding, with and
without bias, relu / relu6 / silu, a residual added as a new output or in place) is compared
with torch's plain NCHW `F.conv2d` followed by the epilogue in torch; whole networks against
ONNX Runtime (`test_cpu_conv_choice.py` runs its network on every kernel, `dnnl` included).
Skipped where the library (`pip install onednn-cpu-gomp`) is not installed, except the test
that its absence is said and the default kernel stays torch's.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from pygraphx.targets.torch_lowering import conv_choice, onednn_capi, onednn_conv  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import (  # noqa: E402
    ConvPlan,
    build_kernel,
    kernels_for,
)
from pygraphx.targets.torch_lowering.store import torch_pad  # noqa: E402

needs_dnnl = pytest.mark.skipif(
    not onednn_conv.available(), reason="oneDNN's C API library (onednn-cpu-gomp) not installed"
)
CL = torch.channels_last
UNARY = {"none": [], "relu": [], "hardtanh": [0.0, 6.0], "swish": []}


def _plan(
    x_lens: list[int],
    w_lens: list[int],
    *,
    stride: int = 1,
    dilation: int = 1,
    groups: int = 1,
    begin: tuple[int, int] = (0, 0),
    end: tuple[int, int] = (0, 0),
    bias: bool = True,
    unary: str = "none",
) -> ConvPlan:
    """A plan as `conv_steps.conv_plan` makes it: symmetric pads in `padding`, asymmetric
    ones as a pre-pad (the input lens then include it)."""
    g = torch.Generator().manual_seed(sum(x_lens) + sum(w_lens))
    w = torch.randn(w_lens, generator=g) * 0.3
    pre_pad = None if begin == end else torch_pad(list(begin), list(end))
    padding = list(begin) if pre_pad is None else [0, 0]
    lens = list(x_lens)
    if pre_pad is not None:
        lens[2:] = [n + b + e for n, b, e in zip(lens[2:], begin, end, strict=True)]
    s, d = [stride] * 2, [dilation] * 2
    packed = torch.ops.mkldnn._reorder_convolution_weight(w, padding, s, d, groups, lens)
    b = torch.randn(w_lens[0], generator=g) if bias else None
    return ConvPlan(w, packed, lens, padding, s, d, groups, pre_pad, b, unary, UNARY[unary])


def _oracle(plan: ConvPlan, x: torch.Tensor, other: torch.Tensor | None) -> torch.Tensor:
    """torch's NCHW convolution and the epilogue, step by step, in x's type (the weight, bias
    and add operand are converted to it: float64 for bf16 layers); `plan.add_after`: the add
    operand after the activation."""
    x = x.contiguous()
    if plan.pre_pad is not None:
        x = F.pad(x, plan.pre_pad)
    bias = None if plan.bias is None else plan.bias.to(x.dtype)
    w = plan.weight.to(x.dtype)
    y = F.conv2d(x, w, bias, plan.stride, plan.padding, plan.dilation, plan.groups)
    other = None if other is None else other.to(x.dtype)
    if other is not None and not plan.add_after:
        y = y + other
    if plan.unary == "relu":
        y = F.relu(y)
    elif plan.unary == "hardtanh":
        y = y.clamp(*plan.scalars)
    elif plan.unary == "swish":
        y = F.silu(y)
    return y + other if other is not None and plan.add_after else y


LAYERS = {
    "1x1": ([1, 16, 14, 14], [32, 16, 1, 1], {}),
    "3x3 pad": ([2, 8, 13, 11], [16, 8, 3, 3], {"begin": (1, 1), "end": (1, 1)}),
    "stem stride 2 asymmetric": ([1, 3, 17, 17], [8, 3, 3, 3], {"stride": 2, "end": (1, 1)}),
    "depthwise": ([1, 24, 12, 12], [24, 1, 3, 3], {"groups": 24, "begin": (1, 1), "end": (1, 1)}),
    "depthwise stride 2": ([1, 32, 15, 15], [32, 1, 3, 3], {"groups": 32, "stride": 2}),
    "grouped": ([1, 12, 9, 9], [18, 4, 3, 3], {"groups": 3, "bias": False}),
    "dilated": ([1, 6, 16, 16], [10, 6, 3, 3], {"dilation": 2, "begin": (2, 2), "end": (2, 2)}),
    "5x5 bottom pad": ([1, 4, 10, 10], [4, 4, 5, 5], {"begin": (1, 2), "end": (3, 2)}),
}


@needs_dnnl
@pytest.mark.parametrize("nchw", [False, True])
@pytest.mark.parametrize("unary", list(UNARY))
@pytest.mark.parametrize("layer", list(LAYERS))
def test_layer_matches_torch(layer: str, unary: str, nchw: bool) -> None:
    """Channels-last inputs, and NCHW ones (a network's input: oneDNN's reorder converts)."""
    x_lens, w_lens, kw = LAYERS[layer]
    plan = _plan(x_lens, w_lens, unary=unary, **kw)
    assert "dnnl" in kernels_for(plan)
    x = torch.randn(x_lens)
    x = x if nchw else x.contiguous(memory_format=CL)
    run = build_kernel(plan, "dnnl", lambda: x, None)
    got = run()
    assert got.is_contiguous(memory_format=CL)
    torch.testing.assert_close(got, _oracle(plan, x, None), rtol=1e-4, atol=1e-4)
    assert run().data_ptr() != got.data_ptr()  # a new output every call


@needs_dnnl
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("unary", ["none", "relu", "hardtanh"])
def test_residual_add(in_place: bool, unary: str) -> None:
    plan = _plan([1, 24, 10, 10], [16, 24, 1, 1], unary=unary)
    plan.other, plan.in_place = 0, in_place
    x = torch.randn(1, 24, 10, 10).contiguous(memory_format=CL)
    other = torch.randn(1, 16, 10, 10).contiguous(memory_format=CL)
    want = _oracle(plan, x, other)
    operand = other.clone()
    got = build_kernel(plan, "dnnl", lambda: x, lambda: operand)()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (got.data_ptr() == operand.data_ptr()) == in_place  # in place: the operand's memory
    if not in_place:
        torch.testing.assert_close(operand, other, rtol=0, atol=0)


@needs_dnnl
def test_nchw_input_and_operand_are_converted() -> None:
    plan = _plan([1, 8, 9, 9], [8, 8, 3, 3], begin=(1, 1), end=(1, 1), unary="relu")
    plan.other = 0
    x, other = torch.randn(1, 8, 9, 9), torch.randn(1, 8, 9, 9)  # NCHW-contiguous
    got = build_kernel(plan, "dnnl", lambda: x, lambda: other)()
    torch.testing.assert_close(got, _oracle(plan, x, other), rtol=1e-4, atol=1e-4)


@needs_dnnl
def test_a_primitive_per_thread_count() -> None:
    """Made under 2 threads, called under 1 (a step the cpu target runs on one thread): a
    second primitive is made for 1 thread, and both give torch's answer."""
    before = torch.get_num_threads()
    plan = _plan([1, 32, 28, 28], [64, 32, 1, 1], unary="hardtanh")
    x = torch.randn(1, 32, 28, 28).contiguous(memory_format=CL)
    want = _oracle(plan, x, None)
    try:
        torch.set_num_threads(2)
        run = build_kernel(plan, "dnnl", lambda: x, None)
        torch.set_num_threads(1)
        torch.testing.assert_close(run(), want, rtol=1e-4, atol=1e-4)
        torch.set_num_threads(2)
        torch.testing.assert_close(run(), want, rtol=1e-4, atol=1e-4)
    finally:
        torch.set_num_threads(before)
    assert sorted(run.primitives) == [1, 2]
    one, two = run.primitives[1], run.primitives[2]
    if onednn_capi.library().dnnl_memory_desc_equal(one.w_md, two.w_md):
        assert one.weight is two.weight  # one packed copy for both


def _last_line_of_fresh_process(code: str) -> str:
    """The last line `code` prints in a new interpreter (this one's OpenMP runtimes and the
    library's loaded state are its own), from the repository root."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@needs_dnnl
def test_one_openmp_runtime_and_implementation_named() -> None:
    """Loading the library adds no OpenMP runtime of its own (it shares torch's libgomp),
    checked in a fresh process: this one may hold another library's runtime by now (scikit-
    learn's wheel bundles its own libgomp, and some test may have imported it)."""
    code = (
        "import pygraphx, torch\n"
        "from pygraphx.targets.torch_lowering import onednn_capi as c\n"
        "print(c.library() is not None, '|', c.openmp_shared())\n"
    )
    assert _last_line_of_fresh_process(code) == "True | True"
    prim = onednn_conv.Primitive(onednn_capi.runtime(), _plan([1, 8, 8, 8], [8, 8, 1, 1]), False)
    assert prim.impl and prim.impl != "?"


@needs_dnnl
def test_unsupported_activation_is_not_a_candidate() -> None:
    plan = _plan([1, 8, 8, 8], [8, 8, 1, 1])
    plan.unary = "gelu"
    assert "dnnl" not in kernels_for(plan)
    with pytest.raises(onednn_capi.OneDnnError, match="gelu"):
        build_kernel(plan, "dnnl", lambda: torch.zeros(1, 8, 8, 8), None)


def test_missing_library_is_said_and_torch_path_kept(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setenv(onednn_capi.LIB_ENV, str(tmp_path))  # a folder without the library
    monkeypatch.setattr(onednn_capi, "_state", {})
    monkeypatch.setattr(conv_choice, "_ANNOUNCED", set())
    plan = _plan([1, 8, 8, 8], [8, 8, 1, 1])
    assert not onednn_conv.available()
    assert "libdnnl.so.3 not found" in onednn_capi.unavailable_reason()
    names = kernels_for(plan)
    assert "dnnl" not in names
    with caplog.at_level(logging.WARNING, logger="pygraphx.cpu"):
        assert conv_choice.default_kernel(names) == "onednn"
        assert conv_choice.default_kernel(names) == "onednn"
    assert caplog.text.count("cpu convolutions run through") == 1  # said once
    with pytest.raises(onednn_capi.OneDnnError, match="not available"):
        build_kernel(plan, "dnnl", lambda: torch.zeros(1, 8, 8, 8), None)


def test_geometry_of_asymmetric_padding() -> None:
    plan = _plan([1, 3, 17, 17], [8, 3, 3, 3], stride=2, begin=(0, 1), end=(2, 0))
    lens, pad_l, pad_r, out = onednn_conv.geometry(plan)
    assert lens == [1, 3, 17, 17] and pad_l == [0, 1] and pad_r == [2, 0]
    want = F.conv2d(F.pad(torch.zeros(lens), plan.pre_pad), plan.weight, stride=2).shape
    assert out == list(want)
    assert np.prod(out) > 0


def _two_layer_net() -> tuple[object, dict[str, np.ndarray]]:
    from onnx import helper

    from tests.helpers import make_model

    rng = np.random.default_rng(5)
    inits = {
        "w1": (rng.standard_normal((16, 8, 3, 3)) * 0.3).astype(np.float32),
        "b1": rng.standard_normal(16).astype(np.float32),
        "w2": (rng.standard_normal((8, 16, 1, 1)) * 0.3).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["a1"]),
        helper.make_node("Conv", ["a1", "w2"], ["y"]),
    ]
    feeds = {"x": rng.standard_normal((1, 8, 12, 12)).astype(np.float32)}
    return make_model(nodes, feeds, ["y"], inits), feeds


@needs_dnnl
def test_dnnl_layers_make_no_torch_packed_copy() -> None:
    """A layer on `dnnl` packs its weight once, in oneDNN's own layout: torch's packed copy
    is made only for a layer that runs torch's kernel (forced here), also when profiling."""
    import pygraphx
    from pygraphx.targets.cpu.target import CpuTarget
    from tests.helpers import run_ort

    model, feeds = _two_layer_net()
    want = run_ort(model, feeds)[0]
    for kernel, torch_copies in (("off", 0), ("onednn", 2)):
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        prog.compile(CpuTarget(threads=1, conv_kernel=kernel))
        packed = prog._executable.lowered.ctx.packed_weights
        np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
        seen: list[str] = []
        profiled = prog.run(
            feeds, observer=lambda ins, value, seconds, seen=seen: seen.append(ins.name())
        )
        np.testing.assert_allclose(profiled[0], want, rtol=1e-4, atol=1e-4)
        assert seen.count("convolution") == 2  # the unfused twins ran
        assert sum(key[0] == "mkldnn_weight" for key in packed) == torch_copies


SYSTEM_GOMP = Path("/lib/x86_64-linux-gnu/libgomp.so.1")


@needs_dnnl
@pytest.mark.skipif(not SYSTEM_GOMP.exists(), reason="no system libgomp to load as a second one")
def test_a_second_openmp_runtime_is_refused() -> None:
    """With a second OpenMP runtime in the process (two pools of workers fighting for the
    cores), the library is not used, and the reason says so."""
    code = (
        "import ctypes, torch\n"
        f"ctypes.CDLL({str(SYSTEM_GOMP)!r})\n"
        "from pygraphx.targets.torch_lowering import onednn_capi as c\n"
        "print(c.library() is None, '|', c.unavailable_reason())\n"
    )
    refused, reason = _last_line_of_fresh_process(code).split(" | ")
    assert refused == "True" and "two OpenMP runtimes" in reason and "libgomp" in reason
