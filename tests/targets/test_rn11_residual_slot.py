"""rn11: a convolution group relu(conv + bias + r) writes its result over its residual r's
arena slot where r dies there (the memory plan's `shared_slot`, `conv_residual.residual_slot`),
running oneDNN's sum post-op (`ConvPlan.accumulate`) instead of a binary add into a slot of its
own. Checked on the plan (which groups share, no live overlap) and end to end against ONNX
Runtime, the profiled run included; a residual read again later keeps its own slot.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.passes.memory_coloring import check_plan, plan_memory  # noqa: E402
from pygraphx.targets.cpu import target as cpu_target  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import onednn_conv  # noqa: E402
from pygraphx.targets.torch_lowering.conv_fusion import fused_user  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import kernels_for  # noqa: E402
from pygraphx.targets.torch_lowering.conv_residual import residual_slot  # noqa: E402
from tests.helpers import run_ort  # noqa: E402
from tests.targets.cpu_compare import assert_profile_matches, f32, make_model  # noqa: E402

needs_dnnl = pytest.mark.skipif(
    not onednn_conv.available(), reason="oneDNN's C API library (onednn-cpu-gomp) not installed"
)


def _blocks_net(batch: int = 2) -> tuple[object, dict[str, np.ndarray]]:
    """a = relu(conv3x3(x)), then blocks out = relu(conv(relu(conv(src))) + res) as ResNet's
    (the residual is not the last convolution's input): b over a; c over b, which d reads
    again (c keeps its own slot, d takes b's); e over x (the input: no slot)."""
    ch = 16
    inits = {"w0": f32(ch, ch, 3, 3) * 0.2, "b0": f32(ch)}
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        node("Relu", ["c0"], ["a"]),
    ]
    blocks = (("a", "a", "b"), ("b", "b", "c"), ("c", "b", "d"), ("d", "x", "e"))
    for k, (src, res, out) in enumerate(blocks, start=1):
        for j in "pq":
            inits[f"w{j}{k}"], inits[f"b{j}{k}"] = f32(ch, ch, 1, 1) * 0.3, f32(ch)
        nodes += [
            node("Conv", [src, f"wp{k}", f"bp{k}"], [f"p{k}"]),
            node("Relu", [f"p{k}"], [f"m{k}"]),
            node("Conv", [f"m{k}", f"wq{k}", f"bq{k}"], [f"q{k}"]),
            node("Add", [f"q{k}", res], [f"s{k}"]),
            node("Relu", [f"s{k}"], [out]),
        ]
    feeds = {"x": f32(batch, ch, 10, 10)}
    return make_model(nodes, feeds, ["e"], inits), feeds


def _compile(model: object, share: bool = True) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    if share:
        prog.compile(CpuTarget(threads=1))
    else:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(cpu_target, "residual_slot", lambda _ins: None)
            prog.compile(CpuTarget(threads=1))
    return prog


def _groups(module: object) -> list[object]:
    """The fused groups with a residual, in program order."""
    return [u for u in module.instructions if u.op.name == "pointwise" and len(u.inputs) >= 3]


def test_residual_slot_names_the_residuals_that_may_share() -> None:
    prog = _compile(_blocks_net()[0])
    module = prog.get_main_module()
    groups = _groups(module)
    assert len(groups) == 4
    named = [residual_slot(g) for g in groups]
    assert all(n is not None for n in named[:3])
    assert named[3] is None  # the network's input: a parameter, no slot
    assert all(fused_user(i) is None or residual_slot(i) is None for i in module.instructions)


def test_plan_shares_only_where_the_residual_dies() -> None:
    module = _compile(_blocks_net()[0]).get_main_module()
    groups = _groups(module)
    plan = plan_memory(module, fused_reads=fused_user, shared_slot=residual_slot)
    check_plan(plan)
    at = {id(b.ins): b.offset for b in plan.buffers}
    b_, c_, d_ = groups[0], groups[1], groups[2]
    a_ = residual_slot(b_)
    assert at[id(b_)] == at[id(a_)]  # a dies at b
    assert at[id(c_)] != at[id(b_)]  # b is read again by d
    assert at[id(d_)] == at[id(b_)]  # ... where it dies
    plain = plan_memory(module, fused_reads=fused_user)
    assert len({b.offset for b in plain.buffers}) >= len({b.offset for b in plan.buffers})
    assert plan.arena_bytes <= plain.arena_bytes


@needs_dnnl
@pytest.mark.parametrize("batch", [1, 2])
def test_sum_over_residual_matches_ort(batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGX_DEBUG_MEMORY_COLORING", "1")
    model, feeds = _blocks_net(batch)
    want = run_ort(model, feeds)[0]
    prog = _compile(model)
    assert prog._executable.lowered.ctx.cache.get("conv_over_residual") == 2
    for _ in range(2):  # a second run reads slots the first one wrote
        got = np.asarray(prog.run(feeds)[0])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    base = _compile(model, share=False)
    assert base._executable.lowered.ctx.cache.get("conv_over_residual") is None
    np.testing.assert_allclose(np.asarray(base.run(feeds)[0]), got, rtol=1e-5, atol=1e-5)
    assert_profile_matches(prog, feeds)


def _two_conv_net(kernel: int) -> tuple[object, dict[str, np.ndarray]]:
    """relu(conv_a(x) + conv_b(relu(conv_c(x))) + biases) then relu(conv_d(y) + y)... as
    ResNet's downsample block and the block after it; `kernel` the last convolution's size."""
    ch, node = 16, helper.make_node
    pad = [kernel // 2] * 4
    inits = {"wa": f32(ch, 8, 1, 1) * 0.3, "wc": f32(ch, 8, 1, 1) * 0.3, "ba": f32(ch),
             "wb": f32(ch, ch, 1, 1) * 0.3, "bb": f32(ch), "wd": f32(ch, ch, kernel, kernel) * 0.1,
             "bd": f32(ch), "we": f32(ch, ch, 1, 1) * 0.3, "be": f32(ch)}  # fmt: skip
    nodes = [
        node("Conv", ["x", "wc"], ["c"]),
        node("Relu", ["c"], ["rc"]),
        node("Conv", ["x", "wa", "ba"], ["a"]),
        node("Conv", ["rc", "wb", "bb"], ["b"]),
        node("Add", ["a", "b"], ["s"]),
        node("Relu", ["s"], ["y"]),
        node("Conv", ["y", "we", "be"], ["e"]),
        node("Relu", ["e"], ["re"]),
        node("Conv", ["re", "wd", "bd"], ["d"], pads=pad),
        node("Add", ["d", "y"], ["t"]),
        node("Relu", ["t"], ["z"]),
    ]
    feeds = {"x": f32(1, 8, 12, 12)}
    return make_model(nodes, feeds, ["z"], inits), feeds


@needs_dnnl
@pytest.mark.parametrize(("kernel", "shared"), [(1, 2), (3, 1)])
def test_two_convolutions_and_winograd_shapes(kernel: int, shared: int) -> None:
    """The downsample-style group writes over the earlier convolution's result; a 3x3
    stride-1 group (a Winograd candidate) keeps its own slot."""
    model, feeds = _two_conv_net(kernel)
    want = run_ort(model, feeds)[0]
    prog = _compile(model)
    assert prog._executable.lowered.ctx.cache.get("conv_over_residual") == shared
    np.testing.assert_allclose(np.asarray(prog.run(feeds)[0]), want, rtol=1e-4, atol=1e-4)
    assert_profile_matches(prog, feeds)


def test_accumulating_plan_runs_on_dnnl_only() -> None:
    from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan

    w = torch.randn(8, 8, 1, 1)
    plan = ConvPlan(w, w, [1, 8, 4, 4], [0, 0], [1, 1], [1, 1], 1, None, accumulate=True)
    want = ["dnnl"] if onednn_conv.available() else []
    assert kernels_for(plan) == want
