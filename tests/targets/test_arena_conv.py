"""The cpu target's memory plan with `conv_output="arena"`: a convolution fused into its
epilogue group reads its input while the fused step writes the group's arena slot, so the
plan (`plan_memory(fused_reads=...)`) keeps that input live through the group. Checked on the
plan itself (no fused group's slot overlaps its convolution's input; without the extension
some do), and end to end against ONNX Runtime with every layer writing its slot directly.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pygraphx  # noqa: E402
from pygraphx.passes.memory_coloring import check_plan, plan_memory, root_of  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import onednn_conv  # noqa: E402
from pygraphx.targets.torch_lowering.conv_fusion import fused_user  # noqa: E402
from tests.helpers import run_ort  # noqa: E402
from tests.targets.test_dnnl2_fusions import _c2f_net, _chain_net, _step_kinds  # noqa: E402

needs_dnnl = pytest.mark.skipif(
    not onednn_conv.available(), reason="oneDNN's C API library (onednn-cpu-gomp) not installed"
)


def _shared_groups(plan, module) -> int:  # noqa: ANN001
    """How many fused groups' buffers share bytes with their convolution's input buffer."""
    where = {id(b.ins): (b.offset, b.offset + b.size) for b in plan.buffers}
    shared = 0
    for ins in module.instructions:
        user = fused_user(ins)
        x = root_of(ins.inputs[0]) if user is not None else None
        if x is None or id(x) not in where or id(user) not in where:
            continue
        (a0, a1), (b0, b1) = where[id(x)], where[id(user)]
        shared += a0 < b1 and b0 < a1
    return shared


def _compiled(net, **settings):  # noqa: ANN001, ANN003, ANN202
    model, feeds = net()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=1, **settings))
    return prog, model, feeds


def test_plan_keeps_fused_inputs_apart() -> None:
    prog, _, _ = _compiled(_chain_net)
    module = prog.get_main_module()
    assert sum(fused_user(i) is not None for i in module.instructions) == 6
    plain = plan_memory(module)
    extended = plan_memory(module, fused_reads=fused_user)
    check_plan(plain)
    check_plan(extended)
    assert _shared_groups(plain, module) >= 1  # the plain plan reuses a dead input's memory
    assert _shared_groups(extended, module) == 0
    assert extended.arena_bytes >= plain.arena_bytes


def test_only_arena_output_changes_the_plan() -> None:
    """conv_output="torch" (and every other target) lowers with the pipeline's plan."""
    prog, _, _ = _compiled(_chain_net, conv_output="torch")
    module = prog.get_main_module()
    ctx = prog._executable.lowered.ctx
    want = {id(b.ins): b.offset for b in plan_memory(module).buffers}
    assert ctx.offsets == want
    arena, _, _ = _compiled(_chain_net, conv_output="arena")
    got = arena._executable.lowered.ctx
    extended = plan_memory(arena.get_main_module(), fused_reads=fused_user)
    assert got.offsets == {id(b.ins): b.offset for b in extended.buffers}


@needs_dnnl
@pytest.mark.parametrize("net", [_chain_net, _c2f_net])
def test_every_fused_layer_writes_its_slot(net, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("PGX_DEBUG_MEMORY_COLORING", "1")
    prog, model, feeds = _compiled(net, conv_output="arena")
    want = run_ort(model, feeds)[0]
    for _ in range(2):  # the second run reads slots the first one left behind
        np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
    fused = _step_kinds(prog).count("convolution+pointwise")
    assert fused >= 3
    assert prog._executable.lowered.ctx.cache.get("conv_into_slot", 0) == fused
    seen: list[str] = []  # profiling runs the unfused steps, into the same arena
    profiled = prog.run(feeds, observer=lambda ins, v, s: seen.append(ins.name()))
    np.testing.assert_allclose(profiled[0], want, rtol=1e-4, atol=1e-4)
    assert seen.count("convolution") == fused


def test_no_convolution_keeps_the_pipelines_plan() -> None:
    """Nothing fused to keep apart: arena mode lowers with the plan the pipeline made."""
    from onnx import helper

    from tests.helpers import make_model

    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Exp", ["a"], ["y"])]
    model = make_model(nodes, {"x": x}, ["y"], {})
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=1, conv_output="arena"))
    assert prog._executable.lowered.ctx.plan is prog.get_main_module().memory_plan
    np.testing.assert_allclose(prog.run({"x": x})[0], run_ort(model, {"x": x})[0], rtol=1e-6)
