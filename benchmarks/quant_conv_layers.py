"""Per-layer device time of ResNet-50's convolutions: cuDNN half vs the int8 / fp8 Triton kernel.

    python benchmarks/quant_conv_layers.py --batch 32 --json out.json

Every distinct convolution shape of the built-in ResNet-50 (`pygraphx.models`) at `--batch`,
channels-last, timed with `triton.testing.do_bench_cudagraph` (median ms of launches replayed
from a CUDA graph, as the gpu executable runs them: no Python launch cost; L2 stays warm):

* `fp16`: `torch.nn.functional.conv2d` on half tensors (cuDNN), no bias or activation;
* `int8`, `fp8`: `quant_conv_kernels.conv` (autotuned at its first call), half output, only the
  per-channel scale as epilogue (the stem's 3-channel input NCHW, as the program has it);
* for 1x1 stride-1 convolutions also the plain GEMMs: `quant_kernels.int8_gemm` (Triton),
  `torch._int_mm` (cuBLASLt int8, int32 out, no epilogue) and `torch._scaled_mm` (cuBLASLt fp8,
  half out).

The totals weight each shape by how many layers have it. Random 8-bit operands.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import onnx
import onnx.shape_inference
import torch
import torch.nn.functional as F
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pygraphx.models import get_model  # noqa: E402
from pygraphx.targets.gpu import quant_conv_kernels as qck  # noqa: E402
from pygraphx.targets.gpu import quant_kernels as qk  # noqa: E402


def conv_shapes(batch: int) -> Counter:
    """(N, C, H, W, C_out, k, stride, pad) of every Conv node -> how many there are."""
    model = onnx.shape_inference.infer_shapes(get_model("resnet50", batch=batch))
    dims = {}
    for vi in [*model.graph.input, *model.graph.value_info]:
        dims[vi.name] = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    found: Counter = Counter()
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        attrs = {a.name: list(a.ints) for a in node.attribute}
        n, c, h, w = dims[node.input[0]]
        c_out, _, k, _ = weights[node.input[1]]
        stride = attrs.get("strides", [1, 1])[0]
        pad = attrs.get("pads", [0, 0, 0, 0])[0]
        found[(n, c, h, w, c_out, k, stride, pad)] += 1
    return found


def bench(fn) -> float:
    fn()  # autotunes at the first call
    torch.cuda.synchronize()
    # replayed from a CUDA graph, as the gpu executable runs it: `do_bench` around each Python
    # call also timed the Triton launcher's CPU work (3x3 64-channel int8 layer on an H200:
    # 0.089 ms that way, 0.019 ms from a graph; `benchmarks/quant_tiles_ab.py`)
    return float(triton.testing.do_bench_cudagraph(fn, rep=40, return_mode="median"))


def time_shape(n, c, h, w, c_out, k, stride, pad) -> dict[str, float]:
    dev = "cuda"
    cl = torch.channels_last
    x = torch.randn(n, c, h, w, device=dev).to(torch.half).contiguous(memory_format=cl)
    wt = torch.randn(c_out, c, k, k, device=dev).to(torch.half).contiguous(memory_format=cl)
    ho = (h + 2 * pad - k) // stride + 1
    wo = (w + 2 * pad - k) // stride + 1
    rows = n * ho * wo
    row = {"fp16": bench(lambda: F.conv2d(x, wt, None, stride, pad))}
    scale = torch.rand(c_out, device=dev) * 1e-3
    out = torch.empty(rows, c_out, device=dev, dtype=torch.half)
    geometry = (k, (stride, stride), (pad, pad), (1, 1), ho, wo)
    x8 = torch.randint(-128, 128, (n, c, h, w), device=dev, dtype=torch.int8)
    x8 = x8.contiguous(memory_format=cl)
    w8 = torch.randint(-128, 128, (c_out, k * k * c), device=dev, dtype=torch.int8)
    xf = (x8.float() / 4).to(torch.float8_e4m3fn)
    wf = (w8.float() / 4).to(torch.float8_e4m3fn)
    if c % qck.CONV_BLOCK_K != 0:  # the stem: its quantised input is NCHW (gathered)
        x8, xf = x8.contiguous(), xf.view(torch.uint8).contiguous().view(xf.dtype)
    row["int8"] = bench(lambda: qck.conv(x8, w8, scale, out, geometry))
    row["fp8"] = bench(lambda: qck.conv(xf, wf, scale, out, geometry))
    if k == 1 and stride == 1:
        a8 = x8.permute(0, 2, 3, 1).reshape(rows, c)
        af = xf.permute(0, 2, 3, 1).reshape(rows, c)
        row["int8_gemm"] = bench(lambda: qk.int8_gemm(a8, w8, scale, out))
        w8t = w8.t()
        row["int_mm"] = bench(lambda: torch._int_mm(a8, w8t))
        one = torch.ones((), device=dev)
        wft = wf.t()
        row["scaled_mm"] = bench(
            lambda: torch._scaled_mm(af, wft, scale_a=one, scale_b=one, out_dtype=torch.half)
        )
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--json")
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    totals: Counter = Counter()
    rows = []
    for shape, count in sorted(conv_shapes(args.batch).items()):
        row = time_shape(*shape)
        rows.append({"shape": shape, "count": count, **row})
        for key, ms in row.items():
            totals[key] += ms * count
        cells = "  ".join(f"{key} {ms:.4f}" for key, ms in row.items())
        print(f"  x{count:<2d} {shape}: {cells}", flush=True)
    print(
        "  totals (ms, weighted by count): " + "  ".join(f"{k} {v:.3f}" for k, v in totals.items())
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "totals": dict(totals)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
