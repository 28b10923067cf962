"""The per-call cost of oneDNN convolutions: torch's ideep path against oneDNN's C API.

    PGX_ONEDNN_LIB=/path/to/lib python benchmarks/onednn_conv_probe.py --threads 1 2
    python benchmarks/onednn_conv_probe.py --bf16 --layers   # bf16 layers and quantize_bf16
    python benchmarks/onednn_conv_probe.py --model resnet50 --batch 1 --layers
    python benchmarks/onednn_conv_probe.py --impls --threads 2   # oneDNN's implementations

Two parts, both A/B in one process (the machine may be shared: compare columns, not runs):

* `--layers`: every distinct convolution of the model, with its bias and a relu6, on the
  `onednn` kernel (`mkldnn._convolution_pointwise`, ideep sets the primitive up per call) and
  the `dnnl` kernel (`onednn_conv.py`: primitive made once), interleaved round by round, best
  of `--rounds`, thread CPU time at one thread (other processes' load does not inflate it),
  wall time above; each `dnnl` output checked against `onednn`'s. The sum is weighted by how
  often the layer occurs.
* the whole model at batch `--batch`: pygraphx with `conv_kernel="onednn"` and
  `conv_kernel="dnnl"`, and ONNX Runtime, alternating single runs (`cpu_vs_peers.neighbours`):
  median wall ms and mean process-CPU ms per run.

* `--impls`: every distinct layer timed on each of oneDNN's implementations that
  `conv_choice.impl_candidates` races (`conv_choice.time_kernels`, as the compile does), and
  the model with `conv_kernel="off"` (oneDNN's first implementation) against `"impl"` (the
  measured choice), without ONNX Runtime, each compiled first in one of two rounds (the
  program compiled first in a process ran 1-2% faster in every A/B here, whatever it was).

It also says whether one OpenMP runtime is loaded (oneDNN's package and torch sharing
torch's `libgomp.so.1`) and which implementations oneDNN picked.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# isort: off
import pygraphx  # noqa: E402  (before torch: it sets OpenMP's spin count)
import torch  # noqa: E402

# isort: on
from benchmarks.cpu_conv_layers import distinct_layers  # noqa: E402
from benchmarks.cpu_vs_peers import make_openvino, make_ort, neighbours  # noqa: E402
from pygraphx.models import get_model, model_inputs  # noqa: E402
from pygraphx.targets.cpu.target import CpuTarget  # noqa: E402
from pygraphx.targets.torch_lowering import conv_choice, onednn_capi, onednn_conv  # noqa: E402
from pygraphx.targets.torch_lowering.conv_kernels import ConvPlan, build_kernel  # noqa: E402


def layer_plan(layer: tuple, pads: list[int], dtype: torch.dtype = torch.float32) -> ConvPlan:
    x, w_lens, stride, group, _ = layer
    w = (torch.randn(w_lens) * 0.1).to(dtype)
    begin, end = pads[: len(pads) // 2], pads[len(pads) // 2 :]
    padding = list(begin) if begin == end else [0, 0]
    pre_pad = None if begin == end else [begin[1], end[1], begin[0], end[0]]
    lens = (
        list(x)
        if pre_pad is None
        else [x[0], x[1], x[2] + begin[0] + end[0], x[3] + begin[1] + end[1]]
    )
    packed = torch.ops.mkldnn._reorder_convolution_weight(
        w, padding, list(stride), [1, 1], group, lens
    )
    return ConvPlan(w, packed, lens, padding, list(stride), [1, 1], group, pre_pad,
                    torch.randn(w_lens[0]).to(dtype), "hardtanh", [0.0, 6.0])  # fmt: skip


def time_layers(model: str, batch: int, rounds: int, dtype: torch.dtype) -> None:
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    total: Counter = Counter()
    impls: Counter = Counter()
    for layer, count in distinct_layers(model, batch).items():
        plan = layer_plan(layer, list(layer[4]), dtype)
        x = torch.randn(layer[0]).to(dtype).contiguous(memory_format=torch.channels_last)
        fns = {k: build_kernel(plan, k, lambda x=x: x, None) for k in ("onednn", "dnnl")}
        err = (fns["onednn"]().float() - fns["dnnl"]().float()).abs().max().item()
        impls[onednn_conv.Primitive(onednn_capi.runtime(), plan, False).impl] += count
        n = max(3, min(200, int(2e7 / max(1, math.prod(layer[1]) * math.prod(layer[0][2:])))))
        best = dict.fromkeys(fns, float("inf"))
        for _ in range(rounds):
            for k, fn in fns.items():
                start = clock()
                for _ in range(n):
                    fn()
                best[k] = min(best[k], (clock() - start) / n)
        for k, v in best.items():
            total[k] += v * count
        a, b = best["onednn"] * 1e6, best["dnnl"] * 1e6
        print(f"{layer[0]!s:22} {layer[1]!s:20} s{layer[2][0]} g{layer[3]:<4} x{count}  "
              f"onednn {a:8.1f} us  dnnl {b:8.1f} us  saved {a - b:6.1f} us  "
              f"max|diff| {err:.1e}")  # fmt: skip
    print(
        f"sum (weighted): onednn {total['onednn'] * 1e3:.2f} ms  dnnl {total['dnnl'] * 1e3:.2f} ms"
    )
    print("oneDNN implementations (dnnl):", dict(impls))


def time_impls(model: str, batch: int, dtype: torch.dtype) -> None:
    """Each distinct layer on oneDNN's implementations, as `conv_choice` times them."""
    total: Counter = Counter()
    for layer, count in distinct_layers(model, batch).items():
        plan = layer_plan(layer, list(layer[4]), dtype)
        names = ["dnnl", *conv_choice.impl_candidates(plan, False)]
        times = conv_choice.time_kernels(plan, names, None)
        first, chosen = times["dnnl"], conv_choice.pick(times)
        total["first"] += first * count
        total["chosen"] += times[chosen] * count
        rest = "  ".join(f"{k[5:]} {v / first:.2f}" for k, v in times.items() if k != "dnnl")
        print(f"{layer[0]!s:22} {layer[1]!s:20} s{layer[2][0]} g{layer[3]:<4} x{count}  "
              f"first {first * 1e6:7.1f} us  {rest}  -> {chosen}")  # fmt: skip
    print(f"sum (weighted): first {total['first'] * 1e3:.3f} ms  "
          f"chosen {total['chosen'] * 1e3:.3f} ms")  # fmt: skip


