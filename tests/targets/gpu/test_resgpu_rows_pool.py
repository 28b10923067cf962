"""The `ROWS` input of the int8 / fp8 convolution kernel (a convolution of few channels read
from a zero-padded NHWC copy, one kernel row's run of bytes per K block) against torch's
float64 convolution of the same 8-bit values, and the channels-last max pool kernel
(`gpu/pool.py`) against `F.max_pool2d`, alone and in a compiled program against ONNX Runtime.
On the GPU when there is one, else under `TRITON_INTERPRET=1` on CPU tensors."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets.gpu import quant_conv as qc  # noqa: E402
from pygraphx.targets.gpu import quant_conv_kernels as qck  # noqa: E402
from pygraphx.targets.gpu.pool import max_pool_nhwc, pool_fits  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
F8 = torch.float8_e4m3fn
#: on a GPU the fp8 kernels' sums are the tensor cores' (`qck.FP8_NATIVE`), not float32's
FP8_SUMS = "fp8 tensor-core sums are not float32-exact"


def _geometry(n, c, h, w, c_out, kernel, stride, pad) -> SimpleNamespace:
    """What `quant_conv.Geometry` holds for a square `kernel` (no Instruction needed)."""
    ho, wo = (h + 2 * pad - kernel) // stride + 1, (w + 2 * pad - kernel) // stride + 1
    return SimpleNamespace(
        n=n, c=c, h=h, w=w, c_out=c_out, kh=kernel, kw=kernel, stride=[stride, stride],
        pad=[pad, pad], dilation=[1, 1], ho=ho, wo=wo, rows=n * ho * wo, k=kernel**2 * c,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.int8, F8], ids=["int8", "fp8"])
@pytest.mark.parametrize(
    ("c", "kernel", "stride", "pad", "layout"),
    [(3, 7, 2, 3, "nchw"), (3, 7, 2, 3, "nhwc"), (1, 3, 1, 1, "nchw"), (8, 5, 1, 2, "nhwc"),
     (16, 3, 2, 1, "nchw"), (3, 7, 2, 0, "nchw")],
)  # fmt: skip
def test_rows_input_matches_torch(dtype, c, kernel, stride, pad, layout) -> None:
    """Each output's sum over the padded copy's runs (zero weights past the window, zero
    input in the padding) is the convolution's: int8 exactly, fp8 to float32 accumulation
    (on a GPU within `qck.FP8_SUM_ERROR` of the sum of the products' magnitudes)."""
    n, h, w, c_out = 2, 15, 12, 40
    geo = _geometry(n, c, h, w, c_out, kernel, stride, pad)
    assert qck.row_layout(c, kernel, geo.dilation) is not None
    gen = torch.Generator().manual_seed(c * kernel + stride)
    if dtype == torch.int8:
        x = torch.randint(-128, 128, (n, c, h, w), dtype=torch.int8, generator=gen)
        wgt = torch.randint(-128, 128, (c_out, c, kernel, kernel), dtype=torch.int8, generator=gen)
    else:
        x = (torch.randn((n, c, h, w), generator=gen) * 40).clamp(-448, 448).to(F8)
        wgt = (torch.randn((c_out, c, kernel, kernel), generator=gen) * 40).clamp(-448, 448)
        wgt = wgt.to(F8)
    args = {"stride": stride, "padding": pad}
    want = torch.nn.functional.conv2d(x.double(), wgt.double(), **args)
    size = torch.nn.functional.conv2d(x.double().abs(), wgt.double().abs(), **args)
    want, size = (t.permute(0, 2, 3, 1).reshape(-1, c_out) for t in (want, size))
    if layout == "nhwc":
        x = x.view(torch.uint8).contiguous(memory_format=torch.channels_last).view(dtype)
    reader = qc.input_reader(geo, DEVICE)
    assert isinstance(reader, qc.RowsInput)
    product = qc.implicit_conv(wgt.to(DEVICE), geo)
    out = torch.empty((geo.rows, c_out), dtype=torch.float32, device=DEVICE)
    for _ in range(2):  # the buffer's padding stays zero from one call to the next
        product(reader(x.to(DEVICE)), torch.ones(c_out, device=DEVICE), out)
        err = (out.cpu().double() - want).abs()
        if dtype == torch.int8:
            assert (err == 0).all(), err.max()
        else:
            bound = qck.FP8_SUM_ERROR if CUDA else 2**-20
            assert (err <= bound * size + 1e-30).all(), (err / size).max()


def test_rows_layout_and_its_refusals() -> None:
    """The stem's 3 channels in 4-byte pixels, 7 of them padded to one 32-byte run; none for
    channels read in place, dilation, or runs over 128 bytes; a wrongly shaped copy is a
    clear error."""
    assert qck.row_layout(3, 7, (1, 1)) == (4, 32)
    assert qck.row_layout(1, 3, (1, 1)) == (4, 32)
    assert qck.row_layout(16, 3, (1, 1)) == (16, 64)
    assert qck.row_layout(64, 3, (1, 1)) is None
    assert qck.row_layout(3, 3, (2, 2)) is None
    assert qck.row_layout(48, 3, (1, 1)) is None  # 3 * 64 bytes
    x = torch.zeros((1, 4, 9, 9), dtype=torch.int8)
    wt = torch.zeros((8, 7 * 32), dtype=torch.int8)
    out = torch.empty((4 * 4, 8))
    with pytest.raises(ValueError, match="padded NHWC"):
        qck.conv(x, wt, torch.ones(8), out, (1, (2, 2), (0, 0), (1, 1), 4, 4), run=32)


def _nhwc(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("kernel", "stride", "pad"), [((3, 3), (2, 2), (1, 1)), ((2, 2), (2, 2), (0, 0)),
                                  ((3, 2), (1, 2), (1, 1)), ((5, 5), (3, 3), (2, 2))],
)  # fmt: skip
def test_max_pool_matches_torch(dtype, kernel, stride, pad) -> None:
    """Bit for bit `F.max_pool2d`'s result (the maximum is exact), NaN where a window holds
    one, negative inputs at the borders (the padding takes no part)."""
    gen = torch.Generator().manual_seed(sum(kernel) + stride[0])
    x = (torch.randn((2, 40, 11, 10), generator=gen) - 3.0).to(dtype)
    x[1, 3, 4, 5] = float("nan")
    want = torch.nn.functional.max_pool2d(x.float(), kernel, stride, pad).to(dtype)
    xd = _nhwc(x.to(DEVICE))
    out = _nhwc(torch.empty(want.shape, dtype=dtype, device=DEVICE))
    max_pool_nhwc(xd, out, kernel, stride, pad)
    np.testing.assert_array_equal(out.cpu().float().numpy(), want.float().numpy())
    assert torch.isnan(out).any()


def test_max_pool_refuses_what_it_does_not_compute() -> None:
    assert pool_fits([1, 4, 8, 8], (3, 3), (2, 2), (1, 1), (1, 1))
    assert not pool_fits([1, 4, 8, 8], (3, 3), (2, 2), (2, 2), (1, 1))  # pad > half window
    assert not pool_fits([1, 4, 8, 8], (3, 3), (1, 1), (1, 1), (2, 2))  # dilation
    x = torch.zeros((1, 4, 8, 8))  # NCHW
    with pytest.raises(ValueError, match="channels-last"):
        max_pool_nhwc(x, torch.zeros((1, 4, 4, 4)), (3, 3), (2, 2), (1, 1))


def _stem_pool_model(then_conv: bool = False):
    """ResNet's stem, small: a 7x7 stride-2 convolution of 3 channels with bias, ReLU, then a
    3x3 stride-2 max pool (`then_conv`: and a 1x1 convolution of the pool, which reads it
    quantised); (the model, its feeds by seed)."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array((rng.standard_normal((16, 3, 7, 7)) * 0.1).astype(np.float32), "w"),
        numpy_helper.from_array((rng.standard_normal(16) * 0.3).astype(np.float32), "b"),
    ]
    pooled = "p" if then_conv else "out"
    nodes = [
        helper.make_node("Conv", ["img", "w", "b"], ["c"], pads=[3, 3, 3, 3], strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], [pooled], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1]),
    ]  # fmt: skip
    if then_conv:
        w1 = (rng.standard_normal((8, 16, 1, 1)) * 0.2).astype(np.float32)
        inits.append(numpy_helper.from_array(w1, "w1"))
        nodes.append(helper.make_node("Conv", ["p", "w1"], ["out"]))
    shape = [2, 3, 20, 18]
    graph = helper.make_graph(
        nodes, "stem", [helper.make_tensor_value_info("img", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, 9)

    def feeds(seed: int) -> dict[str, np.ndarray]:
        return {"img": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}

    return model, feeds


def _spy(monkeypatch, module, name: str) -> list:
    """(args, kwargs) of every call of `module.name` from now on."""
    calls: list = []
    real = getattr(module, name)

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


def _gpu_target():
    return pygraphx.get_target("gpu", **({} if CUDA else {"device": "cpu"}))


def test_max_pool_in_a_half_program_matches_onnxruntime(monkeypatch) -> None:
    """The stem in half on the gpu target (on a GPU the pool is `max_pool_nhwc` on cuDNN's
    channels-last output; the CPU's convolution is NCHW, so there torch pools): ONNX
    Runtime's float32 numbers to half precision."""
    from pygraphx.targets.gpu import lowering

    calls = _spy(monkeypatch, lowering, "max_pool_nhwc")
    model, feeds = _stem_pool_model()
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds(0))[0]
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    pygraphx.quantize_fp16(prog)
    prog.compile(_gpu_target())
    got = np.array(prog.run(feeds(0))[0], dtype=np.float32)
    assert bool(calls) == CUDA and not prog._executable.fallbacks
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


@pytest.mark.parametrize("then_conv", [False, True], ids=["pool-out", "pool-quantised"])
@pytest.mark.parametrize(
    "kind", ["int8", pytest.param("fp8", marks=pytest.mark.xfail(CUDA, reason=FP8_SUMS))]
)
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_stem_rows_and_pool_match_ref(fp16: bool, kind: str, then_conv: bool, monkeypatch):
    """The int8 / fp8 stem runs as the `ROWS` kernel (its bias and ReLU inside, a
    channels-last result) and the pool after it as `max_pool_nhwc`, which also writes the
    next convolution's quantised input when the pool feeds one (`then_conv`): the `ref`
    target's numbers on the same quantised program (int8: exact int32 sums; fp8 with
    `fold_fp8` applied to the reference, as the fp8 kernels' program)."""
    from pygraphx.passes.fold_fp8 import fold_fp8
    from pygraphx.targets.gpu import lowering

    monkeypatch.setenv("PGX_GPU_INT8_GEMM", "triton")
    monkeypatch.setenv("PGX_GPU_FP8_CONV", "triton")
    pools, convs = _spy(monkeypatch, lowering, "max_pool_nhwc"), _spy(monkeypatch, qck, "conv")
    model, feeds = _stem_pool_model(then_conv)
    progs = []
    for _ in range(2):
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        getattr(pygraphx, f"quantize_{kind}")(prog, "ref", [feeds(k) for k in range(1, 4)])
        if fp16:
            pygraphx.quantize_fp16(prog)
        progs.append(prog)
    ref, gpu = progs
    if kind == "fp8":
        fold_fp8(ref.get_main_module())
    ref.compile(pygraphx.get_target("ref"))
    gpu.compile(_gpu_target())
    want = np.array(ref.run(feeds(0))[0])
    for _ in range(2):
        got = np.array(gpu.run(feeds(0))[0])
    assert not gpu._executable.fallbacks
    assert convs and convs[0][1].get("run") == 32, convs
    assert pools and all(len(args) == (6 if then_conv else 5) for args, _ in pools), pools
    rtol = 2e-3 if fp16 else 1e-5
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())


