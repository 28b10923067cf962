"""Device memory the gpu lowering holds, checked on the CPU (`GpuTarget(device="cpu")`): every
tensor a lowered program keeps (its value slots, its steps' closures, the arena, scratch) is
counted by storage and compared with what it needs, the weights once plus the planned arena;
and a compiled program's executable goes away with the program (the benchmark's warm compile
relies on that)."""

from __future__ import annotations

import gc
import types
import weakref
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.ir.instruction import reachable  # noqa: E402
from pygraphx.passes.memory_coloring import check_plan, plan_memory  # noqa: E402
from pygraphx.targets.gpu.lowering import lower_library_convolution  # noqa: E402
from pygraphx.targets.gpu.target import GpuTarget  # noqa: E402
from pygraphx.targets.gpu.triton_groups import triton_wanted  # noqa: E402
from pygraphx.targets.torch_lowering.lower import LOWERINGS, _load_lowerings  # noqa: E402
from tests.helpers import make_model  # noqa: E402

RNG = np.random.default_rng(11)


#: storages this small are scalar constants fused steps keep (a relu's 0): not counted
SCALAR_BYTES = 16


def held_storages(roots: list[Any]) -> dict[int, int]:
    """data_ptr -> bytes of every tensor storage reachable from `roots` through lists, tuples,
    dicts and function closures (how steps keep their tensors), scalars aside."""
    storages: dict[int, int] = {}
    for x in reachable(roots, _held_children):
        if isinstance(x, torch.Tensor) and x.is_mkldnn:  # a packed weight: no storage
            storages[id(x)] = x.numel() * x.element_size()
        elif isinstance(x, torch.Tensor):
            st = x.untyped_storage()
            if st.nbytes() > SCALAR_BYTES:
                storages[st.data_ptr()] = st.nbytes()
    return storages


