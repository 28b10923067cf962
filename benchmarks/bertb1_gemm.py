"""BERT-base / GPT-2 weight products on N threads: our kernels against OpenVINO's FullyConnected.

    PYTHONPATH=. python benchmarks/bertb1_gemm.py --threads 2 --calls 40

Each product `x (rows, K) @ W (K, N) + b` of the models' shapes, at float32 and bf16: oneDNN's
`_linear_pointwise` with the weight reordered once (our default kernel), MKL's packed `_mkl_linear`
(float32), and OpenVINO on a one-node ONNX model (MatMul + Add), at the same precision. The
candidates alternate call by call; each figure is the fastest wall time of `--calls` calls (the
least disturbed on a shared machine), in ms and GFLOP/s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.scratch import scratch_dir  # noqa: E402

SHAPES = {  # (K, N): name
    (768, 2304): "qkv",
    (768, 768): "attn out",
    (768, 3072): "ffn1 (+gelu)",
    (3072, 768): "ffn2",
}


def ov_product(w: np.ndarray, b: np.ndarray, rows: int, precision: str, threads: int) -> Any:
    """OpenVINO's compiled `x @ w + b` (one FullyConnected) as a call on a numpy input."""
    import openvino as ov

    k, n = w.shape
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["y0"]),
            helper.make_node("Add", ["y0", "b"], ["y"]),
        ],
        "fc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, rows, n])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = scratch_dir() / "fc.onnx"
    onnx.save(model, str(path))
    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads,
              "NUM_STREAMS": 1}  # fmt: skip
    request = core.compile_model(core.read_model(str(path)), "CPU", config).create_infer_request()
    return lambda x: request.infer({"x": x})


def candidates(rows: int, k: int, n: int, bf16: bool, threads: int) -> dict[str, Any]:
    """name -> a no-argument call computing the product once."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, n), dtype=np.float32) * 0.05
    b = rng.standard_normal(n, dtype=np.float32)
    xn = rng.standard_normal((1, rows, k), dtype=np.float32)
    dtype = torch.bfloat16 if bf16 else torch.float32
    x = torch.from_numpy(xn[0]).to(dtype)
    wt = torch.from_numpy(w).to(dtype).t().contiguous()
    bias = torch.from_numpy(b).to(dtype)
    lp = torch.ops.mkldnn._linear_pointwise
    packed = torch.ops.mkldnn._reorder_linear_weight(wt, rows)
    found = {"dnnl": lambda: lp(x, packed, bias, "none", [], "")}
    if not bf16:
        mkl_w = torch.ops.mkl._mkl_reorder_linear_weight(wt, rows)
        found["mkl"] = lambda: torch.ops.mkl._mkl_linear(x, mkl_w, wt, bias, rows)
    ov = ov_product(w, b, rows, "bf16" if bf16 else "f32", threads)
    found["openvino"] = lambda: ov(xn)
    return found


def fastest(fns: dict[str, Any], calls: int) -> dict[str, float]:
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():
        fn()
    for _ in range(calls):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--calls", type=int, default=40)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"rows {args.rows}, {args.threads} thread(s), fastest of {args.calls} calls: ms "
          "(GFLOP/s)")  # fmt: skip
    for bf16 in (False, True):
        for (k, n), name in SHAPES.items():
            best = fastest(candidates(args.rows, k, n, bf16, args.threads), args.calls)
            flop = 2 * args.rows * k * n
            cells = ", ".join(f"{c} {s * 1e3:.3f} ({flop / s * 1e-9:.0f})" for c, s in best.items())
            print(f"{'bf16' if bf16 else 'f32 '} {name:13s} {k}x{n}: {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
