"""Winograd F(4x4, 3x3) as one native kernel (`native/kernels/winograd_f43.c`, helper wino13).

The torch route (`winograd.Winograd`) runs the input transform, the 36 products and the output
transform as passes over megabyte temporaries, which scale poorly to a second thread. The
native kernel does the three for a block of tiles inside the core's L2 (the input read through
its strides, the padding as zeros at the borders: no padded copy), the threads splitting the
tile blocks (and the output channels where there are few blocks), and writes the bias, the add
and relu / clip / swish into the channels-last output (`PGX_WINOGRAD_NATIVE_SILU=0`: a swish
and what follows it run as torch ops on the output afterwards). Only where the build has
AVX-512F (`wino_f43_supported`); `PGX_WINOGRAD_NATIVE=0` takes the torch route (as does a
machine without a C compiler, announced once; a failed build is kept for the process, not
retried per layer). Figures: `benchmarks/results/wino13.md`.

A bf16 layer (bf16 weight, `quantize_bf16`; bf16wino14) runs on the same kernel where the build
has AVX-512 BF16 (`wino_f43_bf16_supported`): its bf16 input and add operand read and widened
inside the transforms (no conversion pass), the transformed weight in float32 as for a float32
layer, the result rounded to bf16 (nearest even) once as it is stored: the rounding oneDNN's
bf16 kernels do, so the error is theirs (`PGX_WINOGRAD_NATIVE_BF16=0`: oneDNN's bf16 kernels).
Only with the whole epilogue in the kernel: with `PGX_WINOGRAD_NATIVE_SILU=0` a bf16 swish
layer stays on oneDNN (`supports`), not rounded twice.
Figures: `benchmarks/results/bf16wino14.md`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from pygraphx.ir.env import switch_on
from pygraphx.targets import native
from pygraphx.targets.torch_lowering.onednn_conv import ConvPlan
from pygraphx.targets.torch_lowering.winograd_scratch import Scratch

Tensor = torch.Tensor
EpilogueOp = Callable[[Tensor, Tensor, Tensor | None], Tensor]
Getter = Callable[[], Tensor]

#: `PGX_WINOGRAD_NATIVE=0` (off, no, false): F(4,3) layers run the torch-ops route
NATIVE_ENV = "PGX_WINOGRAD_NATIVE"
KERNEL = "winograd_f43"
#: output channels per block of the micro-kernel's products (the C file's KB)
KB = 64
#: bytes of one tile block's transformed input (36 x tiles x C floats): it stays in L2 while
#: the products of all output blocks read it
BLOCK_BYTES = 320 * 1024
#: a transformed weight of more bytes than this is read from memory every tile block (it
#: does not stay in L3 between blocks: 32 MB on the EPYC, shared) ...
BIG_WEIGHT_BYTES = 16 << 20
#: ... so its blocks take at least this many tiles (past `BLOCK_BYTES`): ResNet-50's
#: (512, 7, 7) -> 512 at batch 8 (32 tiles, 37.7 MB), 1 thread: 0.85x the time of blocks of 6
BIG_WEIGHT_TILES = 32
#: the role of the threads' block buffers in a `Scratch`
WORK_ROLE = "native_f43"
#: tiles per block, at least (the micro-kernel's rows) and at most
MIN_TILES, MAX_TILES = 6, 36


class _Args(ctypes.Structure):
    _fields_ = [
        ("x", ctypes.c_void_p),
        ("wt", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("y", ctypes.c_void_p),
        ("other", ctypes.c_void_p),
        ("work", ctypes.c_void_p),
        *[(name, ctypes.c_int64) for name in
          ("n", "c", "h", "w", "top", "left", "ho", "wo", "k",
           "sxn", "sxh", "sxw", "syn", "syh", "syw", "son", "soh", "sow", "act", "add")],
        ("lo", ctypes.c_double),
        ("hi", ctypes.c_double),
        ("tb", ctypes.c_int64),
        ("ksplit", ctypes.c_int64),
        ("threads", ctypes.c_int64),
        ("xbf16", ctypes.c_int64),
        ("ybf16", ctypes.c_int64),
        ("obf16", ctypes.c_int64),
    ]  # fmt: skip


def enabled() -> bool:
    """Whether F(4,3) layers may take the native kernel (`PGX_WINOGRAD_NATIVE` not off)."""
    return switch_on(NATIVE_ENV)


#: `PGX_WINOGRAD_NATIVE_SILU=0`: a swish epilogue runs as torch's silu over the output after
#: the kernel (instead of the kernel's own, a polynomial exp within about 1e-7)
SILU_ENV = "PGX_WINOGRAD_NATIVE_SILU"


def native_silu() -> bool:
    """Whether the kernel applies a swish itself (`SILU_ENV` not off)."""
    return switch_on(SILU_ENV)


#: `PGX_WINOGRAD_NATIVE_BF16=0`: a bf16 program's 3x3 layers stay on oneDNN's bf16 kernels
#: (no F(4,3) on bf16 activations)
BF16_ENV = "PGX_WINOGRAD_NATIVE_BF16"


def bf16_enabled() -> bool:
    """Whether bf16 layers may take the native kernel (`BF16_ENV` and `NATIVE_ENV` not off)."""
    return enabled() and switch_on(BF16_ENV)


def _bind(lib: ctypes.CDLL) -> None:
    lib.wino_f43_supported.argtypes = []
    lib.wino_f43_supported.restype = ctypes.c_int
    if not lib.wino_f43_supported():
        raise native.NativeUnavailable(
            f"native kernel {KERNEL}: this processor has no AVX-512F (the build has no kernel)")
    lib.wino_f43_work_floats.argtypes = [ctypes.c_int64, ctypes.c_int64]
    lib.wino_f43_work_floats.restype = ctypes.c_int64
    lib.wino_f43_run.argtypes = [ctypes.POINTER(_Args)]
    lib.wino_f43_run.restype = ctypes.c_int
    lib.wino_f43_bf16_supported.argtypes = []
    lib.wino_f43_bf16_supported.restype = ctypes.c_int


#: the library, bound once; a failed build (no compiler, no AVX-512F) is kept for the process:
#: not retried for every layer (`native.BoundLibrary`)
_BOUND = native.BoundLibrary(KERNEL, _bind)


def library() -> ctypes.CDLL:
    """The kernel's library, its functions bound; raises `native.NativeUnavailable` (the
    first failure's, again, for the rest of the process)."""
    return _BOUND.get()


