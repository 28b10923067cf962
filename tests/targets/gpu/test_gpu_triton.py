"""The gpu target's fused groups as generated Triton kernels, run on the CPU by Triton's
interpreter (`TRITON_INTERPRET=1`, `GpuTarget(device="cpu", triton=True)`): the built-in models
end to end against ref, the announcement of groups the generator refuses (checked against
numpy), and when the kernels are (not) used."""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if importlib.util.find_spec("triton") is None:  # not imported here: Triton reads
    pytest.skip("triton is not installed", allow_module_level=True)  # TRITON_INTERPRET once

from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.targets.gpu.target import GpuTarget  # noqa: E402
from tests.helpers import make_model  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # masked lanes in numpy

RNG = np.random.default_rng(11)
# the transformers at a short sequence; the image builders take no image size (224x224)
MODELS = {"bert_base": {"seq_len": 8}, "gpt2": {"seq_len": 8}, "mobilenetv2": {}, "resnet50": {}}


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch, tmp_path):
    if torch.cuda.is_available():  # Triton reads TRITON_INTERPRET at its first import only
        pytest.skip("interpreter tests run on machines without a GPU (tests/conftest.py)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("PGX_CACHE_DIR", str(tmp_path / "kernels"))
    monkeypatch.delenv("PGX_GPU_TRITON", raising=False)
    return tmp_path / "kernels"


def compile_gpu_on_cpu(model, **settings) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(GpuTarget(device="cpu", **settings))
    return prog


def triton_groups(prog: pygraphx.Program):
    return prog._executable.lowered.ctx.cache.get("triton_groups")


def run_ref(model, inputs) -> list[np.ndarray]:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("ref"))
    return [np.array(a) for a in prog.run(inputs)]


@pytest.mark.parametrize("name", list(MODELS))
def test_builtin_model_with_triton_kernels_matches_ref(name: str, interpret) -> None:
    model = get_model(name, **MODELS[name])
    inputs = model_inputs(name, model)
    prog = compile_gpu_on_cpu(model, triton=True)
    groups = triton_groups(prog)
    assert groups is not None and groups.lowered > 0
    assert not groups.refused, dict(groups.refused)
    assert not prog._executable.fallbacks
    assert len(groups.kernels) < groups.lowered  # identical groups share one kernel
    if name in ("bert_base", "gpt2"):  # RowFusion: each layer norm is one fused_reduce kernel
        rows = [i for i in prog.get_main_module().instructions if i.op.name == "fused_reduce"]
        norms = [i for i in rows if sum(j.op.name == "reduce_mean" for j in
                                        i.module_inputs[0].instructions) == 2]  # fmt: skip
        assert len(norms) == 25
    assert any(interpret.glob("k*.py"))  # built through the disk cache
    for got, want in zip(prog.run(inputs), run_ref(model, inputs), strict=True):
        got = np.array(got)
        scale = float(np.sqrt(np.mean(want.astype(np.float64) ** 2)))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(scale, 1.0))


def column_sum_model():
    """exp(x) summed over the leading axis plus an element-wise tail; returns the model, its
    inputs and numpy's result."""
    x = RNG.standard_normal((6, 5)).astype(np.float32)
    nodes = [
        helper.make_node("Exp", ["x"], ["e"]),
        helper.make_node("ReduceSum", ["e", "axes"], ["s"], keepdims=1),
        helper.make_node("Sigmoid", ["x"], ["g"]),
        helper.make_node("Mul", ["g", "s"], ["out"]),
    ]
    model = make_model(nodes, {"x": x}, ["out"], {"axes": np.array([0], np.int64)})
    s = np.exp(x.astype(np.float64)).sum(axis=0, keepdims=True)
    return model, {"x": x}, s / (1 + np.exp(-x.astype(np.float64)))


def wide_norm_model(width: int = 9000):
    """A normalisation over rows wider than one block (two reductions of a row of 9000: the
    row kernels refuse it); returns the model, its inputs and numpy's result."""
    x = RNG.standard_normal((2, width)).astype(np.float32)
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]),
        helper.make_node("Sub", ["x", "m"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["d2"]),
        helper.make_node("ReduceMean", ["d2"], ["v"], axes=[-1]),
        helper.make_node("Add", ["v", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["out"]),
    ]
    model = make_model(nodes, {"x": x}, ["out"], {"eps": np.array(1e-5, np.float32)}, opset=17)
    x64 = x.astype(np.float64)
    d = x64 - x64.mean(axis=-1, keepdims=True)
    return model, {"x": x}, d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + 1e-5)


