"""hyg15: the bf16 error of the routes hyg15 changed, `old` (the concat sum chain's and the
bf16 deconvolutions' bias rounded to bf16) against `new` (float32), over several inputs.

    PYTHONPATH=. python benchmarks/hyg15_errors.py --models unet_small yolov8_style --inputs 4

Input 0 is the zoo's own; the others are drawn uniformly over its value range (seeded). The
relative RMS error against ONNX Runtime float32 (`cpu_vs_peers.relative_error`), 1 thread.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bf16wino14_ab import load  # noqa: E402
from benchmarks.cpu_engines import make_ort  # noqa: E402
from benchmarks.cpu_vs_peers import relative_error  # noqa: E402
from benchmarks.hyg15_ab import compile_variant  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["unet_small", "yolov8_style"])
    p.add_argument("--inputs", type=int, default=4)
    args = p.parse_args(argv)
    for name in args.models:
        model, feeds = load(name)
        ort_run = make_ort(model, 1)[0]
        progs = {v: compile_variant(model, 1, v)[2] for v in ("old", "new")}
        errs: dict[str, list[float]] = {"old": [], "new": []}
        for i in range(args.inputs):
            rng = np.random.default_rng(i)
            inputs = feeds if i == 0 else {
                k: rng.uniform(v.min(), v.max(), v.shape).astype(v.dtype) for k, v in feeds.items()
            }  # fmt: skip
            want = ort_run(inputs)
            for v, prog in progs.items():
                got = [np.asarray(a, np.float64) for a in prog.run(inputs)]
                errs[v].append(relative_error(got, want))
        for v in ("old", "new"):
            each = " ".join(f"{e:.4e}" for e in errs[v])
            print(f"{name} bf16 {v}: mean {np.mean(errs[v]):.4e} ({each})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
