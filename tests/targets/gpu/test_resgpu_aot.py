"""The kernels and variants resgpu added, through Triton's real compiler for CUDA sm_90 (and
ROCm gfx942 where no fp8 is involved), with no GPU (`test_gpu_quant_aot.py`'s jobs, in a
fresh process): the convolution's `ROWS` input mode (int8 and fp8, with and without a
quantising epilogue, the fp8 one with the hardware conversion) in every `ROWS` tile, the
padded-copy kernel, and the max pool kernel for each float type, alone and writing its int8 /
fp8 quantise (with and without the float store and the hardware conversion)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("triton")

from pygraphx.codegen.triton.quantise import MAGIC  # noqa: E402
from pygraphx.targets.gpu import pool  # noqa: E402
from pygraphx.targets.gpu import quant_conv_kernels as qck  # noqa: E402
from tests.targets.gpu.test_gpu_quant_aot import (  # noqa: E402
    OUT_TYPES,
    _compile,
    _job,
    _product_job,
)


def rows_jobs() -> list[dict]:
    """`_conv_kernel` with MODE `ROWS` for every `ROWS` tile (int8 and fp8, quantising to
    the same type, the float result stored or not), plus the fp8 quantise by the hardware
    conversion."""
    jobs = []
    tiles = [t for t in qck.CONV_CONFIGS if t[2] == qck.ROWS_BLOCK_K]
    for k, tile in enumerate(tiles):
        for fp8 in (False, True):
            quant, store = (2 if fp8 else 1), bool(k % 2)
            ops, out = ("bias", "relu"), OUT_TYPES[k % len(OUT_TYPES)]
            name = f"rows-{'fp8' if fp8 else 'int8'}-{tile}"
            job = _product_job(fp8, qck.ROWS, quant, store, ops, out, tile, name)
            jobs.append(job)
    cast = _product_job(True, qck.ROWS, 2, False, ("bias", "relu"), "fp16", tiles[0], "cast")
    cast["constexprs"]["CAST"] = True
    return [*jobs, cast]


def pool_jobs() -> list[dict]:
    """`_max_pool_kernel` for each float type, alone and writing an int8 / fp8 quantise; and
    `_pad_rows_kernel`."""
    jobs = []
    cases = [(0, True, False), (1, True, False), (1, False, False), (2, True, False),
             (2, False, True)]  # fmt: skip
    for x in OUT_TYPES:
        for quant, store, cast in cases:
            types = {"x_ptr": f"*{x}", "out_ptr": f"*{x}", "qs_ptr": "*fp32",
                     "q_ptr": {0: f"*{x}", 1: "*i8", 2: "*u8"}[quant]}  # fmt: skip
            constexprs = {"KH": 3, "KW": 3, "BLOCK_P": pool._BLOCK_P, "BLOCK_C": 64,
                          "STORE": store, "QUANT": quant, "MAGIC": MAGIC, "CAST": cast}  # fmt: skip
            name = f"pool-{x}-q{quant}{'s' if store else ''}{'-cast' if cast else ''}"
            jobs.append(_job(pool, "_max_pool_kernel", types, constexprs, {"num_warps": 4}, name))
    types = {"x_ptr": "*u8", "out_ptr": "*u8"}
    constexprs = {"C4": 4, "BLOCK": 512}
    jobs.append(_job(qck, "_pad_rows_kernel", types, constexprs, {"num_warps": 4}, "pad", False))
    return jobs


def test_rows_pool_and_pad_kernels_compile_for_sm90(tmp_path: Path) -> None:
    _compile(rows_jobs() + pool_jobs(), tmp_path)
