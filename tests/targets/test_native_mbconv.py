"""The native inverted-residual block kernel (`native/kernels/mbconv.c`, `native_mbconv.py`).

The kernel against torch's float64 `F.conv2d` chain (strides 1 and 2, with and without the
residual and the expansion, odd map sizes, channel counts that are no multiple of 16, batch 1
and 3, 1 and 2 threads, strided input and output); networks of blocks against ONNX Runtime
with the block counted as one step, the profiled (unfused) path, and the switch.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import native_mbconv  # noqa: E402
from pygraphx.targets.torch_lowering.native_mbconv import MbConv  # noqa: E402
from tests.helpers import run_ort  # noqa: E402


def _kernel_ok() -> str | None:
    """Why the kernel cannot run here, else None."""
    try:
        native_mbconv.library()
    except native.NativeUnavailable as exc:
        return str(exc)
    return None


_WHY = _kernel_ok()
needs_kernel = pytest.mark.skipif(_WHY is not None, reason=f"native mbconv unavailable: {_WHY}")
CL = torch.channels_last
CLIP = ("hardtanh", [0.0, 6.0])


def _weights(c: int, m: int, k: int, expand: bool, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale / np.sqrt(np.prod(shape[1:]) or 1)

    return {
        "we": r(m, c, 1, 1) if expand else None, "be": r(m, scale=0.3) if expand else None,
        "wd": r(m, 1, 3, 3), "bd": r(m, scale=0.3), "wp": r(k, m, 1, 1), "bp": r(k, scale=0.3),
    }  # fmt: skip


def _oracle(x: torch.Tensor, w: dict, stride: int, acts: list, residual: bool) -> torch.Tensor:
    d = torch.float64

    def act(y: torch.Tensor, a: tuple) -> torch.Tensor:
        unary, scalars = a
        if unary == "hardtanh":
            return y.clamp(*scalars)
        return y.relu() if unary == "relu" else y

    e = x.to(d)
    if w["we"] is not None:
        e = act(F.conv2d(e, w["we"].to(d), w["be"].to(d)), acts[0])
    m = w["wd"].shape[0]
    e = act(F.conv2d(e, w["wd"].to(d), w["bd"].to(d), stride, 1, 1, m), acts[1])
    y = F.conv2d(e, w["wp"].to(d), w["bp"].to(d))
    if residual:
        y = y + x.to(d)
    return act(y, acts[2])


CASES = [
    # n, c, h, w, m, k, stride, residual, expand
    (1, 16, 28, 28, 96, 24, 2, False, True),
    (1, 24, 14, 14, 144, 24, 1, True, True),
    (3, 20, 13, 11, 120, 20, 1, True, True),
    (3, 20, 13, 11, 120, 33, 2, False, True),
    (1, 7, 9, 5, 40, 7, 1, True, True),
    (2, 160, 7, 7, 960, 40, 1, False, True),
    (1, 32, 15, 15, 32, 16, 1, False, False),  # no expansion, the depthwise reads x
    (3, 17, 9, 7, 17, 17, 1, True, False),  # no expansion, a padded copy
    (1, 17, 10, 9, 17, 9, 2, False, False),
    (1, 8, 1, 1, 24, 8, 1, True, True),
    (1, 8, 2, 3, 24, 8, 2, False, True),
]


@needs_kernel
@pytest.mark.parametrize("threads,shared", [(1, None), (2, False), (2, True)])
@pytest.mark.parametrize("case", CASES)
def test_kernel_against_torch(
    case: tuple, threads: int, shared: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1 thread; 2 threads on ranges of rows (and images) of their own, or image by image on
    shared buffers."""
    n, c, h, w, m, k, stride, residual, expand = case
    monkeypatch.setattr(native_mbconv, "SHARED", shared)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        wts = _weights(c, m, k, expand, sum(case))
        acts = [CLIP, CLIP, ("none", [])]
        x = torch.randn(n, c, h, w, generator=torch.Generator().manual_seed(7)) * 2
        x = x.contiguous(memory_format=CL)
        mb = MbConv(*wts.values(), stride, acts, [n, c, h, w], residual)
        assert mb.args.shared == int(bool(shared))
        got = mb(x, other=x if residual else None)
        want = _oracle(x, wts, stride, acts, residual)
        assert got.shape == want.shape and got.is_contiguous(memory_format=CL)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
        got2 = mb(x, other=x if residual else None)  # a second call: same values
        assert torch.equal(got, got2)
    finally:
        torch.set_num_threads(before)


