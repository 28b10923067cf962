"""UNet-small (bf16 and float32) and YOLOv8-style (bf16): the old upsampling paths against
unet13's, A/B in one process (helper unet13, issue 10).

    PYTHONPATH=. python benchmarks/unet13_ab.py --threads 2 --rounds 6 --repeat 8
    PYTHONPATH=. python benchmarks/unet13_ab.py --models unet_small --precisions bf16 \
        --variants old deconv resize new

Variants (the switches are read at compile, so every program here is compiled once):
`old`: `PGX_CPU_BF16_DECONV=float32` and `PGX_CPU_BF16_RESIZE=torch` (main before unet13);
`deconv`: only the bf16 deconvolution (oneDNN's C API primitive where it runs);
`deconv_torch`: only the bf16 deconvolution on torch's oneDNN op (`PGX_CPU_BF16_DECONV=torch`);
`resize`: only oneDNN's resampling; `new`: both (the defaults); `new_torch`: both, the
deconvolution on torch's op; `noswap`: `new` without unetb13's `swap_resize_convolution` pass
(UNet's 1x1 convolutions back after the bilinear resizes; every other variant but `old` runs
that pass, on float32 too); `openvino`: OpenVINO at its default precision (bf16 on a CPU
with bf16 instructions; f32 for `--precisions f32`), as `cpu_vs_peers` makes it.
bf16 = `quantize_bf16`'s default "products" policy (what `cpu_vs_peers --bf16` runs).
Timing alternates blocks of runs (a warm-up run, then `--repeat` timed runs) of the variants,
the order reversed every round; reported per variant: median wall ms over all timed runs,
the best block's median, mean process CPU ms per run, and the relative RMS error of the
output against ONNX Runtime float32. Float32 programs take neither of unet13's paths (both
switches act on bf16 only), but do take unetb13's pass (`new` against `noswap`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cpu_engines import make_openvino, make_ort, make_pygraphx  # noqa: E402
from benchmarks.cpu_vs_peers import load_zoo, relative_error  # noqa: E402
from pygraphx.quantize.truncate_float import PRODUCTS  # noqa: E402
from pygraphx.targets.torch_lowering.deconv_bf16 import DECONV_ENV  # noqa: E402
from pygraphx.targets.torch_lowering.onednn_resample import KERNEL_ENV  # noqa: E402

SWAP = "swap_resize_convolution"  # unetb13's pass (PGX_DISABLE_PASSES names it to skip it)
PASSES_ENV = "PGX_DISABLE_PASSES"

#: variant -> (PGX_CPU_BF16_DECONV, PGX_CPU_BF16_RESIZE, PGX_DISABLE_PASSES)
VARIANTS = {
    "old": ("float32", "torch", SWAP),
    "deconv": ("bf16", "torch", ""),
    "deconv_torch": ("torch", "torch", ""),
    "resize": ("float32", "onednn", ""),
    "new_torch": ("torch", "onednn", ""),
    "new": ("bf16", "onednn", ""),
    "noswap": ("bf16", "onednn", SWAP),
}


def ab(name: str, precision: str, threads: int, variants: list[str], rounds: int,
       repeat: int) -> None:  # fmt: skip
    model, feeds, _ = load_zoo(name, "full")
    want = make_ort(model, threads)[0](feeds)
    runs = {}
    saved = {k: os.environ.get(k) for k in (DECONV_ENV, KERNEL_ENV, PASSES_ENV)}
    for v in variants:
        if v == "openvino":  # OpenVINO at its default precision (bf16 on this CPU)
            ov_precision = None if precision == "bf16" else "f32"
            run, seconds, used = make_openvino(model, threads, ov_precision)
            err = relative_error([np.asarray(a, np.float64) for a in run(feeds)], want)
            print(f"  {name} {precision} t{threads} openvino ({used}): compile {seconds:.2f} s, "
                  f"rel error vs ORT f32 {err:.3e}", flush=True)  # fmt: skip
            runs[v] = run
            continue
        os.environ[DECONV_ENV], os.environ[KERNEL_ENV], os.environ[PASSES_ENV] = VARIANTS[v]
        bf16 = (PRODUCTS,) if precision == "bf16" else None
        run, seconds, prog = make_pygraphx(model, "arena", threads, bf16=bf16)
        err = relative_error([np.asarray(a, np.float64) for a in prog.run(feeds)], want)
        kinds = [
            "+".join(i.op.name for i in s.instructions if not i.is_literal())
            for s in prog._executable.lowered.steps
        ]
        ups = sorted({k for k in kinds if "deconvolution" in k or "resize" in k})
        print(f"  {name} {precision} t{threads} {v}: compile {seconds:.2f} s, rel error vs ORT "
              f"f32 {err:.3e}, upsampling steps {ups}", flush=True)  # fmt: skip
        runs[v] = run
    for k, value in saved.items():
        if value is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = value
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
    for v in variants:
        wall = statistics.median(w for w, _ in times[v])
        cpu = statistics.fmean(c for _, c in times[v]) * 1e3
        print(f"{name} {precision} t{threads} {v:>7}: wall {wall * 1e3:7.2f} ms (best block "
              f"{min(blocks[v]) * 1e3:7.2f}, x{wall / base:.3f} of {variants[0]}), "
              f"cpu {cpu:7.2f} ms/run", flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["unet_small", "yolov8_style"])
    p.add_argument("--precisions", nargs="+", default=["bf16", "f32"], choices=["bf16", "f32"])
    p.add_argument("--variants", nargs="+", default=["old", "new"], choices=[*VARIANTS, "openvino"])
    p.add_argument("--threads", type=int, nargs="+", default=[2])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeat", type=int, default=8)
    args = p.parse_args(argv)
    print(f"# loadavg at start: {Path('/proc/loadavg').read_text().strip()}", flush=True)
    for threads in args.threads:
        for name in args.models:
            for precision in args.precisions:
                if name != "unet_small" and precision == "f32":
                    continue  # (YOLOv8-style has no linear resize and no deconvolution)
                ab(name, precision, threads, args.variants, args.rounds, args.repeat)
    print(f"# loadavg at end: {Path('/proc/loadavg').read_text().strip()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
