"""A channel concat whose only user is a 1x1 convolution (YOLOv8's C2f and SPPF blocks) runs
on `cpu` as one convolution per part summed into the output (`conv_concat.py`): oneDNN's sum
post-op chains the parts' convolutions, the concat is never written. Checked against ONNX
Runtime (whole models) and torch (`onednn_conv.build_sum` on its own), with each epilogue the
convolution fuses, in arena and torch output modes, and in the profiled (unfused) run; the
forms it must leave alone (a part that is a graph input, a concat with a second user) still
run right."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from onnx import helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import conv_concat, onednn_conv  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan  # noqa: E402
from pygraphx.targets.torch_lowering.gemm_kernels import cpu_has_bf16  # noqa: E402
from tests.helpers import make_model, run_ort  # noqa: E402
from tests.targets.cpu_compare import assert_profile_matches  # noqa: E402

pytestmark = pytest.mark.skipif(not onednn_conv.available(), reason="onednn-cpu-gomp missing")

RNG = np.random.default_rng(7)
node = helper.make_node


def f32(*shape: int, scale: float = 0.3) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _silu(x: str, y: str) -> list:
    return [node("Sigmoid", [x], [f"{y}_s"]), node("Mul", [x, f"{y}_s"], [y])]


def _conv(name: str, x: str, c_in: int, c_out: int, inits: dict, k: int = 1) -> list:
    """Conv (bias) + SiLU: YOLO's Conv-BN-SiLU after BN folding."""
    inits[f"{name}_w"], inits[f"{name}_b"] = f32(c_out, c_in, k, k), f32(c_out)
    pads = [k // 2] * 4
    conv = node("Conv", [x, f"{name}_w", f"{name}_b"], [f"{name}_c"], pads=pads)
    return [conv, *_silu(f"{name}_c", name)]


def _c2f(n: int = 1, c: int = 8, side: int = 12, tail: str = "silu") -> tuple:
    """x -> cv1 (1x1, 2c) -> split in halves -> n bottlenecks (3x3) on the last -> concat of
    all -> cv2 (1x1) with the epilogue `tail`: "silu" (bias + SiLU), "none" (no bias, no
    activation), "add" (silu(conv + b) + x: C2f's shortcut form) or "relu_add"
    (relu(conv + b + x))."""
    inits: dict = {"split": np.array([c, c], np.int64)}
    nodes = _conv("cv1", "x", 2 * c, 2 * c, inits)
    nodes.append(node("Split", ["cv1", "split"], ["y0", "y1"], axis=1))
    parts = ["y0", "y1"]
    for i in range(n):
        nodes += _conv(f"m{i}", parts[-1], c, c, inits, k=3)
        parts.append(f"m{i}")
    nodes.append(node("Concat", parts, ["cat"], axis=1))
    inits["cv2_w"] = f32(2 * c, (2 + n) * c, 1, 1)
    if tail == "none":
        nodes.append(node("Conv", ["cat", "cv2_w"], ["y"]))
    else:
        inits["cv2_b"] = f32(2 * c)
        nodes.append(node("Conv", ["cat", "cv2_w", "cv2_b"], ["cv2_c"]))
        if tail == "silu":
            nodes += _silu("cv2_c", "y")
        elif tail == "add":
            nodes += [*_silu("cv2_c", "cv2"), node("Add", ["cv2", "cv1"], ["y"])]
        else:
            nodes += [node("Add", ["cv2_c", "cv1"], ["r"]), node("Relu", ["r"], ["y"])]
    feeds = {"x": f32(1, 2 * c, side, side, scale=1.0)}
    # the graph input feeds a convolution first: every concat part is channels-last
    return make_model(nodes, feeds, ["y"], inits), feeds


def _sppf(c: int = 8, side: int = 10) -> tuple:
    """YOLOv8's SPPF: cv1 (1x1), three chained 5x5 max pools, concat of the four, cv2."""
    inits: dict = {}
    nodes = _conv("cv1", "x", c, c, inits)
    parts = ["cv1"]
    for i in range(3):
        nodes.append(node("MaxPool", [parts[-1]], [f"p{i}"], kernel_shape=[5, 5], pads=[2] * 4))
        parts.append(f"p{i}")
    nodes.append(node("Concat", parts, ["cat"], axis=1))
    nodes += _conv("cv2", "cat", 4 * c, c, inits)
    feeds = {"x": f32(1, c, side, side, scale=1.0)}
    return make_model(nodes, feeds, ["cv2"], inits), feeds


def _compile(model, monkeypatch, mode: str = "on", **settings) -> pygraphx.Program:
    monkeypatch.setenv(conv_concat.MODE_ENV, mode)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(**settings))
    return prog