@needs_kernel
@pytest.mark.parametrize("threads,shared", [(1, None), (2, False), (2, True)])
def test_strided_input_output_and_activations(
    threads: int, shared: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """x a channel slice of a wider channels-last tensor (pixels 40 floats apart), the output
    a slice of a wider one, the residual a non-channels-last tensor (copied), relu and none
    epilogues in the other places."""
    n, c, h, w, m, k = 2, 24, 11, 13, 72, 24
    monkeypatch.setattr(native_mbconv, "SHARED", shared)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        wts = _weights(c, m, k, True, 3)
        acts = [("relu", []), ("none", []), ("hardtanh", [-1.0, 2.5])]
        wide = torch.randn(n, 40, h, w).contiguous(memory_format=CL)
        x = wide[:, 5 : 5 + c]
        assert x.stride(1) == 1 and x.stride(3) == 40
        r = torch.randn(n, k, h, w)  # NCHW
        out = torch.full((n, 50, h, w), float("nan")).contiguous(memory_format=CL)
        y = out[:, 10 : 10 + k]
        mb = MbConv(*wts.values(), 1, acts, [n, c, h, w], True)
        mb(x, y, r)
        d = torch.float64
        e = F.conv2d(x.to(d), wts["we"].to(d), wts["be"].to(d)).relu()
        e = F.conv2d(e, wts["wd"].to(d), wts["bd"].to(d), 1, 1, 1, m)
        want = (F.conv2d(e, wts["wp"].to(d), wts["bp"].to(d)) + r.to(d)).clamp(-1.0, 2.5)
        torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
        assert torch.isnan(out[:, :10]).all() and torch.isnan(out[:, 10 + k :]).all()
    finally:
        torch.set_num_threads(before)


@needs_kernel
@pytest.mark.parametrize("threads,shared", [(1, None), (2, False), (2, True)])
@pytest.mark.parametrize("expand", [True, False])
def test_cropped_input(
    threads: int, shared: bool | None, expand: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """x a spatial crop of a larger channels-last map (its rows are not one run of pixels),
    the output a crop too (written row by row)."""
    n, c, h, w, m, k = 1, 16, 9, 10, 48 if expand else 16, 16
    monkeypatch.setattr(native_mbconv, "SHARED", shared)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        wts = _weights(c, m, k, expand, 11)
        acts = [CLIP, CLIP, ("none", [])]
        x = torch.randn(n, c, h + 3, w + 4).contiguous(memory_format=CL)[:, :, 1 : 1 + h, 2 : 2 + w]
        out = torch.full((n, k, h + 2, w + 2), float("nan")).contiguous(memory_format=CL)
        y = out[:, :, 1 : 1 + h, 1 : 1 + w]
        mb = MbConv(*wts.values(), 1, acts, [n, c, h, w], True)
        mb(x, y, x)
        want = _oracle(x, wts, 1, acts, True)
        torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
        assert torch.isnan(out[:, :, 0]).all() and torch.isnan(out[:, :, :, -1]).all()
    finally:
        torch.set_num_threads(before)


def test_schedule_and_bounds() -> None:
    rows, chunks = native_mbconv.schedule(1, 56, 56, 56, 144, 1, 2)
    assert chunks == 2 and 1 <= rows <= 28
    rows, chunks = native_mbconv.schedule(8, 7, 7, 7, 960, 1, 2)
    assert chunks == 1 and rows >= 1
    assert native_mbconv.bounds("hardtanh", [0, 6]) == (0.0, 6.0)
    assert native_mbconv.bounds("relu", [])[0] == 0.0
    with pytest.raises(ValueError, match="swish"):
        native_mbconv.bounds("swish", [])


def test_rule() -> None:
    """Every block at 1 and 2 threads; above, the blocks whose output map is 14x14 or larger
    (both measured)."""
    for threads in (1, 2):
        assert native_mbconv.rule(1, 7, 7, 960, 1, threads)
    assert native_mbconv.efficiency(8, 56, 56, 144, 1, 2) == 1.0
    assert native_mbconv.rule(1, 112, 112, 32, 1, 16)
    assert native_mbconv.rule(1, 112, 112, 96, 2, 16)
    assert native_mbconv.rule(1, 14, 14, 576, 1, 16)
    assert not native_mbconv.rule(1, 14, 14, 576, 2, 16)
    assert not native_mbconv.rule(1, 7, 7, 960, 1, 16)
    assert native_mbconv.rule(8, 28, 28, 192, 1, 16)
    assert not native_mbconv.rule(8, 7, 7, 960, 1, 16)
    # 2 threads, batch 1: the 7x7 outputs share the image; larger maps, batch 8 split rows
    assert native_mbconv.share_image(1, 7, 7, 960, 1, 2)
    assert native_mbconv.share_image(1, 14, 14, 576, 2, 2)
    assert not native_mbconv.share_image(1, 14, 14, 576, 1, 2)
    assert not native_mbconv.share_image(8, 7, 7, 960, 1, 2)
    assert not native_mbconv.share_image(1, 7, 7, 960, 1, 1)


def test_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(native_mbconv.ENV, raising=False)
    assert native_mbconv.mode() == "rule" and native_mbconv.enabled()
    for off in ("0", "off", "No", "false"):
        monkeypatch.setenv(native_mbconv.ENV, off)
        assert native_mbconv.mode() == "off" and not native_mbconv.enabled()
        assert not native_mbconv.use_native(1, 16, 56, 56, 96, 24, 1)
    monkeypatch.setenv(native_mbconv.ENV, "all")
    assert native_mbconv.mode() == "all"


# --- networks --------------------------------------------------------------------------------


def _net(n: int, h: int, blocks: list[tuple], seed: int = 0):  # noqa: ANN202
    """A 3x3 stem (3 -> blocks[0]'s channels, relu) then inverted-residual blocks
    (c, m, k, stride): expansion (where m != c) + clip, depthwise + clip, projection, the
    residual where stride 1 and k == c; a 1x1 convolution after them."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3, h, h)).astype(np.float32)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    c0 = blocks[0][0]
    inits = {"w0": w(c0, 3, 3, 3), "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w0"], ["s0"], pads=[1] * 4),
             helper.make_node("Relu", ["s0"], ["b0"])]  # fmt: skip
    cur = "b0"
    for j, (c, m, k, stride) in enumerate(blocks):
        p = f"k{j}_"
        inits.update({p + "wd": w(m, 1, 3, 3), p + "bd": w(m) * 0.2, p + "wp": w(k, m, 1, 1),
                      p + "bp": w(k) * 0.2})  # fmt: skip
        src = cur
        if m != c:
            inits.update({p + "we": w(m, c, 1, 1), p + "be": w(m) * 0.2})
            nodes += [helper.make_node("Conv", [cur, p + "we", p + "be"], [p + "ce"]),
                      helper.make_node("Clip", [p + "ce", "lo", "hi"], [p + "ae"])]  # fmt: skip
            src = p + "ae"
        nodes += [
            helper.make_node("Conv", [src, p + "wd", p + "bd"], [p + "cd"], group=m,
                             strides=[stride] * 2, pads=[1] * 4),  # fmt: skip
            helper.make_node("Clip", [p + "cd", "lo", "hi"], [p + "ad"]),
            helper.make_node("Conv", [p + "ad", p + "wp", p + "bp"], [p + "cp"]),
        ]
        out = p + "cp"
        if stride == 1 and k == c:
            nodes.append(helper.make_node("Add", [cur, out], [p + "y"]))
            out = p + "y"
        cur = out
    k = blocks[-1][2]
    inits["w9"] = w(8, k, 1, 1)
    nodes.append(helper.make_node("Conv", [cur, "w9"], ["z"]))
    graph = helper.make_graph(
        nodes, "net", [helper.make_tensor_value_info("x", 1, list(x.shape))],
        [helper.make_tensor_value_info("z", 1, None)],
        [numpy_helper.from_array(v, name) for name, v in inits.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": x}


NET = [(16, 16, 8, 1), (8, 48, 8, 1), (8, 48, 8, 1), (8, 48, 12, 2), (12, 72, 12, 1)]


def _compile(model, mode: str, monkeypatch, threads: int = 1, **target):  # noqa: ANN001, ANN202
    monkeypatch.setenv(native_mbconv.ENV, mode)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=threads, **target))
    return prog


@needs_kernel
@pytest.mark.parametrize("stem", ["0", "1"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("output", ["arena", "torch"])
@pytest.mark.parametrize("n,h", [(1, 17), (3, 12)])
def test_network_against_ort(
    n: int, h: int, output: str, threads: int, stem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five blocks (the first without expansion, three with a residual, one of stride 2), each
    one step on the kernel; twice (the second run reads the slots the first left); the
    profiled path runs the unfused steps; the switch off gives the oneDNN route. `stem` on
    (mnv15, `PGX_CPU_NATIVE_MBSTEM`): the 3x3 convolution before the first block is that
    block's expansion (one step for the two)."""
    monkeypatch.setenv("PGX_DEBUG_MEMORY_COLORING", "1")
    monkeypatch.setenv(native_mbconv.STEM_ENV, stem)
    model, feeds = _net(n, h, NET)
    want = run_ort(model, feeds)[0]
    prog = _compile(model, "all", monkeypatch, threads, conv_output=output)
    for _ in range(2):
        np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
    lowered = prog._executable.lowered
    assert lowered.ctx.cache.get("native_mbconv", 0) == len(NET)
    steps = [[i.op.name for i in s.instructions] for s in lowered.steps]
    fused = stem == "1"
    assert steps.count(["convolution", "pointwise"] * 3) == len(NET) - 1 + fused, steps
    assert steps.count(["convolution", "pointwise"] * 2) == 1 - fused, steps
    assert steps[0] == ["convolution", "pointwise"] * (3 if fused else 1), steps
    seen: list[str] = []
    profiled = prog.run(feeds, observer=lambda ins, v, s: seen.append(ins.name()))
    np.testing.assert_allclose(profiled[0], want, rtol=1e-4, atol=1e-4)
    assert seen.count("convolution") == 2 + 3 * (len(NET) - 1) + 2
    off = _compile(model, "0", monkeypatch, threads, conv_output=output)
    assert off._executable.lowered.ctx.cache.get("native_mbconv", 0) == 0
    np.testing.assert_allclose(off.run(feeds)[0], want, rtol=1e-4, atol=1e-4)


@needs_kernel
def test_not_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """A swish after the projection (the kernel has none) and a bf16 program with the bf16
    blocks switched off (`PGX_CPU_NATIVE_MBCONV_BF16=0`) keep their route."""
    model, feeds = _net(1, 10, [(8, 24, 8, 1)])
    graph = model.graph
    for node in graph.node:  # the projection's add followed by a sigmoid-linear unit
        if node.op_type == "Add":
            node.output[0] = "pre"
    graph.node.extend([helper.make_node("Sigmoid", ["pre"], ["sg"]),
                       helper.make_node("Mul", ["pre", "sg"], ["k0_y"])])  # fmt: skip
    nodes = list(graph.node)
    last = nodes.pop(-3)  # the final 1x1 convolution after the swish
    del graph.node[:]
    graph.node.extend(nodes + [last])
    want = run_ort(model, feeds)[0]
    prog = _compile(model, "all", monkeypatch)
    np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
    assert prog._executable.lowered.ctx.cache.get("native_mbconv", 0) == 0
    model, feeds = _net(1, 10, [(8, 24, 8, 1)])
    monkeypatch.setenv(native_mbconv.ENV, "all")
    monkeypatch.setenv(native_mbconv.BF16_ENV, "0")  # (bfmb16: bf16 blocks' own switch)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_bf16(prog, ["all"])
    prog.compile(CpuTarget(threads=1))
    assert prog._executable.lowered.ctx.cache.get("native_mbconv", 0) == 0


def test_wrong_tensors_are_refused() -> None:
    """A tensor of another type or size than the block was made for is refused, never read or
    written past its end."""
    if not native_mbconv.available():
        pytest.skip("no native mbconv kernel here")
    torch.manual_seed(3)
    c, m, k = 8, 24, 8
    block = native_mbconv.MbConv(
        torch.randn(m, c, 1, 1), None, torch.randn(m, 1, 3, 3), None, torch.randn(k, m, 1, 1),
        None, 1, [("relu", []), ("relu", []), ("none", [])], [1, c, 8, 8], True,
    )  # fmt: skip
    good = torch.randn(1, c, 8, 8).contiguous(memory_format=torch.channels_last)
    for bad in (good.double(), torch.randn(1, c, 4, 4)):
        with pytest.raises(ValueError, match="must be a float32"):
            block(bad, other=good)
        with pytest.raises(ValueError, match="residual must be a float32"):
            block(good, other=bad)
    with pytest.raises(ValueError, match="output must be a float32"):
        block(good, torch.empty(1, k, 4, 4), other=good)
