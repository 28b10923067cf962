"""int8 and fp8 convolutions on the gpu target: the implicit-GEMM kernel against torch's float
convolution of the same 8-bit values, and whole quantised programs against the `ref` target's
run of the same program (on the GPU when there is one, else the GPU lowering on CPU tensors with
the Triton kernels under `TRITON_INTERPRET=1`)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import pygraphx  # noqa: E402
from pygraphx.targets.gpu import quant_conv  # noqa: E402
from pygraphx.targets.gpu import quant_conv_kernels as qck  # noqa: E402
from pygraphx.targets.gpu import quant_kernels as qk  # noqa: E402
from pygraphx.targets.gpu import quantise_kernels as qe  # noqa: E402
from pygraphx.targets.gpu.quant_conv import FP8_CONV_ENV, fp8_conv_mode  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"

#: Hopper's fp8 tensor cores keep fewer bits than float32 in the Triton fp8 kernels' sums (on
#: an H200 with Triton 3.6; the convolution kernel uses their own accumulation,
#: `qck.FP8_NATIVE`, within `qck.FP8_SUM_ERROR`): on a GPU these whole-program checks against
#: float32 sums fail, and `PGX_GPU_FP8_*=triton` says so when set
#: (`quant.announce_inexact_fp8`); under the interpreter (CI) the sums are float32 and they hold
FP8_INEXACT_ON_GPU = pytest.mark.xfail(
    torch.cuda.is_available(), reason="fp8 tensor-core sums are not float32-exact", strict=True
)
F8 = torch.float8_e4m3fn


def _operands(dtype: torch.dtype, n: int, c: int, h: int, w: int, c_out: int, kernel: int):
    gen = torch.Generator().manual_seed(c * kernel + c_out)
    if dtype == torch.int8:
        x = torch.randint(-128, 128, (n, c, h, w), dtype=torch.int8, generator=gen)
        wgt = torch.randint(-128, 128, (c_out, c, kernel, kernel), dtype=torch.int8, generator=gen)
        return x, wgt
    x = (torch.randn((n, c, h, w), generator=gen) * 40).clamp(-448, 448).to(F8)
    wgt = (torch.randn((c_out, c, kernel, kernel), generator=gen) * 40).clamp(-448, 448).to(F8)
    return x, wgt


@pytest.mark.parametrize("dtype", [torch.int8, F8], ids=["int8", "fp8"])
@pytest.mark.parametrize(
    ("c", "kernel", "stride", "pad", "dilation", "layout", "mode"),
    [
        (64, 3, 1, 1, 1, "nhwc", qck.IMPLICIT),
        (128, 3, 2, 1, 1, "nhwc", qck.IMPLICIT),
        (64, 3, 1, 2, 2, "nhwc", qck.IMPLICIT),
        (64, 1, 2, 0, 1, "nhwc", qck.IMPLICIT),
        (128, 1, 1, 0, 1, "nhwc", qck.POINTWISE),
        (3, 7, 2, 3, 1, "nchw", qck.GATHER),  # the stem: 3 channels, K = 147
        (3, 7, 2, 3, 1, "nhwc", qck.GATHER),
        (64, 3, 1, 1, 1, "nchw", qck.GATHER),  # not channels-last
    ],
)
def test_conv_kernel_matches_torch(dtype, c, kernel, stride, pad, dilation, layout, mode) -> None:
    """The kernel's sums times the per-channel scale equal torch's float64 convolution of the
    same 8-bit values (int8 exactly; fp8 to float32 accumulation under the interpreter), in
    each input mode. On a GPU the fp8 sums are the tensor cores' (`qck.FP8_NATIVE`): each
    within `qck.FP8_SUM_ERROR` of the sum of the products' magnitudes."""
    n, h, w, c_out = 2, 9, 7, 40
    x, weight = _operands(dtype, n, c, h, w, c_out, kernel)
    want = torch.nn.functional.conv2d(
        x.double(), weight.double(), stride=stride, padding=pad, dilation=dilation
    )
    ho, wo = want.shape[2:]
    scale = torch.rand(c_out) * 1e-3
    want = (want * scale.double()[None, :, None, None]).permute(0, 2, 3, 1).reshape(-1, c_out)
    if layout == "nhwc":
        x = x.view(torch.uint8).contiguous(memory_format=torch.channels_last).view(dtype)
    x = x.to(DEVICE)
    k = kernel * kernel * c
    wide = torch.zeros((c_out, k + 5), dtype=torch.uint8)  # rows wider than K: not read
    wide[:, :k] = weight.view(torch.uint8).permute(0, 2, 3, 1).reshape(c_out, k)
    wt = wide.view(dtype)[:, :k].to(DEVICE)
    out = torch.empty((n * ho * wo, c_out), dtype=torch.float32, device=DEVICE)
    geometry = (kernel, (stride, stride), (pad, pad), (dilation, dilation), ho, wo)
    assert qck.input_mode(x, geometry) == mode
    qck.conv(x, wt, scale.to(DEVICE), out, geometry)
    if dtype == F8 and CUDA:
        size = torch.nn.functional.conv2d(
            x.cpu().double().abs(), weight.double().abs(), stride=stride, padding=pad,
            dilation=dilation,
        )  # fmt: skip
        size = (size * scale.double()[None, :, None, None]).permute(0, 2, 3, 1).reshape(-1, c_out)
        err = (out.cpu().double() - want).abs()
        assert (err <= qck.FP8_SUM_ERROR * size + 1e-30).all(), (err / size).max()
        return
    rtol = 1e-6 if dtype == torch.int8 else 1e-5
    np.testing.assert_allclose(
        out.cpu().double().numpy(), want.numpy(), rtol=rtol, atol=rtol * want.abs().max().item()
    )


