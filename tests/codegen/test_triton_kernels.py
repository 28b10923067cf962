"""Generated Triton kernels beyond the models' groups: rows longer than one block (GPT-2's
50257-wide softmax), fp16 and bf16 groups (computed in float32), the disk cache and its key,
the build's errors, and an ahead-of-time compile of the sources for CUDA and ROCm targets
(no GPU needed: this checks what the interpreter does not, that the real compiler takes it)."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from pygraphx.codegen.trace import GroupTrace, module_trace
from pygraphx.ir.module import Module
from pygraphx.ir.shape import Shape
from pygraphx.ops.base import make_op
from tests.codegen.aot_compile import run_jobs
from tests.codegen.conftest import needs_triton
from tests.codegen.groupcheck import assert_close, run_three


def scaled_reduce(red: str, lens: list[int], dtype: str = "float_type", **attrs: object):
    """x * 0.5 + y, then `red`: an attention-like prologue before the reduction."""
    body = Module("main:fused_reduce0")
    x = body.add_parameter("x0", Shape(dtype, lens))
    y = body.add_parameter("x1", Shape(dtype, lens))
    half = body.add_parameter("x2", Shape(dtype, lens))
    v = body.add_instruction(make_op("add"), [body.add_instruction(make_op("mul"), [x, half]), y])
    body.add_return([body.add_instruction(make_op(red, **attrs), [v])])
    shapes = [Shape(dtype, lens), Shape(dtype, lens, [0] * (len(lens) - 1) + [1]),
              Shape(dtype, lens, [0] * len(lens))]  # fmt: skip
    return body, module_trace(body, shapes, "fused_reduce")


@pytest.mark.parametrize(
    "red,attrs",
    [("softmax", {"axis": 1}), ("logsoftmax", {"axis": 1}), ("reduce_sum", {"axes": (1,)}),
     ("reduce_mean", {"axes": (1,)}), ("reduce_max", {"axes": (1,)}),
     ("reduce_min", {"axes": (1,)})],
)  # fmt: skip
def test_gpt2_vocab_wide_rows_loop(red: str, attrs: dict, interpret: object) -> None:
    body, group = scaled_reduce(red, [2, 50257], **attrs)
    got = run_three(group, body, np.random.default_rng(1))
    assert_close(got, rtol=1e-5, atol=1e-6, what=red)


def test_looped_kernel_is_used_for_long_rows(interpret: object) -> None:
    from pygraphx.codegen.triton.kernels import kernel_source

    _, long_group = scaled_reduce("softmax", [2, 50257], axis=1)
    _, short_group = scaled_reduce("softmax", [2, 768], axis=1)
    assert kernel_source(long_group).kind == "row_loop"
    assert kernel_source(short_group).kind == "row"


@pytest.mark.parametrize("dtype", ["half_type", "bf16_type"])
@pytest.mark.parametrize("red,attrs", [("softmax", {"axis": 1}), ("reduce_mean", {"axes": (1,)})])
def test_low_precision_computes_in_float32(
    dtype: str, red: str, attrs: dict, interpret: object
) -> None:
    body, group = scaled_reduce(red, [3, 300], dtype, **attrs)
    got = run_three(group, body, np.random.default_rng(2))
    # numpy, torch and Triton compute the group in float32 and round once: equal to 1 ulp;
    # ref rounds after every instruction
    eps = float(ml_dtypes.finfo(group.output.dtype).eps)
    assert_close(got, rtol=4 * eps, atol=4 * eps, what=f"{dtype} {red}")
    wide = got["numpy"].astype(np.float64)
    np.testing.assert_allclose(got["triton"].astype(np.float64), wide, rtol=eps, atol=eps)


def test_fp16_gelu_group(interpret: object) -> None:
    body = Module("main:pointwise0")
    lens = [4, 300]
    x = body.add_parameter("x0", Shape("half_type", lens))
    k = [body.add_parameter(f"x{j}", Shape("half_type", lens)) for j in (1, 2)]
    e = body.add_instruction(make_op("erf"), [body.add_instruction(make_op("mul"), [x, k[0]])])
    one = body.add_instruction(make_op("add"), [e, k[1]])
    body.add_return([body.add_instruction(make_op("mul"), [x, one])])
    shapes = [Shape("half_type", lens)] + [Shape("half_type", lens, [0, 0])] * 2
    group = module_trace(body, shapes, "pointwise")
    got = run_three(group, body, np.random.default_rng(3))
    assert_close(got, rtol=2e-3, atol=2e-3, what="fp16 gelu")


def _softmax_group() -> GroupTrace:
    return scaled_reduce("softmax", [4, 64], axis=1)[1]


def test_kernel_cache_on_disk(interpret: Path) -> None:
    from pygraphx.codegen.triton.build import build_kernel

    group = _softmax_group()
    first = build_kernel(group, "cpu")
    again = build_kernel(group, "cpu")
    assert first.key == again.key and first.source == again.source
    files = sorted(p.name for p in interpret.iterdir())
    assert files == [f"k{first.key}.py"]  # written once, under $PGX_CACHE_DIR
    assert "@triton.jit" in first.source and "tl.max" in first.source
    other = build_kernel(scaled_reduce("softmax", [4, 65], axis=1)[1], "cpu")
    assert other.key != first.key  # shapes are in the source, so in the key


def test_call_checks_layout(interpret: object) -> None:
    import torch

    from pygraphx.codegen.triton.build import build_kernel

    kernel = build_kernel(_softmax_group(), "cpu")
    x = torch.zeros(4, 64)
    with pytest.raises(ValueError, match="main:fused_reduce0: input 1"):
        kernel([x, x, x], torch.empty(4, 64))


def test_unsupported_reduction_says_why() -> None:
    from pygraphx.codegen.triton.emitter import UnsupportedGroup
    from pygraphx.codegen.triton.kernels import kernel_source

    body = Module("main:fused_reduce1")
    x = body.add_parameter("x0", Shape("float_type", [4, 8]))
    body.add_return([body.add_instruction(make_op("reduce_sum", axes=(0,)), [x])])
    group = module_trace(body, [Shape("float_type", [4, 8])], "fused_reduce")
    with pytest.raises(UnsupportedGroup, match="not over trailing axes"):
        kernel_source(group)


@needs_triton
def test_sources_compile_ahead_of_time(tmp_path: Path) -> None:
    """The generated sources go through Triton's real compiler, to CUDA sm_90 and ROCm
    gfx942 binaries: a long-row softmax, fp16 and max reductions, tanh-GELU."""
    groups = [
        scaled_reduce("softmax", [2, 50257], axis=1)[1],
        scaled_reduce("reduce_mean", [8, 768], "half_type", axes=(1,))[1],
        scaled_reduce("reduce_max", [8, 768], axes=(1,))[1],
        _gelu_tanh_group(),
    ]
    compile_ahead_of_time(groups, tmp_path)


def compile_ahead_of_time(groups: list[GroupTrace], where: Path) -> None:
    """Compile the kernels of `groups` for sm_90 and gfx942 in a fresh process (the
    interpreter, once used, leaves `triton.language` patched in this one)."""
    from pygraphx.codegen.triton.emitter import tl_dtype
    from pygraphx.codegen.triton.kernels import kernel_source

    jobs = []
    for k, group in enumerate(groups):
        src = kernel_source(group)
        path = where / f"k{k}.py"
        path.write_text(src.source)
        sig = {f"in{j}": "*" + _short(tl_dtype(d.dtype)) for j, d in enumerate(group.inputs)}
        sig["out"] = "*" + _short(tl_dtype(group.output.dtype))
        sig["BLOCK"] = "constexpr"
        jobs.append(
            {"path": str(path), "signature": sig, "block": 1 if src.kind == "row" else 1024}
        )
    assert len(run_jobs(jobs, where)) == 2 * len(jobs)


def _short(tl_name: str) -> str:
    names = {
        "tl.float32": "fp32", "tl.float16": "fp16", "tl.bfloat16": "bf16", "tl.float64": "fp64",
        "tl.int1": "i1", "tl.int8": "i8", "tl.uint8": "u8", "tl.int32": "i32", "tl.int64": "i64",
    }  # fmt: skip
    return names[tl_name]


def _gelu_tanh_group() -> GroupTrace:
    body = Module("main:pointwise1")
    lens = [8, 3072]
    x = body.add_parameter("x0", Shape("float_type", lens))
    c = body.add_parameter("x1", Shape("float_type", lens))
    cube = body.add_instruction(make_op("pow"), [x, c])
    t = body.add_instruction(make_op("tanh"), [body.add_instruction(make_op("add"), [x, cube])])
    body.add_return([body.add_instruction(make_op("mul"), [x, t])])
    return module_trace(body, [Shape("float_type", lens), Shape("float_type", lens, [0, 0])],
                        "pointwise")  # fmt: skip


@needs_triton
@pytest.mark.parametrize("source, target", [("fp8e4m3fn_type", "float_type"),
                                            ("float_type", "fp8e5m2fnuz_type")])  # fmt: skip
def test_fp8_casts_are_refused_with_the_reason(source: str, target: str) -> None:
    """fp8 conversions stay on the torch path (ONNX's fp8 rounding and saturation rules are not
    Triton's): the generator refuses the group and says why, so the caller can announce it."""
    from pygraphx.codegen.triton.emitter import UnsupportedGroup
    from pygraphx.codegen.triton.kernels import kernel_source

    body = Module("main:cast")
    x = body.add_parameter("x0", Shape(source, [4, 8]))
    body.add_return([body.add_instruction(make_op("convert", target_type=target), [x])])
    group = module_trace(body, [x.shape], "pointwise")
    with pytest.raises(UnsupportedGroup, match="float8"):
        kernel_source(group)


def test_autotune_pick_prefers_the_default_among_near_ties() -> None:
    """The fastest candidate wins unless one before it (the default first) is within `TIE`
    of it: a choice between configurations that time alike is not left to noise."""
    from pygraphx.codegen.triton.timing import TIE, pick

    options = ["default", "b", "c"]
    assert pick([10.0, 5.0, 5.1], options) == "b"  # clearly faster
    assert pick([10.0 * (1 + TIE / 2), 10.0, 12.0], options) == "default"  # within TIE
    assert pick([10.0 * (1 + 2 * TIE), 10.0, 10.0], options) == "b"  # beyond it: the first fastest
    with pytest.raises(ValueError, match="2 times for 3 options"):
        pick([1.0, 2.0], options)
