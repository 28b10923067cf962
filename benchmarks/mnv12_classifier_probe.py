"""MobileNetV2's classifier (1 x 1280 @ 1280 x 1000 + bias) on oneDNN's matmul primitive with
the weight in the layout oneDNN picks (`any`, what `onednn_linear.Linear` packs) against the
plain row-major ones (`ab`: K x N, `ba`: N x K, the ONNX Gemm's own), and ONNX Runtime's Gemm
(MLAS), caches flushed before each call by a numpy pass over `--flush-mb` (numpy: no OpenMP
pool of its own to compete with oneDNN's). One engine per process (`--engine`): ORT's pool and
oneDNN's OpenMP team both spin after a call and would share the two cores.

    python benchmarks/mnv12_classifier_probe.py --threads 2 --engine any --flush-mb 64
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402,F401  (first: OpenMP's spin count before torch)
import torch  # noqa: E402

from pygraphx.targets.torch_lowering import onednn_linear  # noqa: E402

#: oneDNN 3.x's format tags: any, ab (row-major K x N), ba (its transpose)
TAGS = {"any": 1, "ab": 3, "ba": 14}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--engine", choices=[*TAGS, "ort"], default="any")
    ap.add_argument("--flush-mb", type=int, default=64)
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--k", type=int, default=1280)
    ap.add_argument("--n", type=int, default=1000)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    k, n = args.k, args.n
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)  # ONNX Gemm's B, transB=1
    b = rng.standard_normal(n).astype(np.float32)
    x = rng.standard_normal((1, k)).astype(np.float32)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + b
    impl = ""
    if args.engine == "ort":
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper

        graph = helper.make_graph(
            [helper.make_node("Gemm", ["x", "W", "b"], ["y"], transB=1)],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
            [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 9
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        providers = ["CPUExecutionProvider"]
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=providers)

        def call() -> np.ndarray:
            return sess.run(None, {"x": x})[0]
    else:
        onednn_linear.TAG_ANY = TAGS[args.engine]  # (the probe's own process only)
        wt = torch.from_numpy(np.ascontiguousarray(w.T))  # (K, N)
        lin = onednn_linear.Linear(wt, torch.from_numpy(b), 1, now=True)
        impl = lin.primitive().impl
        xt = torch.from_numpy(x)

        def call() -> np.ndarray:
            return lin(xt).numpy()

    err = float(np.abs(call() - want).max())
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    flush = np.zeros(args.flush_mb << 20, np.uint8)
    cold, warm = [], []
    for _ in range(args.calls):
        flush += 1
        t0 = clock()
        call()
        cold.append(clock() - t0)
        t0 = clock()
        call()
        warm.append(clock() - t0)
    us = lambda v: f"min {min(v) * 1e6:7.1f} med {np.median(v) * 1e6:7.1f}"  # noqa: E731
    print(f"t{args.threads} {args.engine:4s} {impl:22s} flush {args.flush_mb:3d} MB: "
          f"cold {us(cold)} us, warm {us(warm)} us, max err {err:.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