def _steps(prog: pygraphx.Program) -> list[list[str]]:
    return [[i.op.name for i in s.instructions] for s in prog._executable.lowered.steps]


def _chains(prog: pygraphx.Program) -> list[list[str]]:
    return [names for names in _steps(prog) if names[:2] == ["concat", "convolution"]]


def _check(prog: pygraphx.Program, model, feeds: dict) -> None:
    want = run_ort(model, feeds)
    for _ in range(2):  # the second run reuses every slot and primitive
        got = prog.run(dict(feeds))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("output", ["arena", "torch"])
def test_c2f_concat_runs_as_a_sum_chain(n: int, output: str, monkeypatch) -> None:
    model, feeds = _c2f(n)
    prog = _compile(model, monkeypatch, conv_output=output)
    # concat + 1x1 convolution + its bias-and-SiLU group: one step
    assert _chains(prog) == [["concat", "convolution", "pointwise"]], _steps(prog)
    cache = prog._executable.lowered.ctx.cache
    assert cache.get("conv_concat_sum") == 1
    # arena: the memory plan keeps the parts live through the step, apart from its slot
    assert cache.get("conv_concat_into_slot", 0) == (1 if output == "arena" else 0)
    _check(prog, model, feeds)
    assert_profile_matches(prog, feeds)


@pytest.mark.parametrize("tail", ["none", "add", "relu_add"])
def test_each_epilogue_lands_on_the_last_convolution(tail: str, monkeypatch) -> None:
    model, feeds = _c2f(1, tail=tail)
    prog = _compile(model, monkeypatch)
    want = ["concat", "convolution"] if tail == "none" else ["concat", "convolution", "pointwise"]
    assert _chains(prog) == [want], _steps(prog)
    _check(prog, model, feeds)
    assert_profile_matches(prog, feeds)


def test_sppf_pools_are_summed_parts(monkeypatch) -> None:
    model, feeds = _sppf()
    prog = _compile(model, monkeypatch)
    assert len(_chains(prog)) == 1, _steps(prog)
    _check(prog, model, feeds)
    assert_profile_matches(prog, feeds)


def test_off_keeps_the_concat(monkeypatch) -> None:
    model, feeds = _c2f(2)
    prog = _compile(model, monkeypatch, mode="off")
    assert not _chains(prog)
    assert any(names == ["concat"] for names in _steps(prog))
    _check(prog, model, feeds)


def test_measured_choice_is_right_either_way(monkeypatch) -> None:
    model, feeds = _c2f(2, side=16)
    prog = _compile(model, monkeypatch, mode="measure")
    chosen = prog._executable.lowered.ctx.cache["conv_choice"].chosen
    assert chosen["concat_sum"] + chosen["concat_concat"] == 1, chosen
    assert len(_chains(prog)) == chosen["concat_sum"]
    _check(prog, model, feeds)


def test_bad_mode_is_a_clear_error(monkeypatch) -> None:
    model, _ = _c2f(1)
    with pytest.raises(conv_concat.ConcatSumError, match="PGX_CONV_CONCAT_SUM"):
        _compile(model, monkeypatch, mode="sometimes")


def test_graph_input_part_and_second_user_keep_the_concat(monkeypatch) -> None:
    """A part that is a graph input (standard layout) and a concat read twice: no chain."""
    inits: dict = {"w": f32(8, 8, 1, 1), "v": f32(8, 8, 1, 1)}
    nodes = _conv("a", "x", 4, 4, inits)
    nodes += [
        node("Concat", ["a", "x"], ["cat1"], axis=1),
        node("Conv", ["cat1", "w"], ["y1"]),
        node("Concat", ["a", "a"], ["cat2"], axis=1),
        node("Conv", ["cat2", "v"], ["y2"]),
        node("Relu", ["cat2"], ["y3"]),
    ]
    feeds = {"x": f32(1, 4, 9, 9, scale=1.0)}
    model = make_model(nodes, feeds, ["y1", "y2", "y3"], inits)
    prog = _compile(model, monkeypatch)
    assert not _chains(prog), _steps(prog)
    _check(prog, model, feeds)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("epilogue", ["none", "swish", "add", "swish_add"])
