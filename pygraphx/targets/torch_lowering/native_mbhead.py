"""A network's head as one native call (`native/kernels/mbconv_head.c`'s `mbhead_run`, mnv15).

MobileNetV2 ends with a 1x1 convolution (320 -> 1280) + bias + clip, a global average pooling
and the classifier (1280 -> 1000). On the oneDNN route these are three steps: the convolution
writes the 1280x7x7 map, the pooling reads it back, the classifier reads its 5 MB weight on one
fork/join of its own. The kernel computes the convolution 64 channels at a time into a small
tile and sums the tile's columns (the map is never written), adds the ranges' sums (barrier),
then the threads split the classifier's columns (each reads its part of the weight): one call,
one fork/join.

This module binds the kernel (`MbHead`: weights packed once, the argument struct built once; a
run is one ctypes call) and says how the work is split (`pixel_chunks`).
`conv_dw_fusion.native_head` matches the pattern (a float32 1x1 convolution of a literal weight
whose only user is its clip / relu / bias group, whose only user is an average pooling over the
whole map; then, optionally, a flatten (or reshape) to (N, C) and a `dot` with a literal (C, K)
weight, each the only user of the one before) and `conv_native.defer_head` / `_emit_head`
lower it as one step (the unfused twins kept for profiling).
`PGX_CPU_NATIVE_MBHEAD=0` (off, no, false) keeps the library route; AVX-512F builds only
(`native_mbconv.available`), else the library route, announced once.

bf16 (mnv18, `mbconv_bf16_head.c`'s `mbhead_bf16_run`): a bf16 program's head (the 1x1
convolution on AVX512_BF16's dot product, the map, the pooled values and the classifier's
result each rounded to bf16 as the program's steps round them; the classifier without a bias,
its result bf16 or, where the program converts it to float32 next, float32), where
`bf16_available` (`PGX_CPU_NATIVE_MBHEAD_BF16=0`: the oneDNN / library steps, the path before).
"""

from __future__ import annotations

import ctypes
import weakref

import torch

from pygraphx.ir.env import switch_on
from pygraphx.targets.torch_lowering import native_mbconv

Tensor = torch.Tensor
#: `PGX_CPU_NATIVE_MBHEAD=0` (off, no, false): the head runs as before (three steps)
ENV = "PGX_CPU_NATIVE_MBHEAD"
#: jobs (image x 64-channel block x pixel range) per thread at least, where the pixels can be
#: split (16 threads at batch 1: MobileNetV2's 20 channel blocks become 80 jobs)
JOBS_PER_THREAD = 4
#: pixels per range at least (the micro-kernel computes 6 at a time)
MIN_PIXELS = 6
#: mnv18: `PGX_CPU_NATIVE_MBHEAD_BF16=0` (off, no, false): a bf16 program's head runs as
#: before (the oneDNN convolution, the pooling, the classifier: three steps)
BF16_ENV = "PGX_CPU_NATIVE_MBHEAD_BF16"
#: mnv16: the classifier's bias (a group adding a constant per column to the `dot`: an ONNX
#: Gemm's C) is added by the kernel, in the head's step (was a step of its own after it);
#: False: its own step (the old path)
BIAS = True


class _Args(ctypes.Structure):
    _fields_ = [
        *[(name, ctypes.c_void_p) for name in ("x", "wt", "b", "wc", "bc", "y", "work")],
        *[(name, ctypes.c_int64) for name in
          ("n", "cin", "h", "w", "cout", "ncls", "sxn", "sxh", "sxw", "syn", "syc")],
        *[(name, ctypes.c_double) for name in ("lo", "hi")],
        *[(name, ctypes.c_int64) for name in ("pchunks", "threads")],
        ("yb", ctypes.c_int64),  # (mnv18: the bf16 head's output bf16)
    ]  # fmt: skip


def enabled() -> bool:
    """Whether heads may take the native kernel (`PGX_CPU_NATIVE_MBHEAD` not off)."""
    return switch_on(ENV)


