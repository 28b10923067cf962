"""bf16 programs end to end: the concat sum chain's and the bf16 transposed convolutions' bias
rounded to bf16 (`old`, the route before hyg15) against added in float32 (`new`, the default),
A/B in one process (helper hyg15, issue 10).

    PYTHONPATH=. python benchmarks/hyg15_ab.py --models unet_small yolov8_style --threads 1 2

`old` is compiled with `conv_concat.wide_bias` and `conv_epilogue_match.wide_bias` (which
`deconv_bf16.fuse_group` imports at call time) answering False: exactly those two routes take
the rounded bias; every other layer is the same in both programs (`conv_fusion` holds its own
binding). Timing as `bf16wino14_ab.py`: blocks of runs alternating, the order reversed every
round; median wall ms, best block, mean process CPU ms per run, the relative RMS error
against ONNX Runtime float32.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bf16wino14_ab import load  # noqa: E402
from benchmarks.cpu_engines import make_ort, make_pygraphx  # noqa: E402
from benchmarks.cpu_vs_peers import relative_error  # noqa: E402
from pygraphx.quantize.truncate_float import PRODUCTS  # noqa: E402
from pygraphx.targets.torch_lowering import conv_concat, conv_epilogue_match  # noqa: E402


def compile_variant(model, threads: int, variant: str):  # noqa: ANN201
    if variant == "new":
        return make_pygraphx(model, "arena", threads, bf16=(PRODUCTS,))
    never = lambda user, conv: False  # noqa: E731
    with (
        mock.patch.object(conv_concat, "wide_bias", never),
        mock.patch.object(conv_epilogue_match, "wide_bias", never),
    ):
        return make_pygraphx(model, "arena", threads, bf16=(PRODUCTS,))


def ab(name: str, threads: int, variants: list[str], rounds: int, repeat: int) -> None:
    model, feeds = load(name)
    want = make_ort(model, threads)[0](feeds)
    runs = {}
    for v in variants:
        run, seconds, prog = compile_variant(model, threads, v)
        err = relative_error([np.asarray(a, np.float64) for a in prog.run(feeds)], want)
        cache = prog._executable.lowered.ctx.cache
        routes = {k: cache.get(k, 0) for k in ("conv_concat_sum", "deconv_capi")}
        print(f"  {name} bf16 t{threads} {v}: compile {seconds:.2f} s, rel error vs ORT f32 "
              f"{err:.4e}; {routes}", flush=True)  # fmt: skip
        runs[v] = run
    times: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    blocks: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            runs[v](feeds)
            block = []
            for _ in range(repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                runs[v](feeds)
                block.append((time.perf_counter() - t0, time.process_time() - c0))
            times[v] += block
            blocks[v].append(statistics.median(w for w, _ in block))
    base = statistics.median(w for w, _ in times[variants[0]])
    base_cpu = statistics.fmean(c for _, c in times[variants[0]])
    for v in variants:
        wall = statistics.median(w for w, _ in times[v])
        cpu = statistics.fmean(c for _, c in times[v])
        print(f"{name} bf16 t{threads} {v:>4}: wall {wall * 1e3:7.2f} ms (best block "
              f"{min(blocks[v]) * 1e3:7.2f}, x{wall / base:.3f} of {variants[0]}), "
              f"cpu {cpu * 1e3:7.2f} ms/run (x{cpu / base_cpu:.3f})", flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["unet_small", "yolov8_style"])
    p.add_argument("--variants", nargs="+", default=["old", "new"], choices=["old", "new"])
    p.add_argument("--threads", type=int, nargs="+", default=[1])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeat", type=int, default=8)
    args = p.parse_args(argv)
    print(f"# loadavg at start: {Path('/proc/loadavg').read_text().strip()}", flush=True)
    for threads in args.threads:
        for name in args.models:
            ab(name, threads, args.variants, args.rounds, args.repeat)
    print(f"# loadavg at end: {Path('/proc/loadavg').read_text().strip()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
