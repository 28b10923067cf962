"""A whole inverted-residual block as one native kernel (`native/kernels/mbconv.c`, helper mbv14).

MobileNetV2's block (1x1 expansion + bias + clip, depthwise 3x3 + bias + clip, 1x1 projection
+ bias, maybe + the block's input) runs on the `dnnl` route as two or three oneDNN primitives
(chained: `conv_chain.py`; the first pair one primitive where oneDNN fuses it natively:
`conv_dw_fusion.py`), the expanded tensor (6x the block's channels) written to memory and read
back, one fork/join of the threads per primitive. The native kernel computes the block strip by
strip of output rows, the expanded rows and the depthwise result kept in the core's L2, the
projection written straight into the channels-last output; one fork/join for the block.

This module binds the kernel and packs the weights (`MbConv`) and says which blocks take it
(`use_native`: the rule measured on the 2-core EPYC, `rule`; `benchmarks/results/mbv14.md`);
`conv_dw_fusion.native_block` matches a block in the program and `conv_native.defer_block` /
`_emit_block` lower it as one step for its six (four without an expansion) instructions.
`PGX_CPU_NATIVE_MBCONV=0` (off, no, false) keeps the oneDNN route everywhere, `=all` puts every
block the kernel can run on it; AVX-512F builds only (`mbconv_supported`), else the oneDNN
route, announced once. bf16 blocks (helper bfmb16, `kernels/mbconv_bf16.c`: the 1x1 products
on AVX512_BF16's dot product, the depthwise in float32, one rounding to bf16 per convolution as
oneDNN's bf16 kernels) unless `PGX_CPU_NATIVE_MBCONV_BF16=0` (on by default: `BF16_DEFAULT`;
`bf16_available`), by `bf16_rule` (1 and 2 threads), where the build has the instructions
(`mbconv_bf16_supported`); else bf16 programs keep the oneDNN route.
"""

from __future__ import annotations

import ctypes
import math
import os
import weakref

import torch

from pygraphx.ir.env import OFF_VALUES, switch_on
from pygraphx.targets import native
from pygraphx.targets.torch_lowering.native_mbpack import (  # noqa: F401  (re-exported)
    _pad16,
    _pad_k,
    pack_1x1,
    pack_1x1_bf16,
    pack_dw,
    pack_stem_bf16,
    pad_vector,
)
from pygraphx.targets.torch_lowering.winograd_scratch import Scratch

Tensor = torch.Tensor
#: the role of the threads' strip buffers in a `Scratch` (a program's, shared by its blocks:
#: the buffers the block before left in the caches) and the key of that scratch in a
#: lowering context's `cache`
WORK_ROLE = "native_mbconv"
SCRATCH_KEY = "mbconv_scratch"

#: `PGX_CPU_NATIVE_MBCONV=0` (off, no, false): blocks run on the oneDNN route
ENV = "PGX_CPU_NATIVE_MBCONV"
KERNEL = "mbconv"
#: the kernel's further source files (`native.BoundLibrary` parts): the network's head and the
#: block chain (`mbconv_head.c`, split out of mbconv.c by mnv18), the bf16 block, the bf16 head
#: and the bf16 block chain (`mbconv_bf16_head.c`, mnv18)
PARTS = ("mbconv_head", "mbconv_bf16", "mbconv_bf16_head")
#: bfmb16: `PGX_CPU_NATIVE_MBCONV_BF16=0` (off, no, false) keeps bf16 blocks on the oneDNN
#: route, `=1` puts them on the kernel (by `bf16_rule`); unset: `BF16_DEFAULT`, on: never
#: slower in the A/Bs on the 2-core EPYC (MobileNetV2 bf16 at 2 threads, the depthwise
#: writing bf16: b8 0.96-0.98x, b1 0.98-0.99x in the machine's usual state, 0.76-0.84x in its
#: slow one; benchmarks/results/bfmb16.md)
BF16_ENV = "PGX_CPU_NATIVE_MBCONV_BF16"
BF16_DEFAULT = True
#: bytes of a thread's strip buffers (the expanded rows and the depthwise rows) at most
STRIP_BYTES = 384 * 1024

_BOUNDS = {"none": (-math.inf, math.inf), "relu": (0.0, math.inf)}


