"""One bf16 (or float32) weight product, ours (`onednn_linear.Linear`, oneDNN 3.2's C API) against
OpenVINO's FullyConnected (a one-MatMul ONNX model), one thread, thread CPU time, interleaved
(helper gemm15).

    PYTHONPATH=. python benchmarks/gemm15_fc_micro.py [--f32] [--reps 200]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.scratch import scratch_dir  # noqa: E402

SHAPES = [(128, 768, 768), (128, 768, 2304), (128, 768, 3072), (128, 3072, 768)]


def ov_model(m: int, k: int, n: int, w: np.ndarray, b: np.ndarray, bf16: bool, threads: int):
    import onnx
    import openvino as ov
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["y0"]),
            helper.make_node("Add", ["y0", "b"], ["y"]),
        ],
        "fc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, n])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    path = Path(scratch_dir()) / "fc.onnx"
    onnx.save(model, str(path))
    core = ov.Core()
    cfg = {"INFERENCE_PRECISION_HINT": "bf16" if bf16 else "f32", "INFERENCE_NUM_THREADS": threads,
           "NUM_STREAMS": 1}  # fmt: skip
    return core.compile_model(core.read_model(str(path)), "CPU", cfg).create_infer_request()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--f32", action="store_true")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    import torch

    from pygraphx.targets.torch_lowering import onednn_linear

    torch.set_num_threads(1)
    bf16 = not args.f32
    dt = torch.bfloat16 if bf16 else torch.float32
    rng = np.random.default_rng(0)
    print(f"# {'bf16' if bf16 else 'f32'}, 1 thread, us a call (best of {args.rounds} rounds of "
          f"{args.reps}), loadavg {Path('/proc/loadavg').read_text().split()[:3]}")  # fmt: skip
    for m, k, n in SHAPES:
        w = (rng.standard_normal((k, n)) / 30).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        x = rng.standard_normal((1, m, k)).astype(np.float32)
        lin = onednn_linear.Linear(torch.from_numpy(w).to(dt), torch.from_numpy(b).to(dt), m)
        xt = torch.from_numpy(x).reshape(m, k).to(dt)
        req = ov_model(m, k, n, w, b, bf16, 1)
        tin = req.get_input_tensor(0)
        tin.data[:] = x
        fns = {"pgx": lambda: lin(xt), "OV": lambda: req.infer()}
        best = {name: float("inf") for name in fns}
        for r in range(args.rounds):
            for name in (fns if r % 2 == 0 else list(fns)[::-1]):
                fn = fns[name]
                fn()
                t = time.thread_time()
                for _ in range(args.reps):
                    fn()
                best[name] = min(best[name], (time.thread_time() - t) / args.reps)
        flops = 2 * m * k * n
        print(f"{m}x{k}x{n}: pgx {best['pgx'] * 1e6:8.1f} "
              f"({flops / best['pgx'] / 1e9:5.1f} GFLOP/s)"
              f"  OV {best['OV'] * 1e6:8.1f} ({flops / best['OV'] / 1e9:5.1f})  "
              f"pgx/OV {best['pgx'] / best['OV']:.3f}  [{lin.primitive().impl}]")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
