"""oneDNN's other implementations of a `dnnl` convolution, and the measured choice between them.

Every implementation oneDNN offers for a layer (`onednn_conv.implementations`), float32 and
bf16, runs the layer with its epilogue and must give torch's float64 answer; asking for one
gives that one even when a primitive of the same layer (at oneDNN's first implementation) was
made before it (in oneDNN 3.2 a cached primitive would be returned instead: the cache is off
while it is made, and its capacity is restored after). A network compiled with
`conv_kernel="impl"` measures the implementations, matches ONNX Runtime, says what it chose,
and its choices come back from the cache file in a new process's stead.
"""

from __future__ import annotations

import json
import logging
from ctypes import byref, c_int
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import (  # noqa: E402
    conv_choice,
    native_mbconv,
    onednn_capi,
    onednn_conv,
)
from pygraphx.targets.torch_lowering.conv_kernels import build_kernel  # noqa: E402
from pygraphx.targets.torch_lowering.gemm_kernels import cpu_has_bf16  # noqa: E402
from tests.helpers import run_ort  # noqa: E402
from tests.targets.test_cpu_conv_choice import LAYERS as NET_LAYERS  # noqa: E402
from tests.targets.test_cpu_conv_choice import _net  # noqa: E402
from tests.targets.test_cpu_onednn_conv import LAYERS, _oracle, _plan  # noqa: E402
from tests.targets.test_dnnl2_bf16 import _assert_bf16_rounding, _bf16_plan  # noqa: E402

pytestmark = pytest.mark.skipif(
    not onednn_conv.available(), reason="oneDNN's C API library (onednn-cpu-gomp) not installed"
)
CL = torch.channels_last
DTYPES = [
    "float32",
    pytest.param("bf16", marks=pytest.mark.skipif(not cpu_has_bf16(), reason="no bf16 CPU")),
]


