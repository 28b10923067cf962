"""The cpu target's per-layer convolution kernel choice (`torch_lowering/conv_choice.py`).

Every kernel (`onednn`, `matmul`, `dnnl` where oneDNN's C API library loads, `torch_cl`),
forced or measured, must give ONNX Runtime's
answer on a small MobileNet/ResNet-style network (1x1 and depthwise layers, relu6 and relu,
residual adds, strides, asymmetric padding); choices are cached per process (a second compile,
or a saved program loaded again, measures nothing) and, with `PGX_CONV_CHOICE_CACHE`, in a
file; the measurement respects its budget and the switch. Tolerance 1e-4: oneDNN, MKL and ORT
accumulate float32 dot products in different orders.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import onnx  # noqa: E402
from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import (  # noqa: E402
    choice_cache,
    conv_choice,
    native_mbconv,
    onednn_conv,
)
from pygraphx.targets.torch_lowering.conv_choice import ConvChoiceError, pick  # noqa: E402
from tests.helpers import make_model, run_ort  # noqa: E402

RNG = np.random.default_rng(7)
#: 1x1 stride-1 layers of `_net` (the ones `matmul` can take) and all its convolutions
POINTWISE_LAYERS, LAYERS = 4, 7
#: the kernel a convolution runs on unless told otherwise
DEFAULT = "dnnl" if onednn_conv.available() else "onednn"
NEEDS_DNNL = pytest.mark.skipif(
    not onednn_conv.available(), reason="oneDNN's C API library (onednn-cpu-gomp) not installed"
)
KERNELS = ["onednn", "matmul", pytest.param("dnnl", marks=NEEDS_DNNL), "torch_cl"]


def f32(*shape: int, scale: float = 0.5) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _net(batch: int = 2) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """stem 3x3/2 (asymmetric pads) + relu6, an inverted residual block (1x1 expand + relu6,
    depthwise 3x3 + relu6, 1x1 project + residual add), a 1x1 + add + relu, and a 1x1 stride-2
    layer: every epilogue form the fusion knows."""
    c, e = 8, 24
    inits = {
        "w0": f32(c, 3, 3, 3), "b0": f32(c), "w1": f32(e, c, 1, 1), "b1": f32(e),
        "w2": f32(e, 1, 3, 3), "b2": f32(e), "w3": f32(c, e, 1, 1), "b3": f32(c),
        "w4": f32(c, c, 1, 1), "b4": f32(c), "w5": f32(c, c, 1, 1), "w6": f32(16, c, 1, 1),
        "lo": np.float32(0.0), "hi": np.float32(6.0),
    }  # fmt: skip
    conv = helper.make_node
    nodes = [
        conv("Conv", ["x", "w0", "b0"], ["c0"], strides=[2, 2], pads=[0, 0, 1, 1]),
        conv("Clip", ["c0", "lo", "hi"], ["a0"]),
        conv("Conv", ["a0", "w1", "b1"], ["c1"]),
        conv("Clip", ["c1", "lo", "hi"], ["a1"]),
        conv("Conv", ["a1", "w2", "b2"], ["c2"], group=e, pads=[1, 1, 1, 1]),
        conv("Clip", ["c2", "lo", "hi"], ["a2"]),
        conv("Conv", ["a2", "w3", "b3"], ["c3"]),
        conv("Add", ["c3", "a0"], ["r3"]),
        conv("Conv", ["r3", "w4", "b4"], ["c4"]),
        conv("Add", ["c4", "r3"], ["s4"]),
        conv("Relu", ["s4"], ["a4"]),
        conv("Conv", ["a4", "w5"], ["c5"]),
        conv("Relu", ["c5"], ["a5"]),
        conv("Conv", ["a5", "w6"], ["y"], strides=[2, 2]),
    ]
    feeds = {"x": f32(batch, 3, 17, 17, scale=1.0)}
    return make_model(nodes, feeds, ["y"], inits), feeds


def _compile(model: onnx.ModelProto, **settings: str) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(**settings))
    return prog


def _state(prog: pygraphx.Program) -> conv_choice.ChoiceState:
    return prog._executable.lowered.ctx.cache["conv_choice"]


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (conv_choice.KERNEL_ENV, conv_choice.BUDGET_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(conv_choice.CACHE_ENV, "off")  # no per-user file (tests/conftest.py)
    monkeypatch.setenv(conv_choice.KERNEL_ENV, "measure")  # the tests below time kernels
    # every layer measured in one compile (with oneDNN's implementations as candidates too, a
    # loaded machine may spend the default second before the last layer)
    monkeypatch.setenv(conv_choice.BUDGET_ENV, "30")
    # the net's inverted-residual block stays three convolutions the choice measures (the
    # native block kernel would run it as one step: `tests/targets/test_native_mbconv.py`)
    monkeypatch.setenv(native_mbconv.ENV, "0")
    conv_choice.clear_cache()


def test_default_measures_implementations_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default mode (`impl`) times oneDNN's implementations of the `dnnl` kernel, never
    another kernel: every layer runs `dnnl` on one of them (or `onednn` without the library)."""
    monkeypatch.delenv(conv_choice.KERNEL_ENV)
    state = _state(_compile(_net()[0]))
    assert state.mode == "impl"
    kernels = [name.partition("/")[0] for name in state.chosen.elements()]
    assert kernels == [DEFAULT] * LAYERS