def test_pool_quantises_as_the_quantise_kernels(monkeypatch) -> None:
    """The pool's quantised output is bit for bit `quantise_int8` / `quantise_fp8` (both fp8
    byte forms) of its float output, which it writes too when asked, and not otherwise."""
    from pygraphx.targets.gpu import quantise_kernels as qe

    gen = torch.Generator().manual_seed(4)
    x = _nhwc((torch.randn((2, 24, 9, 8), generator=gen) * 30).half().to(DEVICE))
    x[0, 1, 2, 3] = float("nan")
    shape = (2, 24, 5, 4)
    scale = torch.tensor([0.37], device=DEVICE)
    window = ((3, 3), (2, 2), (1, 1))
    for qdtype, cast in ((torch.int8, "1"), (F8, "0"), (F8, "1")):
        monkeypatch.setenv(qe.FP8_CAST_ENV, cast)
        out = _nhwc(torch.empty(shape, dtype=torch.float16, device=DEVICE))
        q = _nhwc(torch.empty(shape, dtype=qdtype, device=DEVICE))
        max_pool_nhwc(x, out, *window, (scale, q, True))
        want = torch.empty_like(q)
        if qdtype == torch.int8:
            qe.quantise_int8(out, scale, want)
        else:
            qe.quantise_fp8(out, scale, want)
        assert torch.equal(q.view(torch.uint8).cpu(), want.view(torch.uint8).cpu()), qdtype
        alone = _nhwc(torch.full(shape, 7.0, dtype=torch.float16, device=DEVICE))
        max_pool_nhwc(x, alone, *window, (scale, q, False))
        assert (alone == 7.0).all()  # not written
        assert torch.equal(q.view(torch.uint8).cpu(), want.view(torch.uint8).cpu())


