"""Generated Triton kernels on views: a kernel traced from the input's real strides vs copying
the input to contiguous first and running the contiguous kernel (CUDA only).

    python benchmarks/triton_strides.py [--json out.json]

Cases: an element-wise group (x * scale + bias, ReLU) on a channels-last fp16 activation, and
the same on a transposed [seq, hidden] matrix (a row-major view of a column-major tensor).
Times are medians of per-launch device time (CUDA events around 50 back-to-back launches).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
from onnx import helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402
from pygraphx.codegen.trace import TensorDesc, group_trace  # noqa: E402
from pygraphx.codegen.triton.build import build_kernel  # noqa: E402
from pygraphx.passes.manager import run_passes  # noqa: E402
from pygraphx.passes.pipeline import optimize_passes  # noqa: E402
from tests.helpers import make_model  # noqa: E402


def pointwise_group(shape: tuple[int, ...]):
    x = np.zeros(shape, np.float16)
    b = np.ones((shape[1], 1, 1) if len(shape) == 4 else shape[-1:], np.float16)  # per channel
    nodes = [
        helper.make_node("Mul", ["x", "s"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    model = make_model(nodes, {"x": x}, ["y"], {"s": np.array(0.5, np.float16), "b": b})
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    run_passes(prog, optimize_passes(plan_memory=False))
    ins = next(i for i in prog.get_main_module().instructions if i.op.name == "pointwise")
    return ins


DEV_GPU = "cuda"
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: TRITON_INTERPRET=1, no timing


def per_launch_ms(fn, reps: int = 50, rounds: int = 7) -> float:
    if DEV == "cpu":
        return float("nan")
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return statistics.median(times)


def case(name: str, view: torch.Tensor) -> dict:
    """`view`: the input as the group sees it (non-contiguous)."""
    ins = pointwise_group(tuple(view.shape))
    group = group_trace(ins)
    descs = list(group.inputs)
    k = next(j for j, d in enumerate(descs) if d.lens == tuple(view.shape) and 0 not in d.strides)
    others = [
        torch.randn(d.lens, device=DEV).half().as_strided(d.lens, d.strides)
        if 0 in d.strides
        else torch.randn(d.lens, device=DEV).half()
        for d in descs
    ]
    out = torch.empty(view.shape, dtype=view.dtype, device=DEV)
    strided = dataclasses.replace(
        group, inputs=[*descs[:k], TensorDesc(descs[k].lens, view.stride(), descs[k].dtype),
                       *descs[k + 1:]])  # fmt: skip
    direct = build_kernel(strided, DEV)
    plain = build_kernel(group, DEV)
    dense = torch.empty_like(view, memory_format=torch.contiguous_format)
    args = [*others[:k], view, *others[k + 1 :]]
    dense_args = [*others[:k], dense, *others[k + 1 :]]

    def run_direct() -> None:
        direct(args, out)

    def run_copy() -> None:
        dense.copy_(view)
        plain(dense_args, out)

    run_direct()
    want = out.clone()
    run_copy()
    torch.testing.assert_close(out, want)
    row = {"case": name, "shape": list(view.shape), "strides": list(view.stride()),
           "strided_kernel_ms": per_launch_ms(run_direct),
           "copy_then_kernel_ms": per_launch_ms(run_copy)}  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json")
    opts = ap.parse_args()
    n = 32 if DEV == DEV_GPU else 2
    cl = torch.randn(1, 256, 56, 56, device=DEV).half().to(memory_format=torch.channels_last)
    cl32 = torch.randn(n, 256, 56, 56, device=DEV).half()
    cl32 = cl32.to(memory_format=torch.channels_last)
    tr = torch.randn(768, 128, device=DEV).half().t()
    rows = [case("channels_last b1", cl), case("channels_last b32", cl32),
            case("transposed 128x768", tr)]  # fmt: skip
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