class _Args(ctypes.Structure):
    _fields_ = [
        *[(name, ctypes.c_void_p) for name in
          ("x", "we", "be", "wd", "bd", "wp", "bp", "y", "other", "work")],
        *[(name, ctypes.c_int64) for name in
          ("n", "cin", "h", "w", "m", "ho", "wo", "cout", "stride",
           "sxn", "sxh", "sxw", "syn", "syh", "syw", "son", "soh", "sow")],
        *[(name, ctypes.c_double) for name in ("elo", "ehi", "dlo", "dhi", "plo", "phi")],
        *[(name, ctypes.c_int64) for name in ("rows", "chunks", "threads", "shared")],
        *[(name, ctypes.c_int64) for name in ("stem", "ih", "iw", "sxc")],  # (mnv15)
    ]  # fmt: skip


def mode() -> str:
    """`PGX_CPU_NATIVE_MBCONV`: "off" (0, off, no, false), "all" (every block the kernel can
    run: measurements) or "rule" (anything else, the default: the blocks `rule` picks)."""
    raw = os.environ.get(ENV, "1").strip().lower()
    if raw in OFF_VALUES:
        return "off"
    return "all" if raw == "all" else "rule"


#: mnv15: `PGX_CPU_NATIVE_MBSTEM=0` (off, no, false): a network's first 3x3 convolution (a few
#: input channels) is not the expansion of the block after it (`conv_dw_fusion._is_stem`)
STEM_ENV = "PGX_CPU_NATIVE_MBSTEM"


def stem_enabled() -> bool:
    """Whether a stem may be a block's expansion (`PGX_CPU_NATIVE_MBSTEM` not off)."""
    return switch_on(STEM_ENV)


#: mnv18: `PGX_CPU_NATIVE_MBSTEM_BF16=0` (off, no, false): a bf16 program's first 3x3
#: convolution (after the float32 image's convert to bf16) stays on oneDNN, the convert its own
#: step (the path before mnv18); on: the first bf16 block's expansion, the kernel reading the
#: float32 image (`conv_dw_fusion._is_stem`)
STEM_BF16_ENV = "PGX_CPU_NATIVE_MBSTEM_BF16"


def stem_bf16_enabled() -> bool:
    """Whether a bf16 stem may be a block's expansion (`PGX_CPU_NATIVE_MBSTEM_BF16` and
    `PGX_CPU_NATIVE_MBSTEM` not off)."""
    return stem_enabled() and switch_on(STEM_BF16_ENV)


def enabled() -> bool:
    """Whether blocks may take the native kernel (`PGX_CPU_NATIVE_MBCONV` not off)."""
    return mode() != "off"


#: above 2 threads a block takes the kernel where its output map has at least this many pixels
#: (measured at 16 threads: `rule`)
MIN_PIXELS_MANY_THREADS = 128