@pytest.mark.parametrize("kernel", ["measure", "impl", "off", *KERNELS])
def test_every_kernel_matches_ort(kernel: str) -> None:
    model, feeds = _net()
    prog = _compile(model, conv_kernel=kernel)
    np.testing.assert_allclose(prog.run(feeds)[0], run_ort(model, feeds)[0], rtol=1e-4, atol=1e-4)
    chosen = _state(prog).chosen
    assert sum(chosen.values()) == LAYERS
    if kernel == "matmul":
        # the 1x1 + add + relu layer is not a matmul post-op chain: it stays on the default
        assert chosen["matmul"] == POINTWISE_LAYERS - 1
        assert chosen[DEFAULT] == LAYERS - POINTWISE_LAYERS + 1
    elif kernel in ("torch_cl", "onednn", "dnnl"):
        assert chosen[kernel] == LAYERS
    elif kernel == "off":
        assert chosen[DEFAULT] == LAYERS


@pytest.mark.parametrize("kernel", KERNELS)
def test_epilogues_stay_fused(kernel: str) -> None:
    """The depthwise layer with bias and relu6, and the 1x1 layers with their residual adds,
    run as one step each, whatever kernel runs them."""
    model, feeds = _net(batch=1)
    prog = _compile(model, conv_kernel=kernel)
    fused = [
        [i.op.name for i in s.instructions]
        for s in prog._executable.lowered.steps
        if len(s.instructions) > 1
    ]
    assert len(fused) == LAYERS - 1  # the last convolution has no epilogue
    depthwise = [ins for ins in prog.get_main_module().instructions if ins.name() == "convolution"]
    assert any(ins.op.group > 1 for ins in depthwise)
    np.testing.assert_allclose(prog.run(feeds)[0], run_ort(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_second_compile_and_loaded_program_measure_nothing(tmp_path: Path) -> None:
    model, feeds = _net()
    first = _compile(model)
    measured = _state(first).measured
    assert measured >= 1  # the 1x1 layers have two candidates
    second = _compile(model)
    assert _state(second).measured == 0
    assert _state(second).cached == measured
    assert dict(_state(second).chosen) == dict(_state(first).chosen)
    path = tmp_path / "net.pgx"
    pygraphx.save(second, path)
    loaded = pygraphx.load(path)
    assert _state(loaded).measured == 0
    np.testing.assert_allclose(loaded.run(feeds)[0], run_ort(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_cache_file_survives_the_process_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "sub" / "conv.json"
    monkeypatch.setenv(conv_choice.CACHE_ENV, str(path))
    model, _ = _net()
    measured = _state(_compile(model)).measured
    assert path.exists()
    conv_choice.clear_cache()  # as a new process would start
    again = _state(_compile(model))
    assert (again.measured, again.cached) == (0, measured)


def test_default_cache_file_is_per_user_and_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Unset, the cache is a file under $XDG_CACHE_HOME/pygraphx/ named by the machine's tag,
    written after the first compile, read by a new process, and named in the log line."""
    monkeypatch.delenv(conv_choice.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    want = tmp_path / "pygraphx" / f"conv_choice-{choice_cache.machine_tag()}.json"
    assert choice_cache.cache_path() == want
    model, feeds = _net()
    with caplog.at_level(logging.INFO, logger="pygraphx.cpu"):
        measured = _state(_compile(model)).measured
    assert measured >= 1 and want.exists()
    assert f"cache file {want}" in caplog.text
    conv_choice.clear_cache()  # as a new process would start
    prog = _compile(model)
    assert (_state(prog).measured, _state(prog).cached) == (0, measured)
    np.testing.assert_allclose(prog.run(feeds)[0], run_ort(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_default_cache_file_names_the_machine_and_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another CPU model, torch version or oneDNN version gives another default file (choices
    measured on one machine or build are not read on another)."""
    monkeypatch.delenv(conv_choice.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def name_with(target: object, attribute: str, value: object) -> str:
        with mock.patch.object(target, attribute, value):
            choice_cache.machine_tag.cache_clear()
            try:
                return choice_cache.default_path().name
            finally:
                choice_cache.machine_tag.cache_clear()

    choice_cache.machine_tag.cache_clear()
    here = choice_cache.default_path().name
    assert here.startswith("conv_choice-") and here.endswith(".json")
    assert name_with(choice_cache, "_cpu_model", lambda: "Some Other CPU") != here
    assert name_with(choice_cache, "_onednn_version", lambda: "9.9.9+other") != here
    assert name_with(torch, "__version__", "0.0.0+other") != here
    assert choice_cache.default_path().name == here


@pytest.mark.parametrize("value", ["off", "0", "none", ""])
def test_cache_off_writes_no_file(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(conv_choice.CACHE_ENV, value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model, _ = _net()
    assert _state(_compile(model)).measured >= 1
    assert choice_cache.cache_path() is None
    assert not any(tmp_path.rglob("*"))
    conv_choice.clear_cache()
    assert _state(_compile(model)).cached == 0


def test_cache_file_merges_other_processes_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry another process wrote after this one read the file is kept when this one
    writes; an entry naming no kernel of this version is dropped."""
    path = tmp_path / "conv.json"
    monkeypatch.setenv(conv_choice.CACHE_ENV, str(path))
    model, _ = _net()
    _compile(model)
    written = json.loads(path.read_text())
    path.write_text(json.dumps({**written, "other layer": "dnnl", "stale": "no_such_kernel"}))
    conv_choice.clear_cache()
    monkeypatch.setenv(conv_choice.BUDGET_ENV, "30")
    choice_cache.store("another", "onednn")  # a new entry: the file is written again
    state = conv_choice.ChoiceState("impl", 30.0, new_entries=True)
    state.chosen["dnnl"] += 1
    conv_choice.finish(state)
    again = json.loads(path.read_text())
    assert again["other layer"] == "dnnl" and again["another"] == "onednn"
    assert "stale" not in again
    assert {k: again[k] for k in written} == written


def test_unreadable_cache_file_is_announced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "conv.json"
    path.write_text("{not json")
    monkeypatch.setenv(conv_choice.CACHE_ENV, str(path))
    model, feeds = _net()
    with caplog.at_level(logging.WARNING, logger="pygraphx.cpu"):
        prog = _compile(model)
    assert "cannot read the convolution choice cache" in caplog.text
    assert _state(prog).measured >= 1


def test_zero_budget_measures_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(conv_choice.BUDGET_ENV, "0")
    state = _state(_compile(_net()[0]))
    assert state.measured == 0
    assert state.over_budget >= 1
    assert state.chosen[DEFAULT] == LAYERS


def test_environment_switch_and_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(conv_choice.KERNEL_ENV, "off")
    with caplog.at_level(logging.INFO, logger="pygraphx.cpu"):
        state = _state(_compile(_net()[0]))
    assert state.measured == 0 and state.chosen[DEFAULT] == LAYERS
    assert f"cpu convolution kernels: {DEFAULT} x7" in caplog.text
    monkeypatch.setenv(conv_choice.KERNEL_ENV, "measure")
    with caplog.at_level(logging.INFO, logger="pygraphx.cpu"):
        _compile(_net()[0])
    assert "measured" in caplog.text


def test_bad_settings_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = _net()
    with pytest.raises(ConvChoiceError, match="conv_kernel='fastest'"):
        _compile(model, conv_kernel="fastest")
    monkeypatch.setenv(conv_choice.BUDGET_ENV, "soon")
    with pytest.raises(ConvChoiceError, match="PGX_CONV_CHOICE_BUDGET='soon'"):
        _compile(model)


def test_pick_keeps_the_default_within_the_margin() -> None:
    assert pick({"onednn": 1.0, "matmul": 0.97}) == "onednn"
    assert pick({"onednn": 1.0, "matmul": 0.90}) == "matmul"
    assert pick({"onednn": 0.5, "matmul": 0.90}) == "onednn"
