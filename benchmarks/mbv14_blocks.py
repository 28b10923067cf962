"""MobileNetV2's inverted-residual block shapes one by one: the native block kernel
(`native_mbconv`, `PGX_CPU_NATIVE_MBCONV=all`) against the oneDNN route (`=0`), each block a
one-block program compiled both ways, run in one process in alternating blocks (the order
reversed every round). 1 thread: the calling thread's CPU time a run (the kernels run on it);
more threads: wall time a run. The programs' own cost (the executor, the input's conversion)
is in both (the block sits between a 3x3 convolution and a 1x1 one, as in the network);
`diff_us` is what the block itself changes.

    python benchmarks/mbv14_blocks.py --threads 1 --batch 1 [--rounds 6 --runs 30]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pygraphx  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

#: (input channels, map size, expanded channels (= input: no expansion), output channels,
#: depthwise stride, residual, how many of MobileNetV2's 17 blocks have this shape)
BLOCKS = [
    (32, 112, 32, 16, 1, False, 1),
    (16, 112, 96, 24, 2, False, 1),
    (24, 56, 144, 24, 1, True, 1),
    (24, 56, 144, 32, 2, False, 1),
    (32, 28, 192, 32, 1, True, 2),
    (32, 28, 192, 64, 2, False, 1),
    (64, 14, 384, 64, 1, True, 3),
    (64, 14, 384, 96, 1, False, 1),
    (96, 14, 576, 96, 1, True, 2),
    (96, 14, 576, 160, 2, False, 1),
    (160, 7, 960, 160, 1, True, 2),
    (160, 7, 960, 320, 1, False, 1),
]


def block_model(  # noqa: ANN201
    n: int, c: int, h: int, m: int, k: int, stride: int, residual: bool
):
    """One block as an ONNX model (random weights), its feeds."""
    rng = np.random.default_rng(c + h + m + k)
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    inits = {"wd": w(m, 1, 3, 3), "bd": w(m) * 0.2, "wp": w(k, m, 1, 1), "bp": w(k) * 0.2,
             "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}  # fmt: skip
    # the block between a 3x3 convolution and a 1x1 one (as in the network: its input and its
    # output are channels-last arena slots, not the program's NCHW input and output)
    inits.update({"w0": w(c, c, 3, 3), "w9": w(k, k, 1, 1)})
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1] * 4),
             helper.make_node("Relu", ["c0"], ["xin"])]  # fmt: skip
    src = "xin"
    if m != c:
        inits.update({"we": w(m, c, 1, 1), "be": w(m) * 0.2})
        nodes += [helper.make_node("Conv", ["xin", "we", "be"], ["ce"]),
                  helper.make_node("Clip", ["ce", "lo", "hi"], ["ae"])]  # fmt: skip
        src = "ae"
    nodes += [
        helper.make_node("Conv", [src, "wd", "bd"], ["cd"], group=m, strides=[stride] * 2,
                         pads=[1] * 4),  # fmt: skip
        helper.make_node("Clip", ["cd", "lo", "hi"], ["ad"]),
        helper.make_node("Conv", ["ad", "wp", "bp"], ["cp"]),
    ]
    out = "cp"
    if residual:
        nodes.append(helper.make_node("Add", ["xin", "cp"], ["y"]))
        out = "y"
    nodes.append(helper.make_node("Conv", [out, "w9"], ["z"]))
    out = "z"
    graph = helper.make_graph(
        nodes, "block",
        [helper.make_tensor_value_info("x", 1, list(x.shape))],
        [helper.make_tensor_value_info(out, 1, None)],
        [numpy_helper.from_array(v, name) for name, v in inits.items()],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # (the IR version opset 17 needs: older ONNX Runtimes refuse newer)
    return model, {"x": x}


def compiled(model, threads: int, value: str):  # noqa: ANN001, ANN201
    from pygraphx.targets.cpu.target import CpuTarget

    with ExitStack() as stack:
        stack.enter_context(mock.patch.dict(os.environ, {"PGX_CPU_NATIVE_MBCONV": value}))
        prog = pygraphx.parse_onnx_buffer(model.SerializeToString())
        prog.compile(CpuTarget(threads=threads))
    return prog


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import onnxruntime as ort
    import torch

    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    print(f"batch {args.batch} threads {args.threads} rounds {args.rounds} x {args.runs}; "
          f"{'thread CPU' if args.threads == 1 else 'wall'} ms a run, minimum / median of the "
          f"blocks; loadavg {Path('/proc/loadavg').read_text().split()[:3]}")  # fmt: skip
    results, total = [], {"old": 0.0, "new": 0.0}
    for c, h, m, k, s, res, count in BLOCKS:
        model, feeds = block_model(args.batch, c, h, m, k, s, res)
        progs = {"old": compiled(model, args.threads, "0"),
                 "new": compiled(model, args.threads, "all")}  # fmt: skip
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        want = sess.run(None, feeds)[0]
        err = {n: float(np.abs(np.asarray(pr.run(feeds)[0]) - want).max())
               for n, pr in progs.items()}  # fmt: skip
        times = {n: [] for n in progs}
        order = list(progs.items())
        for r in range(args.rounds):
            for name, prog in order if r % 2 == 0 else order[::-1]:
                for _ in range(3):
                    prog.run(feeds)
                for _ in range(args.runs):
                    t0 = clock()
                    prog.run(feeds)
                    times[name].append(clock() - t0)
        row = {"block": f"{c}->{m}->{k} @{h} s{s}{' +x' if res else ''}", "count": count}
        for name, ts in times.items():
            ts = np.array(ts) * 1e3
            row[f"{name}_min"] = round(float(ts.min()), 4)
            row[f"{name}_med"] = round(float(np.median(ts)), 4)
            total[name] += count * float(np.median(ts))
        row["new/old_med"] = round(row["new_med"] / row["old_med"], 3)
        row["diff_us_med"] = round((row["new_med"] - row["old_med"]) * 1e3, 1)
        row["err"] = err
        results.append(row)
        print(f"{row['block']:>26} x{count}: old {row['old_min']:.4f} / {row['old_med']:.4f}  "
              f"new {row['new_min']:.4f} / {row['new_med']:.4f}  "
              f"new/old {row['new/old_med']:.3f}  diff {row['diff_us_med']:+.1f} us  "
              f"err old {err['old']:.1e} new {err['new']:.1e}")
    print(f"weighted sum of medians (17 blocks): old {total['old']:.3f} new {total['new']:.3f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "blocks": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
