"""MobileNetV2's blocks in the network: each block's native step (mbv14) against the sum of
the oneDNN route's steps for the same instructions, minimum over runs of each step's time
(`profile.time_steps`: a chain's members timed one by one), both programs in one process,
alternating.

    python benchmarks/mbv14_steps.py --threads 1 --batch 1 --runs 40
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--runs", type=int, default=40)
    args = p.parse_args(argv)
    import torch

    from pygraphx.targets.cpu.profile import time_steps

    torch.set_num_threads(args.threads)
    model = get_model("mobilenetv2", batch=args.batch)
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs("mobilenetv2", model).items()}
    progs = {"old": compiled(model, args.threads, {"PGX_CPU_NATIVE_MBCONV": "0"}),
             "new": compiled(model, args.threads, {"PGX_CPU_NATIVE_MBCONV": "all"})}  # fmt: skip
    mins: dict[str, np.ndarray | None] = {n: None for n in progs}
    names: dict[str, list[list[int]]] = {}
    for r in range(args.runs):
        for name, prog in progs.items() if r % 2 == 0 else list(progs.items())[::-1]:
            steps = time_steps(prog._executable, feeds, 1)
            t = np.array([s.seconds for s in steps])
            mins[name] = t if mins[name] is None else np.minimum(mins[name], t)
            # instructions named by their place in the module (the two programs come from
            # the same passes, only the lowering differs)
            low = prog._executable.lowered
            pos = low.ctx.position
            names[name] = [[pos[id(i)] for i in s.instructions] for s in low.steps]
    old_of = {}
    for k, ins in enumerate(names["old"]):
        for i in ins:
            old_of[i] = k
    print(f"batch {args.batch} threads {args.threads} runs {args.runs}; step minimum ms "
          f"(loadavg {Path('/proc/loadavg').read_text().split()[:3]})")
    total_old = total_new = 0.0
    for k, ins in enumerate(names["new"]):
        if len(ins) < 4:
            continue
        olds = sorted({old_of[i] for i in ins if i in old_of})
        o = float(sum(mins["old"][j] for j in olds)) * 1e3
        n = float(mins["new"][k]) * 1e3
        total_old, total_new = total_old + o, total_new + n
        print(f"block step {k:3d} ({len(ins)} instr): old {o:.4f} ({len(olds)} steps)  "
              f"new {n:.4f}  new/old {n / o:.3f}")
    print(f"blocks: old {total_old:.3f} new {total_new:.3f} ms; whole run step sums: old "
          f"{mins['old'].sum() * 1e3:.3f} new {mins['new'].sum() * 1e3:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
