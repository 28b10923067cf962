"""Where ResNet-50's 8-bit convolutions lose to cuDNN half: a few layers, per tile and epilogue.

    python benchmarks/quant_conv_probe.py [--json out.json]

For a few ResNet-50 b32 layers (the 1x1 expansions that take the block's residual, a 3x3, a
deep 3x3, the 7x7 stem), channels-last, device time from CUDA-graph replays
(`triton.testing.do_bench_cudagraph`, as the gpu executable runs its steps):

* `cudnn`: `F.conv2d` half (no bias / activation: the fp16 program adds a pointwise group);
* `int8 <epilogue> <tile>`: `quant_conv_kernels._conv_kernel` at a fixed tile, for the
  epilogues the program uses (`-`: the scale only; `brq`: bias + ReLU + int8 quantise, float
  stored too; `bresq`: bias + residual + ReLU + quantise);
* `fp8 <epilogue> <tile>` (fp8 e4m3, sums promoted to float32 every 32 products) and
  `fp8n <epilogue> <tile>` (Hopper's native fp8 accumulation, `FP8_NATIVE`);
* for the stem also the input channels-last (`nhwc`: gathered runs of 3 channels).

And the fp8 sums' error: the largest |sum - exact| / sum(|products|) over a deep layer's
output (K = 2304), promoted and native, against float64 sums of the same fp8 values.
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

#: name -> ((N, C, H, W, C_out, k, stride, pad), epilogues, tiles)
LAYERS = {
    "1x1_64_256_56": (
        (32, 64, 56, 56, 256, 1, 1, 0), ("-", "bresq"),
        [(128, 128, 64, 4, 4), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (64, 128, 64, 4, 5)],
    ),
    "1x1_128_512_28": (
        (32, 128, 28, 28, 512, 1, 1, 0), ("-", "bresq"),
        [(128, 128, 64, 4, 4), (128, 256, 128, 8, 3), (128, 128, 128, 8, 3), (64, 128, 128, 4, 4)],
    ),
    "3x3_64_56": (
        (32, 64, 56, 56, 64, 3, 1, 1), ("-", "brq"),
        [(128, 64, 64, 4, 4), (64, 64, 64, 4, 5), (256, 64, 64, 8, 4)],
    ),
    "3x3_256_14": (
        (32, 256, 14, 14, 256, 3, 1, 1), ("-", "brq"),
        [(128, 128, 64, 4, 4), (128, 128, 128, 8, 3), (128, 256, 128, 8, 3), (64, 128, 128, 4, 4)],
    ),
    "stem": (
        (32, 3, 224, 224, 64, 7, 2, 3), ("-", "br"),
        [(128, 64, 64, 4, 4), (64, 64, 64, 4, 5), (256, 64, 64, 8, 4)],
    ),
}  # fmt: skip


def bench(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median"))


class Layer:
    """One layer's operands (int8 and fp8), output buffers and epilogue inputs."""

    def __init__(self, shape: tuple) -> None:
        n, c, h, w, c_out, k, stride, pad = shape
        dev, cl = "cuda", torch.channels_last
        self.ho, self.wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        self.rows, self.c_out = n * self.ho * self.wo, c_out
        self.geometry = (k, (stride, stride), (pad, pad), (1, 1), self.ho, self.wo)
        x8 = torch.randint(-128, 128, (n, c, h, w), device=dev, dtype=torch.int8)
        w8 = torch.randint(-128, 128, (c_out, k * k * c), device=dev, dtype=torch.int8)
        xf = (torch.randn(n, c, h, w, device=dev) * 8).to(torch.float8_e4m3fn)
        wf = (torch.randn(c_out, k * k * c, device=dev) * 8).to(torch.float8_e4m3fn)
        if c % qck.CONV_BLOCK_K == 0:
            x8 = x8.contiguous(memory_format=cl)
            xf = xf.view(torch.uint8).contiguous(memory_format=cl).view(xf.dtype)
        self.x = {"int8": x8, "fp8": xf, "fp8n": xf}
        self.w = {"int8": w8, "fp8": wf, "fp8n": wf}
        self.scale = torch.rand(c_out, device=dev) * 1e-4
        self.out = torch.empty(self.rows, c_out, device=dev, dtype=torch.half)
        self.res = torch.randn(self.rows, c_out, device=dev).half()
        self.bias = torch.randn(c_out, device=dev).half()
        self.qs = torch.tensor([0.05], device=dev)
        self.half_x = torch.randn(n, c, h, w, device=dev).half().contiguous(memory_format=cl)
        self.half_w = torch.randn(c_out, c, k, k, device=dev).half().contiguous(memory_format=cl)
        self.conv = (stride, pad)

    def epilogue(self, name: str, kind: str):
        """(Epilogue, residual, qout) for `name` (module docstring)."""
        if name == "-":
            return None, None, None
        ops = {"br": ["bias", "relu"], "brq": ["bias", "relu"]}.get(name)
        ops = ops or ["bias", "residual", "relu"]
        quant = name.endswith("q")
        qout = None
        if quant:
            qout = torch.empty_like(self.out, dtype=torch.int8 if kind == "int8" else torch.uint8)
        ep = qk.Epilogue(ops, self.bias, self.qs if quant else None)
        return ep, (self.res if "residual" in ops else None), qout

    def launch(self, kind: str, ep_name: str, tile: tuple, x=None):
        """A zero-argument launch of `_conv_kernel` at `tile`."""
        ep, res, qout = self.epilogue(ep_name, kind)
        x = self.x[kind] if x is None else x
        args, codes = qck.launch_arguments(
            x, self.w[kind], self.scale, self.out, self.geometry, ep, res, qout
        )
        codes["FP8_NATIVE"] = kind == "fp8n"
        bm, bn, bk, warps, stages = tile
        config = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}
        grid = qk._grid(self.rows, self.c_out, config)

        def run():
            qck._conv_kernel[grid](*args, **codes, **config, num_warps=warps, num_stages=stages)

        return run


