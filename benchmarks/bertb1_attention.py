"""A float32 attention block on the CPU: oneDNN's three primitives against torch's kernels.

    PYTHONPATH=. python benchmarks/bertb1_attention.py --threads 2 --batch 1 --head 64 --mask pad

Q, K and V are the strided head views of one fused (b, s, 3 * h * d) product (as a model's QKV
GEMM makes them); the mask is a padding mask (b, 1, 1, s) or a causal (1, 1, s, s) one. The
candidates (`onednn`: `onednn_attention.attend`, the default on the CPU; `sdpa`: torch's fused
kernel, `attention._sdpa`; `torch3`: matmul / softmax / matmul) alternate call by call; each
figure is the fastest of `--calls` calls, in microseconds, with the largest difference from
`sdpa`'s result.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pygraphx.targets.torch_lowering import onednn_attention  # noqa: E402
from pygraphx.targets.torch_lowering.attention import _sdpa  # noqa: E402


def three_steps(scale: float):
    def attend(q, kt, v, mask):
        x = torch.matmul(q, kt).mul_(scale)
        if mask is not None:
            x.add_(mask)
        return torch.matmul(torch.softmax(x, -1), v)

    return attend


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head", type=int, default=64, help="head width")
    ap.add_argument("--mask", choices=["pad", "causal"], default="pad")
    ap.add_argument("--calls", type=int, default=100)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    b, s, h, d = args.batch, args.seq, args.heads, args.head
    qkv = torch.randn(b, s, 3, h, d)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    kt = k.transpose(-1, -2)
    if args.mask == "pad":
        mask = torch.zeros(b, 1, 1, s)
        mask[..., -5:] = -1e4
    else:
        mask = torch.triu(torch.full((s, s), -1e4), 1)[None, None]
    scale = d**-0.5
    fns = {
        "sdpa": _sdpa(scale, torch.float32),
        "torch3": three_steps(scale),
        "onednn": onednn_attention.attend(scale, {}, _sdpa(scale, torch.float32)),
    }
    ref = fns["sdpa"](q, kt, v, mask)
    diffs = {n: float((f(q, kt, v, mask) - ref).abs().max()) for n, f in fns.items()}
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(args.calls):
        for n, f in fns.items():
            start = time.perf_counter()
            f(q, kt, v, mask)
            best[n] = min(best[n], time.perf_counter() - start)
    print(f"{args.threads} thread(s), (b, h, s, d) = {(b, h, s, d)}, {args.mask} mask, fastest of "
          f"{args.calls}: " + ", ".join(f"{n} {t * 1e6:.0f} us (diff {diffs[n]:.1e})"
                                       for n, t in best.items()))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
