"""torch's allocator with and without transparent huge pages (`THP_MEM_ALLOC_ENABLE`), A/B.

    PYTHONPATH=. python benchmarks/xfmr2_thp_ab.py --models bert_base gpt2 --threads 1 2 \
        --rounds 3 --runs 12

The setting is read once per process (by torch's allocator, at its first allocation), so each
measurement is a fresh process; for every (model, threads) the two settings alternate, `--rounds`
times. A process compiles the model on the `cpu` target, runs it twice, then `--runs` timed runs
(wall and process CPU time), and reports the medians, the fastest run, the process's huge pages
(`AnonHugePages`) and its peak resident memory. Printed: one line per process, then per (model,
threads) the median over rounds of each setting's median CPU and wall ms a run. `--json` writes
the rows.

Run this on a quiet machine: other processes' load moves wall times by more than the effect.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
import numpy as np
import pygraphx
from pygraphx.models import get_model, model_inputs
from pygraphx.targets.cpu.target import CpuTarget
name, batch, threads, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
model = get_model(name, batch=batch)
feeds = model_inputs(name, model)
prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
prog.compile(CpuTarget(threads=threads))
for _ in range(2):
    prog.run(feeds)
wall, cpu = [], []
for _ in range(runs):
    w0, c0 = time.perf_counter(), time.process_time()
    prog.run(feeds)
    wall.append(time.perf_counter() - w0)
    cpu.append(time.process_time() - c0)
kb = {}
lines = open("/proc/self/status").read().splitlines()
for line in lines + open("/proc/self/smaps_rollup").read().splitlines():
    key, _, rest = line.partition(":")
    if key in ("VmHWM", "AnonHugePages"):
        kb[key] = int(rest.split()[0])
print(json.dumps({"wall_ms": 1e3 * float(np.median(wall)), "wall_min_ms": 1e3 * min(wall),
                  "cpu_ms": 1e3 * float(np.median(cpu)), "cpu_min_ms": 1e3 * min(cpu),
                  "huge_mb": kb.get("AnonHugePages", 0) / 1024, "peak_mb": kb["VmHWM"] / 1024}))
"""


def one(model: str, batch: int, threads: int, runs: int, thp: str, root: Path = ROOT) -> dict:
    """One fresh process running `model` from the source tree `root` with `thp`
    (`THP_MEM_ALLOC_ENABLE`; "" leaves it to pygraphx)."""
    env = {**os.environ, "PYTHONPATH": str(root), "PGX_CPU_LOAD_ADAPT": "0"}
    env.pop("THP_MEM_ALLOC_ENABLE", None)
    if thp:
        env["THP_MEM_ALLOC_ENABLE"] = thp
    cmd = [sys.executable, "-c", CHILD, model, str(batch), str(threads), str(runs)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=root)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["bert_base"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rows = []
    for model in args.models:
        for threads in args.threads:
            for r in range(args.rounds):
                for thp in ("0", "1") if r % 2 == 0 else ("1", "0"):
                    got = one(model, args.batch, threads, args.runs, thp)
                    res = {"model": model, "batch": args.batch, "threads": threads, "thp": thp,
                           "round": r, **got}  # fmt: skip
                    rows.append(res)
                    print(json.dumps(res), flush=True)
    print("median over rounds of each process's median (ms a run):")
    for model in args.models:
        for threads in args.threads:
            cells = []
            for thp in ("0", "1"):
                key = (model, threads, thp)
                sel = [x for x in rows if (x["model"], x["threads"], x["thp"]) == key]
                keys = ("cpu_ms", "wall_ms", "peak_mb")
                cpu, wall, peak = (np.median([x[k] for x in sel]) for k in keys)
                cells.append(f"THP_MEM_ALLOC_ENABLE={thp}: cpu {cpu:.1f} wall {wall:.1f} peak "
                             f"{peak:.0f} MB")  # fmt: skip
            print(f"  {model} b{args.batch} t{threads}: " + " | ".join(cells))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
