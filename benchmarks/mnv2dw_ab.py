"""A/B of the 1x1 + depthwise fusion (`conv_dw_fusion.py`) on a whole model, in one process.

    python benchmarks/mnv2dw_ab.py --threads 1 --batch 1 --rounds 10
    python benchmarks/mnv2dw_ab.py --threads 2 --batch 8 --rounds 6 --model mobilenetv2

Two programs of the same model, compiled with `PGX_CONV_DW_FUSION=off` and `on` (the order
of the compiles alternates with `--off-first`), run in alternating blocks of `--runs` runs;
per block the wall time and the process CPU time per run. Prints each round and the median of
each column; outputs of the two are compared with each other and with ONNX Runtime's.
`PGX_CPU_LOAD_ADAPT=0` is set, so a busy machine does not take threads away from the runs
(wall times are then inflated by the other processes' load: compare the CPU columns there).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("PGX_CPU_LOAD_ADAPT", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402


def compiled(model: object, threads: int, fusion: str, bf16: bool = False) -> object:
    """The model compiled for the cpu target with the fusion `on` or `off` (`bf16`: after
    `quantize_bf16`'s default conversion)."""
    from pygraphx.targets.cpu.target import CpuTarget

    os.environ["PGX_CONV_DW_FUSION"] = fusion
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    if bf16:
        pygraphx.quantize_bf16(prog)
    prog.compile(CpuTarget(threads=threads))
    return prog


def block(prog: object, feeds: dict, runs: int) -> tuple[float, float]:
    """(wall ms, process CPU ms) per run over `runs` runs."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(runs):
        prog.run(feeds)
    return ((time.perf_counter() - wall) / runs * 1e3, (time.process_time() - cpu) / runs * 1e3)


def output(prog: object, feeds: dict) -> np.ndarray:
    y = prog.run(feeds)
    return np.asarray(y[0] if isinstance(y, (list, tuple)) else y)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--runs", type=int, default=0, help="runs per block (0: about 0.2 s)")
    p.add_argument("--off-first", action="store_true", help="compile the unfused program first")
    p.add_argument("--bf16", action="store_true", help="quantize_bf16 both programs")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import onnxruntime as ort

    model = get_model(args.model, batch=args.batch)
    feeds = model_inputs(args.model, model)
    order = ["off", "on"] if args.off_first else ["on", "off"]
    progs = {mode: compiled(model, args.threads, mode, args.bf16) for mode in order}
    fused = {m: progs[m]._executable.lowered.ctx.cache.get("conv_dw_fused", 0) for m in progs}
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    for mode, prog in progs.items():
        got = output(prog, feeds)
        rel = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        print(f"{mode}: {fused[mode]} pairs fused, max|diff| vs ORT "
              f"{float(np.abs(got - want).max()):.3g}, rel {rel:.3g}")  # fmt: skip
    for prog in progs.values():
        block(prog, feeds, 5)
    runs = args.runs or max(2, int(200.0 / block(progs["off"], feeds, 3)[0]))
    rows: dict[str, list[tuple[float, float]]] = {m: [] for m in order}
    for r in range(args.rounds):
        for mode in order if r % 2 == 0 else order[::-1]:
            rows[mode].append(block(progs[mode], feeds, runs))
        print(f"round {r}: " + "  ".join(
            f"{m} wall {rows[m][-1][0]:.3f} cpu {rows[m][-1][1]:.3f}" for m in order))  # fmt: skip
    med = {m: [statistics.median(v[k] for v in rows[m]) for k in (0, 1)] for m in order}
    kind = "bf16" if args.bf16 else "float32"
    print(f"{kind} threads {args.threads} batch {args.batch} runs/block {runs} load "
          f"{os.getloadavg()}")  # fmt: skip
    for m in order:
        print(f"median {m}: wall {med[m][0]:.3f} ms  cpu {med[m][1]:.3f} ms")
    print(
        f"on/off: wall {med['on'][0] / med['off'][0]:.3f}  cpu {med['on'][1] / med['off'][1]:.3f}"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "rows": rows,
                    "median": med,
                    "fused": fused,
                    "load": os.getloadavg(),
                }
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
