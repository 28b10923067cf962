"""The erf-GELU pass alone, two forms (`PGX_CPU_GELU_ERF_MIDDLE=0`) against three (the middle
form), one process, alternating, both orders (helper tfov17): us a call (median thread CPU time
at one thread, wall at more) over a float32 (rows, n) array reset by a copy before each call
(the copy's time subtracted: a copy alone timed the same way), and the share of 16-vectors
each form takes.

    PYTHONPATH=. python benchmarks/tfov17_gelu_pass.py --rows 1024 --n 1536 --mean -0.7 --std 1.5
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402


def shares(x: torch.Tensor) -> str:
    v = x.reshape(-1)[: x.numel() // 16 * 16].reshape(-1, 16)
    central = ((v > -1.5) & (v < 2)).all(1)
    middle = (v.abs() < 4).all(1) & ~central
    n = v.shape[0]
    return (f"vectors: central {central.sum().item() / n:.1%}, middle "
            f"{middle.sum().item() / n:.1%}, tail {1 - (central | middle).sum().item() / n:.1%}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--n", type=int, default=1536)
    ap.add_argument("--mean", type=float, default=-0.7)
    ap.add_argument("--std", type=float, default=1.5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--values", help="a .npy file of values (a model's FFN-up products)")
    args = ap.parse_args()
    from pygraphx.targets.torch_lowering import native_gelu

    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    if args.values:
        src = torch.from_numpy(np.load(args.values).astype(np.float32)).reshape(-1)
    else:
        g = torch.Generator().manual_seed(17)
        src = torch.randn(args.rows * args.n, generator=g) * args.std + args.mean
    work = torch.empty_like(src)
    passes = {}
    for name, env in (("two forms", "0"), ("three forms", "1")):
        os.environ[native_gelu.MIDDLE_ENV] = env
        passes[name] = native_gelu.GeluErf()
    passes["copy only"] = lambda t: t
    times: dict[str, list[float]] = {k: [] for k in passes}
    for r in range(args.rounds):
        for name in list(passes)[:: 1 if r % 2 == 0 else -1]:
            work.copy_(src)
            start = clock()
            work.copy_(src)
            passes[name](work)
            times[name].append(clock() - start)
    copy = np.median(times["copy only"])
    print(f"# {src.numel()} values, mean {src.mean():.2f} std {src.std():.2f}; {shares(src)}; "
          f"{args.threads} thread(s), loadavg {Path('/proc/loadavg').read_text().split()[:3]}")
    for name in ("two forms", "three forms"):
        print(f"  {name:12s} {(np.median(times[name]) - copy) * 1e6:8.1f} us a call (less the "
              f"copy, {copy * 1e6:.1f} us)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
