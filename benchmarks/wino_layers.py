"""Per-layer timings of the Winograd kernels against oneDNN on the 3x3 stride-1 layers of
ResNet-50, UNet and a YOLOv8-style detector.

    python benchmarks/wino_layers.py --models resnet50 --batch 1 8 --threads 1 2

For each distinct 3x3 stride-1 one-group convolution of a model (with a bias and a relu, as in
ResNet), the candidates `dnnl` (the default kernel, oneDNN's first implementation; `onednn`
without oneDNN's library), `winograd` (F(4x4, 3x3)) and `winograd2` (F(2x2, 3x3)) are timed
exactly as the compile's per-layer choice times them (`conv_choice.time_kernels`: interleaved
rounds, best of each, caches as a network leaves them; one thread: thread CPU time, else
wall time). Each Winograd result is checked against the default kernel's. The last lines sum
each column weighted by how many times the layer occurs, and the sum of the best per layer.
Shapes come from the models themselves (ResNet-50: `pygraphx.models`; UNet and YOLOv8:
`benchmarks/zoo.py`'s torch modules at their full sizes, 256x256 and 640x640, by hooks).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,I001  (first: pygraphx sets OpenMP's spin count before torch)
import torch  # noqa: E402

from pygraphx.models import get_model  # noqa: E402
from pygraphx.targets.torch_lowering import conv_choice, onednn_conv  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan, build_kernel  # noqa: E402
from pygraphx.targets.torch_lowering.malloc_keep import keep_freed_memory  # noqa: E402

#: (input lens without batch, output channels, padding) of a 3x3 stride-1 one-group layer
Layer = tuple[tuple[int, int, int], int, int]
CANDIDATES = ("winograd", "winograd2")


def resnet50_layers() -> Counter:
    """ResNet-50's 3x3 stride-1 layers (from the model pygraphx builds)."""
    prog = pygraphx.parse_onnx_buffer(get_model("resnet50", batch=1).SerializeToString())
    seen: Counter = Counter()
    for ins in prog.get_main_module().instructions:
        if ins.op.name != "convolution":
            continue
        x, w = (tuple(i.shape.lens()) for i in ins.inputs)
        if w[2:] == (3, 3) and ins.op.group == 1 and tuple(ins.op.stride) == (1, 1):
            seen[(x[1:], w[0], ins.op.padding[0])] += 1
    return seen


def zoo_layers(name: str) -> Counter:
    """The 3x3 stride-1 one-group `nn.Conv2d` layers of a `benchmarks/zoo.py` model, found by
    forward hooks on one run at its full size."""
    from benchmarks.zoo import torch_module

    module, inputs = torch_module(name, "full")
    seen: Counter = Counter()

    def hook(conv: torch.nn.Conv2d, args: tuple, _out: object) -> None:
        if (conv.kernel_size, conv.stride, conv.groups, conv.dilation) == (
            (3, 3),
            (1, 1),
            1,
            (1, 1),
        ):
            seen[(tuple(args[0].shape[1:]), conv.out_channels, conv.padding[0])] += 1

    for sub in module.modules():
        if isinstance(sub, torch.nn.Conv2d):
            sub.register_forward_hook(hook)
    with torch.no_grad():
        module(*(torch.from_numpy(v) for v in inputs.values()))
    return seen


def layer_plan(layer: Layer, batch: int) -> tuple[ConvPlan, torch.Generator]:
    """`layer` at `batch` images with random weights and bias and a relu, as in ResNet (and
    the generator, to draw its input next)."""
    (c, h, w), k, pad = layer
    gen = torch.Generator().manual_seed(c * k + h)
    weight = torch.randn(k, c, 3, 3, generator=gen) / (3 * c**0.5)
    bias = torch.randn(k, generator=gen)
    plan = ConvPlan(weight, weight, [batch, c, h, w], [pad, pad], [1, 1], [1, 1], 1, None,
                    bias=bias, unary="relu")  # fmt: skip
    return plan, gen


def time_layer(layer: Layer, batch: int) -> dict[str, float]:
    """Seconds per call of the default kernel and each Winograd kernel on `layer`."""
    (c, h, w), k, pad = layer
    plan, gen = layer_plan(layer, batch)
    weight = plan.weight
    plan.packed = torch.ops.mkldnn._reorder_convolution_weight(
        weight, [pad, pad], [1, 1], [1, 1], 1, [batch, c, h, w]
    )
    default = "dnnl" if onednn_conv.available() else "onednn"
    names = [default, *CANDIDATES]
    times = conv_choice.time_kernels(plan, names, None)
    x = torch.randn(batch, c, h, w, generator=gen).contiguous(memory_format=torch.channels_last)
    ref = build_kernel(plan, default, lambda: x, None)()
    for name in CANDIDATES:
        y = build_kernel(plan, name, lambda: x, None)()
        err = float((y - ref).abs().max() / ref.abs().max())
        assert err < 1e-4, f"{layer} {name}: relative difference {err:.1e} from {default}"
    return times


def layer_args(doc: str) -> argparse.ArgumentParser:
    """The command line of the per-layer benchmarks: models, batches, thread counts."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet50"],
                    choices=["resnet50", "unet_small", "yolov8_style"])  # fmt: skip
    ap.add_argument("--batch", nargs="+", type=int, default=[1])
    ap.add_argument("--threads", nargs="+", type=int, default=[1])
    return ap


def main() -> None:
    args = layer_args(__doc__).parse_args()
    keep_freed_memory()  # as the cpu target does when it lowers a convolution
    for model in args.models:
        layers = resnet50_layers() if model == "resnet50" else zoo_layers(model)
        for batch in args.batch:
            for threads in args.threads:
                torch.set_num_threads(threads)
                report(model, layers, batch, threads)


def report(model: str, layers: Counter, batch: int, threads: int) -> None:
    """Time every layer and print one markdown table."""
    print(f"\n### {model} batch {batch}, {threads} thread(s), ms per call (best of rounds)\n")
    print("| layer (C, H, W) -> K | n | default | winograd | winograd2 | best/default |")
    print("| --- | --- | --- | --- | --- | --- |")
    total: Counter = Counter()
    for layer, count in sorted(layers.items(), key=lambda kv: -kv[0][0][1]):
        times = time_layer(layer, batch)
        names = list(times)
        best = min(times.values())
        for name, sec in times.items():
            total[name] += sec * count
        total["best"] += best * count
        cells = " | ".join(f"{times[n] * 1e3:.3f}" for n in names)
        ratio = best / times[names[0]]
        print(f"| {layer[0]} -> {layer[1]} | {count} | {cells} | {ratio:.2f} |", flush=True)
    default = next(iter(total))
    cells = " | ".join(f"{total[n] * 1e3:.2f}" for n in (default, *CANDIDATES))
    ratio = total["best"] / total[default]
    print(f"| **sum x n** | | {cells} | {ratio:.2f} (best {total['best'] * 1e3:.2f}) |")


if __name__ == "__main__":
    main()
