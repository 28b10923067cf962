"""How much of a GPT-2 product's in-run loss is its cold weights (helper gpt17).

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/gpt17_cold.py --threads 2 --rounds 12

Rounds of whole runs, step by step, alternating two modes, both orders: `run` (each product
timed as it comes in the run) and `warm-w` (before each product, its packed oneDNN weight is
read once by both threads — `torch.sum` over the packed bytes viewed as float32 — before the
step before it runs, so that the product's source is as that step leaves it; the product is
then timed). The product's destination (a new tensor a run) is as in the run in both
modes. `warm-dst`: before the step before a product that makes a new destination tensor,
a tensor of that size is written and freed (malloc gives the product's `torch.empty` that
block next: its destination in the caches), the weights as in the run. Per group: the sum of each product's fastest over the rounds; the difference is what the
weights arriving from DRAM cost. 1 thread: thread CPU time; more: wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bertb1_profile as bp  # noqa: E402
import cpu_transformer_blocks as ctb  # noqa: E402
import gemm14_profile as g14  # noqa: E402
import gemm15_ab as harness  # noqa: E402
import gpt16_profile as g16  # noqa: E402
from gpt17_gap import unwrapped  # noqa: E402

from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.targets.torch_lowering.onednn_linear import Linear  # noqa: E402

PRODUCTS = ("qkv", "proj", "ffn_up", "ffn_down", "lm_head")


def linears(obj: Any, depth: int = 0, seen: set[int] | None = None) -> list[Linear]:
    """The `Linear`s a step's function reaches through closures, bound methods and attributes."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 8:
        return []
    seen.add(id(obj))
    if isinstance(obj, Linear):
        return [obj]
    found: list[Linear] = []
    inner = [getattr(obj, "__self__", None), getattr(obj, "func", None)]
    inner += [c.cell_contents for c in getattr(obj, "__closure__", None) or ()
              if c.cell_contents is not None]  # fmt: skip
    inner += list(getattr(obj, "__dict__", {}).values()) if callable(obj) else []
    if isinstance(obj, (list, tuple)):
        inner += list(obj)
    for x in inner:
        if x is not None and not isinstance(x, (int, float, str, bytes, np.ndarray)):
            found += linears(x, depth + 1, seen)
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bp.model_arguments(ap, model="gpt2", threads=2, runs=12)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--wait-quiet", type=float, default=0.0)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    model = get_model(args.model, batch=args.batch)
    feeds = model_inputs(args.model, model)
    prog = ctb.compile_pgx(model.SerializeToString(), args)
    for _ in range(3):
        prog.run(feeds)
    exe = prog._executable
    ex = exe.executor
    steps = ex.steps
    groups = [g16.group_of(g14.pgx_kind(s)) for s in exe.lowered.steps]
    weights: dict[int, list[torch.Tensor]] = {}
    dsts: dict[int, list[tuple]] = {}  # a product's new destination's shape (none: in place)
    for k, g in enumerate(groups):
        if g in PRODUCTS:
            lins = linears(steps[k])
            packed = [lin.primitive().weight for lin in lins]
            weights[k] = [p[: p.numel() // 4 * 4].view(torch.float32) for p in packed]
            dsts[k] = [lin.out_lens for lin in lins if lin.residual != "sum"][:1]
    print(f"# products with their packed weights found: {sum(map(bool, weights.values()))} of "
          f"{len(weights)}")  # fmt: skip
    if args.wait_quiet:
        print(harness.wait_quiet(args.wait_quiet), flush=True)
    n = len(steps)
    modes = ("run", "warm-w", "warm-dst")
    best = {m: np.full(n, np.inf) for m in modes}
    for r in range(args.rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            ex.bind(feeds)
            with exe.scope():
                for k, fn in enumerate(steps):
                    if mode == "warm-w" and weights.get(k + 1):
                        for w in weights[k + 1]:  # (the next step's, before this one runs)
                            torch.sum(w)
                    if mode == "warm-dst" and dsts.get(k + 1):
                        # (a block of the destination's size written and freed: malloc hands
                        # it to the product's `torch.empty` next, in the caches)
                        torch.zeros(dsts[k + 1][0]).fill_(1.0)
                    start = clock()
                    fn()
                    best[mode][k] = min(best[mode][k], clock() - start)
            ex.collect()
    what = "thread CPU" if args.threads == 1 else "wall"
    print(f"{args.model} b{args.batch} t{args.threads}, {args.rounds} rounds, {what} ms (sums of "
          f"each step's fastest); loadavg {Path('/proc/loadavg').read_text().split()[0]}")
    by: dict[str, list[int]] = defaultdict(list)
    for k, g in enumerate(groups):
        by[g].append(k)
    print(f"  {'group':10s} {'run':>9s} {'warm-w':>9s} {'run-warm':>9s} {'warm-dst':>9s} "
          f"{'run-wdst':>9s}")
    for g in PRODUCTS:
        ks = by.get(g, [])
        if ks:
            a, b, c = (best[m][ks].sum() * 1e3 for m in modes)
            print(f"  {g:10s} {a:9.2f} {b:9.2f} {a - b:9.2f} {c:9.2f} {a - c:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