@pytest.mark.parametrize("qtype", ["int8", "fp8", "fp8-cast"])
def test_epilogue_quantises_to_int8_or_fp8(qtype: str, monkeypatch) -> None:
    """bias + ReLU, then the quantise of the result in the same kernel: the bytes equal the
    standalone quantise kernels' on the stored float value, and (fp8) the values torch's
    cast gives (round half to even); `fp8` with the bytes built from float32 bits
    (`PGX_GPU_FP8_CAST=0`), `fp8-cast` by the hardware conversion where the GPU has one (the
    default: `qe.fp8_cast`)."""
    if qtype == "fp8":
        monkeypatch.setenv(qe.FP8_CAST_ENV, "0")
    n, c, h, w, c_out = 1, 64, 5, 5, 48
    x, weight = _operands(F8, n, c, h, w, c_out, 3)
    x_cl = x.contiguous(memory_format=torch.channels_last).to(DEVICE)
    wt = weight.permute(0, 2, 3, 1).reshape(c_out, -1).contiguous().to(DEVICE)
    scale = (torch.rand(c_out) * 1e-4).to(DEVICE)
    bias = torch.randn(c_out).to(DEVICE)
    qs = torch.tensor([0.02], dtype=torch.float32, device=DEVICE)
    qdtype = torch.int8 if qtype == "int8" else torch.uint8
    ep = qk.Epilogue(["bias", "relu"], bias, qs)
    out = torch.empty((n * h * w, c_out), dtype=torch.float16, device=DEVICE)
    q = torch.empty((n * h * w, c_out), dtype=qdtype, device=DEVICE)
    qck.conv(x_cl, wt, scale, out, (3, (1, 1), (1, 1), (1, 1), h, w), ep, None, q)
    want = torch.empty_like(q)
    if qtype == "int8":
        qe.quantise_int8(out, qs, want)
    else:
        qe.quantise_fp8(out, qs, want.view(F8))
        cast = (out.float() / qs).clamp(-448, 448).to(F8).float()
        np.testing.assert_array_equal(q.view(F8).float().cpu().numpy(), cast.cpu().numpy())
    assert (out >= 0).all()
    np.testing.assert_array_equal(q.cpu().numpy(), want.cpu().numpy())


def test_conv_kernel_rejects_mixed_operands() -> None:
    x = torch.zeros((1, 64, 3, 3), dtype=torch.int8, device=DEVICE)
    wt = torch.zeros((8, 64), dtype=F8, device=DEVICE)
    out = torch.empty((9, 8), device=DEVICE)
    with pytest.raises(ValueError, match="one type"):
        qck.conv(x, wt, torch.ones(8, device=DEVICE), out, (1, (1, 1), (0, 0), (1, 1), 3, 3))


