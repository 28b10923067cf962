"""Two source trees of pygraphx, A/B in alternating fresh processes (a branch against main).

    PYTHONPATH=. python benchmarks/xfmr2_tree_ab.py --base /work/main --models bert_base \
        --threads 1 2 --rounds 3 --runs 12

Each process imports pygraphx from its tree (`PYTHONPATH`), with pygraphx's own allocator and
OpenMP settings, compiles the model on the `cpu` target and times `--runs` runs (as
`xfmr2_thp_ab.py`). Printed: one line per process, then per (model, threads) the median over
rounds of each tree's median CPU and wall ms a run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from xfmr2_thp_ab import ROOT, one  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", type=Path, required=True, help="the other tree (A)")
    ap.add_argument("--models", nargs="+", default=["bert_base"])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=12)
    args = ap.parse_args(argv)
    trees = {"A base": args.base.resolve(), "B this": ROOT}
    rows = []
    for model in args.models:
        for threads in args.threads:
            for r in range(args.rounds):
                for name in list(trees) if r % 2 == 0 else list(trees)[::-1]:
                    got = one(model, 1, threads, args.runs, "", trees[name])
                    rows.append({"model": model, "threads": threads, "tree": name, **got})
                    print(json.dumps(rows[-1]), flush=True)
    for model in args.models:
        for threads in args.threads:
            cells = []
            for name in trees:
                sel = [
                    x
                    for x in rows
                    if (x["model"], x["threads"], x["tree"]) == (model, threads, name)
                ]
                cpu = np.median([x["cpu_ms"] for x in sel])
                wall = np.median([x["wall_ms"] for x in sel])
                cells.append(f"{name}: cpu {cpu:.1f} wall {wall:.1f}")
            print(f"  {model} b1 t{threads}: " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
