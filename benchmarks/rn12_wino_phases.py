"""The Winograd kernel's passes timed one by one on ResNet-50's 3x3 layer shapes (helper rn12):
padded copy, input transform, products, output transform, store, the whole call, and torch's
direct convolution of the same layer, per thread count; `FLUSH_MB=64` writes 64 MiB before each
call (cold caches, as in a network) instead of timing warm repeats. Best of 3 blocks, wall time.

    FLUSH_MB=64 PYTHONPATH=. python benchmarks/rn12_wino_phases.py 1 2
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[1]))
import pygraphx  # noqa
import torch
from types import SimpleNamespace
from pygraphx.targets.torch_lowering import winograd as W

def plan_for(n, c, hw, k):
    return SimpleNamespace(weight=torch.randn(k, c, 3, 3), x_lens=(n, c, hw, hw), groups=1,
        stride=(1, 1), dilation=(1, 1), padding=(1, 1), pre_pad=None, accumulate=False,
        bias=torch.randn(k), unary="relu", scalars=(), add_after=False)

def phases(conv, x, y, ops, T):
    t = time.perf_counter
    a = t(); flat = W._padded(x, conv.geo, conv.scratch); T['pad'] += t() - a
    for ch in conv.chunks:
        a = t(); v = conv._input_transform(flat, ch); b = t(); T['in'] += b - a
        p = conv.products(v, conv.alloc('prod', (*v.shape[:2], conv.geo.k))); c = t()
        T['prod'] += c - b
        tl = conv._output_transform(p, ch); d = t(); T['out'] += d - c
        conv._store(tl, ch, y, None, ops); T['store'] += t() - d

FLUSH = int(os.environ.get('FLUSH_MB', '0'))
junk = torch.empty(max(FLUSH, 1) << 18)
def flush():
    if FLUSH: junk.fill_(1.0)
#: (batch, channels, map side, output channels): ResNet-50's 3x3 stride-1 layers
SHAPES = [(1, 64, 56, 64), (1, 128, 28, 128), (1, 256, 14, 256), (8, 128, 28, 128),
          (8, 64, 56, 64)]  # fmt: skip


def timed(fn, n):
    """Mean seconds of `n` calls of `fn`, each after `flush()`."""
    total = 0.0
    for _ in range(n):
        flush()
        a = time.perf_counter()
        fn()
        total += time.perf_counter() - a
    return total / n


for threads in map(int, sys.argv[1:]):
    torch.set_num_threads(threads)
    with torch.inference_mode():
        for n, c, hw, k in SHAPES:
            plan = plan_for(n, c, hw, k)
            conv = W.Winograd(plan, 4)
            x = torch.randn(n, c, hw, hw).contiguous(memory_format=torch.channels_last)
            y = torch.empty(n, hw, hw, k)
            ops = W.epilogue_ops(plan, False)
            w = torch.nn.functional.conv2d
            xw = x; wt = plan.weight.contiguous(memory_format=torch.channels_last)
            for _ in range(5): conv(x, y, None, ops); w(xw, wt, plan.bias, padding=1)
            R = 40 if n == 1 else 8
            best = {}
            for rep in range(3):
                T = dict(pad=0, **{k_: 0 for k_ in ('in', 'prod', 'out', 'store')})
                for _ in range(R):
                    flush(); phases(conv, x, y, ops, T)
                whole = timed(lambda: conv(x, y, None, ops), R)
                dn = timed(lambda: w(xw, wt, plan.bias, padding=1), R)
                cur = {k_: v / R * 1e3 for k_, v in T.items()}
                cur['whole'] = whole * 1e3; cur['torch_conv'] = dn * 1e3
                for k_, v in cur.items(): best[k_] = min(best.get(k_, 1e9), v)
            parts = " ".join(f"{k_} {v:.3f}" for k_, v in best.items())
            print(f"t{threads} n{n} c{c} {hw}x{hw} chunks={len(conv.chunks)} {parts}", flush=True)