@pytest.fixture(autouse=True)
def _small_1x1_layers_timed(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """These tests' 1x1 layers are small (quick); they are timed as a 28x28 map's would be,
    except in the test of that threshold itself."""
    if "threshold" not in request.node.name:
        monkeypatch.setattr(conv_choice, "MIN_1X1_PIXELS", 0)
    # the shared net's inverted-residual block stays three measured convolutions (not the
    # native block kernel's one step)
    monkeypatch.setenv(native_mbconv.ENV, "0")


def test_small_1x1_layers_are_not_timed_by_default_threshold() -> None:
    """A 1x1 layer of fewer output pixels than a 28x28 map has no candidates (oneDNN's first
    runs: on MobileNetV2's 14x14 and 7x7 ones every other was within 5%); a depthwise layer
    of the same size still has them."""
    small = _plan([1, 64, 14, 14], [32, 64, 1, 1])
    large = _plan([1, 64, 28, 28], [32, 64, 1, 1])
    strided = _plan([1, 64, 56, 56], [32, 64, 1, 1], stride=2)
    depthwise = _plan([1, 64, 14, 14], [64, 1, 3, 3], groups=64, begin=(1, 1), end=(1, 1))
    assert conv_choice.impl_candidates(small, False) == []
    assert conv_choice.impl_candidates(large, False) == conv_choice.impl_candidates(strided, False)
    assert conv_choice.impl_candidates(large, False)
    assert conv_choice.impl_candidates(depthwise, False)


def test_wide_1x1_layers_are_not_timed_threshold() -> None:
    """A 1x1 layer of at least 64 channels on both sides has no candidates (on ResNet-50's
    none beat oneDNN's first by 5%); one with fewer on either side, or a wide depthwise
    layer, still has them."""
    wide = _plan([1, 64, 28, 28], [256, 64, 1, 1])
    narrow_out = _plan([1, 256, 28, 28], [32, 256, 1, 1])
    narrow_in = _plan([1, 16, 28, 28], [96, 16, 1, 1])
    depthwise = _plan([1, 256, 28, 28], [256, 1, 3, 3], groups=256, begin=(1, 1), end=(1, 1))
    assert conv_choice.impl_candidates(wide, False) == []
    assert conv_choice.impl_candidates(narrow_out, False)
    assert conv_choice.impl_candidates(narrow_in, False)
    assert conv_choice.impl_candidates(depthwise, False)


def _layer(layer: str, dtype: str, unary: str = "hardtanh") -> object:
    x_lens, w_lens, kw = LAYERS[layer]
    make = _plan if dtype == "float32" else _bf16_plan
    return make(x_lens, w_lens, unary=unary, **kw)


def _cache_capacity() -> int:
    capacity = c_int()
    onednn_capi.library().dnnl_get_primitive_cache_capacity(byref(capacity))
    return capacity.value


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layer", ["1x1", "depthwise", "stem stride 2 asymmetric", "dilated"])
def test_every_implementation_matches_torch(layer: str, dtype: str) -> None:
    plan = _layer(layer, dtype)
    names = onednn_conv.implementations(plan, False)
    assert names and not any(n.startswith("ref") for n in names)
    assert len(names) == len(set(names))
    x = torch.randn(plan.x_lens if plan.pre_pad is None else LAYERS[layer][0])
    x = x.to(plan.weight.dtype).contiguous(memory_format=CL)
    for name in names:
        run = build_kernel(replace(plan, impl=name), "dnnl", lambda: x, None)
        assert next(iter(run.primitives.values())).impl == name
        got = run()
        if dtype == "float32":
            torch.testing.assert_close(got, _oracle(plan, x, None), rtol=1e-4, atol=1e-4)
        else:
            _assert_bf16_rounding(got, _oracle(plan, x.double(), None))


@pytest.mark.parametrize("in_place", [False, True])
def test_implementations_with_a_residual_add(in_place: bool) -> None:
    plan = _plan([1, 24, 10, 10], [16, 24, 1, 1], unary="relu")
    plan.other, plan.in_place = 0, in_place
    x = torch.randn(1, 24, 10, 10).contiguous(memory_format=CL)
    other = torch.randn(1, 16, 10, 10).contiguous(memory_format=CL)
    want = _oracle(plan, x, other)
    names = onednn_conv.implementations(plan, True)
    assert len(names) > 1  # (the JIT kernels of every ISA level of an x86-64 CPU)
    for name in names:
        operand = other.clone()
        got = build_kernel(replace(plan, impl=name), "dnnl", lambda: x, lambda o=operand: o)()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_chosen_implementation_despite_a_cached_primitive() -> None:
    """The first implementation's primitive made (and cached by oneDNN) first; then each other
    one, which must be what runs; the cache's capacity is as before."""
    plan = _layer("depthwise", "float32")
    names = onednn_conv.implementations(plan, False)
    if len(names) < 2:
        pytest.skip("oneDNN offers one implementation on this CPU")
    capacity = _cache_capacity()
    x = torch.randn(LAYERS["depthwise"][0]).contiguous(memory_format=CL)
    first = build_kernel(plan, "dnnl", lambda: x, None)
    assert next(iter(first.primitives.values())).impl == names[0]
    for name in names[1:]:
        run = build_kernel(replace(plan, impl=name), "dnnl", lambda: x, None)
        assert next(iter(run.primitives.values())).impl == name
    assert _cache_capacity() == capacity
    again = build_kernel(plan, "dnnl", lambda: x, None)
    assert next(iter(again.primitives.values())).impl == names[0]


def test_an_implementation_not_offered_is_said_and_the_first_runs(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pygraphx.targets.torch_lowering import onednn_conv_primitive

    monkeypatch.setattr(onednn_conv_primitive, "_SAID", set())  # (the descriptor says it)
    plan = _layer("1x1", "float32")
    x = torch.randn(LAYERS["1x1"][0]).contiguous(memory_format=CL)
    with caplog.at_level(logging.WARNING, logger="pygraphx.cpu"):
        run = build_kernel(replace(plan, impl="no_such_kernel:avx9"), "dnnl", lambda: x, None)
    assert "oneDNN offers no 'no_such_kernel:avx9'" in caplog.text
    first = onednn_conv.implementations(plan, False)[0]
    assert next(iter(run.primitives.values())).impl == first
    torch.testing.assert_close(run(), _oracle(plan, x, None), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layer", ["1x1", "depthwise", "grouped", "3x3 pad"])
def test_candidates_leave_out_the_slow_kinds(layer: str) -> None:
    """No gemm-based or SSE4.1 kernel, on a 1x1 layer no generic `jit` one, on a depthwise
    layer only depthwise kernels, and none on a layer neither 1x1 nor depthwise."""
    plan = _layer(layer, "float32")
    names = onednn_conv.implementations(plan, False)
    candidates = conv_choice.impl_candidates(plan, False)
    assert all(c.startswith("dnnl/") for c in candidates)
    want = [n for n in names[1:] if "gemm" not in n and "sse41" not in n]
    if layer in ("grouped", "3x3 pad"):
        want = []
    if layer == "1x1":
        want = [n for n in want if not n.startswith("jit:")]
        assert want  # (oneDNN has jit_1x1 / brgconv_1x1 besides its first on x86-64)
    if layer == "depthwise":
        want = [n for n in want if "_dw" in n]
        assert want  # (oneDNN has jit_dw besides brdgmm_dw on x86-64)
    assert [c.partition("/")[2] for c in candidates] == want


@pytest.fixture
def _impl_mode(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    path = tmp_path / "choices.json"
    monkeypatch.setenv(conv_choice.CACHE_ENV, str(path))
    monkeypatch.setenv(conv_choice.BUDGET_ENV, "30")  # every layer measured in one compile
    monkeypatch.setenv(conv_choice.KERNEL_ENV, "impl")
    conv_choice.clear_cache()
    yield path
    conv_choice.clear_cache()


def _compile(model: object) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget())
    return prog


@pytest.mark.usefixtures("_impl_mode")
def test_impl_mode_matches_ort_and_says_what_it_chose(caplog: pytest.LogCaptureFixture) -> None:
    model, feeds = _net()
    with caplog.at_level(logging.INFO, logger="pygraphx.cpu"):
        prog = _compile(model)
    state = prog._executable.lowered.ctx.cache["conv_choice"]
    assert state.mode == "impl" and state.measured >= 1
    assert sum(state.chosen.values()) == NET_LAYERS
    assert all(c == "dnnl" or c.startswith("dnnl/") for c in state.chosen)
    assert "cpu convolution kernels:" in caplog.text and "measured" in caplog.text
    np.testing.assert_allclose(prog.run(feeds)[0], run_ort(model, feeds)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("_impl_mode")
def test_the_fastest_candidate_is_what_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Timings made up so that oneDNN's last candidate wins every layer that has candidates:
    each such convolution then runs that implementation (its primitive says so), and the
    network still matches ORT."""
    made: list[tuple[str | None, str]] = []  # (the plan's implementation, the primitive's)
    real_build = onednn_conv.build

    def timed(plan: object, names: list[str], *args: object) -> dict[str, float]:
        return {name: 1.0 if i < len(names) - 1 else 0.5 for i, name in enumerate(names)}

    def build(plan: object, *args: object) -> object:
        run = real_build(plan, *args)
        made.extend((plan.impl, p.impl) for p in run.primitives.values())
        return run

    monkeypatch.setattr(conv_choice, "time_kernels", timed)
    monkeypatch.setattr(onednn_conv, "build", build)
    model, feeds = _net()
    prog = _compile(model)
    state = prog._executable.lowered.ctx.cache["conv_choice"]
    wanted = [c.partition("/")[2] for c in state.chosen.elements() if c.startswith("dnnl/")]
    assert len(wanted) == NET_LAYERS - 1  # all but the 3x3 stem (1x1 or depthwise) have some
    assert all(ran == asked for asked, ran in made if asked is not None)
    assert sorted(asked for asked, _ in made if asked is not None) == sorted(wanted)
    np.testing.assert_allclose(prog.run(feeds)[0], run_ort(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_cached_implementation_choices_come_back(_impl_mode: Path) -> None:
    model, feeds = _net()
    first = _compile(model).run(feeds)[0]
    entries = json.loads(_impl_mode.read_text())
    assert entries and all(v == "dnnl" or v.startswith("dnnl/") for v in entries.values())
    conv_choice.clear_cache()  # as a new process would start
    prog = _compile(model)
    state = prog._executable.lowered.ctx.cache["conv_choice"]
    assert state.measured == 0 and state.cached == len(entries)
    np.testing.assert_allclose(prog.run(feeds)[0], first, rtol=1e-5, atol=1e-5)


@pytest.mark.usefixtures("_impl_mode")
def test_a_candidate_that_fails_to_build_is_left_out_and_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """oneDNN failing to make another implementation's primitive costs that candidate only:
    the compile goes on with oneDNN's first, and says which candidate was left out."""
    real_build = onednn_conv.build

    def build(plan: object, *args: object) -> object:
        if plan.impl is not None:
            raise onednn_capi.OneDnnError("primitive_create failed (dnnl_status_t 3)")
        return real_build(plan, *args)

    monkeypatch.setattr(onednn_conv, "build", build)
    monkeypatch.setattr(conv_choice, "_ANNOUNCED", set())
    model, feeds = _net()
    with caplog.at_level(logging.WARNING, logger="pygraphx.cpu"):
        prog = _compile(model)
    state = prog._executable.lowered.ctx.cache["conv_choice"]
    assert dict(state.chosen) == {"dnnl": NET_LAYERS}
    assert "left out (primitive_create failed" in caplog.text
    np.testing.assert_allclose(prog.run(feeds)[0], run_ort(model, feeds)[0], rtol=1e-4, atol=1e-4)
