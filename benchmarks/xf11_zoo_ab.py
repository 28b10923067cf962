"""A/B in one process on the zoo's transformers (ViT-B/16, MiniLM at 8 sentences): GEMMs on
torch's oneDNN linear (`PGX_CPU_DNNL_GEMM=torch`) against oneDNN's matmul primitive through its
C API (the default), float32 and bf16.

    PGX_CPU_LOAD_ADAPT=0 PYTHONPATH=. python benchmarks/xf11_zoo_ab.py --threads 2 --runs 8

Programs alternate run by run (which goes first alternates too); printed: median wall ms a run
of each, and each one's largest output difference from ONNX Runtime's, relative to the largest
output value.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH: its tree wins

import zoo  # noqa: E402
from xf11_gemm_ab import compile_with  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--models", nargs="+", default=["vit_b16", "minilm"])
    args = ap.parse_args(argv)
    import onnxruntime as ort
    import torch

    torch.set_num_threads(args.threads)
    for name in args.models:
        data, feeds = zoo.build(name, "full")
        want = ort.InferenceSession(data).run(None, feeds)
        for bf16 in (False, True):
            opts = argparse.Namespace(bf16=bf16, threads=args.threads)
            progs = {s: compile_with(data, opts, s) for s in ("torch", "matmul")}
            times: dict[str, list[float]] = {s: [] for s in progs}
            for prog in progs.values():
                prog.run(feeds)
            for r in range(args.runs):
                for s in list(progs)[:: 1 if r % 2 else -1]:
                    start = time.perf_counter()
                    progs[s].run(feeds)
                    times[s].append(time.perf_counter() - start)
            cells = []
            for s, prog in progs.items():
                outs = prog.run(feeds)
                err = max(float(np.abs(o - w).max() / np.abs(w).max())
                          for o, w in zip(outs, want, strict=True))  # fmt: skip
                cells.append(f"{s} {np.median(times[s]) * 1e3:.2f} ms (rel err {err:.1e})")
            print(f"{name} {'bf16' if bf16 else 'f32'} t{args.threads}: " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
