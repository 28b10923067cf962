"""The native layer-norm kernel (`native_layernorm.py`, `native/kernels/layernorm.c`) against
float64 torch, its bf16 copy against `.to(torch.bfloat16)`, in place over its input where
nothing else reads it (`layernorm._over_input`), and in models against ONNX Runtime;
`PGX_CPU_LAYERNORM_NATIVE=0` / `PGX_CPU_LAYERNORM_INPLACE=0` keep the old kernels."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import pygraphx  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import native_layernorm  # noqa: E402
from tests.targets.test_gemm14_residual import block  # noqa: E402


def _native_or_skip(copy: bool = False) -> None:
    try:
        lib = native_layernorm.library()
    except native.NativeUnavailable as exc:
        pytest.skip(str(exc))
    if copy and not lib.ln_bf16_supported():
        pytest.skip("this build has no AVX-512 BF16 (the bf16 copy)")


GEN = torch.Generator().manual_seed(1414)


@pytest.mark.parametrize("dims", [(37, 45), (3, 7, 83), (1, 128, 768), (2, 5, 16)])
@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("copy", [False, True], ids=["f32", "f32+bf16"])
def test_kernel_against_float64(monkeypatch, dims, affine, threads, copy) -> None:
    _native_or_skip(copy)
    monkeypatch.setattr(native_layernorm, "get_num_threads", lambda: threads)
    n = dims[-1]
    x = torch.randn(dims, generator=GEN) * 3 + 1
    w = torch.randn(n, generator=GEN) if affine[0] else None
    b = torch.randn(n, generator=GEN) if affine[1] else None
    want = torch.nn.functional.layer_norm(x.double(), (n,), *(
        None if t is None else t.double() for t in (w, b)), eps=1e-5)  # fmt: skip
    got = native_layernorm.LayerNorm(dims, w, b, 1e-5, copy)(x)
    y, yb = got if copy else (got, None)
    assert y.dtype == torch.float32 and y.shape == dims and y.data_ptr() != x.data_ptr()
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
    if copy:
        assert yb.dtype == torch.bfloat16 and torch.equal(yb, y.to(torch.bfloat16))
    kept = x.clone()
    over = native_layernorm.LayerNorm(dims, w, b, 1e-5, copy, inplace=True)(x)
    y2 = over[0] if copy else over
    assert y2.data_ptr() == x.data_ptr() and torch.equal(y2, y)
    assert not torch.equal(x, kept)


def test_input_it_does_not_take_goes_to_torch(caplog) -> None:
    _native_or_skip()
    x = torch.randn(6, 40, generator=GEN)[:, :20]  # strided rows
    w = torch.randn(20, generator=GEN)
    got = native_layernorm.LayerNorm((6, 20), w, None, 1e-5)(x)
    torch.testing.assert_close(got, torch.layer_norm(x, (20,), w, None, 1e-5))
    assert "not contiguous float32" in caplog.text


def _norm_steps(prog) -> list:
    steps = prog._executable.lowered.steps
    return [
        s for s in steps if s.instructions[0].op.name == "reduce_mean" and len(s.instructions) > 3
    ]


def _check(model, x, bf16: bool = False) -> list:
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    if bf16:
        pygraphx.quantize_bf16(prog)
    prog.compile(CpuTarget(threads=1))
    for _ in range(2):
        for g, w in zip(prog.run({"x": x}), want, strict=True):
            if bf16:
                rel = np.sqrt(np.mean((g - w) ** 2) / np.mean(w**2))
                assert rel < 2e-2, rel
            else:
                np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
    return _norm_steps(prog)


@pytest.mark.parametrize("batch", [1, 3])
def test_block_norms_in_place(batch: int) -> None:
    """Of the block's three norms, the two after a residual sum (a fresh tensor only the norm
    reads) write over it; the first reads the program's input."""
    _native_or_skip()
    steps = _check(*block(batch))
    assert len(steps) == 3 and sum(1 for s in steps if s.unfused) == 2


@pytest.mark.parametrize("expose, over", [("y", 2), ("late", 1)])
def test_norm_of_a_read_value_is_not_in_place(expose: str, over: int) -> None:
    """y returned: its norm reads the program's input anyway, the other two still write over
    their sums; y read late: its product adds it apart (into a slot, not a fresh tensor), so
    z's norm keeps its input too; all against ORT."""
    _native_or_skip()
    steps = _check(*block(3, expose))
    assert sum(1 for s in steps if s.unfused) == over


def test_switches(monkeypatch) -> None:
    _native_or_skip()
    monkeypatch.setenv(native_layernorm.INPLACE_ENV, "0")
    assert not any(s.unfused for s in _check(*block(3)))
    monkeypatch.setenv(native_layernorm.ENV, "0")
    calls = []
    monkeypatch.setattr(native_layernorm, "LayerNorm", lambda *a, **k: calls.append(a))
    _check(*block(3))
    assert not calls


def test_bf16_program_copy_in_one_pass(monkeypatch) -> None:
    """A post-norm block in a bf16 program: the norms' float32 results and their bf16 copies
    from the native kernel (copy=True), within bf16's error of ORT's float32."""
    _native_or_skip(copy=True)
    made = []
    real = native_layernorm.LayerNorm

    def spy(*args, **kwargs):
        made.append(args[4] if len(args) > 4 else kwargs.get("copy", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(native_layernorm, "LayerNorm", spy)
    _check(*block(3), bf16=True)
    assert True in made


def test_observer_sees_the_input_kept() -> None:
    """The observer path (profiling, per-instruction checks) runs the out-of-place twin: a
    value it holds without copying is not overwritten by the norm."""
    _native_or_skip()
    model, x = block(3)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(CpuTarget(threads=1))
    inputs = {id(s.instructions[0].inputs[0]) for s in _norm_steps(prog) if s.unfused}
    held, copies = {}, {}

    def observe(ins, value, seconds) -> None:
        if id(ins) in inputs:
            held[id(ins)] = value
            copies[id(ins)] = np.array(value, copy=True)

    prog.run({"x": x}, observer=observe)
    assert len(held) == 2
    for k, v in held.items():
        np.testing.assert_array_equal(np.asarray(v), copies[k])


def test_no_native_kernel_takes_torch(monkeypatch, caplog) -> None:
    """`PGX_NATIVE=off` (as without a compiler): said once, torch's kernel, same results."""
    monkeypatch.setenv(native.NATIVE_ENV, "off")
    fresh = native.BoundLibrary(native_layernorm.KERNEL, native_layernorm._bind)
    monkeypatch.setattr(native_layernorm, "_BOUND", fresh)
    monkeypatch.setattr(native.compiler, "_ANNOUNCED", set())
    steps = _check(*block(3))
    assert len(steps) == 3 and not any(s.unfused for s in steps)
    assert native_layernorm.KERNEL in caplog.text
