"""MobileNetV2's outputs on the cpu target saved / compared bit for bit (helper mnv18: a change
meant to leave the outputs identical, e.g. `mbconv.c` split in parts): run once on the code
before (`--save`), once after (`--check`), each in its own process.

    PYTHONPATH=. python benchmarks/mnv18_outputs.py --save F.npz [--bf16] [--threads 1 2]
    PYTHONPATH=. python benchmarks/mnv18_outputs.py --check F.npz [--bf16] [--threads 1 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ab_harness import Variant, compile_variant, load  # noqa: E402


def outputs(bf16: bool, threads: list[int], batches: list[int]) -> dict[str, np.ndarray]:
    import torch

    got = {}
    for t in threads:
        torch.set_num_threads(t)
        for b in batches:
            case = load(f"mobilenetv2:{b}")
            prog = compile_variant(case, t, Variant("x", {}, bf16=bf16))
            for k in range(2):  # (the second run: the chain's pointers set)
                out = prog.run(case.feeds)
            vals = out.values() if isinstance(out, dict) else out
            for j, v in enumerate(vals):
                got[f"t{t}_b{b}_{j}_{'bf16' if bf16 else 'f32'}"] = np.asarray(
                    v.float() if hasattr(v, "float") else v)
    return got


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--save")
    p.add_argument("--check")
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 3])
    a = p.parse_args()
    got = outputs(a.bf16, a.threads, a.batches)
    if a.save:
        np.savez(a.save, **got)
        print(f"saved {len(got)} outputs to {a.save}")
        return 0
    ref = np.load(a.check)
    bad = 0
    for k, v in got.items():
        same = np.array_equal(ref[k], v)
        bad += not same
        what = "identical" if same else f"DIFFERENT, max |diff| {np.abs(ref[k] - v).max():g}"
        print(f"{k}: {what}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
