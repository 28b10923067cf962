"""A/B of the 8-bit Triton kernels' launch choices on one GPU, in one process (CUDA only).

    python benchmarks/quant_tiles_ab.py [--json out.json]

* ResNet-50 convolutions (batch 32, channels-last, the int8 `quant_conv_kernels.conv` with the
  per-channel scale only): autotuned over the previous `CONV_CONFIGS` / `_prune` (`old`) and
  over the current ones (`new`), each with the tile it picked; cuDNN half as the peer.
* BERT-base products (4096 rows): `quant_kernels.int8_gemm` with the epilogue the model fuses
  (bias + GELU, residual) and without; `fp8_gemm` reading fp8 as bytes (`FP8_POINTERS`
  False, as before) and through fp8 pointers (now), and whether both give the same numbers;
  cuBLAS half (`torch.matmul`) as the peer.

Every time is the median of `triton.testing.do_bench_cudagraph` (launches replayed from a CUDA
graph, as the gpu executable runs them: no Python launch cost), after the autotuning call.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pygraphx.targets.gpu import quant_conv_kernels as qck  # noqa: E402
from pygraphx.targets.gpu import quant_kernels as qk  # noqa: E402

#: (N, C, H, W, C_out, k, stride, pad): ResNet-50's 64-output-channel layers, and two controls
CONV_SHAPES = [
    (32, 3, 224, 224, 64, 7, 2, 3), (32, 64, 56, 56, 64, 1, 1, 0), (32, 64, 56, 56, 64, 3, 1, 1),
    (32, 256, 56, 56, 64, 1, 1, 0), (32, 64, 56, 56, 256, 1, 1, 0), (32, 512, 7, 7, 512, 3, 1, 1),
]  # fmt: skip
#: `CONV_CONFIGS` before the 64-wide tiles
OLD_CONV_CONFIGS = [
    (128, 128, 64, 4, 4), (128, 128, 128, 8, 3), (128, 256, 64, 8, 3), (128, 256, 128, 8, 3),
    (256, 128, 64, 8, 3), (256, 128, 128, 8, 3), (64, 128, 128, 4, 4), (128, 64, 128, 4, 4),
    (64, 64, 64, 4, 5), (64, 128, 64, 4, 5),
]  # fmt: skip
#: (name, N, K, epilogue ops) of BERT-base's products at 4096 rows
GEMM_SHAPES = [
    ("qkv", 2304, 768, ()), ("ffn_up", 3072, 768, ("bias", "gelu")),
    ("ffn_down", 768, 3072, ("residual",)), ("attn_out", 768, 768, ("residual",)),
]  # fmt: skip
ROWS = 4096


def _old_prune(configs: list, named_args: dict, **kwargs) -> list:
    """`_prune` before: K blocks dividing C (CONV_BLOCK_K for a gathered input), any width."""
    if kwargs.get("MODE") == qck.GATHER:
        return [cfg for cfg in configs if cfg.kwargs["BLOCK_K"] == qck.CONV_BLOCK_K]
    return [cfg for cfg in configs if named_args["C"] % cfg.kwargs["BLOCK_K"] == 0] or configs[:1]


def graph_ms(fn) -> float:
    fn()  # autotunes at the first call
    torch.cuda.synchronize()
    return float(triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median"))


def _tile(tuner) -> str:
    cfg = tuner.best_config
    kw = cfg.kwargs
    return f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} w{cfg.num_warps} s{cfg.num_stages}"


def conv_row(n, c, h, w, c_out, k, stride, pad) -> dict:
    """Old vs new int8 convolution tiles and cuDNN half for one layer."""
    cl = torch.channels_last
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    x8 = torch.randint(-128, 128, (n, c, h, w), device="cuda", dtype=torch.int8)
    x8 = x8.contiguous(memory_format=cl) if c % qck.CONV_BLOCK_K == 0 else x8
    w8 = torch.randint(-128, 128, (c_out, k * k * c), device="cuda", dtype=torch.int8)
    scale = torch.rand(c_out, device="cuda") * 1e-3
    out = torch.empty(n * ho * wo, c_out, device="cuda", dtype=torch.half)
    geometry = (k, (stride, stride), (pad, pad), (1, 1), ho, wo)
    row: dict = {}
    key = ("M", "N", "K", "C")
    tuners = {
        "old": qk._autotuned(qck._conv_kernel, OLD_CONV_CONFIGS, key, _old_prune),
        "new": qk._autotuned(qck._conv_kernel, qck.CONV_CONFIGS, key, qck._prune),
    }
    for name, tuner in tuners.items():
        qck._tuned["conv"] = tuner
        row[f"int8_{name}"] = graph_ms(lambda: qck.conv(x8, w8, scale, out, geometry))
        row[f"int8_{name}_tile"] = _tile(tuner)
    qck._tuned.clear()
    xh = torch.randn(n, c, h, w, device="cuda").half().contiguous(memory_format=cl)
    wh = torch.randn(c_out, c, k, k, device="cuda").half().contiguous(memory_format=cl)
    row["cudnn_fp16"] = graph_ms(lambda: F.conv2d(xh, wh, None, stride, pad))
    return row


def gemm_row(n: int, k: int, ops: tuple) -> dict:
    """int8 with / without the fused epilogue, fp8 bytes vs fp8 pointers, cuBLAS half."""
    m = ROWS
    a8 = torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8)
    w8 = torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8)
    scale = torch.rand(n, device="cuda") * 1e-4
    out = torch.empty(m, n, device="cuda", dtype=torch.half)
    bias = torch.randn(n, device="cuda").half() if "bias" in ops else None
    residual = torch.randn(m, n, device="cuda").half() if "residual" in ops else None
    ep = qk.Epilogue(ops, bias=bias, gelu=(0.7071067811865476, 1.0, 0.5)) if ops else None
    row = {"int8_plain": graph_ms(lambda: qk.int8_gemm(a8, w8, scale, out))}
    row["int8_plain_tile"] = _tile(qk._tuned_kernel("gemm"))
    if ops:
        row["int8_epilogue"] = graph_ms(lambda: qk.int8_gemm(a8, w8, scale, out, ep, residual))
    af = (torch.randn(m, k, device="cuda") * 4).to(torch.float8_e4m3fn)
    wf = (torch.randn(n, k, device="cuda") * 4).to(torch.float8_e4m3fn)
    outs = {}
    for name, pointers in (("bytes", False), ("ptrs", True)):
        qk.FP8_POINTERS = pointers
        qk._tuned.pop("fp8_gemm", None)  # its own autotuning
        res = torch.empty_like(out)
        row[f"fp8_{name}"] = graph_ms(lambda res=res: qk.fp8_gemm(af, wf, scale, res, ep, residual))
        row[f"fp8_{name}_tile"] = _tile(qk._tuned_kernel("fp8_gemm"))
        outs[name] = res
    qk.FP8_POINTERS = True
    row["fp8_same_numbers"] = bool(torch.equal(outs["bytes"], outs["ptrs"]))
    ah, wh = torch.randn(m, k, device="cuda").half(), torch.randn(n, k, device="cuda").half()
    row["cublas_fp16"] = graph_ms(lambda: ah @ wh.t())
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--skip-conv", action="store_true")
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"triton {triton.__version__}")  # fmt: skip
    result: dict = {"conv": [], "gemm": []}
    for shape in [] if args.skip_conv else CONV_SHAPES:
        row = {"shape": shape, **conv_row(*shape)}
        result["conv"].append(row)
        print(f"  conv {row}", flush=True)
    for name, n, k, ops in GEMM_SHAPES:
        row = {"name": name, "m": ROWS, "n": n, "k": k, "ops": list(ops), **gemm_row(n, k, ops)}
        result["gemm"].append(row)
        print(f"  gemm {row}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