def time_model(
    model_name: str,
    batch: int,
    threads: int,
    repeat: int,
    bf16: bool,
    openvino: bool,
    kernels: tuple[str, ...] = ("onednn", "dnnl"),
    ort: bool = True,
) -> None:
    model = get_model(model_name, batch=batch)
    feeds = model_inputs(model_name, model)
    engines = {}
    for kernel in kernels:
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        if bf16:
            pygraphx.quantize_bf16(prog)
        prog.compile(CpuTarget(threads=threads, conv_kernel=kernel))
        engines[f"pgx_{kernel}"] = prog.run
    if ort:  # (its idle pool spins: at 2 threads the engine after it ran 2-3x slower)
        engines["ort"], _ = make_ort(model, threads)
    if openvino:  # at the same precision (OpenVINO's default is bf16 on a bf16 CPU)
        key = "ov_bf16" if bf16 else "ov_f32"
        engines[key], _, _ = make_openvino(model, threads, None if bf16 else "f32")
    wall, cpu = neighbours(engines, feeds, warmup=10, repeat=repeat)
    print(f"{model_name} b{batch} threads={threads}: " + "  ".join(
        f"{k} {wall[k]:.2f} ms (cpu {cpu[k]:.2f})" for k in engines))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mobilenetv2")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--layers", action="store_true", help="time every distinct layer too")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--bf16", action="store_true", help="bf16 layers / quantize_bf16 model")
    ap.add_argument("--openvino", action="store_true", help="OpenVINO too (f32, or bf16)")
    ap.add_argument("--impls", action="store_true", help="oneDNN's implementations, off/impl")
    args = ap.parse_args(argv)
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    if not onednn_conv.available():
        print("oneDNN C API unavailable:", onednn_capi.unavailable_reason())
        return 1
    print("one OpenMP runtime in the process:", onednn_capi.openmp_shared())
    for threads in args.threads:
        torch.set_num_threads(threads)
        if args.layers:
            time_layers(args.model, args.batch, args.rounds, dtype)
        if not args.impls:
            time_model(args.model, args.batch, threads, args.repeat, args.bf16, args.openvino)
            continue
        time_impls(args.model, args.batch, dtype)
        for kernels in (("off", "impl"), ("impl", "off")):  # each compiled first once
            time_model(
                args.model, args.batch, threads, args.repeat, args.bf16, False, kernels, ort=False
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
