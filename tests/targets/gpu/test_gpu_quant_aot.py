"""The gpu target's int8 / fp8 Triton kernels (`quant_kernels`, `quant_conv_kernels`) through
Triton's real compiler, for CUDA sm_90 (H100, H200) and, the int8 ones, ROCm gfx942, with no
GPU (`tests/codegen/aot_compile.py`, in a fresh process): every constexpr variant the target
launches (int8 or fp8 operands, the convolution's three input modes, each epilogue op, the
quantise of the result to int8 or fp8 with and without the float store, the output types) and
every autotuned tile, whose shared memory must fit one sm_90 block.

The other tests run these kernels under Triton's interpreter on the CPU, which executes them as
Python and checks no types: `_dot8`'s int8 `tl.dot` after an fp8 `return` in a constexpr `if`
passed there, while the compiler, which goes on past that `return`, rejected every fp8 kernel
on an H200 (Triton 3.6)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

pytest.importorskip("triton")

from pygraphx.codegen.triton.quantise import MAGIC  # noqa: E402
from pygraphx.targets.gpu import quant_conv_kernels as qck  # noqa: E402
from pygraphx.targets.gpu import quant_kernels as qk  # noqa: E402
from pygraphx.targets.gpu import quantise_kernels as qe  # noqa: E402
from tests.codegen.aot_compile import run_jobs  # noqa: E402

SM90 = ["cuda", 90, 32]
GFX942 = ["hip", "gfx942", 64]
#: the shared memory one block may use on sm_90 (227 KiB; launches needing more fail)
SM90_SHARED = 232448
OUT_TYPES = ("fp16", "fp32", "bf16")
#: epilogues (`qk.Epilogue` ops), each op at least once and three at most
EPILOGUES = [
    (), ("bias",), ("residual", "relu"), ("bias", "gelu"), ("bias", "residual", "relu"),
    ("gelu",), ("bias", "residual_affine", "relu"),
]  # fmt: skip
#: (QUANT, STORE): the float result only, or also its int8 / fp8 quantise, or that alone
QUANTS = [(0, True), (1, True), (1, False), (2, True), (2, False)]


def _job(
    module, kernel: str, types: dict, constexprs: dict, options: dict, name: str,
    aligned_strides: bool = True,
) -> dict:  # fmt: skip
    """An `aot_compile` job for `module.kernel`: arguments typed by `types` (else i32),
    pointers (and strides, if `aligned_strides`) 16-divisible, as Triton's launcher marks
    aligned tensors and strides; fp8 kernels and the hardware fp8 conversion for sm_90 alone."""
    fn = getattr(module, kernel)
    if "CAST" in fn.arg_names and "CAST" not in constexprs:  # a constexpr, as launches pass it
        constexprs = {**constexprs, "CAST": False}
    if "PRE_RES" in fn.arg_names and "PRE_RES" not in constexprs:  # likewise (`tile_launch`)
        constexprs = {**constexprs, "PRE_RES": False}
    if "RECIP" in fn.arg_names and "RECIP" not in constexprs:  # likewise (`launch_arguments`)
        constexprs = {**constexprs, "RECIP": False}
    signature = {a: "constexpr" if a in constexprs else types.get(a, "i32") for a in fn.arg_names}
    strides = ("stride", "sx") if aligned_strides else ()
    attrs = [a for a in fn.arg_names if signature[a][0] == "*" or a.startswith(strides)]
    targets = [SM90] if constexprs.get("FP8") or constexprs.get("CAST") else [SM90, GFX942]
    return {
        "kernel": f"{module.__name__}:{kernel}", "signature": signature, "attrs": attrs,
        "constexprs": constexprs, "options": options, "targets": targets, "name": name,
    }  # fmt: skip


def _product_types(fp8: bool, out: str, quant: int, ops: tuple) -> dict:
    """The pointer types of a GEMM / convolution launch (`qk._epilogue_args`: the scale stands
    in for a missing bias, residual or quantised output)."""
    operand = "*u8" if fp8 else "*i8"  # fp8 operands are passed as their bytes
    return {
        "a_ptr": operand, "x_ptr": operand, "w_ptr": operand, "scale_ptr": "*fp32",
        "out_ptr": f"*{out}", "bias_ptr": f"*{out}" if "bias" in ops else "*fp32",
        "res_ptr": f"*{out}" if {"residual", "residual_affine"} & set(ops) else "*fp32",
        "rs_ptr": "*fp32", "rb_ptr": "*fp32",
        "qs_ptr": "*fp32", "q_ptr": {0: "*fp32", 1: "*i8", 2: "*u8"}[quant],
        "g1": "fp32", "g2": "fp32", "g3": "fp32",
    }  # fmt: skip


def _product_job(fp8, mode, quant, store, ops, out, tile, name) -> dict:
    """A `_int8_gemm_kernel` (`mode` None) or `_conv_kernel` launch; `tile` = (BLOCK_M,
    BLOCK_N, BLOCK_K, warps, stages)."""
    codes = [qk.Epilogue.CODES[op] for op in ops] + [0] * (3 - len(ops))
    bm, bn, bk, warps, stages = tile
    constexprs = {
        "E0": codes[0], "E1": codes[1], "E2": codes[2], "QUANT": quant, "STORE": store,
        "MAGIC": MAGIC, "FP8": fp8, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8,
        "FP8_PTRS": fp8,  # on CUDA fp8 bytes are read through fp8 pointers (`qk._fp8_pointers`)
    }  # fmt: skip
    types = _product_types(fp8, out, quant, ops)
    options = {"num_warps": warps, "num_stages": stages}
    if mode is None:
        return _job(qk, "_int8_gemm_kernel", types, constexprs, options, name)
    aligned = mode != qck.GATHER  # a gathered input: the stem's 3 channels, any strides
    constexprs["MODE"] = mode
    constexprs["FP8_NATIVE"] = fp8 and qck.FP8_NATIVE  # as `qck.launch_arguments` passes it
    # an fp8 convolution's fp8 quantise by the hardware conversion, as on sm_89+ (sm_90 only)
    constexprs["CAST"] = fp8 and quant == 2
    return _job(qck, "_conv_kernel", types, constexprs, options, name, aligned)


def _untimed_tile(m: int, conv: bool) -> tuple[int, ...]:
    """The tile launched where nothing is timed (`qk._config`, 8 warps, 4 stages)."""
    config = qk._config(m)
    bk = qck.CONV_BLOCK_K if conv else config["BLOCK_K"]
    return (config["BLOCK_M"], config["BLOCK_N"], bk, 8, 4)


def launch_variant_jobs() -> list[dict]:
    """Every (operand type, input mode, QUANT, STORE) of the GEMM and convolution kernels,
    with the epilogues, output types and untimed tiles in rotation; and the element-wise
    kernels for each type they take."""
    jobs = []
    modes = [None, qck.IMPLICIT, qck.POINTWISE, qck.GATHER]
    cases = itertools.product(modes, (False, True), QUANTS)
    for i, (mode, fp8, (quant, store)) in enumerate(cases):
        ops, out = EPILOGUES[i % len(EPILOGUES)], OUT_TYPES[i % len(OUT_TYPES)]
        tile = _untimed_tile(16 if i % 2 else 1024, mode is not None)
        kind = "gemm" if mode is None else f"conv{mode}"
        name = f"{kind}-{'fp8' if fp8 else 'int8'}-q{quant}{'s' if store else ''}-{out}-{ops}"
        jobs.append(_product_job(fp8, mode, quant, store, ops, out, tile, name))
    return jobs + _elementwise_jobs()


def _elementwise_jobs() -> list[dict]:
    """`quantise_int8`, `quantise_fp8` / `fake_quantise_fp8` and `dequantise` for each type."""
    jobs, options = [], {"num_warps": 4}
    for x in OUT_TYPES:
        block = {"BLOCK": 1024, "MAGIC": MAGIC}
        types = {"x_ptr": f"*{x}", "scale_ptr": "*fp32", "out_ptr": "*i8"}
        jobs.append(_job(qe, "_quantise_int8_kernel", types, block, options, f"q8-{x}"))
        for trip, cast in ((False, False), (False, True), (True, False)):
            types = dict(types, out_ptr=f"*{x}" if trip else "*u8")
            fp8 = {**block, "ROUND_TRIP": trip, "CAST": cast}
            name = f"qf8-{x}-{trip}-{cast}"
            jobs.append(_job(qe, "_quantise_fp8_kernel", types, fp8, options, name))
        for acc in ("i32", "fp32"):
            types = {"acc_ptr": f"*{acc}", "scale_ptr": "*fp32", "out_ptr": f"*{x}"}
            tile = {"BLOCK_M": qe._BLOCK_M, "BLOCK_N": qe._BLOCK_N}
            jobs.append(_job(qe, "_dequantise_kernel", types, tile, options, f"dq-{acc}-{x}"))
    return jobs


def autotuned_tile_jobs() -> list[dict]:
    """Every tile `triton.autotune` may launch: `qk.GEMM_CONFIGS`, and `qck.CONV_CONFIGS` per
    input mode (a gathered input only with `CONV_BLOCK_K`, as `qck._prune` keeps), int8 and
    fp8, with a quantising three-op epilogue."""
    jobs = []
    ops = ("bias", "residual", "relu")
    for fp8, tile in itertools.product((False, True), qk.GEMM_CONFIGS):
        name = f"gemm-{'fp8' if fp8 else 'int8'}-{tile}"
        jobs.append(_product_job(fp8, None, 2 if fp8 else 1, True, ops, "fp16", tile, name))
    modes = (qck.IMPLICIT, qck.POINTWISE, qck.GATHER)
    for fp8, mode, tile in itertools.product((False, True), modes, qck.CONV_CONFIGS):
        if mode == qck.GATHER and tile[2] != qck.CONV_BLOCK_K:
            continue
        name = f"conv{mode}-{'fp8' if fp8 else 'int8'}-{tile}"
        jobs.append(_product_job(fp8, mode, 2 if fp8 else 1, False, ops, "fp16", tile, name))
    return jobs


def _compile(jobs: list[dict], where: Path) -> None:
    """Compile `jobs` for their targets; each must compile and fit sm_90's shared memory."""
    oks = run_jobs(jobs, where)
    assert len(oks) == sum(len(job["targets"]) for job in jobs)
    shared = {line.rsplit(" shared=", 1)[0]: int(line.rsplit("=", 1)[1]) for line in oks}
    too_big = {k: b for k, b in shared.items() if k.startswith("ok cuda") and b > SM90_SHARED}
    assert not too_big, too_big