@pytest.mark.parametrize(
    ("c", "n", "mode"),
    [(64, 64, qck.IMPLICIT), (3, 64, qck.GATHER), (256, 64, qck.POINTWISE),
     (64, 256, qck.POINTWISE), (512, 512, qck.IMPLICIT), (128, 96, qck.IMPLICIT)],
)  # fmt: skip
def test_autotuned_tiles_fit_the_layer(c: int, n: int, mode: int) -> None:
    """The tiles autotuning times for a layer: K blocks of one tap (dividing C; a gathered
    input, `CONV_BLOCK_K`), no column block twice as wide as the output channels, and for
    64 output channels the 64-wide tiles (an H200 ran ResNet-50's 3x3 64-channel layer in
    0.019 ms with 128 x 64, 0.023 with the 64 x 64 it had before)."""
    import triton

    configs = [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8})
        for bm, bn, bk, _, _ in qck.CONV_CONFIGS
    ]
    kept = [
        (cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.kwargs["BLOCK_K"])
        for cfg in qck._prune(configs, {"C": c, "N": n}, MODE=mode)
    ]
    assert kept
    for _, bn, bk in kept:
        assert bk == qck.CONV_BLOCK_K if mode == qck.GATHER else c % bk == 0
        assert bn < 2 * n
    if n == 64:
        assert (128, 64, 64) in kept and all(bn == 64 for _, bn, _ in kept)