def _held_children(x: Any) -> Any:
    """What a container or a closure holds (a tensor or anything else: nothing further)."""
    if isinstance(x, (list, tuple)):
        return x
    if isinstance(x, dict):
        return x.values()
    if isinstance(x, types.FunctionType):
        return [c.cell_contents for c in x.__closure__ or () if _filled(c)]
    return ()


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def conv_model() -> tuple[Any, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """3x3 conv -> relu -> 3x3 conv -> 1x1 conv, each weight its own initializer."""
    x = RNG.standard_normal((1, 4, 12, 12)).astype(np.float32)
    inits = {
        "w1": RNG.standard_normal((8, 4, 3, 3)).astype(np.float32),
        "w2": RNG.standard_normal((8, 8, 3, 3)).astype(np.float32),
        "w3": RNG.standard_normal((6, 8, 1, 1)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c2", "w3"], ["out"]),
    ]
    return make_model(nodes, {"x": x}, ["out"], inits), {"x": x}, inits


def library_conv(channels_last: bool):
    """The gpu target's cuDNN-path convolution, made to run on the CPU (else torch's)."""
    _load_lowerings()

    def conv(ctx, ins) -> bool:
        return lower_library_convolution(ctx, ins, channels_last) or LOWERINGS["convolution"](
            ctx, ins
        )

    return conv


@pytest.mark.parametrize("channels_last", [True, False], ids=["nhwc", "nchw"])
def test_lowering_holds_weights_once_and_the_planned_arena(channels_last: bool) -> None:
    model, feeds, inits = conv_model()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    overrides = {"convolution": library_conv(channels_last)}
    prog.compile(GpuTarget(device="cpu", triton=False, overrides=overrides))
    ex = prog._executable
    ctx = ex.lowered.ctx
    plan = ctx.plan
    weights = sum(i.shape.bytes() for i in ctx.module.instructions if i.is_literal())
    assert weights >= sum(a.nbytes for a in inits.values())
    need = weights + max(plan.arena_bytes, 1)
    held = held_storages([ctx.env, [s.fn for s in ctx.steps], ctx.scratch.buffers, ctx.arena])
    assert sum(held.values()) <= need, (sum(held.values()), weights, plan.arena_bytes)
    # the oracle: onnxruntime on the same model (checks the relaid weights are the same numbers)
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)[0]
    np.testing.assert_allclose(np.array(prog.run(feeds)[0]), want, rtol=1e-4, atol=1e-4)
    held = held_storages([ctx.env, [s.fn for s in ctx.steps], ctx.scratch.buffers, ctx.arena])
    out_bytes = want.nbytes  # a run keeps its outputs (and parameters) bound until the next
    assert sum(held.values()) <= need + out_bytes + feeds["x"].nbytes


def test_convolution_outputs_take_no_arena_room() -> None:
    """cuDNN returns new tensors: the gpu target's plan leaves convolutions out of the arena,
    and the rest is still placed without overlaps (`check_plan`)."""
    model, feeds, _ = conv_model()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(GpuTarget(device="cpu", triton=False))
    ctx = prog._executable.lowered.ctx
    module = ctx.module
    full = plan_memory(module)
    assert any(b.ins.op.name == "convolution" for b in full.buffers)
    assert not any(b.ins.op.name == "convolution" for b in ctx.plan.buffers)
    assert {id(b.ins) for b in ctx.plan.buffers} == {
        id(b.ins) for b in full.buffers if b.ins.op.name != "convolution"
    }
    check_plan(ctx.plan)
    assert ctx.plan.arena_bytes < full.arena_bytes
    assert ctx.arena.numel() == max(ctx.plan.arena_bytes, 1)
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(np.array(prog.run(feeds)[0]), sess.run(None, feeds)[0],
                               rtol=1e-4, atol=1e-4)  # fmt: skip


def test_executable_is_freed_with_its_program() -> None:
    """Nothing global keeps a compiled program's executable (its weights and arena) alive."""
    model, feeds, _ = conv_model()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(GpuTarget(device="cpu"))
    prog.run(feeds)
    ref = weakref.ref(prog._executable)
    del prog
    gc.collect()
    assert ref() is None


def _triton_runs_here() -> bool:
    return triton_wanted(None, torch.device("cpu")) or torch.cuda.is_available()


# the lowering is inspected on device "cpu", where Triton runs only under the interpreter (on a
# GPU machine conftest leaves TRITON_INTERPRET unset: benchmarks/gpu_memory_probe.py measures
# the device there)
cpu_triton = pytest.mark.skipif(
    not triton_wanted(None, torch.device("cpu")),
    reason="inspects the cpu-device lowering with Triton's interpreter (TRITON_INTERPRET=1)",
)

needs_triton = pytest.mark.skipif(
    not _triton_runs_here(), reason="needs Triton (a GPU or TRITON_INTERPRET=1)"
)


@needs_triton
@pytest.mark.parametrize(("rows", "k", "n"), [(1, 300, 37), (4, 512, 8), (3, 7, 1000)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gemv_kernel_matches_numpy(rows: int, k: int, n: int, dtype: torch.dtype) -> None:
    from pygraphx.targets.gpu.gemv import gemv

    device = "cuda" if torch.cuda.is_available() else "cpu"
    a = torch.randn(rows, k, dtype=torch.float32).to(dtype)
    w = torch.randn(k, n, dtype=torch.float32).to(dtype)
    out = torch.empty(rows, n, dtype=dtype, device=device)
    gemv(a.to(device), w.t().contiguous().to(device), out)
    want = a.double().numpy() @ w.double().numpy()
    got = out.cpu().double().numpy()
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    scale = np.abs(a.double().numpy()) @ np.abs(w.double().numpy())
    assert np.all(np.abs(got - want) <= tol * scale + 1e-3), np.max(np.abs(got - want))


@needs_triton
@cpu_triton
def test_classifier_runs_as_gemv_with_its_weight_held_once() -> None:
    """A batch-1 fp16 classifier (MatMul by a constant, then Add) through `lower_gemv`: the
    transposed weight replaces the upload, and the result matches onnxruntime."""
    from pygraphx.targets.gpu.gemv import lower_gemv

    x = RNG.standard_normal((1, 96)).astype(np.float32)
    inits = {"w": (RNG.standard_normal((96, 40)) / 10).astype(np.float32),
             "b": RNG.standard_normal(40).astype(np.float32)}  # fmt: skip
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Add", ["y", "b"], ["out"])]  # fmt: skip
    model = make_model(nodes, {"x": x}, ["out"], inits)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_fp16(prog)
    used: list[str] = []

    def dot(ctx, ins) -> bool:
        if lower_gemv(ctx, ins):
            used.append("gemv")
            return True
        return False

    prog.compile(GpuTarget(device="cpu", overrides={"dot": dot}))
    assert used == ["gemv"]
    ctx = prog._executable.lowered.ctx
    weights = sum(i.shape.bytes() for i in ctx.module.instructions if i.is_literal())
    held = held_storages([ctx.env, [s.fn for s in ctx.steps], ctx.scratch.buffers, ctx.arena])
    assert sum(held.values()) <= weights + max(ctx.plan.arena_bytes, 1)
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})[0]
    np.testing.assert_allclose(np.array(prog.run({"x": x})[0]), want, rtol=2e-2, atol=2e-2)


@needs_triton
@cpu_triton
def test_epilogue_runs_in_place_on_the_convolution_result() -> None:
    """relu(conv(x)) with Triton: the relu group writes over the convolution's own tensor, so
    neither takes arena room; the first run (which autotunes into a new tensor) and the later
    in-place runs match onnxruntime."""
    from pygraphx.targets.gpu.triton_groups import in_place_input

    model, feeds, _ = conv_model()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(GpuTarget(device="cpu", triton=True))
    ctx = prog._executable.lowered.ctx
    in_place = [i for i in ctx.module.instructions if in_place_input(i) is not None]
    assert in_place, "the relu after the first convolution should run in place"
    planned = {id(b.ins) for b in ctx.plan.buffers}
    assert not any(id(i) in planned for i in in_place)
    # bound per run (in place), not a private buffer held for good
    assert not any(ctx.static[ctx.index[id(i)]] for i in in_place)
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)[0]
    for _ in range(3):
        got = np.array(prog.run(feeds)[0])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_cudnn_benchmark_setting_and_environment(monkeypatch) -> None:
    """cuDNN's algorithm timing (its workspace shows in the peak) can be turned off."""
    from pygraphx.targets.gpu.target import cudnn_benchmark

    monkeypatch.delenv("PGX_GPU_CUDNN_BENCHMARK", raising=False)
    assert cudnn_benchmark(None) is False  # heuristics unless compile(exhaustive_tune=True)
    assert cudnn_benchmark(None, exhaustive_tune=True) is True
    monkeypatch.setenv("PGX_GPU_CUDNN_BENCHMARK", "1")
    assert cudnn_benchmark(None) is True
    monkeypatch.setenv("PGX_GPU_CUDNN_BENCHMARK", "0")
    assert cudnn_benchmark(None, exhaustive_tune=True) is False
    assert cudnn_benchmark(True) is True
    assert GpuTarget(device="cpu", cudnn_benchmark=False).settings["cudnn_benchmark"] is False