def test_build_sum_matches_torch(dtype: str, epilogue: str) -> None:
    """The chain alone against F.conv2d of the concatenated parts, with its epilogue."""
    dt = getattr(torch, dtype)
    if dt == torch.bfloat16 and not cpu_has_bf16():
        pytest.skip("no bf16 instructions on this CPU")
    lengths, k, side = [16, 8, 8], 24, 7
    xs = [torch.randn(1, c, side, side).to(dt).contiguous(memory_format=torch.channels_last)
          for c in lengths]  # fmt: skip
    w, b = torch.randn(k, sum(lengths), 1, 1).to(dt) * 0.2, torch.randn(k).to(dt)
    other = torch.randn(1, k, side, side).to(dt).contiguous(memory_format=torch.channels_last)
    plan = ConvPlan(w, w, [1, sum(lengths), side, side], [0, 0], [1, 1], [1, 1], 1, None, b)
    plans = conv_concat.part_plans(plan, lengths)
    plans[-1].unary = "swish" if "swish" in epilogue else "none"
    plans[-1].add_after = epilogue == "swish_add"
    adds = epilogue in ("add", "swish_add")
    run = onednn_conv.build_sum(
        plans, [lambda x=x: x for x in xs], (lambda: other) if adds else None, None
    )
    got = run().float()
    want = torch.nn.functional.conv2d(torch.cat(xs, 1).float(), w.float(), b.float())
    if epilogue == "add":
        want = want + other.float()
    if "swish" in epilogue:
        want = torch.nn.functional.silu(want)
    if epilogue == "swish_add":
        want = want + other.float()
    tol = 1e-4 if dt == torch.float32 else 5e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * 10)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert all(p.impl.startswith(("brg", "jit")) for p in run.primitives[torch.get_num_threads()])


NEAREST = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
           "nearest_mode": "floor"}  # fmt: skip


def _neck(order: str, side: int = 12) -> tuple:
    """YOLOv8's neck: a (3x3 conv) and b (stride-2 3x3 conv of a), then concat of b upsampled
    x2 (nearest) and a in `order` ("us" or "su"), then a 1x1 conv + bias + SiLU."""
    inits: dict = {"scales": np.array([1, 1, 2, 2], np.float32)}
    nodes = _conv("a", "x", 4, 8, inits, k=3)
    inits["b_w"], inits["b_b"] = f32(12, 8, 3, 3), f32(12)
    nodes += [
        node("Conv", ["a", "b_w", "b_b"], ["b_c"], pads=[1] * 4, strides=[2, 2]),
        *_silu("b_c", "b"),
        node("Resize", ["b", "", "scales"], ["up"], **NEAREST),
        node("Concat", ["up" if c == "u" else "a" for c in order], ["cat"], axis=1),
    ]
    nodes += _conv("cv", "cat", 20, 16, inits)
    feeds = {"x": f32(1, 4, side, side, scale=1.0)}
    return make_model(nodes, feeds, ["cv"], inits), feeds


@pytest.mark.parametrize("order", ["us", "su"])
@pytest.mark.parametrize("output", ["arena", "torch"])
def test_upsample_part_runs_at_its_input_size(order: str, output: str, monkeypatch) -> None:
    """The upsampled part's convolution runs before the upsample (they commute for a 1x1
    convolution and a nearest upsample), repeated into the output; the upsample is never
    written on its own."""
    model, feeds = _neck(order)
    prog = _compile(model, monkeypatch, conv_output=output)
    chains = [n for n in _steps(prog) if n[:3] == ["resize", "concat", "convolution"]]
    assert chains == [["resize", "concat", "convolution", "pointwise"]], _steps(prog)
    assert not any(n[0] == "resize" and len(n) == 2 for n in _steps(prog))
    _check(prog, model, feeds)
    assert_profile_matches(prog, feeds)


def test_upsample_part_off_keeps_the_repeat_into_the_concat(monkeypatch) -> None:
    model, feeds = _neck("us")
    prog = _compile(model, monkeypatch, mode="off")
    assert ["resize", "concat"] in _steps(prog)  # (`concat_with_repeat`, as before)
    _check(prog, model, feeds)


def test_time_chain_with_an_upsample_part() -> None:
    w = torch.randn(16, 20, 1, 1)
    plan = ConvPlan(w, w, [1, 20, 8, 8], [0, 0], [1, 1], [1, 1], 1, None)
    times = conv_concat.time_chain(plan, [12, 8], float("inf"), (0, [2, 2]))
    assert set(times) == {"concat", "sum"} and all(0 < t < 1 for t in times.values())
