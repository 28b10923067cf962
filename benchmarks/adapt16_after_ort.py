"""What an ONNX Runtime block does to the `cpu` target's next runs in one process (issue 10).

    PYTHONPATH=. python benchmarks/adapt16_after_ort.py --threads 16 \
        --models resnet50:1 mobilenetv2:8

`cpu_threads_probe.py --ab` alternates blocks of ORT and pygraphx runs in one process: ORT's
pool keeps spinning for a while after its block, and the stall adaptation (`cpu/threads.py`
`StallAdapt`) may take that for a neighbour. Per round: an ORT block (`--seconds`), then a block
of the pygraphx program with the adaptation on, another ORT block, then the same program
compiled with it off; each run's wall time and the threads it took are recorded. Prints, per
block, the first runs (ms@threads), the block's median and its thread counts; `--json` keeps
every run."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_engines import make_ort, make_pygraphx  # noqa: E402

from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.targets.cpu.threads import STALL_ADAPT_ENV  # noqa: E402


def compile_cpu(model, threads: int, stall: bool):
    """(run, program) of the cpu target with the stall adaptation on or off."""
    saved = os.environ.get(STALL_ADAPT_ENV)
    os.environ[STALL_ADAPT_ENV] = "1" if stall else "0"
    try:
        return make_pygraphx(model, "arena", threads, True)[0::2]
    finally:
        if saved is None:
            os.environ.pop(STALL_ADAPT_ENV, None)
        else:
            os.environ[STALL_ADAPT_ENV] = saved


def block(run, seconds: float, threads_of=None) -> list[tuple[float, int]]:
    got = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(got) < 3:
        t0 = time.perf_counter()
        run()
        got.append(((time.perf_counter() - t0) * 1e3, threads_of() if threads_of else 0))
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet50:1", "mobilenetv2:8"])
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=0.3)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out = []
    for spec in args.models:
        name, batch = spec.split(":")
        model = get_model(name, batch=int(batch), seq_len=128)
        feeds = model_inputs(name, model)
        ort_run = make_ort(model, args.threads)[0]
        runs, limits = {}, {}
        for stall in (True, False):
            runs[stall], prog = compile_cpu(model, args.threads, stall)
            limits[stall] = prog._executable.scope.limit
        for stall in (True, False):
            for _ in range(5):
                runs[stall](feeds)
        for _ in range(5):
            ort_run(feeds)
        for r in range(args.rounds):
            for stall in (True, False):
                o = block(lambda: ort_run(feeds), args.seconds)
                p = block(lambda s=stall: runs[s](feeds), args.seconds,
                          lambda s=stall: limits[s][0])
                first = " ".join(f"{ms:.2f}@{t}" for ms, t in p[:8])
                counts = sorted({t for _, t in p})
                med = statistics.median(ms for ms, _ in p)
                print(f"{name} b{batch} round {r} adapt {'on ' if stall else 'off'}: ORT "
                      f"{statistics.median(ms for ms, _ in o):.2f} ms; pgx median {med:.2f} ms "
                      f"over {len(p)} runs on {counts} threads, first: {first}",
                      flush=True)  # fmt: skip
                out.append({"model": name, "batch": int(batch), "round": r, "adapt": stall,
                            "ort_ms": [ms for ms, _ in o], "pgx_ms": [ms for ms, _ in p],
                            "pgx_threads": [t for _, t in p]})  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