def test_refused_group_is_announced_and_runs_as_torch(interpret) -> None:
    model, feeds, want = wide_norm_model()
    with pytest.warns(UserWarning, match=r"gpu target: 1 fused group\(s\) run as torch code.*"
                      r"only rows that fit one block") as record:  # fmt: skip
        prog = compile_gpu_on_cpu(model, triton=True)
    assert sum("run as torch code" in str(w.message) for w in record) == 1
    groups = triton_groups(prog)
    assert sum(groups.refused.values()) == 1
    assert not prog._executable.fallbacks  # the torch ops handler, not numpy
    got = np.array(prog.run(feeds)[0])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_triton_is_off_on_the_cpu_without_the_interpreter(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model, feeds, want = column_sum_model()
    prog = compile_gpu_on_cpu(model)
    assert triton_groups(prog) is None
    np.testing.assert_allclose(np.array(prog.run(feeds)[0]), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("how", ["setting", "environment"])
def test_triton_can_be_turned_off(how: str, interpret, monkeypatch) -> None:
    model, feeds, want = column_sum_model()
    settings = {}
    if how == "setting":
        settings["triton"] = False
    else:
        monkeypatch.setenv("PGX_GPU_TRITON", "0")
    prog = compile_gpu_on_cpu(model, **settings)
    assert triton_groups(prog) is None
    np.testing.assert_allclose(np.array(prog.run(feeds)[0]), want, rtol=1e-5, atol=1e-6)


def test_interpreter_turns_triton_on_by_default(interpret) -> None:
    model, feeds, want = column_sum_model()
    prog = compile_gpu_on_cpu(model)
    assert triton_groups(prog) is not None
    np.testing.assert_allclose(np.array(prog.run(feeds)[0]), want, rtol=1e-5, atol=1e-6)


# --- on a CUDA / ROCm device (skipped in CI) ---------------------------------------------------

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")


def compile_on_gpu(model, fp16: bool = False, **settings) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    if fp16:
        pygraphx.quantize_fp16(prog)
    prog.compile(pygraphx.get_target("gpu", **settings))
    return prog


@needs_gpu
@pytest.mark.parametrize("name", ["bert_base", "resnet50"])
def test_gpu_kernels_tuned_before_capture_and_cached(name: str, tmp_path, monkeypatch) -> None:
    """Every group is a kernel; the first run tunes them all (during warm-up) and then
    captures the graph; a second compile finds the tuned configurations on disk and compiles
    only those; triton on and off agree."""
    monkeypatch.setenv("PGX_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PGX_GPU_TRITON", raising=False)
    model = get_model(name, **{k: 128 for k in MODELS[name]})
    inputs = model_inputs(name, model)
    prog = compile_on_gpu(model, fp16=True)
    groups = triton_groups(prog)
    assert groups is not None and groups.lowered > 0 and not groups.refused
    got = [np.array(a) for a in prog.run(inputs)]
    assert prog._executable.graph is not None, prog._executable.why_uncaptured
    assert all(k.config is not None for k in groups.kernels.values())
    again = triton_groups(compile_on_gpu(model, fp16=True))
    assert again.compile_ahead() == (len(again.kernels), pytest.approx(0, abs=60))
    off = compile_on_gpu(model, fp16=True, triton=False)
    assert triton_groups(off) is None
    for a, b in zip(got, off.run(inputs), strict=True):
        b = np.array(b).astype(np.float64)
        rms = np.sqrt(np.mean((a.astype(np.float64) - b) ** 2)) / np.sqrt(np.mean(b**2))
        assert rms < 1e-2


def test_channels_last_group_walks_memory_order(interpret) -> None:
    """A group whose input and output are channels-last (as after a cuDNN NHWC convolution)
    is walked in memory order (neighbouring lanes store to neighbouring addresses),
    and computes the same values as numpy."""
    from pygraphx.codegen.trace import TensorDesc, group_trace
    from pygraphx.codegen.triton.build import build_kernel
    from pygraphx.codegen.triton.kernels import kernel_source
    from pygraphx.passes.manager import run_passes
    from pygraphx.passes.pipeline import optimize_passes

    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    b = RNG.standard_normal((3, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    prog = pygraphx.parse_onnx_buffer(
        make_model(nodes, {"x": x}, ["y"], {"b": b}).SerializeToString()
    )
    run_passes(prog, optimize_passes(plan_memory=False))
    ins = next(i for i in prog.get_main_module().instructions if i.op.name == "pointwise")
    group = group_trace(ins)
    nhwc = (60, 1, 15, 3)

    def cl(d: TensorDesc) -> TensorDesc:
        return d if len(d.lens) != 4 or 0 in d.strides else TensorDesc(d.lens, nhwc, d.dtype)

    group = dataclasses.replace(
        group, inputs=[cl(d) for d in group.inputs], output=cl(group.output)
    )
    # merged N,H,W then channels innermost (the bias varies along C only)
    assert "tl.store(out + d0 * 3 + d1," in kernel_source(group).source
    tensors = {
        d.lens: torch.from_numpy(x).contiguous(memory_format=torch.channels_last)
        for d in group.inputs if d.strides == nhwc
    }  # fmt: skip
    args = [tensors.get(d.lens) if d.strides == nhwc else None for d in group.inputs]
    args = [a if a is not None else torch.from_numpy(b).expand(2, 3, 4, 5) for a in args]
    out = torch.empty(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    build_kernel(group, "cpu")(args, out)
    np.testing.assert_allclose(out.numpy(), np.maximum(x + b, 0), rtol=1e-6)


def test_groups_of_other_shapes_with_one_source_get_their_own_kernels(interpret) -> None:
    """[4, 6] and [6, 4] element-wise groups coalesce to the same 24-element source; each
    still gets a kernel built for its own shapes (a shared one rejected the second's tensors:
    ResNet-50's residual adds on the H100)."""
    feeds = {k: RNG.standard_normal(s).astype(np.float32)
             for k, s in (("a", (4, 6)), ("b", (4, 6)), ("c", (6, 4)), ("d", (6, 4)))}  # fmt: skip
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s1"]),
        helper.make_node("Relu", ["s1"], ["y1"]),
        helper.make_node("Add", ["c", "d"], ["s2"]),
        helper.make_node("Relu", ["s2"], ["y2"]),
    ]
    prog = compile_gpu_on_cpu(make_model(nodes, feeds, ["y1", "y2"]), triton=True)
    assert triton_groups(prog).lowered == 2 and len(triton_groups(prog).kernels) == 2
    y1, y2 = (np.array(a) for a in prog.run(feeds))
    np.testing.assert_allclose(y1, np.maximum(feeds["a"] + feeds["b"], 0), rtol=1e-6)
    np.testing.assert_allclose(y2, np.maximum(feeds["c"] + feeds["d"], 0), rtol=1e-6)


@needs_gpu
def test_autotune_timing_leaves_host_time_out() -> None:
    """`timing.time_candidates` measures the device: a tiny kernel whose every launch is
    preceded by 50 us of host work is timed at its own few microseconds (launches timed back
    to back between events would measure the host's 50 us), and a spin of a known number of
    cycles at that many cycles' time, whichever order the candidates come in."""
    import time

    from pygraphx.codegen.triton.timing import time_candidates

    x = torch.zeros(1024, device="cuda")

    def tiny_after_host_work() -> None:
        end = time.perf_counter() + 50e-6
        while time.perf_counter() < end:
            pass
        x.add_(1.0)

    def spin(cycles: int):
        return lambda: torch.cuda._sleep(cycles)

    small, big = 20_000, 200_000
    tiny, t_small, t_big = time_candidates([tiny_after_host_work, spin(small), spin(big)])
    assert tiny < 0.02  # ms: the host's 50 us are not in it
    assert 5 < t_big / t_small < 15  # ten times the cycles, about ten times the time
    again = time_candidates([spin(big), spin(small)])
    assert again[0] == pytest.approx(t_big, rel=0.2) and again[1] == pytest.approx(t_small, rel=0.3)


def test_quantise_written_by_its_group_has_no_step_of_its_own(monkeypatch) -> None:
    """A layer norm's int8 quantise, written by the group's kernel, is bound to the slot the
    kernel fills: no step of its own (nothing to profile), and the program's output is still
    ref's to within one int8 step of the layer norm's rounding."""
    from tests.targets.gpu.test_gpu_quant_gemm import INT8_GEMM_ENV, block_model, run_both

    monkeypatch.setenv(INT8_GEMM_ENV, "triton")
    model, feeds = block_model()
    got, want, gpu = run_both(model, feeds, "int8", False)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    plan = gpu._executable.lowered.profile
    fused = [(ins, fn) for ins, fn, _ in plan if ins.op.name == "quantizelinear"
             and ins.inputs[0].op.name == "fused_reduce"]  # fmt: skip
    assert fused and all(fn is None for _, fn in fused), fused