def probe_layer(name: str) -> dict:
    shape, epilogues, tiles = LAYERS[name]
    layer = Layer(shape)
    stride, pad = layer.conv
    row = {"cudnn": bench(lambda: F.conv2d(layer.half_x, layer.half_w, None, stride, pad))}
    for kind in ("int8", "fp8", "fp8n"):
        for ep in epilogues:
            for tile in tiles if kind != "fp8" else tiles[:2]:
                key = f"{kind} {ep} {tile}"
                try:
                    row[key] = bench(layer.launch(kind, ep, tile))
                except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
                    row[key] = f"{type(exc).__name__}: {str(exc)[:160]}"
    if name == "stem":  # the input channels-last: each tap's 3 channels adjacent
        x_cl = layer.x["int8"].contiguous(memory_format=torch.channels_last)
        for tile in tiles:
            row[f"int8 br nhwc {tile}"] = bench(layer.launch("int8", "br", tile, x_cl))
    return row


def fp8_error() -> dict:
    """Largest |kernel sum - float64 sum| / sum |products| of a K = 2304 layer (scale 1)."""
    layer = Layer((8, 256, 14, 14, 256, 3, 1, 1))
    xf, wf = layer.x["fp8"], layer.w["fp8"]
    want = (
        F.conv2d(xf.double(), wf.double().view(256, 3, 3, 256).permute(0, 3, 1, 2), None, 1, 1)
        .permute(0, 2, 3, 1)
        .reshape(-1, 256)
    )
    size = (
        F.conv2d(
            xf.double().abs(),
            wf.double().abs().view(256, 3, 3, 256).permute(0, 3, 1, 2),
            None,
            1,
            1,
        )
        .permute(0, 2, 3, 1)
        .reshape(-1, 256)
    )
    found = {}
    one = torch.ones(256, device="cuda")
    for kind in ("fp8", "fp8n"):
        out = torch.empty(want.shape, device="cuda", dtype=torch.float32)
        args, codes = qck.launch_arguments(xf, wf, one, out, layer.geometry)
        codes["FP8_NATIVE"] = kind == "fp8n"
        config = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8}
        grid = qk._grid(out.shape[0], 256, config)
        qck._conv_kernel[grid](*args, **codes, **config, num_warps=8, num_stages=3)
        err = (out.double() - want).abs() / size.clamp_min(1e-30)
        found[kind] = {"max_rel_to_abs_sum": float(err.max()), "mean": float(err.mean())}
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--layers", nargs="+", default=list(LAYERS))
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__} triton "
          f"{triton.__version__}", flush=True)  # fmt: skip
    result = {"fp8_error": fp8_error()}
    print("fp8 error", result["fp8_error"], flush=True)
    for name in args.layers:
        result[name] = probe_layer(name)
        for key, value in result[name].items():
            print(f"  {name} {key}: {value if isinstance(value, str) else f'{value:.4f}'}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