def test_every_launch_variant_compiles_for_sm90_and_gfx942(tmp_path: Path) -> None:
    _compile(launch_variant_jobs(), tmp_path)


@pytest.mark.slow
def test_every_autotuned_tile_compiles_for_sm90(tmp_path: Path) -> None:
    _compile(autotuned_tile_jobs(), tmp_path)


def test_the_variants_cover_every_constexpr_value() -> None:
    """The launch variants hold each value the gpu target passes for each constexpr: int8 and
    fp8, QUANT 0-2, with and without the float store, every epilogue op
    (`qk.Epilogue.CODES`), every input mode of the convolution."""
    seen: dict[str, set] = {}
    for job in launch_variant_jobs():
        for name, value in job["constexprs"].items():
            seen.setdefault(f"{job['kernel']}:{name}", set()).add(value)
    gemm, conv = f"{qk.__name__}:_int8_gemm_kernel", f"{qck.__name__}:_conv_kernel"
    codes = set(qk.Epilogue.CODES.values())
    for kernel in (gemm, conv):
        assert seen[f"{kernel}:FP8"] == {False, True}
        assert seen[f"{kernel}:FP8_PTRS"] == {False, True}
        assert seen[f"{kernel}:QUANT"] == {0, 1, 2}
        assert seen[f"{kernel}:STORE"] == {False, True}
        epilogue = seen[f"{kernel}:E0"] | seen[f"{kernel}:E1"] | seen[f"{kernel}:E2"]
        assert epilogue == codes | {0}
    assert seen[f"{conv}:MODE"] == {qck.IMPLICIT, qck.POINTWISE, qck.GATHER}
    assert seen[f"{conv}:FP8_NATIVE"] == {False, qck.FP8_NATIVE}
    assert seen[f"{qe.__name__}:_quantise_fp8_kernel:ROUND_TRIP"] == {False, True}
    assert seen[f"{qe.__name__}:_quantise_fp8_kernel:CAST"] == {False, True}