def available() -> bool:
    """Whether the native route is on and can be had (announcing once why not)."""
    return enabled() and _BOUND.available("the torch-ops Winograd route")


def bf16_available() -> bool:
    """Whether bf16 layers may take the native kernel: `available()`, `bf16_enabled()`, and
    a build with AVX-512 BF16 (said once where not)."""
    if not (bf16_enabled() and available()):
        return False
    if not library().wino_f43_bf16_supported():
        why = f"native kernel {KERNEL}: this build has no bf16 (AVX-512 BF16, BW, VL)"
        native.announce_fallback(KERNEL + "/bf16", why, "oneDNN's bf16 convolution")
        return False
    return True


def supports(plan: ConvPlan) -> bool:
    """Whether the kernel runs `plan` (a `winograd.supports`-ed plan): no negative pre-pad;
    a bf16 layer only with its whole epilogue in the kernel (`split_epilogue` leaving no op
    to torch). With the native silu off (`SILU_ENV`), a bf16 layer's swish would run on the
    output already rounded to bf16 (two roundings): such a layer is not taken here (nor by
    `winograd.supports_bf16`, `conv_kernels.kernels_for`), it stays on oneDNN's bf16 kernels,
    which apply the swish in float32 before the one rounding."""
    if plan.pre_pad is not None and any(p < 0 for p in plan.pre_pad):
        return False
    return not (plan.weight.dtype == torch.bfloat16 and _torch_tail(plan))


def _torch_tail(plan: ConvPlan) -> bool:
    """Whether `split_epilogue` leaves part of `plan`'s epilogue to torch ops on the output."""
    return plan.unary == "swish" and not native_silu()


