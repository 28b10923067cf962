"""scratch12: the Winograd kernels' temporaries belong to the compiled program
(`winograd.program_scratch`): one scratch per program, shared by its Winograd layers, released
when the program is dropped, never shared between programs; a program run from many threads
(its runs serialised by `CpuExecutable._lock`) stays exact.

Oracle: ONNX Runtime on the same model.
"""

from __future__ import annotations

import gc
import logging
import threading
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import conv_choice, winograd, winograd_native  # noqa: E402
from tests.helpers import make_model, run_ort  # noqa: E402


@pytest.fixture(autouse=True, params=["torch", "native"])
def route(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test on the torch-ops route and on the native F(4,3) kernel (wino13: it keeps its
    threads' block buffers in the program's scratch)."""
    if request.param == "native" and not winograd_native.available():
        pytest.skip("the native Winograd kernel is unavailable here")
    monkeypatch.setenv(winograd_native.NATIVE_ENV, "0" if request.param == "torch" else "1")
    return request.param


def _model() -> tuple[object, dict[str, np.ndarray]]:
    """Three 3x3 layers: two of one padded geometry (16 channels, 13 x 11), a residual add,
    and one pre-padded layer of another geometry."""
    rng = np.random.default_rng(12)
    c = 16

    def f32(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)

    inits = {"w0": f32(c, c, 3, 3), "b0": f32(c), "w1": f32(24, c, 3, 3), "b1": f32(24),
             "w2": f32(8, 24, 3, 3)}  # fmt: skip
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        node("Relu", ["c0"], ["a0"]),
        node("Add", ["a0", "x"], ["s0"]),
        node("Conv", ["s0", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        node("Relu", ["c1"], ["a1"]),
        node("Conv", ["a1", "w2"], ["y"], pads=[0, 1, 2, 1]),
    ]
    feeds = {"x": rng.standard_normal((2, c, 13, 11)).astype(np.float32)}
    return make_model(nodes, feeds, ["y"], inits), feeds


@pytest.fixture
def _forced(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (conv_choice.KERNEL_ENV, conv_choice.BUDGET_ENV, conv_choice.WINOGRAD_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(winograd.SCRATCH_ENV, raising=False)
    monkeypatch.setenv(conv_choice.CACHE_ENV, "off")
    conv_choice.clear_cache()


def _compiled(model: object) -> object:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(conv_kernel="winograd"))
    return prog


def _scratch(prog: object) -> winograd.Scratch:
    ctx = prog._executable.lowered.ctx
    assert ctx.cache["conv_choice"].chosen["winograd"] == 3
    scratch = ctx.cache[winograd.SCRATCH_KEY]
    assert isinstance(scratch, winograd.Scratch)
    return scratch


def _feeds(k: int) -> dict[str, np.ndarray]:
    x = np.random.default_rng(100 + k).standard_normal((2, 16, 13, 11)) * (1 + 50 * (k % 2))
    return {"x": x.astype(np.float32)}


def _close(got: np.ndarray, want: np.ndarray) -> None:
    scale = float(np.abs(want).max())
    assert float(np.abs(got - want).max()) / scale < 3e-5


@pytest.mark.usefixtures("_forced")
def test_programs_own_their_scratch_and_release_it(route: str) -> None:
    model, _ = _model()
    one, two = _compiled(model), _compiled(model)
    s1, s2 = _scratch(one), _scratch(two)
    assert s1 is not s2
    if route == "torch":
        # one padded buffer per geometry: the first two layers share one, the pre-padded
        # layer has its own
        assert sum(key[0] == "flat" for key in s1.bufs) == 2
    else:  # no padded copies: one block buffer shared by the three layers
        assert [key[0] for key in s1.bufs] == [winograd_native.WORK_ROLE]
    for k in range(4):  # interleaved: neither program's run disturbs the other's buffers
        feeds = _feeds(k)
        want = run_ort(model, feeds)[0]
        _close(one.run(feeds)[0], want)
        _close(two.run(feeds)[0], want)
    ptrs1 = {b.untyped_storage().data_ptr() for b in s1.bufs.values()}
    ptrs2 = {b.untyped_storage().data_ptr() for b in s2.bufs.values()}
    assert ptrs1 and not ptrs1 & ptrs2
    assert s1.nbytes() > 0
    gone, buf = weakref.ref(s1), weakref.ref(next(iter(s1.bufs.values())))
    kept = weakref.ref(s2)
    del s1, s2, one
    gc.collect()
    assert gone() is None and buf() is None  # freed with its program
    assert kept() is not None  # the other program's is not
    _close(two.run(_feeds(5))[0], run_ort(model, _feeds(5))[0])


@pytest.mark.usefixtures("_forced")
def test_scratch_off_makes_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(winograd.SCRATCH_ENV, "0")
    model, feeds = _model()
    prog = _compiled(model)
    assert winograd.SCRATCH_KEY not in prog._executable.lowered.ctx.cache
    _close(prog.run(feeds)[0], run_ort(model, feeds)[0])


@pytest.mark.usefixtures("_forced")
def test_program_from_many_threads_stays_exact(caplog: pytest.LogCaptureFixture) -> None:
    # the executable's own lock (`CpuExecutable._lock`) is what keeps one program's Winograd
    # layers off the scratch at once: run past `Program.run`'s lock
    model, _ = _model()
    prog = _compiled(model)
    _scratch(prog)
    exe = prog._executable
    feeds = [_feeds(k) for k in range(6)]
    wants = [run_ort(model, f)[0] for f in feeds]
    start = threading.Barrier(4)
    errors: list[Exception] = []
    done = [0] * 4

    def work(t: int) -> None:
        start.wait()
        try:
            for r in range(12):
                k = (t + r) % len(feeds)
                _close(exe.run(feeds[k])[0], wants[k])
                done[t] += 1
        except Exception as exc:  # any failure is the test's, reported below
            errors.append(exc)

    with caplog.at_level(logging.WARNING):
        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert not errors, errors[0]
    assert done == [12] * 4
