"""What `torch._scaled_mm` accepts on this GPU, and how fast each form is (issue 12).

    python benchmarks/fp8_scaled_mm_probe.py --json out.json

For M = 4096 rows (BERT-base at batch 32, sequence 128) and the BERT GEMMs' (K, N) (QKV
768x2304, attention output 768x768, FFN1 768x3072, FFN2 3072x768) every form below is tried
with fp8 e4m3 operands (the weight column-major, as cuBLASLt wants); a form torch refuses is
recorded with its error message, one that runs with its median time per call (CUDA events
around `--calls` calls, median of `--repeats`) and its largest error against a float64 product
of the same fp8 values (relative to the largest |value|):

* `unit_f32`: unit scales, float32 out (pygraphx's path before issue 12);
* `tensor_f16` / `tensor_f16_bias`: one float32 scale per operand, half out (with a half bias);
* `row_f16` / `row_f16_bias` / `row_bf16` / `row_bf16_bias`: rowwise scales (scale_a (M, 1),
  scale_b (1, N), float32), half or bfloat16 out (with a bias of that type);
* `mm_f16` / `addmm_f16`: the half `torch.mm` / `torch.addmm` of the same shapes (the fp16
  program's GEMM).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_vs_peers import time_calls  # noqa: E402  (CUDA-event timing, shared)

SHAPES = ((768, 2304), (768, 768), (768, 3072), (3072, 768))
F8 = torch.float8_e4m3fn


def timed(fn, calls: int, repeats: int) -> float:
    """Median ms per call of `fn` over `repeats` batches of `calls` calls (one pair of CUDA
    events around each batch: the kernels take ~20 us, an event pair's overhead is not)."""

    def batch() -> None:
        for _ in range(calls):
            fn()

    return statistics.median(time_calls(batch, 1, repeats)) / calls


def operands(m: int, k: int, n: int, dev: torch.device) -> dict:
    """fp8 activation / weight, their float64 values, scales and biases."""
    g = torch.Generator(device="cpu").manual_seed(m + k + n)
    x = (torch.randn(m, k, generator=g) * 100).clamp(-448, 448).to(F8)
    w = (torch.randn(n, k, generator=g) * 100).clamp(-448, 448).to(F8)
    sa, sb = torch.rand(m, 1, generator=g) + 0.5, (torch.rand(1, n, generator=g) + 0.5) * 1e-4
    bias = torch.randn(n, generator=g)
    return {
        "x": x.to(dev), "wt": w.to(dev).t(), "sa": sa.to(dev), "sb": sb.to(dev),
        "bias": bias.to(dev), "x64": x.double(), "w64": w.double().t(),
        "sa64": sa.double(), "sb64": sb.double(), "bias64": bias.double(),
    }  # fmt: skip


def forms(o: dict) -> dict:
    """name -> (call, float64 reference) of every form probed."""
    one = torch.ones((), dtype=torch.float32, device=o["x"].device)
    s_a, s_b = o["sa"][0, 0].contiguous(), o["sb"][0, 0].contiguous()
    sums = o["x64"] @ o["w64"]
    tensor_ref = sums * o["sa64"][0, 0] * o["sb64"][0, 0]
    row_ref = sums * o["sa64"] * o["sb64"]
    f16, bf16 = torch.float16, torch.bfloat16
    x, wt = o["x"], o["wt"]
    xh, wh = x.to(f16), wt.to(f16)
    mm = torch._scaled_mm

    def row(dtype, bias):
        b = o["bias"].to(dtype) if bias else None
        return lambda: mm(x, wt, scale_a=o["sa"], scale_b=o["sb"], bias=b, out_dtype=dtype)

    return {
        "unit_f32": (lambda: mm(x, wt, scale_a=one, scale_b=one, out_dtype=torch.float32), sums),
        "tensor_f16": (lambda: mm(x, wt, scale_a=s_a, scale_b=s_b, out_dtype=f16), tensor_ref),
        "tensor_f16_bias": (
            lambda: mm(x, wt, scale_a=s_a, scale_b=s_b, bias=o["bias"].to(f16), out_dtype=f16),
            tensor_ref + o["bias64"],
        ),
        "row_f16": (row(f16, False), row_ref),
        "row_f16_bias": (row(f16, True), row_ref + o["bias64"]),
        "row_bf16": (row(bf16, False), row_ref),
        "row_bf16_bias": (row(bf16, True), row_ref + o["bias64"]),
        "tensor_a_row_b_f16": (
            lambda: mm(x, wt, scale_a=s_a.reshape(1, 1), scale_b=o["sb"], out_dtype=f16),
            sums * o["sa64"][0, 0] * o["sb64"],
        ),
        "mm_f16": (lambda: torch.mm(xh, wh), sums),
        "addmm_f16": (lambda: torch.addmm(o["bias"].to(f16), xh, wh), sums + o["bias64"]),
    }


def probe(m: int, k: int, n: int, calls: int, repeats: int) -> dict:
    o = operands(m, k, n, torch.device("cuda"))
    out = {}
    for name, (fn, ref) in forms(o).items():
        try:
            got = fn()
        except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
            out[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:400]}
            continue
        err = (got.double().cpu() - ref).abs().max() / ref.abs().max()
        out[name] = {"ok": True, "dtype": str(got.dtype), "ms": timed(fn, calls, repeats),
                     "max_rel_err": float(err)}  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("fp8_scaled_mm_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    result = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
              "rows": args.rows, "shapes": {}}  # fmt: skip
    for k, n in SHAPES:
        rows = probe(args.rows, k, n, args.calls, args.repeats)
        result["shapes"][f"{k}x{n}"] = rows
        for name, r in rows.items():
            what = f"{r['ms']:.4f} ms  err {r['max_rel_err']:.2e}" if r["ok"] else r["error"]
            print(f"M={args.rows} K={k} N={n} {name:20s} {what}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