def _kept(c: int, n: int, k: int, mode: int) -> list[tuple]:
    import triton

    configs = [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}, num_stages=st)
        for bm, bn, bk, _, st in qck.CONV_CONFIGS
    ]
    kept = qck._prune(configs, {"C": c, "N": n, "K": k}, MODE=mode)
    return [(cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.kwargs["BLOCK_K"], cfg.num_stages)
            for cfg in kept]  # fmt: skip


def test_tiles_of_shallow_products_have_two_stages() -> None:
    """A 1x1 convolution of 64 channels (one K block) is timed with two-stage tiles only, each
    tile once; a deep one (3x3 of 512) keeps the stages of `CONV_CONFIGS`; ROWS gets the
    32-byte K blocks only, the others never."""
    shallow = _kept(64, 256, 64, qck.POINTWISE)
    assert shallow and all(st <= 2 for *_, st in shallow)
    assert len(set(shallow)) == len(shallow)
    deep = _kept(512, 512, 4608, qck.IMPLICIT)
    want = {(bm, bn, bk, st) for bm, bn, bk, _, st in qck.CONV_CONFIGS if bk != qck.ROWS_BLOCK_K}
    assert set(deep) == want
    rows = _kept(32, 64, 7 * 32, qck.ROWS)
    assert rows and all(bk == qck.ROWS_BLOCK_K for _, _, bk, _ in rows)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_pad_rows_writes_the_padded_nhwc_copy(layout: str) -> None:
    """`pad_rows` leaves `buffer` equal to torch's zero-padded NHWC copy of `x` (channels
    padded to c4 with zeros, even over old bytes there), the border untouched."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(-128, 128, (2, 3, 9, 7), dtype=torch.int8, generator=gen)
    if layout == "nhwc":
        x = x.contiguous(memory_format=torch.channels_last)
    buffer = torch.zeros((2, 9 + 4, 7 + 5, 4), dtype=torch.uint8)
    buffer[:, 2:11, 3:10, 3] = 77  # a stale 4th channel: written zero
    buffer = buffer.to(DEVICE)
    qck.pad_rows(x.to(DEVICE), buffer, (2, 3))
    want = torch.zeros((2, 13, 12, 4), dtype=torch.uint8)
    want[:, 2:11, 3:10, :3] = x.view(torch.uint8).permute(0, 2, 3, 1)
    assert torch.equal(buffer.cpu(), want)
