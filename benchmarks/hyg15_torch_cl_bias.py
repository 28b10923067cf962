"""hyg15: what a bf16 layer with a float32 ("wide") bias costs on the `torch_cl` kernel.

`F.conv2d` takes no float32 bias with bf16 activations, and its bf16 result is already rounded,
so the float32-bias answer (one rounding of product + bias) needs the product in float32: the
variants timed (1 thread, thread CPU time, alternating rounds, both orders):
`old` (bf16 conv2d, bias rounded to bf16: the route before hyg15), `f32` (conv2d in float32 on
the widened bf16 values, float32 bias, one rounding), `dnnl` (the default kernel, float32 bias).
Usage: PYTHONPATH=. python benchmarks/hyg15_torch_cl_bias.py [rounds]
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan, build_kernel

CL, BF = torch.channels_last, torch.bfloat16
#: (x lens, weight lens, padding, stride, groups): ResNet-50 / YOLOv8-style / MobileNetV2 layers
LAYERS = [
    ([1, 64, 56, 56], [64, 64, 3, 3], 1, 1, 1),
    ([1, 256, 56, 56], [64, 256, 1, 1], 0, 1, 1),
    ([1, 32, 80, 80], [32, 32, 3, 3], 1, 1, 1),
    ([1, 144, 56, 56], [144, 1, 3, 3], 1, 1, 144),
    ([1, 128, 28, 28], [128, 128, 3, 3], 1, 1, 1),
]


def plan_of(x_lens, w_lens, pad, stride, groups) -> ConvPlan:
    w = torch.randn(w_lens).to(BF)
    return ConvPlan(
        weight=w,
        packed=w,  # (dnnl packs its own)
        x_lens=x_lens,
        padding=[pad, pad],
        stride=[stride, stride],
        dilation=[1, 1],
        groups=groups,
        pre_pad=None,
        bias=torch.randn(w_lens[0]) * 8,
        unary="relu",
    )


def variants(plan: ConvPlan, x: torch.Tensor) -> dict:
    w = plan.weight.contiguous(memory_format=CL)
    wf = w.float()
    b, p, s, g = plan.bias, plan.padding, plan.stride, plan.groups
    bb = b.to(BF)

    def old() -> torch.Tensor:
        y = F.conv2d(x, w, bb, s, p, 1, g)
        return y.relu_()

    def f32() -> torch.Tensor:
        y = F.conv2d(x.float(), wf, b, s, p, 1, g)
        return y.relu_().to(BF)

    dnnl = build_kernel(plan, "dnnl", lambda: x, None)
    return {"old": old, "f32": f32, "dnnl": dnnl}


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    torch.set_num_threads(1)
    torch.manual_seed(0)
    for spec in LAYERS:
        plan = plan_of(*spec)
        x = torch.randn(spec[0]).to(BF).contiguous(memory_format=CL)
        fns = variants(plan, x)
        times = {k: [] for k in fns}
        for fn in fns.values():
            fn()
        for r in range(rounds):
            order = list(fns) if r % 2 == 0 else list(reversed(fns))
            for k in order:
                t0 = time.thread_time()
                for _ in range(5):
                    fns[k]()
                times[k].append((time.thread_time() - t0) / 5 * 1e3)
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        line = "  ".join(f"{k} {v:.3f}" for k, v in med.items())
        print(f"{spec[0]} * {spec[1]} g{spec[4]}: ms {line}  f32/old {med['f32'] / med['old']:.2f}")


if __name__ == "__main__":
    main()
