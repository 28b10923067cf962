"""Quantization: rewrite an uncompiled program to compute in lower precision.

`quantize_fp16(prog)` / `quantize_bf16(prog)` (MIGraphX's `truncate_float`) make a parsed
program compute in half or bfloat16 while keeping its parameter and output types; see
`truncate_float.py`. Run them before `prog.compile(...)`.
"""

from __future__ import annotations

from pygraphx.quantize.truncate_float import (
    QuantizeError,
    quantize_bf16,
    quantize_fp16,
    truncate_float,
)

__all__ = ["QuantizeError", "quantize_bf16", "quantize_fp16", "truncate_float"]
