"""ResNet-50's 1x1 layers on oneDNN, each epilogue form and implementation timed against the
others in one process (`conv_choice.race`: interleaved rounds, caches flushed before each call,
thread CPU time at 1 thread, wall at 2).

Forms of the residual expansion, relu(conv(x) + b + r): `bin` the binary add post-op into a
separate output (what the arena runs), `sum` oneDNN's sum post-op over r (r is dead after),
`copy+sum` r copied into the output then the sum post-op, `after` conv + b into the output then
torch's add_ and relu_. Each oneDNN implementation offered is timed on `bin` (`bin@<impl>`).
Layers without a residual: `plain` (oneDNN's first), `plain@<impl>`, and `matmul` (stride 1:
torch's oneDNN linear on the prepacked weight, the `matmul` kernel of `conv_kernels`).

    python benchmarks/rn11_layers.py --batch 1 --threads 1 --flush-mb 4
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,F401,I001  (first: OpenMP's spin count before torch)
import torch  # noqa: E402

from pygraphx.targets.torch_lowering import conv_choice, onednn_conv  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan, build_kernel  # noqa: E402

#: (C, H, W, K, stride, residual, n in the network)
LAYERS = [
    (64, 56, 56, 256, 1, True, 3),
    (128, 28, 28, 512, 1, True, 4),
    (256, 14, 14, 1024, 1, True, 6),
    (512, 7, 7, 2048, 1, True, 3),
    (256, 56, 56, 64, 1, False, 2),
    (512, 28, 28, 128, 1, False, 3),
    (1024, 14, 14, 256, 1, False, 5),
    (2048, 7, 7, 512, 1, False, 2),
    (256, 56, 56, 512, 2, False, 1),
    (512, 28, 28, 1024, 2, False, 1),
    (1024, 14, 14, 2048, 2, False, 1),
]


def plan_of(n: int, c: int, h: int, w: int, k: int, stride: int, unary: str) -> ConvPlan:
    """A 1x1 layer's plan with a bias, random weight."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(k, c, 1, 1, generator=g) / c**0.5
    return ConvPlan(weight=weight, packed=weight, x_lens=[n, c, h, w], padding=[0, 0],
                    stride=[stride, stride], dilation=[1, 1], groups=1, pre_pad=None,
                    bias=torch.randn(k, generator=g), unary=unary, kernel="dnnl")  # fmt: skip


def cl(shape: list[int]) -> torch.Tensor:
    """A channels-last tensor of `shape` filled with 0.5."""
    return torch.empty(shape, memory_format=torch.channels_last).fill_(0.5)


def forms(layer: tuple, batch: int) -> tuple[dict, list[torch.Tensor]]:
    """The closures of every form of `layer`, and the inputs they read."""
    c, h, w, k, stride, residual, _ = layer
    x = cl([batch, c, h, w])
    plan = plan_of(batch, c, h, w, k, stride, "relu")
    out_lens = onednn_conv.geometry(plan)[3]
    out, fns = cl(out_lens), {}
    if not residual:
        fns["plain"] = onednn_conv.build(plan, lambda: x, None, out)
        if stride == 1:  # torch's oneDNN matmul on the packed weight (a new result per call)
            fns["matmul"] = build_kernel(plan, "matmul", lambda: x, None)
        for impl in onednn_conv.implementations(plan, False)[1:]:
            if "gemm" in impl or "sse41" in impl or impl.startswith("jit:"):
                continue
            p = replace(plan, impl=impl)
            fns[f"plain@{impl}"] = onednn_conv.build(p, lambda: x, None, out)
        return fns, [x]
    r = cl(out_lens)
    fns["bin"] = onednn_conv.build(plan, lambda: x, lambda: r, out)
    fns["sum"] = onednn_conv.build(replace(plan, in_place=True), lambda: x, lambda: r)
    acc = onednn_conv.build(replace(plan, accumulate=True), lambda: x, None, out)

    def copy_sum() -> torch.Tensor:
        out.copy_(r)
        return acc()

    fns["copy+sum"] = copy_sum
    bare = onednn_conv.build(replace(plan, unary="none"), lambda: x, None, out)

    def after() -> torch.Tensor:
        return bare().add_(r).relu_()

    fns["after"] = after
    for impl in onednn_conv.implementations(plan, True)[1:]:
        if "gemm" in impl or "sse41" in impl or impl.startswith("jit:"):
            continue
        fns[f"bin@{impl}"] = onednn_conv.build(replace(plan, impl=impl), lambda: x, lambda: r, out)
    return fns, [x, r]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--flush-mb", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="races per layer (best kept)")
    ap.add_argument("--residual-only", action="store_true", help="the residual layers only")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    conv_choice.FLUSH_BYTES = args.flush_mb << 20
    conv_choice.ROUNDS = 5
    print(f"# b{args.batch} t{args.threads} flush {args.flush_mb} MiB, ms per call (best)")
    for layer in [lay for lay in LAYERS if lay[5] or not args.residual_only]:
        fns, inputs = forms(layer, args.batch)
        best: dict[str, float] = {}
        for _ in range(args.repeat):
            for name, sec in conv_choice.race(fns, inputs).items():
                best[name] = min(best.get(name, 1.0), sec)
        c, h, w, k, stride, residual, n = layer
        macs = args.batch * k * c * (h // stride) * (w // stride)
        cells = ", ".join(f"{k_} {t * 1e3:.3f} ({2 * macs / t / 1e9:.0f} GF/s)"
                          for k_, t in best.items())  # fmt: skip
        first = onednn_conv.implementations(plan_of(args.batch, c, h, w, k, stride, "relu"), False)
        print(f"({c},{h},{w})->{k} s{stride} x{n} [{first[0]}]: {cells}")


if __name__ == "__main__":
    main()