def pack_weight(wt: Tensor) -> Tensor:
    """The transformed weight (36, C, K) (`winograd.weight_transform`) in the kernel's layout:
    per block of 64 output channels (K padded with zeros to a multiple of 16), its 36 (C, kw)
    matrices, float32 (the kernel's; a float64 `wt` rounded once)."""
    p, c, k = wt.shape
    k16 = -(-k // 16) * 16
    padded = torch.zeros(p, c, k16, dtype=torch.float32)  # (whatever the default dtype)
    padded[:, :, :k] = wt
    return torch.cat(
        [padded[:, :, k0 : k0 + KB].contiguous().view(-1) for k0 in range(0, k16, KB)]
    )


def blocks(tiles: int, c: int, k: int, threads: int) -> tuple[int, int]:
    """(tiles per block, ranges of output-channel blocks per tile block): blocks whose
    transformed input fits `BLOCK_BYTES` (or of `BIG_WEIGHT_TILES` for a big weight), as many
    jobs as a multiple of the threads."""
    cs = -(-c // 16) * 16
    most = max(MIN_TILES, min(MAX_TILES, BLOCK_BYTES // (36 * cs * 4)))
    if 36 * c * k * 4 > BIG_WEIGHT_BYTES:
        most = max(most, BIG_WEIGHT_TILES)
    nblocks = -(-tiles // most)
    nkb = -(-k // KB)
    ksplit = 1
    if threads > 1:
        if nblocks < threads:
            ksplit = min(nkb, -(-threads // nblocks))
        else:
            nblocks = -(-nblocks // threads) * threads
    tb = max(1, -(-tiles // nblocks))
    return tb, ksplit


def split_epilogue(
    plan: ConvPlan, add: bool, ops: list[EpilogueOp]
) -> tuple[int, int, tuple[float, float], list[EpilogueOp]]:
    """(activation code, add code, clip bounds, the ops left to torch): the kernel applies
    relu / clip / swish (silu, `SILU_ENV` not off) and the add before or after them; with
    the native silu off, the swish and what follows run as `ops`'s tail on the output (`ops`
    is `winograd.epilogue_ops(plan, add)`)."""
    codes = {"none": 0, "relu": 1, "hardtanh": 2}
    if native_silu():
        codes["swish"] = 3
    where = (2 if plan.add_after else 1) if add else 0
    if plan.unary in codes:
        lo, hi = (plan.scalars[0], plan.scalars[1]) if plan.unary == "hardtanh" else (0.0, 0.0)
        return codes[plan.unary], where, (float(lo), float(hi)), []
    if plan.unary != "swish":
        raise ValueError(f"winograd (native): unknown activation {plan.unary!r}")
    # swish by torch: the kernel does the add only if it comes first; torch the rest
    if where == 1:
        return 0, 1, (0.0, 0.0), ops[1:]
    return 0, 0, (0.0, 0.0), ops


class NativeWinograd:
    """One layer's F(4,3) convolution by the native kernel (`winograd.Winograd`'s call)."""

    def __init__(self, plan: ConvPlan, geo: object, wt: Tensor, add: bool,
                 ops: list[EpilogueOp], scratch: Scratch | None = None) -> None:  # fmt: skip
        """`geo`: the layer's `winograd.Geometry` for m = 4; `wt`: its transformed weight;
        `ops`: `winograd.epilogue_ops(plan, add)`; `scratch`: where the threads' block
        buffers live (the program's, shared by its Winograd layers: the buffers the previous
        layer left in the caches), else its own."""
        self.lib = library()
        self.geo = g = geo
        #: the activations' type: float32, or bf16 (a bf16 weight: `quantize_bf16`'s layer)
        self.dtype = torch.bfloat16 if plan.weight.dtype == torch.bfloat16 else torch.float32
        if self.dtype == torch.bfloat16 and not self.lib.wino_f43_bf16_supported():
            raise native.NativeUnavailable(f"native kernel {KERNEL}: this build has no bf16")
        self.weight = pack_weight(wt)
        self.bias = None if plan.bias is None else plan.bias.float().contiguous()
        act, where, (lo, hi), self.rest = split_epilogue(plan, add, ops)
        if self.rest and self.dtype == torch.bfloat16:  # (`supports` refuses such a layer)
            raise ValueError(
                "winograd (native): a bf16 layer's swish left to torch would run on the "
                f"rounded output ({SILU_ENV} off); oneDNN's bf16 kernels run it"
            )
        self.uses_other = where != 0
        self.args = a = _Args()
        a.wt = self.weight.data_ptr()
        a.bias = None if self.bias is None else self.bias.data_ptr()
        a.n, a.c, a.h, a.w, a.top, a.left = g.n, g.c, g.h, g.w, g.top, g.left
        a.ho, a.wo, a.k = g.ho, g.wo, g.k
        a.act, a.add, a.lo, a.hi = act, where, lo, hi
        a.xbf16 = a.ybf16 = a.obf16 = int(self.dtype == torch.bfloat16)
        self.ref = ctypes.byref(a)  # (the argument of every call)
        self.bound: Tensor | None = None
        self.scratch = Scratch() if scratch is None else scratch
        self.threads = self.floats = 0
        self._set_threads(torch.get_num_threads())

    def _set_threads(self, threads: int) -> None:
        g, a = self.geo, self.args
        a.tb, a.ksplit = blocks(g.n * g.th * g.tw, g.c, g.k, threads)
        self.floats = self.lib.wino_f43_work_floats(g.c, a.tb) * threads
        a.threads = self.threads = threads
        self.scratch.get(WORK_ROLE, (self.floats,))  # (grown now, not at the first run)

    def __call__(self, x: Tensor, y: Tensor | None, other: Tensor | None) -> None:
        """The convolution of `x` (NCHW lens, any strides) into `y` ((N, Ho, Wo, K), channel
        stride 1; None: the output `bind` set) with the epilogue (`other`: the add operand,
        (N, Ho, Wo, K) lens)."""
        threads = torch.get_num_threads()
        if threads != self.threads:
            self._set_threads(threads)
        a = self.args
        a.work = self.scratch.address(WORK_ROLE, self.floats)
        if x.stride(1) != 1:
            x = x.contiguous(memory_format=torch.channels_last)
        if x.dtype != self.dtype or (other is not None and other.dtype != self.dtype):
            raise ValueError(f"winograd (native): a {self.dtype} layer given {x.dtype} input")
        a.x = x.data_ptr()
        a.sxn, _, a.sxh, a.sxw = x.stride()
        if y is None:
            y = self.bound
        else:
            self.bind(y)
        if self.uses_other:
            if other is None:
                raise ValueError("winograd (native): the layer's add operand is missing")
            if other.stride(3) != 1:
                other = other.contiguous()
            a.other = other.data_ptr()
            a.son, a.soh, a.sow, _ = other.stride()
        rc = self.lib.wino_f43_run(self.ref)
        if rc != 0:
            why = "mixed activation types" if rc == -2 else "not built for this processor"
            raise RuntimeError(f"native kernel {KERNEL}: {why}")
        for op in self.rest:
            op(y, y, other)

    def bind(self, y: Tensor) -> None:
        """Write `y` ((N, Ho, Wo, K), channel stride 1) from now on (an arena slot: its
        address and strides set once)."""
        if y.stride(3) != 1 or y.dtype != self.dtype:
            raise ValueError(
                f"winograd (native): the output must be {self.dtype} with channel stride 1")
        a = self.args
        a.y = y.data_ptr()
        a.syn, a.syh, a.syw, _ = y.stride()
        self.bound = y

    def closure(
        self, get_x: Getter, get_other: Getter | None, out: Tensor | None
    ) -> Callable[[], Tensor]:
        """`winograd.build`'s closure on this kernel (after one warming call on zeros, as
        there): a new channels-last result each call, or `out` (checked by the caller), whose
        address is bound once."""
        g, dt = self.geo, self.dtype
        other = (torch.zeros(g.n, g.ho, g.wo, g.k, dtype=dt) if self.uses_other or self.rest
                 else None)  # fmt: skip
        self(torch.zeros(g.n, g.c, g.h, g.w, dtype=dt), torch.empty(g.n, g.ho, g.wo, g.k, dtype=dt),
             other)  # fmt: skip

        if out is not None:
            self.bind(out.permute(0, 2, 3, 1))

            def into_out() -> Tensor:
                other = None if get_other is None else get_other().permute(0, 2, 3, 1)
                self(get_x(), None, other)
                return out

            return into_out

        def run() -> Tensor:
            y = torch.empty(g.n, g.ho, g.wo, g.k, dtype=dt)
            other = None if get_other is None else get_other().permute(0, 2, 3, 1)
            self(get_x(), y, other)
            return y.permute(0, 3, 1, 2)  # NCHW lens, channels-last

        return run


__all__ = [
    "BF16_ENV",
    "NATIVE_ENV",
    "NativeWinograd",
    "available",
    "bf16_available",
    "bf16_enabled",
    "blocks",
    "enabled",
    "library",
    "pack_weight",
    "split_epilogue",
    "supports",
]
