"""Which 3x3 layers the default mode runs on Winograd F(4x4, 3x3) without timing them.

`by_rule` (asked by `conv_choice` in mode `impl` with `PGX_CONV_WINOGRAD=rule`, the default)
names a `winograd.supports`-ed layer by its channel counts, its 4x4 output tiles and its
multiply-adds at the program's thread count: `rule_limits` gives the fewest channels and tiles
(the torch-ops route's limits, or the native kernel's, `winograd_native`, where it is at hand);
a bf16 layer (`winograd.supports_bf16`) has its own limits (`RULE_BF16_*`). The constants'
comments give the measurements they come from. Split out of `winograd.py` (issue 10).
"""

from __future__ import annotations

import torch

from pygraphx.targets.torch_lowering import winograd_native
from pygraphx.targets.torch_lowering.onednn_conv import ConvPlan  # (a Protocol of its fields)
from pygraphx.targets.torch_lowering.winograd import KERNEL_TILES, geometry, supports_bf16

#: the layers the default mode (`conv_choice`, mode `impl`) runs on F(4x4, 3x3) without
#: timing it (`by_rule`): both channel counts and the 4x4 output tiles at least
#: `rule_limits(threads)`, and `RULE_MACS` multiply-adds of the direct convolution. Measured on
#: the 2-core EPYC (`benchmarks/results/wino.md`, `wino2.md`), end to end:
#: at 2 threads and more, 128 channels and 32 tiles (main's rule). ResNet-50's 256-channel
#: 14x14 maps at batch 1 (16 tiles) ran 1.54x slower than oneDNN at 2 threads with main's
#: kernel (0.82x packed per layer, but end to end a tie: 38.83 against 38.95 ms); 7x7 maps at
#: batch 1 (4 tiles) 3.5x (2.5x packed). A layer of few tiles reads its transformed weight,
#: (m + 2)^2 / 9 = 4x the direct kernel's, for few rows: at ~18 GB/s (this machine's memory,
#: one core or two alike) the 9.4 MB of a 256-channel layer take 0.52 ms, half of oneDNN's
#: whole 2-thread call (0.95 ms); a second thread shortens the arithmetic, not that read.
#: 64 channels at 2 threads looked 3-5% faster on YOLOv8-style and UNet (one mostly quiet
#: run, best blocks of loaded ones) but lost badly whenever another process took a core
#: (every Winograd layer is some 8 parallel calls, each waiting for it): not taken without a
#: quiet A/B (`benchmarks/wino2_e2e.py`, mode `rule:32:64`)
RULE_CHANNELS, RULE_TILES = 128, 32
#: at one thread, 64 channels and 16 tiles: against 128 and 32, YOLOv8-style 80.7 against
#: 91.5 ms CPU, UNet 157 against 173; ResNet-50 b1 71.2 against 73.0 (16 tiles: its 14x14
#: maps 0.78-0.91x oneDNN with the packed products), b8 541.7 against 555.7. Layers of 32
#: channels lost (YOLOv8's 32-channel 80x80 maps 1.6x oneDNN's time)
RULE_CHANNELS_ONE_THREAD, RULE_TILES_ONE_THREAD = 64, 16
#: the fewest multiply-adds: below, the kernel's fixed cost (some 15 torch calls) outweighs
#: the saving (YOLOv8's 64- and 80-channel 20x20 maps, 15-23 M: 1.5-2.8x oneDNN's time; its
#: 128-channel 20x20 and 64-channel 40x40 maps, 59 M, 0.77-0.93x)
RULE_MACS = 32_000_000
#: above 2 threads a layer needs `RULE_TILES_A_THREAD` tiles a thread, and above
#: `RULE_MAX_THREADS` none runs on F(4,3). On the 16-core Xeon host of the H100 machine
#: (`benchmarks/cpu_threads_probe.py --ab --engines on@T ort@T`, ResNet-50, the rule of 64 / 128
#: channels and 32 tiles against Winograd off, pygraphx / ORT latency,
#: `benchmarks/results/h100host16_ab_*_session10.json`, two calls at 16): at 4 threads b1 1.14
#: against 1.04 off, b8 0.97 against 1.27; at 8 b1 1.15 against 0.76, b8 1.02 against 1.20; at 16
#: b1 1.10 / 1.03 against 0.95 / 0.97, b8 1.12 / 1.12 against 1.06 / 1.03. A layer's Winograd
#: calls (some 8 parallel regions) need more tiles the more threads share them: 16 a thread
#: keeps ResNet-50's b1 maps (49 tiles at 28x28) on oneDNN from 4 threads on and its b8 maps
#: (392 / 98 tiles) on F(4,3) up to 8
RULE_TILES_A_THREAD, RULE_MAX_THREADS = 16, 8


