"""Per-layer A/B of the native F(4,3) kernel (helper wino13) against the torch-ops route and
oneDNN, on the 3x3 stride-1 layers of ResNet-50 (and UNet / YOLOv8-style).

    python benchmarks/wino13_ab.py --models resnet50 --batch 1 8 --threads 1 2
    python benchmarks/wino13_ab.py --models yolov8_style --unary swish --silu-ab

Each layer (random weight, bias and relu, as `wino_layers.layer_plan` makes it) is built three
ways in one process: `dnnl` (the default kernel), `torch` (`winograd.build` with
`PGX_WINOGRAD_NATIVE=0`) and `native`. The three are called in alternating rounds, the order
reversed every round (ABC, CBA, ...), each call after the caches were left as a network leaves
them (`conv_choice._as_in_a_network`); one thread: thread CPU time, else wall time. Reported:
the median and best ms per call of each, and native / torch, native / dnnl of the medians.
`--unary swish` gives every layer a swish (YOLOv8's) instead of a relu; `--silu-ab` adds
`native/tsilu`, the native kernel with the swish run by torch after it
(`PGX_WINOGRAD_NATIVE_SILU=0`).
The native result is checked against the default kernel's first.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections import Counter
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,F401,I001  (first: pygraphx sets OpenMP's spin count before torch)
import time  # noqa: E402

import torch  # noqa: E402

from benchmarks.wino_layers import layer_args, layer_plan, resnet50_layers, zoo_layers  # noqa: E402
from pygraphx.targets.torch_lowering import conv_choice, onednn_conv, winograd  # noqa: E402
from pygraphx.targets.torch_lowering import winograd_native  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import build_kernel  # noqa: E402
from pygraphx.targets.torch_lowering.malloc_keep import keep_freed_memory  # noqa: E402

ROUNDS = 30


def layer_fns(layer: tuple, batch: int, unary: str = "relu",
              silu_ab: bool = False) -> tuple[dict, list[torch.Tensor]]:  # fmt: skip
    (c, h, w), k, pad = layer
    plan, gen = layer_plan(layer, batch)
    plan.unary = unary
    plan.packed = torch.ops.mkldnn._reorder_convolution_weight(
        plan.weight, [pad, pad], [1, 1], [1, 1], 1, [batch, c, h, w]
    )
    cl = torch.channels_last
    x = torch.randn(batch, c, h, w, generator=gen).contiguous(memory_format=cl)
    default = "dnnl" if onednn_conv.available() else "onednn"
    out = None
    if default == "dnnl":
        out = torch.empty(onednn_conv.geometry(plan)[3]).contiguous(memory_format=cl)
    fns = {"dnnl": build_kernel(plan, default, lambda: x, None, out)}
    slot = torch.empty(batch, k, h + 2 * pad - 2, w + 2 * pad - 2).contiguous(memory_format=cl)
    with mock.patch.dict(os.environ, {winograd_native.NATIVE_ENV: "0"}):
        fns["torch"] = winograd.build(plan, lambda: x, None, 4, slot,
                                      winograd.Scratch())  # fmt: skip
    fns["native"] = winograd.build(plan, lambda: x, None, 4, slot)
    if silu_ab:
        with mock.patch.dict(os.environ, {winograd_native.SILU_ENV: "0"}):
            fns["native/tsilu"] = winograd.build(plan, lambda: x, None, 4, slot)
    ref = fns["dnnl"]().clone()
    got = fns["native"]()
    err = float((got - ref).abs().max() / ref.abs().max())
    assert err < 1e-4, f"{layer}: native differs from {default} by {err:.1e}"
    return fns, [x]


def time_fns(fns: dict, inputs: list[torch.Tensor]) -> dict[str, list[float]]:
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    flush = torch.empty(conv_choice.FLUSH_BYTES // 4)
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(ROUNDS + 2):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            s = conv_choice._seconds(fns[n], clock, flush, inputs)
            if r >= 2:
                times[n].append(s)
    return times


def main() -> None:
    ap = layer_args(__doc__)
    ap.add_argument("--unary", default="relu", choices=["relu", "swish", "none"])
    ap.add_argument("--silu-ab", action="store_true")
    args = ap.parse_args()
    keep_freed_memory()
    for model in args.models:
        layers = resnet50_layers() if model == "resnet50" else zoo_layers(model)
        for batch in args.batch:
            for threads in args.threads:
                torch.set_num_threads(threads)
                report(model, layers, batch, threads, args.unary, args.silu_ab)


def report(model: str, layers: Counter, batch: int, threads: int, unary: str = "relu",
           silu_ab: bool = False) -> None:  # fmt: skip
    clock = "thread CPU" if threads == 1 else "wall"
    print(f"\n### {model} batch {batch}, {threads} thread(s), {unary}, ms per call ({clock}; "
          f"median / best of {ROUNDS} alternating rounds)\n")  # fmt: skip
    extra = " native/tsilu |" if silu_ab else ""
    print(f"| layer (C, H, W) -> K | n | tiles | dnnl | torch | native |{extra} nat/torch | "
          "nat/dnnl |")
    print("| --- " * (8 + silu_ab) + "|")
    total: Counter = Counter()
    for layer, count in sorted(layers.items(), key=lambda kv: -kv[0][0][1]):
        fns, inputs = layer_fns(layer, batch, unary, silu_ab)
        times = time_fns(fns, inputs)
        med = {n: statistics.median(v) for n, v in times.items()}
        best = {n: min(v) for n, v in times.items()}
        for n in med:
            total[n] += med[n] * count
        (c, h, w), k, pad = layer
        tiles = batch * (-(-(h + 2 * pad - 2) // 4)) * (-(-(w + 2 * pad - 2) // 4))
        cells = " | ".join(f"{med[n] * 1e3:.3f} / {best[n] * 1e3:.3f}" for n in med)
        print(f"| {layer[0]} -> {k} | {count} | {tiles} | {cells} | "
              f"{med['native'] / med['torch']:.2f} | {med['native'] / med['dnnl']:.2f} |",
              flush=True)  # fmt: skip
    cells = " | ".join(f"{total[n] * 1e3:.2f}" for n in total)
    print(f"| **sum x n (medians)** | | | {cells} | "
          f"{total['native'] / total['torch']:.2f} | {total['native'] / total['dnnl']:.2f} |")


if __name__ == "__main__":
    main()
