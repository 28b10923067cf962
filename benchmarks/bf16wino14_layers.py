"""Per-layer A/B of a bf16 program's 3x3 stride-1 layers (helper bf16wino14): oneDNN's bf16
direct kernel (`dnnl`, the default) against the native F(4,3) kernel on bf16 activations
(`native`: the input widened inside the input transform, float32 transforms and products, the
output rounded to bf16 once).

    python benchmarks/bf16wino14_layers.py --models unet_small yolov8_style --threads 1 2

Each layer (random weight and bias as `wino_layers.layer_plan` makes them, rounded to bf16; the
model's activation: relu for UNet and ResNet-50, swish for YOLOv8-style) is built both ways in
one process and the two are called in alternating rounds, the order reversed every round, each
call after `conv_choice._as_in_a_network`; one thread: thread CPU time, else wall time. Printed:
median / best ms per call, native / dnnl of the medians, and the error of each against float64
`F.conv2d` on the same bf16 values (relative to the output's largest value).
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,F401,I001  (first: pygraphx sets OpenMP's spin count before torch)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.wino13_ab import time_fns  # noqa: E402
from benchmarks.wino_layers import layer_args, layer_plan, resnet50_layers, zoo_layers  # noqa: E402
from pygraphx.targets.torch_lowering import onednn_conv, winograd  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import build_kernel  # noqa: E402
from pygraphx.targets.torch_lowering.malloc_keep import keep_freed_memory  # noqa: E402

UNARY = {"unet_small": "relu", "yolov8_style": "swish", "resnet50": "relu"}


def reference(plan, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    pad = plan.padding
    y = F.conv2d(x.double(), plan.weight.double(), plan.bias.double(), padding=pad)
    return F.silu(y) if plan.unary == "swish" else F.relu(y)


def layer_fns(layer: tuple, batch: int, unary: str) -> tuple[dict, list[torch.Tensor], dict]:
    (c, h, w), k, pad = layer
    plan, gen = layer_plan(layer, batch)
    plan.unary = unary
    plan.weight = plan.weight.to(torch.bfloat16)
    plan.packed = plan.weight
    cl = torch.channels_last
    x = torch.randn(batch, c, h, w, generator=gen).to(torch.bfloat16).contiguous(memory_format=cl)
    ho, wo = h + 2 * pad - 2, w + 2 * pad - 2
    slots = {n: torch.empty(batch, k, ho, wo, dtype=torch.bfloat16).contiguous(memory_format=cl)
             for n in ("dnnl", "native")}  # fmt: skip
    fns = {"dnnl": build_kernel(plan, "dnnl", lambda: x, None, slots["dnnl"]),
           "native": winograd.build(plan, lambda: x, None, 4, slots["native"])}  # fmt: skip
    ref = reference(plan, x)
    errs = {}
    for n, fn in fns.items():
        y = fn().double()
        errs[n] = float((y - ref).abs().max() / ref.abs().max())
    return fns, [x], errs


def report(model: str, layers: Counter, batch: int, threads: int) -> None:
    unary = UNARY[model]
    clock = "thread CPU" if threads == 1 else "wall"
    print(f"\n### {model} bf16 batch {batch}, {threads} thread(s), {unary}, ms per call "
          f"({clock}; median / best of alternating rounds)\n")  # fmt: skip
    print("| layer (C, H, W) -> K | n | tiles | dnnl | native | nat/dnnl | err dnnl | err nat |")
    print("| --- " * 8 + "|")
    total: Counter = Counter()
    for layer, count in sorted(layers.items(), key=lambda kv: -kv[0][0][1]):
        fns, inputs, errs = layer_fns(layer, batch, unary)
        times = time_fns(fns, inputs)
        med = {n: statistics.median(v) for n, v in times.items()}
        best = {n: min(v) for n, v in times.items()}
        for n in med:
            total[n] += med[n] * count
        (c, h, w), k, pad = layer
        tiles = batch * (-(-(h + 2 * pad - 2) // 4)) * (-(-(w + 2 * pad - 2) // 4))
        cells = " | ".join(f"{med[n] * 1e3:.3f} / {best[n] * 1e3:.3f}" for n in med)
        print(f"| {layer[0]} -> {k} | {count} | {tiles} | {cells} | "
              f"{med['native'] / med['dnnl']:.2f} | {errs['dnnl']:.1e} | {errs['native']:.1e} |",
              flush=True)  # fmt: skip
    cells = " | ".join(f"{total[n] * 1e3:.2f}" for n in total)
    print(f"| **sum x n (medians)** | | | {cells} | {total['native'] / total['dnnl']:.2f} | | |")


def main() -> None:
    args = layer_args(__doc__).parse_args()
    if not (onednn_conv.available() and winograd.winograd_native.bf16_available()):
        raise SystemExit("needs oneDNN's C API library and the native kernel's bf16 build")
    keep_freed_memory()
    for model in args.models:
        layers = resnet50_layers() if model == "resnet50" else zoo_layers(model)
        for batch in args.batch:
            for threads in args.threads:
                torch.set_num_threads(threads)
                report(model, layers, batch, threads)


if __name__ == "__main__":
    main()