#: with the native kernel (`winograd_native`, wino13), up to `RULE_NATIVE_MAX_THREADS`
#: threads: both channel counts at least `RULE_NATIVE_CHANNELS`, at least
#: `RULE_NATIVE_TILES[threads]` tiles and `RULE_NATIVE_MACS` multiply-adds. Per layer on the
#: 2-core EPYC (`benchmarks/wino13_ab.py`, `benchmarks/results/wino13.md`; native / oneDNN,
#: medians, 1 thread CPU time; 2 threads wall, under load): every ResNet-50, YOLOv8-style and
#: UNet layer of 16 channels and more is faster, 0.35-0.63x at 1 thread (ResNet-50 b1 56x56
#: 0.46, 28x28 0.43, 14x14 0.58, 7x7 (4 tiles) 0.84; b8 0.35-0.70), 0.4-0.8x at 2 threads
#: (b1 56x56 0.49, 28x28 0.40, 14x14 (16 tiles) 0.56) but for ResNet-50's 7x7 maps at batch 1
#: at 2 threads (4 tiles: 1.11x; its 37.7 MB transformed weight read for 4 tiles) and UNet's
#: 3-channel input layer (1.6-1.9x); YOLOv8's smallest, (64, 20, 20) -> 64 (14.7 M
#: multiply-adds), 0.43x / 0.82x
RULE_NATIVE_CHANNELS = 16
RULE_NATIVE_TILES = {1: 4, 2: 16}
RULE_NATIVE_MACS = 10_000_000
RULE_NATIVE_MAX_THREADS = max(RULE_NATIVE_TILES)
#: above `RULE_NATIVE_MAX_THREADS` threads, native kernel: 64+ channels each side and 32+ tiles,
#: 4 a thread where more. 16-core Xeon host (`wino2_e2e.py --threads T --modes off rule ort`,
#: ResNet-50, pygraphx / ORT, `benchmarks/results/h100host16_s13_wino*.txt`): b8 at 16 threads
#: 0.905 / 0.938x against 1.013 / 1.036x off, at 8 0.901 / 1.036, at 4 0.974 / 1.082; b1 at 8
#: 0.851 / 0.898, at 16 0.875 / 0.911 against 0.923 / 0.891 (noise); at 4 16 tiles took the
#: 14x14 maps too: 0.949 against 0.880x, hence 32 tiles
RULE_NATIVE_WIDE_CHANNELS, RULE_NATIVE_WIDE_TILES, RULE_NATIVE_TILES_A_THREAD = 64, 32, 4


#: a bf16 layer (`supports_bf16`: the native kernel on bf16 activations, bf16wino14) runs on
#: F(4,3) by the rule up to `RULE_BF16_MAX_THREADS` threads (above: oneDNN's bf16 kernel, not
#: measured against it there), with both channel counts at least `RULE_BF16_CHANNELS[threads]`,
#: `RULE_BF16_PIXELS` output pixels (all images) and the native rule's multiply-adds. Per layer
#: on the 2-core EPYC (`benchmarks/bf16wino14_layers.py`, `benchmarks/results/bf16wino14.md`;
#: native / oneDNN bf16 (`jit_bf16`), medians; 1 thread thread CPU, 2 threads wall under load):
#: UNet-small's, YOLOv8-style's and ResNet-50's layers of 16+ channels and 256+ pixels
#: 0.61-0.82x at 1 thread, 0.61-0.97x at 2 threads; below 256 pixels the transformed weight
#: (36 floats a tap pair against oneDNN's 9 bf16) is read for too few products: ResNet-50's
#: 14x14 maps at batch 1 (256 channels, 196 pixels) 0.98x, its 7x7 ones 1.6x; UNet's
#: 3-channel input layer 1.9-2.3x; at 2 threads YOLOv8's 16-channel 160x160 maps 1.35-1.41x
RULE_BF16_CHANNELS = {1: 16, 2: 32}
RULE_BF16_PIXELS = 256
RULE_BF16_MAX_THREADS = max(RULE_BF16_CHANNELS)


def _native_rule(threads: int) -> bool:
    """Whether the native kernel's rule applies: the kernel at hand."""
    return winograd_native.available()


def rule_limits(threads: int) -> tuple[int, int] | None:
    """(fewest channels each side, fewest 4x4 output tiles) of a layer `by_rule` runs on
    F(4,3) at `threads` threads, None where no layer does (above `RULE_MAX_THREADS` on the
    torch-ops route)."""
    if _native_rule(threads):
        if threads > RULE_NATIVE_MAX_THREADS:
            tiles = max(RULE_NATIVE_WIDE_TILES, RULE_NATIVE_TILES_A_THREAD * threads)
            return RULE_NATIVE_WIDE_CHANNELS, tiles
        return RULE_NATIVE_CHANNELS, RULE_NATIVE_TILES[max(threads, 1)]
    if threads <= 1:
        return RULE_CHANNELS_ONE_THREAD, RULE_TILES_ONE_THREAD
    if threads > RULE_MAX_THREADS:
        return None
    return RULE_CHANNELS, max(RULE_TILES, RULE_TILES_A_THREAD * threads)


def by_rule(plan: ConvPlan, threads: int | None = None) -> bool:
    """Whether the default mode runs `plan` on `winograd` (F(4,3)) untimed at `threads`
    threads (default: torch's count now, the one the layer is compiled for; `rule_limits`,
    `RULE_MACS`); `plan` must be `supports`-ed."""
    g = geometry(plan, KERNEL_TILES["winograd"])
    threads = torch.get_num_threads() if threads is None else threads
    if plan.weight.dtype == torch.bfloat16:
        if not 1 <= threads <= RULE_BF16_MAX_THREADS or not supports_bf16(plan):
            return False
        macs = g.n * g.ho * g.wo * g.c * g.k * 9
        return (
            min(g.c, g.k) >= RULE_BF16_CHANNELS[threads]
            and g.n * g.ho * g.wo >= RULE_BF16_PIXELS
            and macs >= RULE_NATIVE_MACS
        )
    limits = rule_limits(threads)
    if limits is None:
        return False
    channels, tiles = limits
    macs = g.n * g.ho * g.wo * g.c * g.k * 9
    native = _native_rule(threads) and winograd_native.supports(plan)
    least = RULE_NATIVE_MACS if native else RULE_MACS
    return min(g.c, g.k) >= channels and g.n * g.th * g.tw >= tiles and macs >= least
