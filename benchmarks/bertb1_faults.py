"""Page faults and time of a transformer run with and without `malloc_keep.keep_freed_memory`.

    PYTHONPATH=. python benchmarks/bertb1_faults.py --model gpt2 --threads 1

Each setting runs in its own process (malloc's thresholds are process-wide and cannot be
undone), the two alternating `--rounds` times; `PGX_CPU_KEEP_FREED=0` stops the lowering from
raising them. Printed: minor page faults a run, median process CPU ms and wall ms a run.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bertb1_profile import model_arguments  # noqa: E402


def child(args: argparse.Namespace) -> None:
    import cpu_transformer_blocks as ctb
    import torch

    from pygraphx.models import get_model, model_inputs

    torch.set_num_threads(args.threads)
    model = get_model(args.model, batch=args.batch)
    feeds = model_inputs(args.model, model)
    prog = ctb.compile_pgx(model.SerializeToString(), args)
    for _ in range(2):
        prog.run(feeds)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cpu, wall = [], []
    for _ in range(args.runs):
        c0, w0 = ctb.cpu_seconds(), time.perf_counter()
        out = prog.run(feeds)
        wall.append(time.perf_counter() - w0)
        cpu.append(ctb.cpu_seconds() - c0)
        del out
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // args.runs
    keep = os.environ.get("PGX_CPU_KEEP_FREED", "1")
    print(f"PGX_CPU_KEEP_FREED={keep}: {faults} faults a run, CPU {np.median(cpu) * 1e3:.1f} ms, "
          f"wall {np.median(wall) * 1e3:.1f} ms")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    model_arguments(ap, model="gpt2", threads=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return 0
    own = [a for a in (argv if argv is not None else sys.argv[1:])]
    for _ in range(args.rounds):
        for keep in ("0", "1"):
            env = {**os.environ, "PGX_CPU_KEEP_FREED": keep, "PGX_CPU_LOAD_ADAPT": "0"}
            subprocess.run([sys.executable, __file__, *own, "--child"], env=env, check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
