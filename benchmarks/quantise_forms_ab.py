"""The int8 / fp8 quantise's forms in BERT-base's element-wise and row kernels, A/B on the device.

    python benchmarks/quantise_forms_ab.py [--json out.json]

Times (device only, `codegen/triton/timing.py`) a [4096, 3072] half GELU whose result is only
quantised (BERT's fp8 `pointwise[mul,erf,add,mul,mul]` group: the half result is not stored),
with each form of the quotient and of the code:

* `div`: `tl.math.div_rn` an element (`quantise.int8_code` / `fp8_code` before), `norm`:
  `quantise.normalised_quotient` (one reciprocal a program, two fma corrections an element);
* fp8 `bits`: `fp8_round` and `fp8_bits` (the interpreter's form), `cast`: the hardware
  conversion (`quantise.FP8_CAST`);

and BERT's `add, add, layer norm` group writing its fp8 quantise (`group_tune_ab`) with the
codes from `bits` against `cast` (both `saturating_quotient`), at every launch configuration
the autotune tries. `none` (a plain cast) is the memory floor.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import triton  # noqa: E402
from quantise_cost import _fmt, layer_norm_times, run_ab  # noqa: E402

from pygraphx.codegen.triton.timing import time_candidates  # noqa: E402

VARIANTS = """
import triton
import triton.language as tl

from pygraphx.codegen.triton.quantise import (
    int8_of_quotient, fp8_bits, fp8_round, normalised_quotient, saturating_quotient,
)


@triton.jit
def _bits(v, x, scale):
    r = fp8_round(tl.minimum(tl.maximum(v, -448.0), 448.0), 12582912.0)
    r = tl.where(x != x, x, tl.where(v != v, v, r))
    neg = (x.to(tl.int32, bitcast=True) ^ scale.to(tl.int32, bitcast=True)) < 0
    return fp8_bits(r, neg)


@triton.jit
def _cast(v, x, scale):
    neg = (x.to(tl.int32, bitcast=True) ^ scale.to(tl.int32, bitcast=True)) < 0
    b = tl.where(x != x, x, v).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    return tl.where(neg, b | 0x80, b)


@triton.jit
def rows_bits(x, scale, MAGIC: tl.constexpr):
    return _bits(saturating_quotient(x, scale, 1024.0), x, scale)


@triton.jit
def rows_cast(x, scale, MAGIC: tl.constexpr):
    return _cast(saturating_quotient(x, scale, 1024.0), x, scale)


@triton.jit
def gelu(x_ptr, s_ptr, out_ptr, n, BLOCK: tl.constexpr, WHICH: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = ((x * (tl.erf(x * 0.7071067690849304) + 1.0)) * 0.5).to(tl.float16).to(tl.float32)
    s = tl.load(s_ptr)
    if WHICH == 0:
        q = y.to(tl.int8)
    elif WHICH == 1:
        q = int8_of_quotient(tl.math.div_rn(y, s), y, 12582912.0)
    elif WHICH == 2:
        q = int8_of_quotient(normalised_quotient(y, s), y, 12582912.0)
    elif WHICH == 3:
        q = _bits(tl.math.div_rn(y, s), y, s)
    elif WHICH == 4:
        q = _bits(normalised_quotient(y, s), y, s)
    elif WHICH == 5:
        q = _cast(tl.math.div_rn(y, s), y, s)
    else:
        q = _cast(normalised_quotient(y, s), y, s)
    tl.store(out_ptr + offs, q.to(tl.int8, bitcast=True), mask=mask)
"""
#: the layer norm's fp8 quantise: codes from float32 bits against the hardware conversion
ROW_FORMS = {f: f"from quantise_forms import rows_{f} as fp8_code_rows" for f in ("bits", "cast")}
NAMES = ["none", "int8 div", "int8 norm", "fp8 div bits", "fp8 norm bits", "fp8 div cast",
         "fp8 norm cast"]  # fmt: skip


def gelu_times(mod, scale: torch.Tensor) -> dict:
    x = torch.randn(4096, 3072, device="cuda").to(torch.float16) * 4
    out = torch.empty(4096, 3072, dtype=torch.int8, device="cuda")
    n, found = x.numel(), {}
    for block, warps in ((1024, 4), (2048, 8)):
        grid = (triton.cdiv(n, block),)
        runs = [
            lambda w=w, g=grid, b=block, nw=warps: mod.gelu[g](
                x, scale, out, n, BLOCK=b, WHICH=w, num_warps=nw
            )
            for w in range(len(NAMES))
        ]
        times = time_candidates(runs)
        key = f"block {block} w{warps}"
        found[key] = dict(zip(NAMES, (t * 1e3 for t in times), strict=True))
        print(f"  gelu + quantise [4096, 3072] {key}: " + _fmt(found[key]))
    return found


def main() -> int:
    timers = {
        "gelu": lambda mod, _, scale: gelu_times(mod, scale),
        "layer_norm": lambda _, tmp, scale: layer_norm_times(tmp, scale, "fp8", ROW_FORMS),
    }
    return run_ab(__doc__.splitlines()[0], VARIANTS, "quantise_forms", timers)


if __name__ == "__main__":
    sys.exit(main())
