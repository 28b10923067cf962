"""Per-layer CPU convolution timings: each distinct convolution of a built-in model, alone.

    python benchmarks/cpu_conv_layers.py resnet50 --batch 8 --threads 1
    python benchmarks/cpu_conv_layers.py mobilenetv2 --only "(16, 112"

For every distinct convolution (input lens, weight, stride, group, padding) of the model, with
a bias and a relu after it, the script times, interleaved round by round (best of `--rounds`):
ONNX Runtime running a one-Conv+Relu model, and each of pygraphx's cpu kernels that can run the
layer (`conv_kernels.kernels_for`: `onednn`, `matmul` for 1x1 layers, `torch_cl`) on a
channels-last input, plus plain NCHW `F.conv2d` + relu. Every kernel's output is checked
against ORT's first. With one thread the clock is the thread's CPU time (other processes' load
does not inflate it), else wall time. The last line sums each column weighted by how many
times the layer occurs in the model.

What it leaves out on purpose: the model around the layer (the input here is hot in the cache,
there is no per-step overhead of the executor), so the sum is below the whole model's time.
ORT's figure includes its layout conversion into and out of its blocked format around the one
Conv, which it pays once per model, not per layer: compare pygraphx's kernels with each other
here, and whole models with `cpu_vs_peers.py`. Process-wide glibc settings are those the cpu
target applies (`torch_lowering/malloc_keep.py`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402
from pygraphx.models import get_model  # noqa: E402

Layer = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int, tuple[int, ...]]


def distinct_layers(name: str, batch: int) -> dict[Layer, int]:
    """(x lens, w lens, stride, group, padding) -> how many convolutions of the model have it."""
    model = get_model(name, batch=batch)
    prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
    seen: dict[Layer, int] = {}
    for ins in prog.get_main_module().instructions:
        if ins.op.name == "convolution":
            x, w = (tuple(i.shape.lens()) for i in ins.inputs)
            key = (x, w, tuple(ins.op.stride), ins.op.group, tuple(ins.op.padding))
            seen[key] = seen.get(key, 0) + 1
    return seen


def ort_session(layer: Layer, w: np.ndarray, b: np.ndarray, threads: int) -> Callable:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    x, _, stride, group, pads = layer
    conv = helper.make_node(
        "Conv", ["x", "w", "b"], ["y"], strides=list(stride), pads=list(pads), group=group
    )
    graph = helper.make_graph(
        [conv, helper.make_node("Relu", ["y"], ["z"])],
        "layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x))],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(None, feeds)[0]


def layer_fns(layer: Layer, threads: int, seed: int = 0) -> dict[str, Callable[[], object]]:
    """The callables to time for one layer, each checked against ORT's answer."""
    import torch
    import torch.nn.functional as F

    from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan, build_kernel, kernels_for

    x_lens, w_lens, stride, group, pads = layer
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(x_lens, generator=gen)
    w = torch.randn(w_lens, generator=gen) * 0.1
    b = torch.randn(w_lens[0], generator=gen)
    pad = list(pads[:2])
    ort_run = ort_session(layer, w.numpy(), b.numpy(), threads)
    feeds = {"x": x.numpy()}
    want = torch.from_numpy(ort_run(feeds))
    xcl = x.contiguous(memory_format=torch.channels_last)
    packed = torch.ops.mkldnn._reorder_convolution_weight(
        w, pad, list(stride), [1, 1], group, list(x_lens)
    )
    plan = ConvPlan(w, packed, list(x_lens), pad, list(stride), [1, 1], group, None, b, "relu")
    fns: dict[str, Callable[[], object]] = {"ort": lambda: ort_run(feeds)}
    for kernel in kernels_for(plan):
        fns[kernel] = build_kernel(plan, kernel, lambda: xcl, None)
    fns["nchw_conv2d"] = lambda: F.conv2d(x, w, b, stride, pad, 1, group).relu_()
    for kernel, fn in fns.items():
        if kernel != "ort":
            err = float((fn() - want).abs().max())
            if err > 1e-3 * max(1.0, float(want.abs().max())):
                raise AssertionError(f"{kernel} on {layer}: max |diff| vs ORT {err:.3g}")
    return fns


def time_layer(fns: dict[str, Callable[[], object]], rounds: int, threads: int) -> dict[str, float]:
    """Best ms per call of each callable, interleaved round by round (~20 ms per block)."""
    clock = time.thread_time if threads == 1 else time.perf_counter

    def block(fn: Callable[[], object], n: int) -> float:
        start = clock()
        for _ in range(n):
            fn()
        return (clock() - start) / n * 1e3

    first = next(fn for k, fn in fns.items() if k != "ort")
    n = max(1, int(20.0 / max(block(first, 1), 1e-3)))
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for kernel, fn in fns.items():
            best[kernel] = min(best[kernel], block(fn, n))
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=["resnet50", "mobilenetv2"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", default=None, help="layers whose (x, w) text contains this")
    args = p.parse_args(argv)
    import torch

    from pygraphx.targets.torch_lowering.malloc_keep import keep_freed_memory

    torch.set_num_threads(args.threads)
    keep_freed_memory()
    total: dict[str, float] = {}
    for layer, count in distinct_layers(args.model, args.batch).items():
        x, w, stride, group, _ = layer
        if args.only and args.only not in str((x, w)):
            continue
        best = time_layer(layer_fns(layer, args.threads), args.rounds, args.threads)
        for kernel, ms in best.items():
            total[kernel] = total.get(kernel, 0.0) + ms * count
        cells = "  ".join(f"{k} {v:.3f}" for k, v in best.items())
        print(f"x{x[1:]} w{w} s{stride[0]} g{group} x{count}: {cells}", flush=True)
    print("ms, weighted by count: " + "  ".join(f"{k} {v:.2f}" for k, v in total.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
