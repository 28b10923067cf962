"""A/B for issue 12: `quant_gpu.py` with the fp8 quantise's rounding done by a multiply.

    python benchmarks/fp8_round_ab.py --models bert_base --variants fp8 --fp8-gemms cublas \
        --calib 2 --warmup 3 --runs 20 --profile --json out.json

`codegen/triton/quantise.fp8_round` rounds |v| <= 448 to the e4m3 grid with
`div_rn(|v|, step)`, an IEEE division by a power of two. This script replaces it (in the
generated group kernels and `quant_kernels`) by a multiply with the inverse step, which is
exact too (the same bytes: power-of-two scaling), then runs `quant_gpu.main` with the given
arguments. Run it in a process of its own (Triton caches a kernel's dependencies per process)
and `quant_gpu.py` alone in another for the baseline. A measurement, not a code path: the
change itself belongs in `codegen/triton/quantise.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pygraphx.codegen.triton import quantise  # noqa: E402
from pygraphx.targets.gpu import quantise_kernels  # noqa: E402


@triton.jit
def fp8_round_mul(v, MAGIC: tl.constexpr):
    """`quantise.fp8_round` with `|v| * 2**(3 - e)` for `|v| / 2**(e - 3)` (exact)."""
    mag = tl.abs(v)
    e = ((mag.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.maximum(e, -6)
    step = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)
    inv = ((127 + 3 - e) << 23).to(tl.float32, bitcast=True)
    q = (mag * inv + MAGIC) - MAGIC
    return tl.where(v.to(tl.int32, bitcast=True) < 0, -q * step, q * step)


def main() -> int:
    quantise.fp8_round = fp8_round_mul
    quantise_kernels.fp8_round = fp8_round_mul
    import quant_gpu

    sys.argv = ["quant_gpu.py", *sys.argv[1:]]
    return quant_gpu.main()


if __name__ == "__main__":
    sys.exit(main())
