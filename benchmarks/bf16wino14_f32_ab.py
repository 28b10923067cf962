"""Float32 layers: the native F(4,3) kernel before bf16wino14 (main's source, built from git as
another library) against this branch's, on the same layers, A/B in one process (helper
bf16wino14): the bf16 flags must not slow the float32 path.

    PYTHONPATH=. python benchmarks/bf16wino14_f32_ab.py --models resnet50 yolov8_style unet_small
    PYTHONPATH=. python benchmarks/bf16wino14_f32_ab.py --models unet_small --base working  # A/A

Each layer (`wino_layers.layer_plan`, relu) is built once on this branch's kernel; `old` is the
same `NativeWinograd` with its library swapped for main's (the argument struct's extra fields
are past the end the old code reads). Alternating rounds both orders, thread CPU time at 1
thread (`wino13_ab.time_fns`). Printed: median ms and new / old per layer and summed.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,F401,I001

import torch  # noqa: E402

from benchmarks.wino13_ab import time_fns  # noqa: E402
from benchmarks.wino_layers import layer_args, layer_plan, resnet50_layers, zoo_layers  # noqa: E402
from pygraphx.targets import native  # noqa: E402
from pygraphx.targets.torch_lowering import winograd, winograd_native  # noqa: E402
from pygraphx.targets.torch_lowering.malloc_keep import keep_freed_memory  # noqa: E402

BASE = "255dfb1"  # main at the start of bf16wino14
SOURCE = "pygraphx/targets/native/kernels/winograd_f43.c"


def old_library(base: str):  # noqa: ANN201
    """main's kernel (`base` a commit), or with `base` "working" this tree's own source built
    as a second library (an A/A check of the harness)."""
    root = Path(__file__).resolve().parents[1]
    if base == "working":
        src = (root / SOURCE).read_text() + "\n/* a second copy */\n"
    else:
        src = subprocess.run(["git", "show", f"{base}:{SOURCE}"], cwd=root, check=True,
                             capture_output=True, text=True).stdout  # fmt: skip
    lib = native.load_source("winograd_f43_base", src)
    lib.wino_f43_run.argtypes = [winograd_native.ctypes.POINTER(winograd_native._Args)]
    lib.wino_f43_run.restype = winograd_native.ctypes.c_int
    lib.wino_f43_work_floats.argtypes = [winograd_native.ctypes.c_int64] * 2
    lib.wino_f43_work_floats.restype = winograd_native.ctypes.c_int64
    return lib


def main() -> None:
    ap = layer_args(__doc__)
    ap.add_argument("--base", default=BASE, help="the old kernel's commit, or 'working'")
    args = ap.parse_args()
    keep_freed_memory()
    torch.set_num_threads(1)
    old = old_library(args.base)
    for model in args.models:
        layers = resnet50_layers() if model == "resnet50" else zoo_layers(model)
        print(f"\n### {model} float32 batch 1, 1 thread, relu, thread CPU ms (median)\n")
        print("| layer | n | old | new | new/old |\n| --- | --- | --- | --- | --- |")
        total: Counter = Counter()
        for layer, count in sorted(layers.items(), key=lambda kv: -kv[0][0][1]):
            (c, h, w), k, pad = layer
            plan, gen = layer_plan(layer, 1)
            x = torch.randn(1, c, h, w, generator=gen).contiguous(memory_format=torch.channels_last)
            fns = {}
            for name in ("new", "old"):
                geo = winograd.geometry(plan, 4)
                conv = winograd_native.NativeWinograd(
                    plan, geo, winograd.weight_transform(plan.weight, 4), False,
                    winograd.epilogue_ops(plan, False))  # fmt: skip
                if name == "old":
                    conv.lib = old
                fns[name] = conv.closure(lambda x=x: x, None, None)
            ya, yb = fns["new"](), fns["old"]()
            assert torch.equal(ya, yb), f"{layer}: the two kernels differ"
            times = time_fns(fns, [x])
            med = {n: statistics.median(v) for n, v in times.items()}
            for n in med:
                total[n] += med[n] * count
            print(f"| {layer[0]} -> {k} | {count} | {med['old'] * 1e3:.3f} | "
                  f"{med['new'] * 1e3:.3f} | {med['new'] / med['old']:.3f} |", flush=True)  # fmt: skip
        print(f"| **sum x n** | | {total['old'] * 1e3:.2f} | {total['new'] * 1e3:.2f} | "
              f"{total['new'] / total['old']:.3f} |")


if __name__ == "__main__":
    main()
