"""Small CPU steps timed as a model runs them: right after a weight product.

    PYTHONPATH=. python benchmarks/attn10_cold.py --threads 1 --calls 40

In a transformer every layer-norm / attention step follows a GEMM that streamed megabytes of
weights through the caches, so the step starts with its data *and its code* (Python, torch's
dispatcher, ctypes, oneDNN) out of L1 / L2. Each candidate runs right after a (128 x 3072) x
(3072 x 768) float32 product (`cold`), then again at once (`warm`); the candidates alternate
call by call. Printed: the median (and fastest) microseconds of each, thread CPU time at one
thread, wall time otherwise, with the largest difference from the first candidate of its group.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pygraphx.targets.torch_lowering import onednn_attention, onednn_layernorm  # noqa: E402
from pygraphx.targets.torch_lowering.attention import _sdpa  # noqa: E402

Fn = Callable[[], torch.Tensor | None]


def norms(dims: tuple[int, ...]) -> dict[str, Fn]:
    """Layer-norm candidates over one (b, s, n) float32 input."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(dims, generator=gen)
    n = dims[-1]
    w, b = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    f32 = onednn_layernorm.LayerNorm({}, dims, w, b, 1e-12, torch.float32)
    bf16 = onednn_layernorm.LayerNorm({}, dims, w, b, 1e-12, torch.bfloat16)
    tl = torch.layer_norm
    return {
        "F.layer_norm": lambda: F.layer_norm(x, (n,), w, b, 1e-12),
        "torch.layer_norm": lambda: tl(x, (n,), w, b, 1e-12),
        "onednn f32": lambda: f32(x),
        "torch.layer_norm .to(bf16)": lambda: tl(x, (n,), w, b, 1e-12).to(torch.bfloat16),
        "onednn bf16": lambda: bf16(x),
    }


def attention(b: int, s: int, h: int, d: int) -> dict[str, Fn]:
    """Attention candidates over Q / K / V head views of three (b, s, h * d) products and a
    padding mask, as BERT's parts make them."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(b, s, h, d, generator=gen).transpose(1, 2) for _ in range(3))
    kt = k.transpose(-1, -2)
    mask = torch.zeros(b, 1, 1, s)
    mask[..., -5:] = -1e4
    scale = d**-0.5
    sdpa = _sdpa(scale, torch.float32)
    onednn = onednn_attention.attend(scale, {}, sdpa)
    out = onednn(q, kt, v, mask)
    merged = (b, s, h * d)
    return {
        "sdpa, heads merged": lambda: sdpa(q, kt, v, mask).transpose(1, 2).reshape(merged),
        "onednn, heads merged": lambda: onednn(q, kt, v, mask).transpose(1, 2).reshape(merged),
        "torch.empty (out)": lambda: torch.empty(b, s, h * d),
        "signature": lambda: onednn_attention._signature(q, kt, v, mask),
        "heads merged (2 views)": lambda: out.transpose(1, 2).reshape(merged),
    }


def measure(group: dict[str, Fn], calls: int, threads: int) -> None:
    clock = time.thread_time_ns if threads == 1 else time.perf_counter_ns
    gen = torch.Generator().manual_seed(3)
    h, w = torch.randn(128, 3072, generator=gen), torch.randn(3072, 768, generator=gen)
    first = next(iter(group.values()))()
    diffs = {}
    for name, fn in group.items():
        if "(" in name:  # a probe of one part (its value is no output to compare)
            diffs[name] = None
            continue
        got = fn()
        same = isinstance(got, torch.Tensor) and got.shape == getattr(first, "shape", None)
        diffs[name] = float((got.float() - first.float()).abs().max()) if same else None
    cold: dict[str, list[float]] = {n: [] for n in group}
    warm: dict[str, list[float]] = {n: [] for n in group}
    for r in range(calls):
        for name, fn in group.items() if r % 2 == 0 else reversed(list(group.items())):
            torch.mm(h, w)
            t0 = clock()
            fn()
            t1 = clock()
            fn()
            t2 = clock()
            cold[name].append((t1 - t0) / 1e3)
            warm[name].append((t2 - t1) / 1e3)
    for name in group:
        c, m = sorted(cold[name]), sorted(warm[name])
        diff = "" if diffs[name] is None else f", diff {diffs[name]:.1e}"
        print(f"  {name:28s} cold {c[len(c) // 2]:7.1f} ({c[0]:7.1f})  "
              f"warm {m[len(m) // 2]:7.1f} ({m[0]:7.1f}) us{diff}")  # fmt: skip


def arguments(doc: str, argv: list[str] | None) -> argparse.Namespace:
    """`--threads` (torch is set to them) and `--calls` of a probe described by `doc`."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calls", type=int, default=40)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, argv)
    clock = "thread CPU" if args.threads == 1 else "wall"
    with torch.inference_mode():
        print(f"{args.threads} thread(s), {clock} time, median (fastest) of {args.calls}")
        print("layer norm (1, 128, 768):")
        measure(norms((1, 128, 768)), args.calls, args.threads)
        print("attention (1, 12, 128, 64), padding mask:")
        measure(attention(1, 128, 12, 64), args.calls, args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
