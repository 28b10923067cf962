"""MobileNetV2: the executor's time between steps, measured inside the same run (helper mnv15).

    python benchmarks/mnv15_between.py --threads 2 --batch 1 --runs 200

Each run: the parameters bound, the steps run under the executable's run scope with each step
timed (`perf_counter` around it), the outputs collected; the run's wall time less its steps'
summed time is what the run spends outside the steps (bind, scope, the loop, collect, the
clock itself: ~0.1 us a step). Printed: the medians and minimums over the runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mnv2b1_ab import compiled  # noqa: E402

from pygraphx.models import get_model, model_inputs  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--env", action="append", default=[], help="K=V while compiling")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    model = get_model("mobilenetv2", batch=args.batch)
    feeds = {k: np.ascontiguousarray(v) for k, v in model_inputs("mobilenetv2", model).items()}
    prog = compiled(model, args.threads, dict(e.split("=", 1) for e in args.env))
    exe = prog._executable
    fns = exe.executor.steps
    clock = time.perf_counter
    for _ in range(5):
        prog.run(feeds)
    totals, inside = [], []
    with exe._lock:
        for _ in range(args.runs):
            t0 = clock()
            exe.executor.bind(feeds)
            s = 0.0
            with exe.scope():
                for fn in fns:
                    a = clock()
                    fn()
                    s += clock() - a
            exe.executor.collect()
            totals.append(clock() - t0)
            inside.append(s)
    t, i = np.array(totals) * 1e3, np.array(inside) * 1e3
    print(f"batch {args.batch} threads {args.threads} runs {args.runs} steps {len(fns)} env "
          f"{args.env}; load {Path('/proc/loadavg').read_text().split()[:3]}")  # fmt: skip
    print(f"run ms median {np.median(t):.3f} min {t.min():.3f}; steps ms median "
          f"{np.median(i):.3f}; outside the steps ms median {np.median(t - i):.4f} "
          f"min {(t - i).min():.4f} ({np.median(t - i) / len(fns) * 1e3:.1f} us a step)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