@needs_triton
@cpu_triton
@pytest.mark.parametrize("name", ["resnet50", "mobilenetv2"])
def test_builtin_cnn_holds_weights_once_and_a_small_arena(name: str) -> None:
    """A built-in CNN in fp16 lowered as on the GPU (cuDNN-path convolutions with channels-last
    weights, Triton groups, in-place epilogues, the classifier as `gemv`), on the CPU and not
    run: everything it holds
    is the weights plus the planned arena, and the arena is a fraction of the full plan's (the
    convolution results and their epilogues live outside it, one tensor each)."""
    from pygraphx.models import get_model
    from pygraphx.targets.gpu.gemv import lower_gemv

    prog = pygraphx.parse_onnx_buffer(get_model(name).SerializeToString())
    pygraphx.quantize_fp16(prog)
    overrides = {"convolution": library_conv(True), "dot": lower_gemv}
    prog.compile(GpuTarget(device="cpu", triton=True, overrides=overrides))
    ctx = prog._executable.lowered.ctx
    weights = sum(i.shape.bytes() for i in ctx.module.instructions if i.is_literal())
    held = held_storages([ctx.env, [s.fn for s in ctx.steps], ctx.scratch.buffers, ctx.arena])
    assert sum(held.values()) <= weights + ctx.plan.arena_bytes, (sum(held.values()), weights)
    full = plan_memory(ctx.module)
    assert ctx.plan.arena_bytes * 5 < full.arena_bytes, (ctx.plan.arena_bytes, full.arena_bytes)
