"""bf16 programs' error against ONNX Runtime float32 over several inputs: the 3x3 layers on
oneDNN's bf16 kernels (`old`, `PGX_WINOGRAD_NATIVE_BF16=0`) and on the native F(4,3) kernel
(`new`), and OpenVINO at its default precision (bf16 here) (helper bf16wino14).

    PYTHONPATH=. python benchmarks/bf16wino14_error.py --models yolov8_style unet_small resnet50

One input is the model's benchmark input (`cpu_vs_peers`'s), the others random normal inputs of
its mean and spread. A single input's relative RMS error moves by a few percent with any change
of rounding (a compile that measures another oneDNN implementation for one layer moves
YOLOv8-style's 2.50e-3 to 2.68e-3), so the mean over inputs is the figure to compare.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bf16wino14_ab import load  # noqa: E402
from benchmarks.cpu_engines import make_openvino, make_ort, make_pygraphx  # noqa: E402
from benchmarks.cpu_vs_peers import relative_error  # noqa: E402
from pygraphx.quantize.truncate_float import PRODUCTS  # noqa: E402
from pygraphx.targets.torch_lowering.winograd_native import BF16_ENV  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["yolov8_style", "unet_small"])
    p.add_argument("--inputs", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    for name in args.models:
        model, feeds = load(name)
        ort = make_ort(model, args.threads)[0]
        engines = {"openvino": make_openvino(model, args.threads, None)[0]}
        for variant, switch in (("old", "0"), ("new", "1")):
            os.environ[BF16_ENV] = switch
            engines[variant] = make_pygraphx(model, "arena", args.threads, bf16=(PRODUCTS,))[0]
        os.environ.pop(BF16_ENV)
        rng = np.random.default_rng(0)
        errors: dict[str, list[float]] = {k: [] for k in engines}
        for i in range(args.inputs):
            f = feeds if i == 0 else {
                k: (rng.standard_normal(v.shape) * v.std() + v.mean()).astype(v.dtype)
                for k, v in feeds.items()
            }  # fmt: skip
            want = ort(f)
            for k, run in engines.items():
                got = [np.asarray(a, np.float64) for a in run(f)]
                errors[k].append(relative_error(got, want))
        for k, v in errors.items():
            cells = " ".join(f"{e:.3e}" for e in v)
            print(f"{name} {k:>8}: mean {np.mean(v):.4e} | {cells}", flush=True)


if __name__ == "__main__":
    main()