def _init(rng, name: str, *shape: int, scale: float) -> TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def stem_and_block_model():
    """A 7x7 stride-2 stem of 3 channels (the patch-matrix path) + bias + ReLU, then a
    bottleneck-like block: 3x3 + bias + ReLU, 1x1 + bias + the block input + ReLU, and a
    1x1 stride-2 convolution."""
    rng = np.random.default_rng(5)
    nodes = [
        helper.make_node("Conv", ["img", "w7", "b7"], ["c0"], pads=[3, 3, 3, 3], strides=[2, 2]),
        helper.make_node("Relu", ["c0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w3", "b3"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w1", "b1"], ["c2"]),
        helper.make_node("Add", ["c2", "r0"], ["s"]),
        helper.make_node("Relu", ["s"], ["r2"]),
        helper.make_node("Conv", ["r2", "w1s"], ["out"], strides=[2, 2]),
    ]
    inits = {
        "w7": ((64, 3, 7, 7), 0.1), "b7": ((64,), 0.3), "w3": ((64, 64, 3, 3), 0.05),
        "b3": ((64,), 0.3), "w1": ((64, 64, 1, 1), 0.1), "b1": ((64,), 0.3),
        "w1s": ((24, 64, 1, 1), 0.1),
    }  # fmt: skip
    return _image_model(nodes, rng, inits, "stem_block", (2, 3, 14, 14))


def _image_model(nodes: list, rng, inits: dict, name: str, shape: tuple):
    """(the model of `nodes` from input "img" of `shape` to "out", with random initialisers
    `inits` (name -> (shape, scale)), and its feeds by seed)."""
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("img", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [_init(rng, k, *lens, scale=scale) for k, (lens, scale) in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    def feeds(seed: int) -> dict[str, np.ndarray]:
        return {"img": np.random.default_rng(seed).standard_normal(shape, np.float32)}

    return model, feeds


def downsample_block_model():
    """ResNet's first block of a stage, where two convolutions meet: a 1x1 + bias (the
    shortcut) and a 3x3 + bias, added, ReLU, then a 1x1 that reads the sum quantised."""
    rng = np.random.default_rng(7)
    nodes = [
        helper.make_node("Conv", ["img", "wa", "ba"], ["a"]),
        helper.make_node("Conv", ["img", "wb", "bb"], ["b"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["a", "b"], ["s"]),
        helper.make_node("Relu", ["s"], ["r"]),
        helper.make_node("Conv", ["r", "wc"], ["out"]),
    ]
    inits = {
        "wa": ((64, 64, 1, 1), 0.1), "ba": ((64,), 0.3), "wb": ((64, 64, 3, 3), 0.05),
        "bb": ((64,), 0.3), "wc": ((16, 64, 1, 1), 0.1),
    }  # fmt: skip
    return _image_model(nodes, rng, inits, "downsample_block", (2, 64, 6, 5))


def _quantised(model, feeds, kind: str, fp16: bool) -> pygraphx.Program:
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    getattr(pygraphx, f"quantize_{kind}")(prog, "ref", [feeds(k) for k in range(1, 4)])
    if fp16:
        pygraphx.quantize_fp16(prog)
    return prog


def _ref_and_gpu(ref: pygraphx.Program, gpu: pygraphx.Program, feeds) -> tuple:
    """(the `ref` target's output, the gpu target's, run twice: on a GPU capture, then replay)
    of the two programs on the same feeds; the gpu run had no numpy fallback."""
    ref.compile(pygraphx.get_target("ref"))
    gpu.compile(pygraphx.get_target("gpu", **({} if CUDA else {"device": "cpu"})))
    want = np.array(ref.run(feeds(0))[0])
    for _ in range(2):
        got = np.array(gpu.run(feeds(0))[0])
    assert not gpu._executable.fallbacks, gpu._executable.fallbacks
    return want, got


def _spy_epilogues(monkeypatch, outs: list | None = None) -> list[tuple]:
    """(operand dtype, epilogue ops..., quantised type or "-") of every `qck.conv` call (and
    into `outs`: (its ops, its float output's dtype))."""
    seen: list[tuple] = []
    real = qck.conv

    def spy(x, wt, scale, out, geometry, epilogue=None, residual=None, qout=None, **rows):
        ops = () if epilogue is None else tuple(epilogue.ops)
        seen.append((str(x.dtype), *ops, "-" if qout is None else str(qout.dtype)))
        if outs is not None:
            outs.append((ops, out.dtype))
        return real(x, wt, scale, out, geometry, epilogue, residual, qout, **rows)

    monkeypatch.setattr(qck, "conv", spy)
    return seen


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@FP8_INEXACT_ON_GPU
def test_fp8_convolutions_match_ref_of_the_folded_program(fp16: bool, monkeypatch) -> None:
    """Every fp8 convolution is one fp8 kernel with its scale, bias, residual, ReLU and the
    next convolution's fp8 quantise inside; the numbers are the `ref` target's on the same
    program with `fold_fp8` applied (fp8 sums in float32, the scale on the sum)."""
    from pygraphx.passes.fold_fp8 import fold_fp8

    monkeypatch.setenv(FP8_CONV_ENV, "triton")
    seen = _spy_epilogues(monkeypatch)
    model, feeds = stem_and_block_model()
    ref, gpu = _quantised(model, feeds, "fp8", fp16), _quantised(model, feeds, "fp8", fp16)
    fold_fp8(ref.get_main_module())
    assert sum(i.op.name == "quant_convolution" for i in ref.get_main_module().instructions) == 4
    want, got = _ref_and_gpu(ref, gpu, feeds)
    kinds = {s[1:] for s in seen}
    assert {s[0] for s in seen} == {"torch.float8_e4m3fn"}, seen
    # stem: bias + ReLU, quantised (its float value feeds the residual add too); the block's
    # convolutions: bias + ReLU and bias + residual + ReLU, each quantised for the next
    assert ("bias", "relu", "torch.float8_e4m3fn") in kinds, kinds
    assert ("bias", "residual", "relu", "torch.float8_e4m3fn") in kinds, kinds
    assert ("-",) in kinds, kinds  # the last convolution: its scale only
    assert got.shape == want.shape and np.isfinite(got).all()
    rtol = 2e-3 if fp16 else 1e-5
    near = np.isclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())
    assert near.mean() > 0.99, near.mean()


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_int8_convolutions_are_one_kernel_each(fp16: bool, monkeypatch) -> None:
    """int8: the same model's block convolutions run as `qck.conv` with their groups and the
    next int8 quantise inside, with the `ref` target's numbers (exact int32 sums)."""
    monkeypatch.setenv("PGX_GPU_INT8_GEMM", "triton")
    seen = _spy_epilogues(monkeypatch)
    model, feeds = stem_and_block_model()
    ref, gpu = _quantised(model, feeds, "int8", fp16), _quantised(model, feeds, "int8", fp16)
    want, got = _ref_and_gpu(ref, gpu, feeds)
    kinds = {s[1:] for s in seen}
    assert ("bias", "residual", "relu", "torch.int8") in kinds, kinds
    assert ("bias", "relu", "torch.int8") in kinds, kinds
    rtol = 2e-3 if fp16 else 1e-5
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())


def _hopper() -> bool:
    return CUDA and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.parametrize("mode", [None, "cudnn", "triton"])
def test_fp8_convolution_path_by_device_and_setting(mode, monkeypatch) -> None:
    """Unset `PGX_GPU_FP8_CONV`: the fp8 convolutions become the fp8 kernel (`fold_fp8` makes
    `quant_convolution`s) on a Hopper GPU and stay cuDNN half on dequantised values elsewhere
    (the CPU, under the interpreter too); `cudnn` / `triton` choose either where Triton runs;
    an unknown value is an error."""
    if mode is None:
        monkeypatch.delenv(FP8_CONV_ENV, raising=False)
    else:
        monkeypatch.setenv(FP8_CONV_ENV, mode)
    model, feeds = stem_and_block_model()
    target = pygraphx.get_target("gpu", **({} if CUDA else {"device": "cpu"}))
    gpu = _quantised(model, feeds, "fp8", True)
    gpu.compile(target)
    names = [i.op.name for i in gpu.get_main_module().instructions]
    native = mode == "triton" or (mode is None and _hopper())
    if native:
        assert names.count("quant_convolution") == 4 and "convolution" not in names
    else:
        assert names.count("convolution") == 4 and "quant_convolution" not in names
    monkeypatch.setenv(FP8_CONV_ENV, "fast")
    with pytest.raises(ValueError, match="PGX_GPU_FP8_CONV"):
        _quantised(model, feeds, "fp8", True).compile(target)


def test_fp8_convolutions_the_kernel_declines_are_not_folded(monkeypatch) -> None:
    """With the fp8 kernel chosen, a convolution it does not run (asymmetric padding) stays
    cuDNN half on dequantised values (not folded: folded, it would have run through the numpy
    fallback); the other is folded; the output is the `ref` target's of the same program."""
    monkeypatch.setenv(FP8_CONV_ENV, "triton")
    rng = np.random.default_rng(11)
    nodes = [
        helper.make_node("Conv", ["img", "wa", "ba"], ["a"], pads=[0, 0, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "wb"], ["out"], pads=[1, 1, 1, 1]),
    ]
    inits = {"wa": ((64, 64, 2, 2), 0.1), "ba": ((64,), 0.3), "wb": ((16, 64, 3, 3), 0.05)}
    model, feeds = _image_model(nodes, rng, inits, "asymmetric", (2, 64, 8, 8))
    gpu = _quantised(model, feeds, "fp8", False)
    want, got = _ref_and_gpu(_quantised(model, feeds, "fp8", False), gpu, feeds)
    names = [i.op.name for i in gpu.get_main_module().instructions]
    assert names.count("quant_convolution") == 1 and names.count("convolution") == 1, names
    rms = np.sqrt(np.mean((got - want) ** 2) / np.mean(want**2))
    assert rms < 1e-2, rms


def test_fp8_conv_mode_default_is_the_device(monkeypatch) -> None:
    """`fp8_conv_mode`: `triton` by default only where `_hopper` says so (compute capability
    9.x), `cudnn` for the CPU, no device, or another GPU; the setting wins either way."""
    monkeypatch.delenv(FP8_CONV_ENV, raising=False)
    assert fp8_conv_mode(None) == "cudnn"
    assert fp8_conv_mode(torch.device("cpu")) == "cudnn"
    monkeypatch.setattr(quant_conv, "_hopper", lambda device: True)
    assert fp8_conv_mode(torch.device("cuda", 0)) == "triton"
    monkeypatch.setenv(FP8_CONV_ENV, "cudnn")
    assert fp8_conv_mode(torch.device("cuda", 0)) == "cudnn"
    monkeypatch.setattr(quant_conv, "_hopper", lambda device: False)
    assert fp8_conv_mode(torch.device("cuda", 0)) == "cudnn"
    monkeypatch.setenv(FP8_CONV_ENV, "triton")
    assert fp8_conv_mode(torch.device("cpu")) == "triton"


@pytest.mark.parametrize("kind", ["int8", pytest.param("fp8", marks=FP8_INEXACT_ON_GPU)])
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_two_convolutions_meet_in_one_epilogue(kind: str, fp16: bool, monkeypatch) -> None:
    """Where a block's shortcut convolution and its last convolution are added (bias each,
    then ReLU), the second runs with the first's dequantise and bias, the add, the ReLU and
    the next quantise as its epilogue ("residual_affine"): no separate group or quantise;
    the numbers are the `ref` target's on the same program. The shortcut writes its
    dequantised value in the program's type (fp8: its float32 sums scaled in its kernel,
    `EpiloguePlan.use_prescale`, as the group rounds them)."""
    from pygraphx.passes.fold_fp8 import fold_fp8

    monkeypatch.setenv("PGX_GPU_INT8_GEMM", "triton")
    monkeypatch.setenv(FP8_CONV_ENV, "triton")
    outs: list = []
    seen = _spy_epilogues(monkeypatch, outs)
    model, feeds = downsample_block_model()
    ref, gpu = _quantised(model, feeds, kind, fp16), _quantised(model, feeds, kind, fp16)
    if kind == "fp8":
        fold_fp8(ref.get_main_module())
    want, got = _ref_and_gpu(ref, gpu, feeds)
    qtype = "torch.int8" if kind == "int8" else "torch.float8_e4m3fn"
    assert ("bias", "residual_affine", "relu", qtype) in {s[1:] for s in seen}, seen
    names = [i.op.name for i in gpu.get_main_module().instructions]
    assert names.count("quant_convolution") == 3, names
    shortcut = torch.float16 if fp16 else torch.float32
    assert outs[0] == ((), shortcut), outs  # the shortcut runs first
    rtol = 2e-3 if fp16 else 1e-5
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())