def efficiency(n: int, h: int, w: int, m: int, stride: int, threads: int) -> float:
    """The fraction of the threads' time the kernel's schedule spends on rows of its own:
    n * Ho output rows over threads x the rows of the busiest thread (its jobs' rows, each
    range of an image one row of halo more: the input rows expanded again)."""
    ho, wo = (h - 1) // stride + 1, (w - 1) // stride + 1
    _, chunks = schedule(n, ho, w, wo, m, stride, threads)
    busiest = -(-n * chunks // threads) * (-(-ho // chunks) + (1 if chunks > 1 else 0))
    return n * ho / (threads * busiest)


def rule(n: int, h: int, w: int, m: int, stride: int, threads: int) -> bool:
    """Whether a block of this shape takes the native kernel at `threads` threads.

    1 and 2 threads (measured on the 2-core EPYC, `benchmarks/results/mbv14.md`): every
    block. MobileNetV2's 17 blocks in the network, 1 thread: 0.85-1.02x the oneDNN route's
    steps at batch 1 (sum 0.95x), 0.74-1.08x alone at batch 8; end to end 0.96x (batch 1)
    and 0.87-0.90x (batch 8) at 1 thread, 0.96x and 0.83-0.91x at 2. Above 2 threads: where
    the output map has at least `MIN_PIXELS_MANY_THREADS` pixels (14x14 and larger), from the
    16-core Xeon host of the GPU machine at 16 threads (`benchmarks/mbv14_blocks.py --threads
    16`, `benchmarks/results/h100host16_s14_blocks16_b*.txt`), new/old per block shape:
    batch 1 0.88-0.96 with 14x14 and larger outputs (two stride-2 blocks 1.006 and 1.025),
    1.12 and 1.29 with 7x7 ones; batch 8 0.92-0.995 with 14x14 and larger, 1.24-1.48 with
    7x7 outputs (oneDNN splits their 576-960 channels between the threads, the kernel only
    the few rows)."""
    if threads <= 2:
        return True
    ho, wo = (h - 1) // stride + 1, (w - 1) // stride + 1
    return ho * wo >= MIN_PIXELS_MANY_THREADS


#: the thread counts at which bf16 blocks take the kernel (`bf16_rule`; above 2 not measured):
#: bfmb16 2 only (1 thread 1.00-1.05x the oneDNN route, before the chain); bfmnv17 1 and 2
#: (every block on the kernel at 1 thread, thread CPU: b1 0.95-0.98x, b8 0.97-0.98x)
BF16_THREADS = (1, 2)
#: above 1 thread a bf16 block takes the kernel where its output map has more pixels than this
#: (`bf16_rule`; bfmb16: 49, the 7x7 outputs on oneDNN; bfmnv17: 0, every block, now that the
#: blocks chain)
BF16_MIN_PIXELS_THREADS = 0
#: whether a bf16 block without an expansion takes the kernel (`bf16_rule`; bfmb16: False,
#: bfmnv17: True)
BF16_NO_EXPANSION = True
#: bfmnv17: `PGX_CPU_NATIVE_MBCONV_BF16_ALL=0` (off, no, false): bfmb16's rule,
#: `BF16_RULE16` (2 threads only, there no block without an expansion and none with a 7x7
#: output), in place of `BF16_THREADS` / `BF16_NO_EXPANSION` / `BF16_MIN_PIXELS_THREADS`
BF16_ALL_ENV = "PGX_CPU_NATIVE_MBCONV_BF16_ALL"
#: bfmb16's rule: (thread counts, no expansion taken, more pixels than this above 1 thread)
BF16_RULE16 = ((2,), False, 49)


def bf16_rule(h: int, w: int, stride: int, expand: bool, threads: int) -> bool:
    """Whether a bf16 block takes the kernel (beyond `rule`): at `BF16_THREADS` threads every
    block (`BF16_NO_EXPANSION`, `BF16_MIN_PIXELS_THREADS`), since the consecutive native
    blocks run as one call (mnv17's block chain). MobileNetV2 bf16 on the 2-core EPYC
    (`benchmarks/results/bfmnv17.md`), every block against bfmb16's rule (2 threads only,
    there the first block, without an expansion, and the four 7x7-output blocks on oneDNN:
    each 1.07-1.31x slower on the kernel alone, before the chain), one process, both orders:
    2 threads, machine quiet before and after, batch 1 0.90 / 0.96 (median; best block
    0.98 / 0.99; process CPU 0.90 / 0.92), batch 8 0.99-1.01 (best 0.99-1.00, process CPU
    0.98-1.01: even; an A/A's spread 1 %); 1 thread (thread CPU, loaded) batch 1 0.95-0.98,
    batch 8 0.97-0.98. `PGX_CPU_NATIVE_MBCONV_BF16_ALL=0`: bfmb16's rule (`BF16_RULE16`)."""
    if switch_on(BF16_ALL_ENV):
        threads_ok, no_expansion, min_pixels = (
            BF16_THREADS, BF16_NO_EXPANSION, BF16_MIN_PIXELS_THREADS)
    else:
        threads_ok, no_expansion, min_pixels = BF16_RULE16
    ho, wo = (h - 1) // stride + 1, (w - 1) // stride + 1
    if threads not in threads_ok or (not expand and not no_expansion):
        return False
    return threads <= 1 or ho * wo > min_pixels


def use_native(n: int, c: int, h: int, w: int, m: int, k: int, stride: int,
               bf16: bool = False, expand: bool = True) -> bool:  # fmt: skip
    """Whether the block of this shape takes the native kernel in a program prepared now (at
    `torch.get_num_threads()` threads): the kernel on and available, and `rule` (or the mode
    "all"); a bf16 block (`bf16`; `expand`: it has an expansion) `bf16_rule` too."""
    kind = mode()
    if kind == "off" or not available():
        return False
    threads = torch.get_num_threads()
    if bf16 and kind != "all" and not bf16_rule(h, w, stride, expand, threads):
        return False
    return kind == "all" or rule(n, h, w, m, stride, threads)


def _bind(lib: ctypes.CDLL) -> None:
    lib.mbconv_supported.argtypes = []
    lib.mbconv_supported.restype = ctypes.c_int
    if not lib.mbconv_supported():
        raise native.NativeUnavailable(
            f"native kernel {KERNEL}: this processor has no AVX-512F (the build has no kernel)")
    lib.mbconv_work_floats.argtypes = [ctypes.c_int64] * 5
    lib.mbconv_work_floats.restype = ctypes.c_int64
    lib.mbconv_shared_floats.argtypes = [ctypes.c_int64] * 5
    lib.mbconv_shared_floats.restype = ctypes.c_int64
    lib.mbconv_stem_floats.argtypes = [ctypes.c_int64] * 3
    lib.mbconv_stem_floats.restype = ctypes.c_int64
    lib.mbconv_run.argtypes = [ctypes.POINTER(_Args)]
    lib.mbconv_run.restype = ctypes.c_int
    # (the block chains' `mbconv_chain_stamped` / `mbconv_bf16_chain_stamped` are bound by
    # `native_mbchain`, as function objects of their own)
    lib.mbconv_bf16_supported.argtypes = []
    lib.mbconv_bf16_supported.restype = ctypes.c_int
    lib.mbconv_bf16_run.argtypes = [ctypes.POINTER(_Args)]
    lib.mbconv_bf16_run.restype = ctypes.c_int
    if lib.mbconv_bf16_supported():  # (a build without AVX512_BF16 defines no bf16 sizes)
        lib.mbconv_bf16_shared_floats.argtypes = [ctypes.c_int64] * 5
        lib.mbconv_bf16_shared_floats.restype = ctypes.c_int64
    # the network's head (`native_mbhead`, mnv15): its argument struct is that module's
    lib.mbhead_work_floats.argtypes = [ctypes.c_int64] * 6
    lib.mbhead_work_floats.restype = ctypes.c_int64
    lib.mbhead_run.argtypes = [ctypes.c_void_p]
    lib.mbhead_run.restype = ctypes.c_int
    lib.mbhead_bf16_run.argtypes = [ctypes.c_void_p]  # (mnv18; 1 in a build without bf16)
    lib.mbhead_bf16_run.restype = ctypes.c_int


#: the library, bound once; a failed build is kept for the process (`native.BoundLibrary`)
_BOUND = native.BoundLibrary(KERNEL, _bind, parts=PARTS)


def library() -> ctypes.CDLL:
    """The kernel's library, its functions bound; raises `native.NativeUnavailable`."""
    return _BOUND.get()


def available() -> bool:
    """Whether the native route is on and can be had (announcing once why not)."""
    return enabled() and _BOUND.available("the oneDNN convolution route")


def bf16_enabled() -> bool:
    """Whether bf16 blocks may take the kernel (`PGX_CPU_NATIVE_MBCONV_BF16`, default
    `BF16_DEFAULT`)."""
    if BF16_ENV not in os.environ:
        return BF16_DEFAULT
    return switch_on(BF16_ENV)


def bf16_available() -> bool:
    """Whether bf16 blocks take the native kernel: the kernel on and available, the bf16
    switch on and the build with AVX512_BF16 (`mbconv_bf16_supported`)."""
    return bf16_enabled() and bf16_built()


def bf16_built() -> bool:
    """Whether the library is on and available and built with AVX512_BF16 (announced once
    where not), whatever the bf16 blocks' switch says (the bf16 head has its own)."""
    if not available():
        return False
    if not library().mbconv_bf16_supported():
        native.announce_fallback(
            f"{KERNEL}_bf16", "native kernel mbconv: this build has no AVX512_BF16",
            "oneDNN's bf16 convolutions",
        )  # fmt: skip
        return False
    return True


def _check(t: Tensor, lens: list[int], what: str, dtype: torch.dtype = torch.float32) -> None:
    """The kernel reads and writes `dtype` of exactly the lens it was made for (a tensor pointed
    to once per new tensor: `MbConv.closure`'s `seen`)."""
    if t.dtype != dtype or list(t.shape) != lens:
        raise ValueError(
            f"native mbconv: the {what} must be a {str(dtype).removeprefix('torch.')} {lens} "
            "tensor, got "
            f"{list(t.shape)} {t.dtype}"
        )


def bounds(unary: str, scalars: list[float]) -> tuple[float, float]:
    """The clip bounds of an epilogue activation none / relu / hardtanh (ValueError else)."""
    if unary == "hardtanh":
        return float(scalars[0]), float(scalars[1])
    if unary in _BOUNDS:
        return _BOUNDS[unary]
    raise ValueError(f"native mbconv: unsupported activation {unary!r}")


# (the packers below make float32 whatever torch's default dtype: the kernels read float32;
# tidy17b: under `torch.set_default_dtype(torch.float64)` they made float64 weights)


def schedule(
    n: int, ho: int, w: int, wo: int, m: int, stride: int, threads: int
) -> tuple[int, int]:
    """(output rows per strip, jobs per image): strips whose buffers fit `STRIP_BYTES`; as
    many row ranges per image as keep the threads busy at the least recomputed rows (each
    range expands the one or two input rows above it again)."""
    m16 = _pad16(m)
    per_row = (stride * w + wo) * m16 * 4
    rows = max(1, min(ho, (STRIP_BYTES - 2 * w * m16 * 4) // per_row))
    best, chunks = None, 1
    for c in range(1, ho + 1):
        cost = -(-n * c // threads) * (-(-ho // c) + (1 if c > 1 else 0))
        if best is None or cost < best:
            best, chunks = cost, c
    rows = min(rows, -(-ho // chunks))
    return rows, chunks


def program_scratch(cache: dict) -> Scratch:
    """The blocks' scratch of the program being lowered (`cache`: its lowering context's
    `cache`, kept by the compiled program, whose runs are serialised)."""
    scratch = cache.get(SCRATCH_KEY)
    if scratch is None:
        scratch = cache[SCRATCH_KEY] = Scratch()
    return scratch


#: the shared mode (`mbconv.c`'s mb_args.shared): None where `share_image` says so, else
#: always (True, more than one thread) or never (False)
SHARED: bool | None = None
#: the efficiency of the rows' split below which the threads share the image
SHARE_BELOW = 0.8


def share_image(n: int, h: int, w: int, m: int, stride: int, threads: int) -> bool:
    """Whether the threads work image by image on shared buffers (splitting the expansion's
    pixels, the depthwise rows and the projection's pixels, two barriers) instead of on ranges
    of rows of their own (each range expanding its halo rows again): where the rows split
    unevenly (`efficiency` below `SHARE_BELOW`). Measured at 2 threads, batch 1 (the kernel
    alone, minimum ms, quiet; `benchmarks/results/mbv14.md`): MobileNetV2's blocks with a 7x7
    output (efficiency 0.70) 0.178 -> 0.153, 0.184 -> 0.157, 0.260 -> 0.224; with 14x14 ones
    (0.88) mixed (0.106 -> 0.108, 0.228 -> 0.221, 0.078 -> 0.079), so those keep their rows."""
    if SHARED is not None:
        return SHARED and threads > 1
    return threads > 1 and efficiency(n, h, w, m, stride, threads) < SHARE_BELOW


class MbConv:
    """One block's weights packed and its kernel's arguments (`__call__` runs it).

    `we` (M, C, 1, 1) or None (no expansion: the depthwise convolution reads the input),
    `wd` (M, 1, 3, 3), `wp` (K, M, 1, 1); biases may be None; `acts`: the three epilogues'
    (unary, scalars); `x_lens` the input's NCHW lens; `residual`: the projection adds a tensor
    of the output's lens (before its activation); `scratch`: where the threads' buffers live
    (the program's, `program_scratch`), else its own. `stem` (mnv15): 0, or the stride (1, 2)
    of a 3x3 convolution (padding 1) that is the expansion: `we` (M, C, 3, 3), `x_lens` the
    image's (N, C, IH, IW) in any layout (MobileNetV2's first convolution and first block).
    `bf16` (bfmb16): the input, the residual and the output bf16, the 1x1 weights rounded to
    bf16, the biases float32 as given (the caller rounds a bf16 layer's); a bf16 stem (mnv18)
    reads the float32 image (`x_dtype`), rounding it to bf16 as it reads (the program's
    convert), its weight bf16 (rounded), never in the shared mode."""

    def __init__(self, we: Tensor | None, be: Tensor | None, wd: Tensor, bd: Tensor | None,
                 wp: Tensor, bp: Tensor | None, stride: int, acts: list[tuple[str, list[float]]],
                 x_lens: list[int], residual: bool,
                 scratch: Scratch | None = None, stem: int = 0,
                 bf16: bool = False) -> None:  # fmt: skip
        self.lib = library()
        if bf16 and not self.lib.mbconv_bf16_supported():
            raise ValueError("native mbconv: bf16 blocks need AVX512_BF16")
        self.dtype = torch.bfloat16 if bf16 else torch.float32
        #: the input's dtype: the block's, or a stem's float32 image (mnv18: bf16 too)
        self.x_dtype = torch.float32 if stem else self.dtype
        self._run = self.lib.mbconv_bf16_run if bf16 else self.lib.mbconv_run
        one = pack_1x1_bf16 if bf16 else pack_1x1
        n, c, ih, iw = x_lens
        h, w = (ih, iw) if not stem else ((ih - 1) // stem + 1, (iw - 1) // stem + 1)
        if stem and (we is None or list(we.shape[1:]) != [c, 3, 3] or stem not in (1, 2)):
            raise ValueError("native mbconv: a stem is a 3x3 convolution of stride 1 or 2")
        m, k = wd.shape[0], wp.shape[0]
        if we is None and m != c:
            raise ValueError("native mbconv: without an expansion the depthwise channels are C")
        self.tensors = [
            None if we is None else (
                pack_stem_bf16(we) if stem and bf16  # (mnv18)
                else one(we.reshape(m, -1, 1, 1))),
            pad_vector(be, m),
            pack_dw(wd),
            pad_vector(bd, m),
            pack_1x1_bf16(_pad_k(wp)) if bf16 else pack_1x1(wp, pad_k=True), pad_vector(bp, k),
        ]  # fmt: skip
        self.ho, self.wo = (h - 1) // stride + 1, (w - 1) // stride + 1
        self.out_lens = [n, k, self.ho, self.wo]
        self.x_lens = list(x_lens)
        self.args = a = _Args()
        a.we, a.be, a.wd, a.bd, a.wp, a.bp = (
            None if t is None else t.data_ptr() for t in self.tensors)
        a.n, a.cin, a.h, a.w, a.m, a.ho, a.wo, a.cout, a.stride = (
            n, c, h, w, m, self.ho, self.wo, k, stride)
        (a.elo, a.ehi), (a.dlo, a.dhi), (a.plo, a.phi) = (bounds(*e) for e in acts)
        a.stem, a.ih, a.iw = stem, ih, iw
        self.stem_floats = self.lib.mbconv_stem_floats(w, c, iw) if stem else 0
        self.residual = residual
        self.ref = ctypes.byref(a)
        self.scratch = Scratch() if scratch is None else scratch
        self.floats = 0
        self.threads = 0
        self.bound: Tensor | None = None
        self._set_threads(torch.get_num_threads())

    def _set_threads(self, threads: int) -> None:
        a = self.args
        a.rows, a.chunks = schedule(a.n, a.ho, a.w, a.wo, a.m, a.stride, threads)
        a.shared = int(share_image(a.n, a.h, a.w, a.m, a.stride, threads))
        if a.stem and self.dtype == torch.bfloat16:  # (mnv18: a bf16 stem splits image rows)
            a.shared = 0
        if a.shared:
            shared = self.lib.mbconv_shared_floats
            if self.dtype == torch.bfloat16:
                shared = self.lib.mbconv_bf16_shared_floats
            floats = shared(a.h, a.w, a.m, a.ho, a.wo)
            self.floats = floats + threads * self.stem_floats + 16
        else:
            floats = self.lib.mbconv_work_floats(a.w, a.m, a.wo, a.stride, a.rows)
            self.floats = (floats + self.stem_floats) * threads + 16
        self.scratch.get(WORK_ROLE, (self.floats,))  # (grown now, not at the first run)
        a.threads = self.threads = threads

    def point_x(self, x: Tensor) -> Tensor:
        """Point the kernel to `x` (NCHW lens; channels-last, else a channels-last copy, which
        is returned to be held until the call)."""
        _check(x, self.x_lens, "input", self.x_dtype)
        a = self.args
        if x.stride(1) != 1 and not a.stem:  # (a stem reads any layout)
            x = x.contiguous(memory_format=torch.channels_last)
        a.x = x.data_ptr()
        a.sxn, a.sxc, a.sxh, a.sxw = x.stride()
        return x

    def bind(self, y: Tensor) -> None:
        """Write `y` (NCHW lens, channels-last) from now on (an arena slot)."""
        _check(y, self.out_lens, "output", self.dtype)
        if y.stride(1) != 1:
            raise ValueError("native mbconv: the output must be channels-last")
        a = self.args
        a.y = y.data_ptr()
        a.syn, _, a.syh, a.syw = y.stride()
        self.bound = y

    def point_other(self, r: Tensor) -> Tensor:
        """Point the kernel to the residual `r` (as `point_x`)."""
        _check(r, self.out_lens, "residual", self.dtype)
        if r.stride(1) != 1:
            r = r.contiguous(memory_format=torch.channels_last)
        a = self.args
        a.other = r.data_ptr()
        a.son, _, a.soh, a.sow = r.stride()
        return r

    def run(self) -> None:
        """Run on what the arguments point to."""
        threads = torch.get_num_threads()
        if threads != self.threads:
            self._set_threads(threads)
        self.args.work = self.scratch.address(WORK_ROLE, self.floats)
        if self._run(self.ref) != 0:
            raise RuntimeError(f"native kernel {KERNEL}: not built for this processor")

    def closure(self, env: list, xi: int, ri: int | None, out: Tensor | None):
        """A step's closure: the block on env[xi] (and the residual env[ri]) into `out` (an
        arena slot, channels-last: bound once; the closure says so as `writes`) or a new
        tensor, which it returns. An input that is the same tensor as the run before is not
        pointed to again (mnv15: known by a weak reference, so the closure does not keep the
        last run's input and residual alive after their last use)."""
        if out is not None:
            self.bind(out)
        run_kernel, ref, lens, cl = self._run, self.ref, self.out_lens, torch.channels_last
        dtype = self.dtype
        threads = torch.get_num_threads
        a, address = self.args, self.scratch.address
        seen: list = [None, None]

        def run() -> Tensor:
            x = env[xi]
            held = held_r = None
            last = seen[0]
            if last is None or last() is not x:
                held = self.point_x(x)
                seen[0] = weakref.ref(x) if held is x else None
            if ri is not None:
                r = env[ri]
                last = seen[1]
                if last is None or last() is not r:
                    held_r = self.point_other(r)
                    seen[1] = weakref.ref(r) if held_r is r else None
            y = out
            if y is None:
                y = torch.empty(lens, dtype=dtype).contiguous(memory_format=cl)
                self.bind(y)
            if threads() != self.threads:
                self._set_threads(threads())
            a.work = address(WORK_ROLE, self.floats)
            if run_kernel(ref) != 0:
                raise RuntimeError(f"native kernel {KERNEL}: not built for this processor")
            del held, held_r
            return y

        run.writes = out  # type: ignore[attr-defined]
        run.mb = (self, env, xi, ri)  # type: ignore[attr-defined]  (`native_mbchain`)
        if ri is None:
            self.args.other = None
        return run

    def __call__(self, x: Tensor, y: Tensor | None = None, other: Tensor | None = None) -> Tensor:
        """The block on `x` (NCHW lens) into `y` (a new channels-last tensor for None)."""
        if y is None:
            y = torch.empty(self.out_lens, dtype=self.dtype).contiguous(
                memory_format=torch.channels_last)
        self.bind(y)
        held = [self.point_x(x)]
        if self.residual:
            if other is None:
                raise ValueError("native mbconv: the block's residual is missing")
            held.append(self.point_other(other))
        else:
            self.args.other = None
        self.run()
        del held
        return y


__all__ = [
    "BF16_ALL_ENV", "BF16_ENV", "ENV", "STEM_BF16_ENV", "stem_bf16_enabled",
    "MIN_PIXELS_MANY_THREADS", "MbConv", "SHARED", "available",
    "bf16_available", "bf16_enabled", "bounds", "efficiency",
    "enabled", "library", "mode", "rule", "schedule", "share_image", "use_native",
]  # fmt: skip
