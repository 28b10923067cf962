"""The native attention kernel's tiles and K packing, `4` against `wide` (helper minilm13), one
thread, thread CPU time per call, median / min of `--rounds` alternating rounds (A B, B A, ...).

    PYTHONPATH=. python benchmarks/minilm13_tiles.py [--bf16] [--rounds 30]

A: `PGX_CPU_NATIVE_ATTENTION_TILES=4` (the first version's 4-row tiles), B: `wide` (the
default). Q / K / V are the strided head views of one fused (b, s, 3*h*d) product, as in the
models; each variant's relative error against a float64 reference is printed. For the bf16
kernel (`--bf16`) the switch changes only how K is packed (16 x 16 transposes of bf16 pairs
against pair by pair): its tiles stay 4 rows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import pygraphx  # noqa: F401  (before torch: it sets OpenMP's spin count)
import torch

from pygraphx.targets.torch_lowering import native_attention

SHAPES = {  # name: (b, h, d, s, padding mask)
    "minilm b8": (8, 12, 32, 128, 1),
    "bert b1": (1, 12, 64, 128, 1),
    "bert b8": (8, 12, 64, 128, 1),
    "vit b1": (1, 12, 64, 197, 0),
    "odd b2": (2, 3, 48, 77, 1),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dt = torch.bfloat16 if args.bf16 else torch.float32
    print("# loadavg at the start:", open("/proc/loadavg").read().split()[:3])
    for name, (b, h, d, s, m) in SHAPES.items():
        qkv = torch.randn(b, s, 3, h, d).to(dt)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        kt = k.transpose(-1, -2)
        mask = None
        if m:
            mask = torch.zeros(b, 1, 1, s)
            mask[..., -9:] = -1e4
        r = (q.double() @ kt.double()) * d**-0.5
        r = torch.softmax(r if mask is None else r + mask.double(), -1) @ v.double()
        fns, errs = {}, {}
        for name_v, env in (("4 rows", "4"), ("wide", "wide")):
            os.environ[native_attention.TILES_ENV] = env
            fns[name_v] = native_attention.attend(d**-0.5, {}, None)
            out = fns[name_v](q, kt, v, mask)  # makes the plan (reads the variable)
            errs[name_v] = float((out.double() - r).norm() / r.norm())
        del os.environ[native_attention.TILES_ENV]
        times: dict[str, list[float]] = {n: [] for n in fns}
        calls = max(1, int(1e5 / (b * h * s * s)))
        for rr in range(args.rounds):
            for n in list(fns) if rr % 2 == 0 else list(fns)[::-1]:
                t = time.thread_time()
                for _ in range(calls):
                    fns[n](q, kt, v, mask)
                times[n].append((time.thread_time() - t) / calls)
        med = {n: statistics.median(t) * 1e6 for n, t in times.items()}
        kind = "bf16" if args.bf16 else "f32"
        print(f"{name} {kind} (b, h, d, s) = {(b, h, d, s)}: " + ", ".join(
            f"{n} {med[n]:.0f} / {min(times[n]) * 1e6:.0f} us (err {errs[n]:.1e})" for n in fns)
            + f"; wide / 4 rows {med['wide'] / med['4 rows']:.3f}", flush=True)  # fmt: skip
    print("# loadavg at the end:", open("/proc/loadavg").read().split()[:3])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
