"""Quantization: rewrite an uncompiled program to compute in lower precision.

`quantize_fp16(prog)` / `quantize_bf16(prog)` (MIGraphX's `truncate_float`) make a parsed
program compute in half or bfloat16 while keeping its parameter and output types; see
`truncate_float.py`. `quantize_int8(prog, target, calibration)` calibrates and rewrites `dot` /
`convolution` to int8 products (`int8.py`), `quantize_fp8(prog, target, calibration)` to fp8
e4m3 ones (`fp8.py`); `int8_report` / `quant_report` measure what that costs in accuracy
(`report.py`). Run them before `prog.compile(...)`.
"""

from __future__ import annotations

from pygraphx.quantize.fp8 import quantize_fp8
from pygraphx.quantize.int8 import quantize_int8
from pygraphx.quantize.report import Int8Report, QuantReport, int8_report, quant_report
from pygraphx.quantize.truncate_float import (
    PRODUCTS,
    QuantizeError,
    quantize_bf16,
    quantize_fp16,
    truncate_float,
)

__all__ = [
    "PRODUCTS",
    "Int8Report",
    "QuantReport",
    "QuantizeError",
    "int8_report",
    "quant_report",
    "quantize_bf16",
    "quantize_fp16",
    "quantize_fp8",
    "quantize_int8",
    "truncate_float",
]