def available() -> bool:
    """Whether the native head is on and its library can be had (announced once where not).
    mnv16: `PGX_CPU_NATIVE_MBCONV=0` turns it off too (the switch of the whole `mbconv`
    library: blocks, stem and head; `PGX_CPU_NATIVE_MBHEAD=0` the head alone)."""
    return enabled() and native_mbconv.available()


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def bf16_available() -> bool:
    """Whether a bf16 head may take the native kernel: the head on (`available`), its bf16
    switch (`PGX_CPU_NATIVE_MBHEAD_BF16`) on and the bf16 kernel built
    (`native_mbconv.bf16_built`; the bf16 blocks' switch `PGX_CPU_NATIVE_MBCONV_BF16` is theirs
    alone, review18a)."""
    return available() and switch_on(BF16_ENV) and native_mbconv.bf16_built()


def pixel_chunks(n: int, cout: int, pixels: int, threads: int) -> int:
    """Pixel ranges per image and channel block: 1 where the images' channel blocks give every
    thread `JOBS_PER_THREAD` jobs, else as many as do (ranges of `MIN_PIXELS` pixels at least)."""
    jobs = n * -(-native_mbconv._pad16(cout) // 64)
    if threads <= 1 or jobs >= JOBS_PER_THREAD * threads:
        return 1
    want = -(-JOBS_PER_THREAD * threads // jobs)
    return max(1, min(want, pixels // MIN_PIXELS))


class MbHead:
    """A head's weights packed and its kernel's arguments.

    `w` (C, Cin, 1, 1), `b` (C) or None, the clip bounds `lo`, `hi`; `wc` the classifier's
    (C, K) weight (None: the kernel's result is the pooled (N, C[, 1, 1]) values), `bc` its
    bias (K) or None; `x_lens` the input's NCHW lens. `bf16` (mnv18): the input and the
    weights bf16 (rounded), the biases float32 as given, no classifier bias; the output of
    `out_dtype` (bf16, or float32 holding the bf16 values)."""

    def __init__(self, w: Tensor, b: Tensor | None, lo: float, hi: float, wc: Tensor | None,
                 bc: Tensor | None, x_lens: list[int], bf16: bool = False,
                 out_dtype: torch.dtype | None = None) -> None:  # fmt: skip
        self.lib = native_mbconv.library()
        if bf16 and (bc is not None or not self.lib.mbconv_bf16_supported()):
            raise ValueError("native mbhead: a bf16 head needs AVX512_BF16 and no classifier "
                             "bias")  # fmt: skip
        self.dtype = torch.bfloat16 if bf16 else torch.float32
        self.out_dtype = out_dtype or self.dtype
        if not bf16 and self.out_dtype != torch.float32:
            raise ValueError("native mbhead: a float32 head writes float32")
        self._run = self.lib.mbhead_bf16_run if bf16 else self.lib.mbhead_run
        one = native_mbconv.pack_1x1_bf16 if bf16 else native_mbconv.pack_1x1
        n, cin, h, wd = x_lens
        cout = w.shape[0]
        if w.shape[1] != cin or list(w.shape[2:]) != [1, 1]:
            raise ValueError(f"native mbhead: a 1x1 weight of {cin} input channels expected, "
                             f"got {list(w.shape)}")  # fmt: skip
        self.x_lens = list(x_lens)
        ncls = 0
        packed_c = bias_c = None
        if wc is not None:
            if wc.dim() != 2 or wc.shape[0] != cout:
                raise ValueError(f"native mbhead: a ({cout}, K) classifier weight expected, "
                                 f"got {list(wc.shape)}")  # fmt: skip
            ncls = wc.shape[1]
            # pack_1x1 takes (N, K): the classifier's (C, K) is K outputs of C inputs
            wct = wc.t().reshape(ncls, cout, 1, 1)
            packed_c = one(wct) if bf16 else native_mbconv.pack_1x1(wct, pad_k=True)
            bias_c = native_mbconv.pad_vector(bc, ncls)
        self.out_lens = [n, ncls] if wc is not None else [n, cout, 1, 1]
        self.tensors = [one(w), native_mbconv.pad_vector(b, cout),
                        packed_c, bias_c]  # fmt: skip
        self.args = a = _Args()
        a.wt, a.b, a.wc, a.bc = (None if t is None else t.data_ptr() for t in self.tensors)
        a.n, a.cin, a.h, a.w, a.cout, a.ncls = n, cin, h, wd, cout, ncls
        a.lo, a.hi = lo, hi
        a.yb = int(self.out_dtype == torch.bfloat16)
        self.ref = ctypes.byref(a)
        self.work: Tensor | None = None
        self.threads = 0
        self._set_threads(torch.get_num_threads())

    def _set_threads(self, threads: int) -> None:
        a = self.args
        a.pchunks = pixel_chunks(a.n, a.cout, a.h * a.w, threads)
        floats = self.lib.mbhead_work_floats(a.n, a.h, a.w, a.cout, a.pchunks, threads)
        self.work = torch.empty(floats + 16, dtype=torch.float32)
        a.work = self.work.data_ptr()
        a.threads = self.threads = threads

    def point_x(self, x: Tensor) -> Tensor:
        """Point the kernel to `x` (NCHW lens; channels-last, else a channels-last copy, which
        is returned to be held until the call)."""
        if x.dtype != self.dtype or list(x.shape) != self.x_lens:
            raise ValueError(f"native mbhead: the input must be a {_name(self.dtype)} "
                             f"{self.x_lens} tensor, got {list(x.shape)} {x.dtype}")  # fmt: skip
        if x.stride(1) != 1:
            x = x.contiguous(memory_format=torch.channels_last)
        a = self.args
        a.x = x.data_ptr()
        a.sxn, _, a.sxh, a.sxw = x.stride()
        return x

    def bind(self, y: Tensor) -> None:
        """Write `y` (the output's lens and `out_dtype`; the classifier's rows of stride 1)
        from now on."""
        if y.dtype != self.out_dtype or list(y.shape) != self.out_lens:
            raise ValueError(f"native mbhead: the output must be a {_name(self.out_dtype)} "
                             f"{self.out_lens} tensor, got {list(y.shape)} {y.dtype}")  # fmt: skip
        a = self.args
        if self.tensors[2] is not None and y.stride(1) != 1:
            raise ValueError("native mbhead: the classifier's output rows must be dense")
        a.y = y.data_ptr()
        a.syn, a.syc = y.stride(0), y.stride(1)

    def new_output(self) -> Tensor:
        return torch.empty(self.out_lens, dtype=self.out_dtype)

    def closure(self, env: list, xi: int, out: Tensor | None):
        """A step's closure: the head on env[xi] into `out` (bound once; the closure says so as
        `writes`) or a new tensor, which it returns. An input that is the same tensor object as
        the run before is not pointed to again (a weak reference: the closure does not keep the
        last run's input alive)."""
        if out is not None:
            self.bind(out)
        run_kernel, ref = self._run, self.ref
        threads = torch.get_num_threads
        seen: list = [None]

        def run() -> Tensor:
            x = env[xi]
            held = None
            last = seen[0]
            if last is None or last() is not x:
                held = self.point_x(x)
                seen[0] = weakref.ref(x) if held is x else None
            y = out
            if y is None:
                y = self.new_output()
                self.bind(y)
            if threads() != self.threads:
                self._set_threads(threads())
            if run_kernel(ref) != 0:
                raise RuntimeError("native kernel mbconv: not built for this processor")
            del held
            return y

        run.writes = out  # type: ignore[attr-defined]
        run.head = (self, env, xi)  # type: ignore[attr-defined]  (`native_mbchain`)
        return run

    def __call__(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        """The head on `x` (NCHW lens) into `y` (a new tensor for None)."""
        if y is None:
            y = self.new_output()
        self.bind(y)
        held = self.point_x(x)
        threads = torch.get_num_threads()
        if threads != self.threads:
            self._set_threads(threads)
        if self._run(self.ref) != 0:
            raise RuntimeError("native kernel mbconv: not built for this processor")
        del held
        return y


__all__ = ["BF16_ENV", "ENV", "MbHead", "available", "bf16_available", "enabled", "pixel_chunks"]
