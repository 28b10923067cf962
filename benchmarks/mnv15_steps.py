"""MobileNetV2: each step's minimum time, old (mnv15's switches off) against new (the defaults),
both programs in one process, alternating runs (helper mnv15).

    python benchmarks/mnv15_steps.py --threads 2 --batch 1 --runs 60

The new program's first step is the old one's first two (the stem and the first block), its
last the old one's last three (the head); the 16 blocks between are the same kernels, listed
side by side (a difference there is the machine or the program around them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mnv2b1_ab import compiled  # noqa: E402

from pygraphx.models import get_model, model_inputs  # noqa: E402

OLD = {"PGX_CPU_NATIVE_MBHEAD": "0", "PGX_CPU_NATIVE_MBSTEM": "0"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--runs", type=int, default=60)
    p.add_argument("--old", default=None, help="K=V,...: the old program (default: both "
                   "switches off); `@module.NAME=value` sets a module attribute while compiling")
    args = p.parse_args(argv)
    import torch

    from pygraphx.targets.cpu.profile import time_steps

    torch.set_num_threads(args.threads)
    model = get_model("mobilenetv2", batch=args.batch)
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs("mobilenetv2", model).items()}
    old = OLD if args.old is None else dict(kv.split("=", 1) for kv in args.old.split(","))
    progs = {"old": compiled(model, args.threads, old), "new": compiled(model, args.threads, {})}
    mins: dict = {n: None for n in progs}
    for r in range(args.runs):
        for name, prog in progs.items() if r % 2 == 0 else list(progs.items())[::-1]:
            t = np.array([s.seconds for s in time_steps(prog._executable, feeds, 1)]) * 1e6
            mins[name] = t if mins[name] is None else np.minimum(mins[name], t)
    o, n = mins["old"], mins["new"]
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"batch {args.batch} threads {args.threads} runs {args.runs}, old {old}, "
          f"load {load}; us")
    if len(o) == len(n):  # the same steps: side by side
        for k in range(len(n)):
            print(f"step {k:2d}: old {o[k]:7.1f} new {n[k]:7.1f}  new/old {n[k] / o[k]:.3f}")
        print(f"sum of step minimums: old {o.sum():.1f} new {n.sum():.1f}")
        return 0
    print(f"stem + block 1: old {o[0]:.1f} + {o[1]:.1f} = {o[0] + o[1]:.1f}, new {n[0]:.1f}")
    for k in range(1, len(n) - 1):
        print(f"block {k + 1:2d}: old {o[k + 1]:7.1f} new {n[k]:7.1f}  "
              f"new/old {n[k] / o[k + 1]:.3f}")
    print(f"head: old {o[-3]:.1f} + {o[-2]:.1f} + {o[-1]:.1f} = {o[-3:].sum():.1f}, "
          f"new {n[-1]:.1f}")
    print(f"sum of step minimums: old {o.sum():.1f} new {n.sum():.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
