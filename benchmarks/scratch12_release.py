"""What the Winograd scratch keeps after a program is dropped (helper scratch12).

Compiles a built-in model for the cpu target, runs it once on each of `--pool` threads of a
persistent pool (a server's workers), then drops the program. Reports, in MB: the Winograd
buffers each pool thread holds (the per-thread scratch of rn12, `winograd.SCRATCH`, where the
tree has one) and the program's own (`winograd.program_scratch`, scratch12), and the
process's resident memory (`VmRSS` after `malloc_trim(0)`), after compile, after the runs and
after the drop. Run it on both trees (its imports come from `PYTHONPATH`):

    PGX_CONV_CHOICE_CACHE=off PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python \\
        benchmarks/scratch12_release.py --model resnet50 --batch 8 --pool 8
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import threading
from concurrent.futures import ThreadPoolExecutor

# isort: off
import pygraphx  # (first: pygraphx sets OpenMP's spin count before torch)
import torch

# isort: on
from pygraphx.models import get_model, model_inputs
from pygraphx.targets.torch_lowering import winograd


def rss_mb() -> float:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def thread_bytes() -> int:
    """The Winograd buffers the calling thread holds in the process-wide scratch (rn12's
    `SCRATCH`, a set per thread), 0 where the tree has none."""
    scratch = getattr(winograd, "SCRATCH", None)
    if scratch is None:
        return 0
    bufs = getattr(scratch._local, "bufs", {})
    return sum(b.numel() * b.element_size() for b in bufs.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--pool", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1, help="the program's threads")
    args = ap.parse_args()
    model = get_model(args.model, batch=args.batch)
    feeds = model_inputs(args.model, model)
    base = rss_mb()
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    prog.compile(pygraphx.get_target("cpu", threads=args.threads))
    compiled = rss_mb()
    exe = prog._executable
    program_scratch = exe.lowered.ctx.cache.get("winograd_scratch")
    chosen = exe.lowered.ctx.cache["conv_choice"].chosen
    pool = ThreadPoolExecutor(args.pool)
    start = threading.Barrier(args.pool)

    def work(_: int) -> int:
        start.wait()  # every pool thread runs it once
        prog.run(feeds)
        return thread_bytes()

    held = list(pool.map(work, range(args.pool)))
    ran = rss_mb()
    own = 0 if program_scratch is None else program_scratch.nbytes()
    del prog, exe, model, program_scratch
    gc.collect()
    dropped = rss_mb()
    after = list(pool.map(lambda _: (start.wait(), thread_bytes())[1], range(args.pool)))
    mb = 1e6
    print(f"{args.model} b{args.batch}, program threads {args.threads}, pool {args.pool}, "
          f"winograd layers {chosen.get('winograd', 0)}, torch threads {torch.get_num_threads()}")
    print(f"per-thread scratch after runs, MB: {[round(b / mb, 1) for b in held]} "
          f"(sum {sum(held) / mb:.1f}); program scratch {own / mb:.1f}")
    print(f"per-thread scratch after the drop, MB: sum {sum(after) / mb:.1f}")
    print(f"RSS MB: start {base:.0f}, compiled {compiled:.0f}, after runs {ran:.0f}, "
          f"after the drop {dropped:.0f} (kept over start: {dropped - base:.0f})")


if __name__ == "__main__":
    main()
