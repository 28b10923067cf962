"""The `gpu` target on a real GPU (skipped without one): the four built-in models against
`ref` in float32 and float16, graph replay against step-by-step runs, the device API, the
announced uncaptured fallback, and event profiling."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")

import pygraphx  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.targets.gpu.device_api import GpuArgument  # noqa: E402
from tests.targets.gpu.test_gpu_target import if_model  # noqa: E402

MODELS = {
    "resnet50": {},
    "mobilenetv2": {},
    "bert_base": {"seq_len": 128},
    "gpt2": {"seq_len": 128},
}
_REF: dict[str, tuple] = {}


def rel_rms(got: np.ndarray, want: np.ndarray) -> float:
    got, want = got.astype(np.float64), want.astype(np.float64)
    return float(np.sqrt(np.mean((got - want) ** 2)) / max(np.sqrt(np.mean(want**2)), 1e-30))


def reference(name: str) -> tuple:
    """(model, inputs, ref outputs), computed once per model."""
    if name not in _REF:
        model = get_model(name, **MODELS[name])
        inputs = model_inputs(name, model)
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        prog.compile(pygraphx.get_target("ref"))
        _REF[name] = (model, inputs, [np.array(a) for a in prog.run(inputs)])
    return _REF[name]


def compile_gpu(model, fp16: bool = False, offload_copy: bool = True, **settings):
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    if fp16:
        pygraphx.quantize_fp16(prog)
    prog.compile(pygraphx.get_target("gpu", **settings), offload_copy=offload_copy)
    return prog


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_builtin_model_matches_ref(name: str, fp16: bool) -> None:
    model, inputs, want = reference(name)
    prog = compile_gpu(model, fp16=fp16)
    assert not prog._executable.fallbacks, prog._executable.fallbacks
    for _ in range(2):  # the first run captures the graph, the second replays it
        got = [np.array(a) for a in prog.run(inputs)]
    assert prog._executable.graph is not None, prog._executable.why_uncaptured
    limit = 1e-2 if fp16 else 1e-3
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert np.isfinite(g).all()
        assert rel_rms(g, w) < limit, (name, rel_rms(g, w))


def test_transformers_use_sdpa() -> None:
    model, _, _ = reference("bert_base")
    assert compile_gpu(model)._executable.attention_blocks == 12


def test_graph_replay_equals_step_by_step_runs() -> None:
    model, inputs, want = reference("mobilenetv2")
    graphed = compile_gpu(model, graph=True)
    eager = compile_gpu(model, graph=False)
    a = [np.array(x) for x in graphed.run(inputs)]
    a = [np.array(x) for x in graphed.run(inputs)]
    b = [np.array(x) for x in eager.run(inputs)]
    assert graphed._executable.graph is not None and eager._executable.graph is None
    for x, y, w in zip(a, b, want, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
        assert rel_rms(x, w) < 1e-3


def test_graph_disabled_by_environment(monkeypatch) -> None:
    monkeypatch.setenv("PGX_GPU_GRAPH", "0")
    model, inputs, want = reference("mobilenetv2")
    prog = compile_gpu(model)
    got = np.array(prog.run(inputs)[0])
    assert prog._executable.graph is None and rel_rms(got, want[0]) < 1e-3


def test_device_api_offload_copy_false() -> None:
    """Seed 001's flow: to_gpu inputs, allocate_gpu outputs passed under the output names,
    results on the device, from_gpu to read them."""
    model, inputs, want = reference("mobilenetv2")
    prog = compile_gpu(model, offload_copy=False)
    params = {k: pygraphx.to_gpu(pygraphx.argument(v)) for k, v in inputs.items()}
    outputs = {k: pygraphx.allocate_gpu(s) for k, s in prog.get_outputs().items()}
    for _ in range(2):
        results = prog.run({**params, **outputs})
    assert all(isinstance(r, GpuArgument) for r in results)
    assert results[0].tensor.data_ptr() == next(iter(outputs.values())).tensor.data_ptr()
    got = np.array(pygraphx.from_gpu(results[0]))
    assert rel_rms(got, want[0]) < 1e-3
    # torch tensors and DLPack objects are accepted as inputs without a host copy
    tensors = {k: torch.from_numpy(v).cuda() for k, v in inputs.items()}
    out_t = prog.run(tensors)[0]
    assert rel_rms(np.array(out_t), want[0]) < 1e-3
    dlpack = {k: DLPackOnly(v.tensor) for k, v in params.items()}
    assert rel_rms(np.array(prog.run(dlpack)[0]), want[0]) < 1e-3


class DLPackOnly:
    """An array object of another framework: only the DLPack protocol."""

    def __init__(self, tensor) -> None:
        self._t = tensor

    def __dlpack__(self, **kwargs):
        return self._t.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def test_profiling_then_replay_returns_fresh_results() -> None:
    """A profiled run rebinds the steps' values; later replays must still return theirs."""
    model, inputs, want = reference("mobilenetv2")
    prog = compile_gpu(model)
    prog.run(inputs)
    prog.run(inputs, observer=lambda *a: None)
    other = {k: v[::-1].copy() if v.shape[0] > 1 else -v for k, v in inputs.items()}
    got = np.array(prog.run(other)[0])
    ref_other = pygraphx.parse_onnx_buffer(model.SerializeToString())
    ref_other.compile(pygraphx.get_target("ref"))
    assert rel_rms(got, np.array(ref_other.run(other)[0])) < 1e-3


def test_host_caller_may_pass_device_tensors() -> None:
    model, inputs, want = reference("mobilenetv2")
    prog = compile_gpu(model)
    got = prog.run({k: torch.from_numpy(v).cuda() for k, v in inputs.items()})
    assert rel_rms(np.array(got[0]), want[0]) < 1e-3


def test_uncapturable_program_says_so_and_runs() -> None:
    """If (host control flow) runs through numpy: one warning, correct results."""
    model, feeds, want = if_model()
    prog = compile_gpu(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = np.array(prog.run(feeds)[0])
    assert any("without a CUDA graph" in str(w.message) for w in caught)
    assert prog._executable.graph is None
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_profiled_run_uses_device_times() -> None:
    model, inputs, _ = reference("mobilenetv2")
    prog = compile_gpu(model)
    prog.run(inputs)
    times: list[float] = []
    start = time.perf_counter()
    prog.run(inputs, observer=lambda ins, value, seconds: times.append(seconds))
    wall = time.perf_counter() - start
    assert sum(t > 0 for t in times) > 50
    assert sum(times) <= wall
