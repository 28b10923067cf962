"""Float32 attention blocks, one thread: torch's SDPA / oneDNN's primitives / the native FMA
kernel (`native_attention`), thread CPU time per call, median of 9 alternating rounds.

    PYTHONPATH=. python benchmarks/attn13_f32_blocks.py

Q / K / V are the strided head views of one fused (b, s, 3*h*d) float32 product; BERT-base,
MiniLM and ViT-B/16 shapes and a (1, 12, 512, 64) one; padding mask where the model has one.
Printed with each one's relative error against float64.
"""

from __future__ import annotations

import statistics
import time

import pygraphx  # noqa: F401  (before torch: it sets OpenMP's spin count)
import torch

from pygraphx.targets.torch_lowering import native_attention, onednn_attention
from pygraphx.targets.torch_lowering.attention import _sdpa

SHAPES = {  # name: (b, h, d, s, padding mask)
    "bert b1": (1, 12, 64, 128, 1),
    "bert b8": (8, 12, 64, 128, 1),
    "minilm b8": (8, 12, 32, 128, 1),
    "vit b1": (1, 12, 64, 197, 0),
    "vit b8": (8, 12, 64, 197, 0),
    "1x12x512": (1, 12, 64, 512, 1),
}


def main() -> int:
    torch.set_num_threads(1)
    for name, (b, h, d, s, m) in SHAPES.items():
        qkv = torch.randn(b, s, 3, h, d)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        kt = k.transpose(-1, -2)
        mask = None
        if m:
            mask = torch.zeros(b, 1, 1, s)
            mask[..., -9:] = -1e4
        sc = d**-0.5
        fns = {
            "sdpa": _sdpa(sc, torch.float32),
            "onednn": onednn_attention.attend(sc, {}, _sdpa(sc, torch.float32)),
            "native": native_attention.attend(sc, {}, None),
        }
        r = (q.double() @ kt.double()) * sc
        r = torch.softmax(r if mask is None else r + mask.double(), -1) @ v.double()
        errs = {n: float((f(q, kt, v, mask).double() - r).norm() / r.norm())
                for n, f in fns.items()}  # fmt: skip
        best: dict[str, list[float]] = {n: [] for n in fns}
        calls = max(2, int(2e5 / (b * h * s * s)))
        for rr in range(9):
            for n in list(fns) if rr % 2 == 0 else list(fns)[::-1]:
                t = time.thread_time()
                for _ in range(calls):
                    fns[n](q, kt, v, mask)
                best[n].append((time.thread_time() - t) / calls)
        print(name, " ".join(f"{n} {statistics.median(best[n]) * 1e6:.0f}us (err {errs[n]:.1e})"
                             for n in fns), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
