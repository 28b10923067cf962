"""mnv15: the network's head on the native kernel (`mbconv.c`'s `mbhead_run`, `native_mbhead.py`)
and a 3x3 stem as a native block's expansion (`mbconv.c`'s stem mode, `MbConv(stem=...)`).

Both against torch's float64 ops (odd sizes, channel counts no multiple of 16, batch 1 and 3,
1 and 2 threads, strided and non-channels-last inputs); a network (stem, blocks, head with its
classifier) against ONNX Runtime with the head one step, the profiled path and the switches;
the block and head closures do not keep the last run's input alive.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

import pygraphx  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import native_mbconv, native_mbhead  # noqa: E402
from pygraphx.targets.torch_lowering.native_mbconv import MbConv  # noqa: E402
from pygraphx.targets.torch_lowering.native_mbhead import MbHead  # noqa: E402
from tests.helpers import run_ort  # noqa: E402


def _kernel_ok() -> str | None:
    try:
        native_mbconv.library()
    except native.NativeUnavailable as exc:
        return str(exc)
    return None


_WHY = _kernel_ok()
needs_kernel = pytest.mark.skipif(_WHY is not None, reason=f"native mbconv unavailable: {_WHY}")
CL = torch.channels_last
D = torch.float64


def _r(g: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * scale / np.sqrt(np.prod(shape[1:]) or 1)


@pytest.fixture
def threads():  # noqa: ANN201
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


# --- the head --------------------------------------------------------------------------------

HEADS = [
    # n, cin, h, w, cout, ncls (0: the pooled values)
    (1, 320, 7, 7, 1280, 1000),
    (3, 17, 5, 3, 40, 33),
    (2, 33, 4, 4, 20, 0),
    (1, 16, 9, 7, 70, 17),
    (3, 8, 1, 1, 24, 5),
    (1, 24, 6, 5, 72, 0),
]


@needs_kernel
@pytest.mark.parametrize("nthreads,chunks", [(1, None), (2, None), (2, 64)])
@pytest.mark.parametrize("case", HEADS)
def test_head_against_torch(
    case: tuple, nthreads: int, chunks: int | None, threads, monkeypatch: pytest.MonkeyPatch
) -> None:
    """clip(conv1x1 + b) averaged over the map [then @ Wc + bc]; `chunks`: JOBS_PER_THREAD
    raised so the pixels are split into ranges (the ranges' sums added after a barrier)."""
    n, cin, h, w, cout, ncls = case
    threads(nthreads)
    if chunks is not None:
        monkeypatch.setattr(native_mbhead, "JOBS_PER_THREAD", chunks)
    g = torch.Generator().manual_seed(sum(case))
    x = (torch.randn(n, cin, h, w, generator=g) * 2).contiguous(memory_format=CL)
    wt, b = _r(g, cout, cin, 1, 1), _r(g, cout, scale=0.3)
    wc = _r(g, cout, ncls) if ncls else None
    bc = _r(g, ncls, scale=0.3) if ncls else None
    head = MbHead(wt, b, 0.0, 6.0, wc, bc, [n, cin, h, w])
    if chunks is not None and h * w >= 2 * native_mbhead.MIN_PIXELS:
        assert head.args.pchunks > 1
    got = head(x)
    want = F.conv2d(x.to(D), wt.to(D), b.to(D)).clamp(0, 6).mean((2, 3), keepdim=True)
    if ncls:
        want = want.flatten(1) @ wc.to(D) + bc.to(D)
    assert list(got.shape) == list(want.shape)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(head(x), got)  # a second call: the same values


@needs_kernel
@pytest.mark.parametrize("nthreads", [1, 2])
def test_head_strided_input_and_output(nthreads: int, threads) -> None:
    """x a crop of a larger channels-last map (rows not one run of pixels), then an NCHW
    tensor (copied); the pooled output a channel slice of a wider (N, C, 1, 1) tensor; relu and
    no bounds."""
    threads(nthreads)
    n, cin, h, w, cout = 2, 20, 5, 6, 36
    g = torch.Generator().manual_seed(5)
    wt = _r(g, cout, cin, 1, 1)
    head = MbHead(wt, None, 0.0, float("inf"), None, None, [n, cin, h, w])
    big = torch.randn(n, cin, h + 2, w + 3, generator=g).contiguous(memory_format=CL)
    for x in (big[:, :, 1 : 1 + h, 2 : 2 + w], torch.randn(n, cin, h, w, generator=g)):
        out = torch.full((n, cout + 10, 1, 1), float("nan"))
        y = out[:, 4 : 4 + cout]
        head(x, y)
        want = F.conv2d(x.to(D), wt.to(D)).relu().mean((2, 3), keepdim=True)
        torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
        assert torch.isnan(out[:, :4]).all() and torch.isnan(out[:, 4 + cout :]).all()
    lower = MbHead(wt, None, -1.0, 0.5, None, None, [n, cin, h, w])
    x = big[:, :, :h, :w]
    want = F.conv2d(x.to(D), wt.to(D)).clamp(-1.0, 0.5).mean((2, 3), keepdim=True)
    torch.testing.assert_close(lower(x).double(), want, rtol=1e-5, atol=1e-5)


def test_head_refuses_wrong_tensors() -> None:
    if not native_mbhead.available():
        pytest.skip("no native head kernel here")
    head = MbHead(torch.randn(16, 8, 1, 1), None, 0.0, 6.0, torch.randn(16, 5), None,
                  [1, 8, 3, 3])  # fmt: skip
    with pytest.raises(ValueError, match="input must be a float32"):
        head(torch.randn(1, 8, 4, 3))
    with pytest.raises(ValueError, match="output must be a float32"):
        head(torch.randn(1, 8, 3, 3), torch.empty(1, 6))
    with pytest.raises(ValueError, match="rows must be dense"):
        head(torch.randn(1, 8, 3, 3), torch.empty(1, 10)[:, ::2])
    with pytest.raises(ValueError, match="classifier weight"):
        MbHead(torch.randn(16, 8, 1, 1), None, 0.0, 6.0, torch.randn(15, 5), None, [1, 8, 3, 3])


def test_pixel_chunks() -> None:
    """Whole maps at 1 and 2 threads for MobileNetV2's head (20 channel blocks); 4 ranges at
    16 threads, batch 1; never ranges under MIN_PIXELS pixels."""
    assert native_mbhead.pixel_chunks(1, 1280, 49, 1) == 1
    assert native_mbhead.pixel_chunks(1, 1280, 49, 2) == 1
    assert native_mbhead.pixel_chunks(1, 1280, 49, 16) == 4
    assert native_mbhead.pixel_chunks(8, 1280, 49, 16) == 1
    assert native_mbhead.pixel_chunks(1, 16, 7, 16) == 1


def test_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    for off in ("0", "off", "No", "false"):
        monkeypatch.setenv(native_mbhead.ENV, off)
        assert not native_mbhead.enabled() and not native_mbhead.available()
        monkeypatch.setenv(native_mbconv.STEM_ENV, off)
        assert not native_mbconv.stem_enabled()
    monkeypatch.delenv(native_mbhead.ENV)
    monkeypatch.delenv(native_mbconv.STEM_ENV)
    assert native_mbhead.enabled() and native_mbconv.stem_enabled()
    monkeypatch.setenv(native_mbconv.ENV, "0")  # mnv16: the whole library's switch
    assert native_mbhead.enabled() and not native_mbhead.available()
    monkeypatch.delenv(native_mbconv.ENV)


@needs_kernel
def test_mbconv_switch_turns_off_the_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """mnv16: `PGX_CPU_NATIVE_MBCONV=0` keeps blocks, stem and head on the library route."""
    monkeypatch.setenv(native_mbconv.ENV, "0")
    model, feeds = _net(1, 16)
    want = run_ort(model, feeds)[0]
    prog = _compile(model, 2)
    np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
    cache = prog._executable.lowered.ctx.cache
    assert cache.get("native_mbhead", 0) == 0 and cache.get("native_mbconv", 0) == 0


# --- the stem as a block's expansion ---------------------------------------------------------

STEMS = [
    # n, c, ih, iw, m, k, stem stride, block (depthwise) stride, channels-last input
    (1, 3, 224, 224, 32, 16, 2, 1, False),
    (3, 3, 13, 11, 20, 7, 2, 1, True),
    (2, 4, 9, 7, 17, 33, 1, 2, False),
    (1, 3, 10, 12, 32, 16, 2, 1, False),
    (2, 1, 6, 5, 40, 24, 2, 2, False),
]


@needs_kernel
@pytest.mark.parametrize("nthreads,shared", [(1, None), (2, False), (2, True)])
@pytest.mark.parametrize("case", STEMS)
def test_stem_against_torch(
    case: tuple, nthreads: int, shared: bool | None, threads, monkeypatch: pytest.MonkeyPatch
) -> None:
    n, c, ih, iw, m, k, s, ds, cl = case
    threads(nthreads)
    monkeypatch.setattr(native_mbconv, "SHARED", shared)
    g = torch.Generator().manual_seed(sum(case))
    x = torch.randn(n, c, ih, iw, generator=g) * 2
    if cl:
        x = x.contiguous(memory_format=CL)
    we, be = _r(g, m, c, 3, 3), _r(g, m, scale=0.3)
    wd, bd = _r(g, m, 1, 3, 3), _r(g, m, scale=0.3)
    wp, bp = _r(g, k, m, 1, 1), _r(g, k, scale=0.3)
    acts = [("hardtanh", [0.0, 6.0]), ("relu", []), ("none", [])]
    mb = MbConv(we, be, wd, bd, wp, bp, ds, acts, [n, c, ih, iw], False, stem=s)
    got = mb(x)
    e = F.conv2d(x.to(D), we.to(D), be.to(D), stride=s, padding=1).clamp(0, 6)
    e = F.conv2d(e, wd.to(D), bd.to(D), stride=ds, padding=1, groups=m).relu()
    want = F.conv2d(e, wp.to(D), bp.to(D))
    assert got.shape == want.shape and got.is_contiguous(memory_format=CL)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(mb(x), got)


def test_stem_refused_shapes() -> None:
    if not native_mbconv.available():
        pytest.skip("no native mbconv kernel here")
    with pytest.raises(ValueError, match="stem is a 3x3"):
        MbConv(torch.randn(8, 3, 1, 1), None, torch.randn(8, 1, 3, 3), None,
               torch.randn(4, 8, 1, 1), None, 1, [("none", [])] * 3, [1, 3, 8, 8], False,
               stem=2)  # fmt: skip


# --- the closures do not keep the last run's input alive ------------------------------------


@needs_kernel
def test_closures_hold_no_input() -> None:
    """A block's and a head's step closure point the kernel to an input once per tensor
    object, but keep no reference to it: dropped from the env after its last use (the torch
    output mode), it is freed (the review finding: the block closure held it to the next run)."""
    g = torch.Generator().manual_seed(1)
    c, m, k = 8, 24, 8
    mb = MbConv(_r(g, m, c, 1, 1), None, _r(g, m, 1, 3, 3), None, _r(g, k, m, 1, 1), None, 1,
                [("relu", []), ("relu", []), ("none", [])], [1, c, 6, 6], True)  # fmt: skip
    head = MbHead(_r(g, 16, c, 1, 1), None, 0.0, 6.0, _r(g, 16, 5), None, [1, c, 6, 6])
    env: list = [None, None]
    block_run = mb.closure(env, 0, 1, None)
    head_run = head.closure(env, 0, None)
    for run, residual in ((block_run, True), (head_run, False)):
        refs = []
        for _ in range(2):  # a new tensor each run (as a step's fresh output)
            x = torch.randn(1, c, 6, 6, generator=g).contiguous(memory_format=CL)
            env[0] = x
            env[1] = x if residual else None
            y = run()
            assert y.shape[0] == 1
            refs.append(weakref.ref(x))
            env[0] = env[1] = None
            del x
            gc.collect()
            assert refs[-1]() is None, "the closure keeps the last run's input alive"
        x = torch.randn(1, c, 6, 6, generator=g).contiguous(memory_format=CL)
        env[0] = x
        env[1] = x if residual else None
        first = run().clone()
        second = run()  # the same tensor again: not pointed to again, the same values
        torch.testing.assert_close(first, second)


# --- a network -------------------------------------------------------------------------------


def _net(n: int, h: int, seed: int = 0, bias: bool = True):  # noqa: ANN202
    """A 3x3 stride-2 stem (3 -> 16, clip), a block without expansion (16 -> 8), a block with
    one (8 -> 48 -> 8, residual), the head: 1x1 8 -> 40 + clip, GlobalAveragePool, Flatten,
    Gemm (transB, 40 -> 11, a bias where `bias`)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3, h, h)).astype(np.float32)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    inits = {"w0": w(16, 3, 3, 3), "b0": w(16) * 0.2, "lo": np.array(0.0, np.float32),
             "hi": np.array(6.0, np.float32), "wd1": w(16, 1, 3, 3), "bd1": w(16) * 0.2,
             "wp1": w(8, 16, 1, 1), "bp1": w(8) * 0.2, "we2": w(48, 8, 1, 1), "be2": w(48) * 0.2,
             "wd2": w(48, 1, 3, 3), "bd2": w(48) * 0.2, "wp2": w(8, 48, 1, 1), "bp2": w(8) * 0.2,
             "wh": w(40, 8, 1, 1), "bh": w(40) * 0.2, "wc": w(11, 40),
             "bc": w(11) * 0.5}  # fmt: skip
    N = helper.make_node
    nodes = [
        N("Conv", ["x", "w0", "b0"], ["s0"], pads=[1] * 4, strides=[2, 2]),
        N("Clip", ["s0", "lo", "hi"], ["a0"]),
        N("Conv", ["a0", "wd1", "bd1"], ["c1"], group=16, pads=[1] * 4),
        N("Clip", ["c1", "lo", "hi"], ["a1"]),
        N("Conv", ["a1", "wp1", "bp1"], ["p1"]),
        N("Conv", ["p1", "we2", "be2"], ["e2"]),
        N("Clip", ["e2", "lo", "hi"], ["ae2"]),
        N("Conv", ["ae2", "wd2", "bd2"], ["c2"], group=48, pads=[1] * 4),
        N("Clip", ["c2", "lo", "hi"], ["a2"]),
        N("Conv", ["a2", "wp2", "bp2"], ["q2"]),
        N("Add", ["p1", "q2"], ["y2"]),
        N("Conv", ["y2", "wh", "bh"], ["h"]),
        N("Clip", ["h", "lo", "hi"], ["ah"]),
        N("GlobalAveragePool", ["ah"], ["gp"]),
        N("Flatten", ["gp"], ["fl"], axis=1),
        N("Gemm", ["fl", "wc", "bc"] if bias else ["fl", "wc"], ["z"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "net", [helper.make_tensor_value_info("x", 1, list(x.shape))],
        [helper.make_tensor_value_info("z", 1, None)],
        [numpy_helper.from_array(v, name) for name, v in inits.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), {"x": x}


def _compile(model, threads: int, **target):  # noqa: ANN001, ANN202
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=threads, **target))
    return prog


@needs_kernel
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("output", ["arena", "torch"])
@pytest.mark.parametrize("n,h", [(1, 23), (3, 16)])
def test_network_against_ort(
    n: int, h: int, output: str, nthreads: int, bias: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stem and the first block one step, the head (1x1 + clip + pool + flatten + dot) one
    step; twice; the profiled path (the unfused twins); the switches off: no native head, the
    stem its own step; every variant against ONNX Runtime."""
    monkeypatch.setenv("PGX_DEBUG_MEMORY_COLORING", "1")
    monkeypatch.delenv(native_mbhead.ENV, raising=False)
    monkeypatch.delenv(native_mbconv.STEM_ENV, raising=False)
    model, feeds = _net(n, h, bias=bias)
    want = run_ort(model, feeds)[0]
    prog = _compile(model, nthreads, conv_output=output)
    for _ in range(2):
        np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
    lowered = prog._executable.lowered
    assert lowered.ctx.cache.get("native_mbhead", 0) == 1
    assert lowered.ctx.cache.get("native_mbconv", 0) == 2
    steps = [[i.op.name for i in s.instructions] for s in lowered.steps]
    assert steps[0] == ["convolution", "pointwise"] * 3, steps
    head = ["convolution", "pointwise", "pooling", "flatten", "dot"]
    head += ["pointwise"] if bias else []  # mnv16: the classifier's bias in the head's step
    assert head == steps[-1], steps
    seen: list[str] = []
    profiled = prog.run(feeds, observer=lambda ins, v, s: seen.append(ins.name()))
    np.testing.assert_allclose(profiled[0], want, rtol=1e-4, atol=1e-4)
    assert seen.count("convolution") == 7 and seen.count("pooling") == 1
    assert seen.count("dot") == 1
    np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
    if bias:  # the old path: the bias its own step after the head's
        monkeypatch.setattr(native_mbhead, "BIAS", False)
        own = _compile(model, nthreads, conv_output=output)
        steps = [[i.op.name for i in s.instructions] for s in own._executable.lowered.steps]
        assert steps[-2:] == [head[:-1], ["pointwise"]], steps
        np.testing.assert_allclose(own.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
        monkeypatch.setattr(native_mbhead, "BIAS", True)
    monkeypatch.setenv(native_mbhead.ENV, "0")
    monkeypatch.setenv(native_mbconv.STEM_ENV, "0")
    off = _compile(model, nthreads, conv_output=output)
    low = off._executable.lowered
    assert low.ctx.cache.get("native_mbhead", 0) == 0
    assert [i.op.name for i in low.steps[0].instructions] == ["convolution", "pointwise"]
    np.testing.assert_allclose(off.run(feeds)[0], want, rtol=1e-4, atol=1e-4)


@needs_kernel
def test_head_without_classifier(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pooling whose user is no flatten + dot (here an add of a constant after the Gemm's
    flatten is not there: the pooled map is the output): the head is the convolution, its
    group and the pooling, one step."""
    monkeypatch.setenv("PGX_DEBUG_MEMORY_COLORING", "1")
    model, feeds = _net(1, 16)
    graph = model.graph
    nodes = [nd for nd in graph.node if nd.op_type not in ("Flatten", "Gemm")]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.output[0].name = "gp"
    want = run_ort(model, feeds)[0]
    prog = _compile(model, 2)
    np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-4)
    steps = [[i.op.name for i in s.instructions] for s in prog._executable.lowered.steps]
    assert ["convolution", "pointwise", "pooling"] in steps, steps


@needs_kernel
def test_bf16_head_not_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bf16 head's switch off (mnv18: on, `tests/targets/test_mnv18_bf16_stem_head.py`)."""
    monkeypatch.setenv(native_mbhead.BF16_ENV, "0")
    model, feeds = _net(1, 16)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_bf16(prog, ["all"])
    prog.compile(CpuTarget(threads=1))
    assert prog._executable.lowered.ctx.cache.get("native_mbhead", 0) == 0


@needs_kernel
@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("output", ["arena", "torch"])
@pytest.mark.parametrize("case", ["rows", "view"])
def test_classifier_bias_forms(
    case: str, output: str, nthreads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mnv16: a Gemm's C that differs between rows (3, 11) at batch 3 is no bias per column:
    the head's step ends at the `dot`, the add its own step; a bias per column whose sum is
    the program's output itself (an Unsqueeze after it) is in the head's step, into its arena
    slot.
    Against ONNX Runtime, the profiled path too."""
    monkeypatch.setenv("PGX_DEBUG_MEMORY_COLORING", "1")
    model, feeds = _net(3, 16)
    graph = model.graph
    head = ["convolution", "pointwise", "pooling", "flatten", "dot"]
    if case == "rows":
        rows = np.random.default_rng(5).standard_normal((3, 11)).astype(np.float32)
        for k, init in enumerate(graph.initializer):
            if init.name == "bc":
                graph.initializer[k].CopyFrom(numpy_helper.from_array(rows, "bc"))
        want_steps = [head, ["pointwise"]]
    else:
        graph.node[-1].output[0] = "zl"
        axes = numpy_helper.from_array(np.array([2], np.int64), "axes")
        graph.initializer.append(axes)
        graph.node.append(helper.make_node("Unsqueeze", ["zl", "axes"], ["z"]))
        want_steps = [head + ["pointwise"]]
    want = run_ort(model, feeds)[0]
    prog = _compile(model, nthreads, conv_output=output)
    for _ in range(2):
        np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-5)
    steps = [[i.op.name for i in s.instructions] for s in prog._executable.lowered.steps]
    at = steps.index(head if case == "rows" else head + ["pointwise"])
    assert steps[at : at + len(want_steps)] == want_steps, steps
    profiled = prog.run(feeds, observer=lambda ins, v, s: None)
    np.testing.assert_allclose(profiled[0], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(prog.run(feeds)[0], want, rtol=1e-4, atol=1e-5)
