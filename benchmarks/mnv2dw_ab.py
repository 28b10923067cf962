"""A/B of the 1x1 + depthwise fusion (`conv_dw_fusion.py`) on a whole model, in one process.

    python benchmarks/mnv2dw_ab.py --threads 1 --batch 1 --rounds 10
    python benchmarks/mnv2dw_ab.py --threads 2 --batch 8 --rounds 6 --model mobilenetv2

Two programs of the same model, compiled with `PGX_CONV_DW_FUSION=off` (the reference of
the ratios) and `on`, `on` first in the first round (`off` with `--off-first`), run in
alternating blocks of `--runs` runs (0: about 0.2 s a block): a
wrapper of `benchmarks/ab_harness.py` (the one harness; per variant the median block, thread
CPU at 1 thread and wall at 2+, and process CPU time; the outputs compared with each other and
with ONNX Runtime's); each compile's fused pair count printed. `PGX_CPU_LOAD_ADAPT=0` is set,
so a busy machine does not take threads away from the runs (wall times are then inflated by
the other processes' load: compare the CPU columns there).

Both variants also set `PGX_CPU_NATIVE_MBCONV=0` (tidy18; `--native` leaves it out): since
mbv14 / mnv15 / bfmb16 MobileNetV2's inverted-residual blocks and head run on the native block
kernels by default (`native_mbconv`, `native_mbhead`, float32 and bf16), which take the 1x1 +
depthwise pairs before this fusion looks at them: on the default route it fuses 0 pairs and the
A/B is an A/A (tidy17 saw "0 pairs fused"). The fusion still applies where the blocks take the
oneDNN route (`PGX_CPU_NATIVE_MBCONV=0`, a CPU without AVX-512): there it fuses MobileNetV2 b1's
16x112x112 -> 96 pair (1 pair; more at batch 8), which is what this A/B times.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("PGX_CPU_LOAD_ADAPT", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import ab_harness as ab  # noqa: E402

#: the oneDNN route of the blocks, where the fusion applies (the native kernels take the pairs)
ONEDNN_BLOCKS = {"PGX_CPU_NATIVE_MBCONV": "0"}


def named(native: bool = False) -> dict[str, ab.Variant]:
    """The variants `on` / `off` (`native`: on the default route, where nothing is fused)."""
    route = {} if native else ONEDNN_BLOCKS
    return {m: ab.Variant(m, {**route, "PGX_CONV_DW_FUSION": m}) for m in ("on", "off")}


NAMED = named()


def fused(prog) -> str:
    return f"{prog._executable.lowered.ctx.cache.get('conv_dw_fused', 0)} pairs fused"


def main(argv: list[str] | None = None) -> int:
    p = ab.parser(__doc__.splitlines()[0], models=[], threads=1, rounds=10, runs=0, warmup=5,
                  named=NAMED, default_names=["off", "on"])  # fmt: skip
    p.add_argument("--model", default="mobilenetv2")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--off-first", action="store_true", help="the unfused program first (run order)")
    p.add_argument("--native", action="store_true",
                   help="keep the native block kernels (the default route: nothing is fused)")
    args = p.parse_args(argv)
    args.new_first = not args.off_first  # the run order; the ratios are on / off either way
    models = args.models or [f"{args.model}:{args.batch}"]
    return ab.run_args(args, named=named(args.native), models=models, note=fused)


if __name__ == "__main__":
    raise SystemExit(main())
