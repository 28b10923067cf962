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
A wrapper of `benchmarks/ab_harness.py` (the one harness): timing alternates blocks of runs
(a settle run, then `--repeat` timed runs) of the variants, the order reversed every round;
reported per variant: the median block (wall at 2+ threads, thread CPU at 1), the best block,
process CPU ms a run, the relative RMS error of the output against ONNX Runtime float32; kept
here: each compile's upsampling steps. Float32 programs take neither of unet13's paths (both
switches act on bf16 only), but do take unetb13's pass (`new` against `noswap`).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness as ab  # noqa: E402
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
NAMED = {k: ab.Variant(k, dict(zip((DECONV_ENV, KERNEL_ENV, PASSES_ENV), v, strict=True)))
         for k, v in VARIANTS.items()}  # fmt: skip


def upsampling(prog) -> str:
    kinds = [
        "+".join(i.op.name for i in s.instructions if not i.is_literal())
        for s in prog._executable.lowered.steps
    ]
    return f"upsampling steps {sorted({k for k in kinds if 'deconvolution' in k or 'resize' in k})}"


def main(argv: list[str] | None = None) -> int:
    p = ab.parser(__doc__.splitlines()[0], models=["unet_small", "yolov8_style"], threads=[2],
                  rounds=6, runs=8, settle=1, named=NAMED, default_names=["old", "new"])
    p.add_argument("--precisions", nargs="+", default=["bf16", "f32"], choices=["bf16", "f32"])
    args = p.parse_args(argv)
    rc = 0
    for precision in args.precisions:
        args.bf16 = precision == "bf16"
        # (YOLOv8-style has no linear resize and no deconvolution: float32 UNet only)
        models = [m for m in args.models if args.bf16 or m.startswith("unet_small")]
        if models:
            rc |= ab.run_args(args, named=NAMED, models=models, note=upsampling)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
