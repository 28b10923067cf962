"""A 2-D float32 or bf16 convolution as a oneDNN primitive made once, run with only pointers
changing.

`torch.ops.mkldnn._convolution_pointwise` (the `onednn` kernel of `conv_kernels.py`) looks its
primitive up again on every call through ideep: 25-55 us per call on the 2-core EPYC, about a
quarter of MobileNetV2's time at batch 1. Here the primitive descriptor, the primitive, its
memory objects and its scratchpad are made once, at prepare, through oneDNN's C API
(`onednn_capi.py`); a call sets the input's and output's data pointers and executes. A layer
writing its arena slot gets a leaner closure (`_run_into`): pointers set only when a tensor
changes, the execution's arguments bound once (a step's Python runs cold in a network).

The layouts are those of the other kernels: activations channels-last (oneDNN's `nhwc`), a new
channels-last output per call, the weight reordered once into the layout oneDNN chose for the
layer. Asymmetric padding is oneDNN's own (`padding_l` / `padding_r`), so the input is not
padded first. The epilogue is post-ops in the order the graph computes it: the add operand
(a binary `add`, or a `sum` into the operand's own memory when `ConvPlan.in_place`), then
the activation (`relu`, `hardtanh` = clip(lo, hi), or `swish`); or, `ConvPlan.add_after`
(YOLO's C2f shortcut, silu(conv + bias) + x), the activation first and the add after it.
A network's NCHW input is converted by a oneDNN reorder made once (5x faster than torch's
`contiguous` on a 3-channel image). `benchmarks/onednn_conv_probe.py` measures the kernel
against the `onednn` one.

oneDNN offers several implementations of a layer and takes the first that applies
(`implementations` lists them). A plan naming another one (`ConvPlan.impl`, the measured
choice of `conv_choice.py`) gets that one: its descriptor is moved there with
`dnnl_primitive_desc_next_impl` and its primitive made with oneDNN's primitive cache off (in
oneDNN 3.2 a cached primitive of the same layer, at the first implementation, comes back
otherwise); a name oneDNN does not offer (a choice cached by another library version) runs the
first, said once.

A bf16 layer (the weight is bf16: `quantize_bf16`) runs in bf16 end to end: source, weight and
destination bf16, the bias in its own type (bf16 or float32), the add operand of the
destination's type; oneDNN accumulates in float32 and applies the post-ops before rounding to
bf16 once. It takes oneDNN's native kernels (`brgconv_1x1` / `brdgmm_dw` / `jit_bf16` on
`avx512_core_bf16`, or AMX) with the weight packed once in bf16, and only on a CPU with bf16
instructions (`supports`): elsewhere oneDNN would run a slow reference kernel.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from contextlib import nullcontext
from ctypes import byref, c_int, c_void_p
from functools import partial
from operator import itemgetter
from typing import Protocol

import torch

from pygraphx.targets.torch_lowering.gemm_kernels import cpu_has_bf16
from pygraphx.targets.torch_lowering.onednn_capi import (
    ARG_BIAS,
    ARG_DST,
    ARG_SCRATCHPAD,
    ARG_SRC,
    ARG_SRC_1,
    ARG_WEIGHTS,
    BF16,
    BINARY_ADD,
    CONVOLUTION_DIRECT,
    DATA_UNDEF,
    ELTWISE_CLIP,
    ELTWISE_RELU,
    ELTWISE_SWISH,
    F32,
    FORWARD_INFERENCE,
    POST_OP_DW,
    QUERY_EXEC_ARG_MD,
    QUERY_SCRATCHPAD_MD,
    QUERY_WEIGHTS_MD,
    SCRATCHPAD_USER,
    TAG_A,
    TAG_ANY,
    TAG_GOIHW,
    TAG_NCHW,
    TAG_NHWC,
    TAG_OIHW,
    Dims,
    ExecArg,
    OneDnnError,
    Reorder,
    Runtime,
    check,
    post_op_arg,
    primitive_cache_off,
    release,
    runtime,
    unavailable_reason,
)

Tensor = torch.Tensor
Getter = Callable[[], Tensor]
log = logging.getLogger("pygraphx.cpu")
_SAID: set[str] = set()  # warnings given once per process


class ConvPlan(Protocol):
    """What a primitive reads of `conv_kernels.ConvPlan` (which imports this module)."""

    weight: Tensor
    x_lens: list[int]
    padding: list[int]
    stride: list[int]
    dilation: list[int]
    groups: int
    pre_pad: list[int] | None
    bias: Tensor | None
    unary: str
    scalars: list[float]
    in_place: bool
    add_after: bool
    impl: str | None
    accumulate: bool
    dw: ConvPlan | None


def geometry(plan: ConvPlan) -> tuple[list[int], list[int], list[int], list[int]]:
    """(input lens before any pre-padding, padding_l, padding_r, output lens) of `plan`."""
    lens = list(plan.x_lens)
    pad_l, pad_r = list(plan.padding), list(plan.padding)
    if plan.pre_pad is not None:  # F.pad order: w_begin, w_end, h_begin, h_end
        wb, we, hb, he = plan.pre_pad
        pad_l, pad_r = [pad_l[0] + hb, pad_l[1] + wb], [pad_r[0] + he, pad_r[1] + we]
        lens = [lens[0], lens[1], lens[2] - hb - he, lens[3] - wb - we]
    k, _, kh, kw = plan.weight.shape
    out = [lens[0], k]
    for i, ks in enumerate((kh, kw)):
        span = (ks - 1) * plan.dilation[i] + 1
        out.append((lens[2 + i] + pad_l[i] + pad_r[i] - span) // plan.stride[i] + 1)
    return lens, pad_l, pad_r, out


class Descriptor:
    """A layer's memory descriptors and its primitive descriptor, at oneDNN's first
    implementation or, `impl`, at the one of that name (the oneDNN objects are destroyed with
    it). Make it with the primitive cache off when `impl` is given (`primitive_cache_off`)."""

    def __init__(self, rt: Runtime, plan: ConvPlan, other: bool, impl: str | None) -> None:
        self.rt = rt
        self.dtype = plan.weight.dtype  # float32, or bfloat16 for src, weights and dst
        self._mds: list[c_void_p] = []
        self._mems: list[c_void_p] = []
        self.pd = self.prim = None
        self.x_lens, self._pad_l, self._pad_r, self.out_lens = geometry(plan)
        self.src_md = self._md(self.x_lens, TAG_NHWC)
        self.dst_md = self._md(self.out_lens, TAG_NHWC)  # the convolution's own result
        self.out_md = self.dst_md  # the primitive's output (the fused depthwise one's, `dw`)
        if plan.dw is not None:
            self.out_lens = geometry(plan.dw)[3]
            self.out_md = self._md(self.out_lens, TAG_NHWC)
        self.w_dims, self.w_tag = _weight_dims(plan)
        self.bias_md = None
        if plan.bias is not None:  # bf16 layers take their bias in float32 or bf16
            self.bias_md = self._md([self.out_lens[1]], TAG_A, plan.bias.dtype)
        self.pd = self._descriptor(plan, other)
        if impl is not None:
            self._advance_to(impl, plan, other)

    def _descriptor(self, plan: ConvPlan, other: bool) -> c_void_p:
        """A new primitive descriptor of the layer at oneDNN's first implementation."""
        lib, rt = self.rt.lib, self.rt
        attr, post_ops = self._attributes(plan, other, self.dst_md)
        pd = c_void_p()
        dil = [d - 1 for d in plan.dilation]  # oneDNN counts the gaps
        try:
            check(
                lib.dnnl_convolution_forward_primitive_desc_create(
                    byref(pd),
                    rt.engine,
                    FORWARD_INFERENCE,
                    CONVOLUTION_DIRECT,
                    self.src_md,
                    self._md(self.w_dims, TAG_ANY),
                    self.bias_md,
                    self.dst_md,
                    Dims(*plan.stride),
                    Dims(*dil),
                    Dims(*self._pad_l),
                    Dims(*self._pad_r),
                    attr,
                ),  # fmt: skip
                f"convolution {self.x_lens} * {list(plan.weight.shape)}",
            )
        finally:
            lib.dnnl_primitive_attr_destroy(attr)
            lib.dnnl_post_ops_destroy(post_ops)
        return pd

    def impls(self) -> list[str]:
        """The names of the implementations oneDNN offers from here on, in its order (the
        descriptor is left at the last one)."""
        names = [self.rt.impl_name(self.pd)]
        while self.rt.next_impl(self.pd):
            names.append(self.rt.impl_name(self.pd))
        return names

    def _advance_to(self, impl: str, plan: ConvPlan, other: bool) -> None:
        """`self.pd` moved to the implementation named `impl`; where oneDNN offers none of
        that name (a choice cached by another library version), a new descriptor at its first
        implementation, said once."""
        rt = self.rt
        while rt.impl_name(self.pd) != impl:
            if not rt.next_impl(self.pd):
                rt.lib.dnnl_primitive_desc_destroy(self.pd)
                self.pd = self._descriptor(plan, other)
                if "impl" not in _SAID:
                    _SAID.add("impl")
                    log.warning(
                        "oneDNN offers no %r for the convolution %s * %s: %s runs",
                        impl, self.x_lens, list(plan.weight.shape), rt.impl_name(self.pd),
                    )  # fmt: skip
                return

    def _md(self, dims: list[int], tag: int, dtype: torch.dtype | None = None) -> c_void_p:
        md = self.rt.desc(dims, DTYPES[dtype or self.dtype], tag)
        self._mds.append(md)
        return md

    def _memory(self, md: c_void_p, data: int | None) -> c_void_p:
        mem = self.rt.memory(md, data)
        self._mems.append(mem)
        return mem

    def __del__(self) -> None:
        release(self.rt.lib, self._mems, self.prim, self.pd, self._mds)

    def _attributes(
        self, plan: ConvPlan, other: bool, dst_md: c_void_p
    ) -> tuple[c_void_p, c_void_p]:
        lib = self.rt.lib
        attr, post_ops = c_void_p(), c_void_p()
        check(lib.dnnl_primitive_attr_create(byref(attr)), "primitive_attr_create")
        check(lib.dnnl_primitive_attr_set_scratchpad_mode(attr, SCRATCHPAD_USER), "scratchpad")
        check(lib.dnnl_post_ops_create(byref(post_ops)), "post_ops_create")
        chain = ["add", "unary"] if not plan.add_after else ["unary", "add"]
        if plan.accumulate:  # dst = conv + dst: oneDNN's sum post-op, before everything else
            check(lib.dnnl_post_ops_append_sum(post_ops, 1.0, 0, 0), "post-op sum")
        for post_op in chain:
            if post_op == "add" and other and plan.in_place:
                check(lib.dnnl_post_ops_append_sum(post_ops, 1.0, 0, 0), "post-op sum")
            elif post_op == "add" and other:
                check(lib.dnnl_post_ops_append_binary(post_ops, BINARY_ADD, dst_md), "add")
            elif post_op == "unary" and plan.unary != "none":
                alg, alpha, beta = _eltwise(plan)
                check(lib.dnnl_post_ops_append_eltwise(post_ops, alg, alpha, beta), plan.unary)
        if plan.dw is not None:
            _append_dw(lib, post_ops, plan.dw)
        check(lib.dnnl_primitive_attr_set_post_ops(attr, post_ops), "set_post_ops")
        return attr, post_ops


class Primitive(Descriptor):
    """One convolution's primitive, its weight, bias and scratchpad, and its memory objects
    (the oneDNN objects are destroyed with it), on oneDNN's first implementation or the one
    named `plan.impl`. `share`: a primitive of the same layer made for another thread count,
    whose packed weight is taken when its layout is the same."""

    def __init__(
        self, rt: Runtime, plan: ConvPlan, other: bool, share: Primitive | None = None
    ) -> None:
        lib = rt.lib
        with primitive_cache_off(lib) if plan.impl is not None else nullcontext():
            super().__init__(rt, plan, other, plan.impl)
            self.prim = rt.primitive(self.pd)  # (a cached one may be another implementation)
        self.to_nhwc = None
        self.impl = rt.impl_name(self.pd)
        self.w_md = w_md = lib.dnnl_primitive_desc_query_md(self.pd, QUERY_WEIGHTS_MD, 0)
        if share is not None and lib.dnnl_memory_desc_equal(w_md, share.w_md):
            self.weight = share.weight  # another thread count, the same packed layout
        else:
            plain = plan.weight.contiguous()
            self.weight = rt.reorder(plain, self._md(self.w_dims, self.w_tag), w_md)
        self.bias = None if plan.bias is None else plan.bias.contiguous()
        scratch_md = lib.dnnl_primitive_desc_query_md(self.pd, QUERY_SCRATCHPAD_MD, 0)
        size = lib.dnnl_memory_desc_get_size(scratch_md)
        self.scratch = torch.empty(max(size, 1), dtype=torch.uint8)
        self.src, self.dst = self._memory(self.src_md, None), self._memory(self.out_md, None)
        args = [(ARG_SRC, self.src), (ARG_DST, self.dst)]
        args.append((ARG_WEIGHTS, self._memory(w_md, self.weight.data_ptr())))
        if self.bias is not None:
            args.append((ARG_BIAS, self._memory(self.bias_md, self.bias.data_ptr())))
        self.dw_weight = self.dw_bias = None
        if plan.dw is not None:
            args += self._dw_args(plan.dw, share)
        args.append((ARG_SCRATCHPAD, self._memory(scratch_md, self.scratch.data_ptr())))
        self.other = None
        if other and not plan.in_place:
            self.other = self._memory(self.dst_md, None)
            position = 1 if plan.add_after and plan.unary != "none" else 0  # in the chain
            position += 1 if plan.accumulate else 0  # after the sum
            args.append((post_op_arg(position, ARG_SRC_1), self.other))
        self.addresses = [0, 0, 0]  # of src, dst, the add operand (see `point`)
        self._execute = lib.dnnl_primitive_execute
        self.nargs = len(args)
        self.args = (ExecArg * len(args))(*(ExecArg(a, m) for a, m in args))
        # the execution with its arguments bound (a dnnl_status_t), and weak references to
        # the last source and add operand whose addresses are set (`_run_into`)
        self.call = partial(_bare_execute(lib), self.prim, rt.stream, self.nargs, self.args)
        self.seen: weakref.ref[Tensor] | None = None
        self.seen_other: weakref.ref[Tensor] | None = None

    def _dw_args(self, dw: ConvPlan, share: Primitive | None) -> list[tuple[int, c_void_p]]:
        """The fused depthwise convolution's weight (packed once, or `share`'s) and bias
        arguments; checks that the primitive's output is the channels-last one expected."""
        lib, pd = self.rt.lib, self.pd
        dst = lib.dnnl_primitive_desc_query_md(pd, QUERY_EXEC_ARG_MD, ARG_DST)
        if not lib.dnnl_memory_desc_equal(dst, self.out_md):
            raise OneDnnError(f"convolution {self.x_lens} with a fused depthwise one: its "
                              f"output is not the channels-last {self.out_lens}")  # fmt: skip
        w_md = lib.dnnl_primitive_desc_query_md(pd, QUERY_EXEC_ARG_MD, POST_OP_DW | ARG_WEIGHTS)
        if share is not None and lib.dnnl_memory_desc_equal(w_md, share.dw_w_md):
            self.dw_weight = share.dw_weight
        else:
            dims, tag = _weight_dims(dw)
            self.dw_weight = self.rt.reorder(dw.weight.contiguous(), self._md(dims, tag), w_md)
        self.dw_w_md = w_md
        args = [(POST_OP_DW | ARG_WEIGHTS, self._memory(w_md, self.dw_weight.data_ptr()))]
        if dw.bias is not None:
            self.dw_bias = dw.bias.contiguous()
            b_md = lib.dnnl_primitive_desc_query_md(pd, QUERY_EXEC_ARG_MD, POST_OP_DW | ARG_BIAS)
            args.append((POST_OP_DW | ARG_BIAS, self._memory(b_md, self.dw_bias.data_ptr())))
        return args

    def channels_last(self, x: Tensor) -> Tensor:
        """The NCHW-contiguous input `x` as a new channels-last tensor, by oneDNN's reorder
        (made at the first call): 29 us for a 1x3x224x224 image where torch takes 167 us."""
        if self.to_nhwc is None:
            self.to_nhwc = Reorder(self.rt, self._md(self.x_lens, TAG_NCHW), self.src_md)
        y = torch.empty(self.x_lens, dtype=self.dtype, memory_format=torch.channels_last)
        self.to_nhwc.run(x.data_ptr(), y.data_ptr())
        return y

    def execute(self, x: Tensor, y: Tensor) -> None:
        """Run on source `x` into destination `y` (the add operand as last pointed)."""
        self.point(self.src, 0, x.data_ptr())
        self.point(self.dst, 1, y.data_ptr())
        check(self._execute(self.prim, self.rt.stream, self.nargs, self.args), "convolution")

    def point(self, mem: c_void_p, slot: int, address: int) -> None:
        """Set memory object `mem`'s buffer to `address` unless it is there already (a run's
        tensors often land where the last run's did; 0.4 us a call saved each time)."""
        if self.addresses[slot] != address:
            self.rt.lib.dnnl_memory_set_data_handle(mem, address)
            self.addresses[slot] = address


_BARE: dict[int, object] = {}


def _bare_execute(lib: object) -> Callable[..., int]:
    """`dnnl_primitive_execute` without ctypes' argument conversion (its arguments are ctypes
    objects already, and a count): 1.1 us a call against 1.8 with the declared argument
    types (a tiny layer, warm, 2-core EPYC). One per library, made once."""
    fn = _BARE.get(id(lib))
    if fn is None:
        fn = _BARE[id(lib)] = lib["dnnl_primitive_execute"]  # (a new function object)
        fn.restype = c_int
    return fn  # type: ignore[return-value]


#: the tensor types a primitive runs in (src, weights and dst alike), and oneDNN's names
DTYPES = {torch.float32: F32, torch.bfloat16: BF16}

#: the activations a primitive fuses (torch's post-op names), and oneDNN's algorithm for each
UNARY = {"relu": ELTWISE_RELU, "hardtanh": ELTWISE_CLIP, "swish": ELTWISE_SWISH}


def supports(plan: ConvPlan) -> bool:
    """Whether a primitive here can run `plan` with its whole epilogue: float32, or bf16 on a
    CPU with bf16 instructions."""
    dtype_ok = plan.weight.dtype == torch.float32 or (
        plan.weight.dtype == torch.bfloat16 and cpu_has_bf16()
    )
    dw = plan.dw
    dw_ok = dw is None or (
        dw.weight.dtype == plan.weight.dtype and (dw.unary == "none" or dw.unary in UNARY)
    )
    return dtype_ok and dw_ok and (plan.unary == "none" or plan.unary in UNARY)


def _append_dw(lib: object, post_ops: c_void_p, dw: ConvPlan) -> None:
    """oneDNN's depthwise post-op for `dw` (a 3x3 kernel, one stride and one padding for both
    axes, as `conv_dw_fusion` checks), then its activation."""
    dtype = DTYPES[dw.weight.dtype]
    bias = DATA_UNDEF if dw.bias is None else DTYPES[dw.bias.dtype]
    kernel, stride, pad = dw.weight.shape[2], dw.stride[0], dw.padding[0]
    check(lib.dnnl_post_ops_append_dw(post_ops, dtype, bias, dtype, kernel, stride, pad), "dw")
    if dw.unary != "none":
        alg, alpha, beta = _eltwise(dw)
        check(lib.dnnl_post_ops_append_eltwise(post_ops, alg, alpha, beta), dw.unary)


def _eltwise(plan: ConvPlan) -> tuple[int, float, float]:
    """(algorithm, alpha, beta) of the activation post-op."""
    if plan.unary not in UNARY:
        raise OneDnnError(f"activation {plan.unary!r} is not a oneDNN post-op here")
    if plan.unary == "hardtanh":
        lo, hi = plan.scalars
        return ELTWISE_CLIP, lo, hi
    return UNARY[plan.unary], 1.0 if plan.unary == "swish" else 0.0, 0.0  # swish: x*sigmoid(1*x)


def _weight_dims(plan: ConvPlan) -> tuple[list[int], int]:
    k, c, kh, kw = plan.weight.shape
    if plan.groups == 1:
        return [k, c, kh, kw], TAG_OIHW
    g = plan.groups
    return [g, k // g, c, kh, kw], TAG_GOIHW


def implementations(plan: ConvPlan, other: bool) -> list[str]:
    """The names of the implementations oneDNN offers for `plan` (with its epilogue; `other`:
    an add operand), in its order of preference, reference kernels left out."""
    rt = runtime()
    if rt is None:
        raise OneDnnError(f"oneDNN's C API library is not available: {unavailable_reason()}")
    with primitive_cache_off(rt.lib):
        names = Descriptor(rt, plan, other, None).impls()
    return [n for n in dict.fromkeys(names) if not n.startswith("ref")]


def first_implementation(plan: ConvPlan) -> str:
    """The implementation oneDNN takes for `plan` (no add operand) at this thread count: for
    a fused 1x1 + depthwise pair `jit_1x1:...` runs them as one kernel, `ref_fused_convolution`
    as two primitives one after the other (`conv_dw_fusion` fuses only the first)."""
    rt = _runtime_for([plan])
    desc = Descriptor(rt, plan, False, None)  # (its descriptor lives while it does)
    return rt.impl_name(desc.pd)


def available() -> bool:
    """Whether oneDNN's C API library is loaded (see `onednn_capi.library`)."""
    return runtime() is not None


def build(
    plan: ConvPlan, get_x: Getter, get_other: Getter | None, out: Tensor | None = None
) -> Callable[[], Tensor]:
    """A closure running `plan` on `get_x()` (and the add operand `get_other()`) through a
    primitive made now; it returns a new channels-last tensor (or, `plan.in_place`, the add
    operand with the result written over it; or `out`, a channels-last tensor of the result's
    lens and type, such as its arena slot, written every call: no allocation, no copy).

    oneDNN fixes a primitive's thread count when it is made (its kernels split the work for
    that many threads and start a team that size), so a primitive is made for each thread
    count the closure is called under (`torch.get_num_threads()`): the one of now, at
    prepare, and others at their first call (a step the cpu target runs on fewer threads)."""
    rt = _runtime_for([plan])
    other = get_other is not None
    made: dict[int, Primitive] = {}
    threads = torch.get_num_threads

    def primitive() -> Primitive:
        n = threads()
        prim = made.get(n)
        if prim is None:
            share = next(iter(made.values()), None)
            prim = made[n] = Primitive(rt, plan, other, share)
            if out is not None and not plan.in_place:  # the output's address never changes
                prim.point(prim.dst, 1, out.data_ptr())
        return prim

    _say_if_reference(plan, primitive().impl)
    cl, out_lens, dtype = torch.channels_last, made[threads()].out_lens, plan.weight.dtype
    if out is not None and not _fits(out, out_lens, dtype):
        raise OneDnnError(f"output buffer {list(out.shape)} {out.dtype}: expected a "
                          f"channels-last {out_lens} {dtype}")  # fmt: skip

    def source(p: Primitive, x: Tensor) -> Tensor:
        if x.is_contiguous(memory_format=cl):
            return x
        if x.is_contiguous() and list(x.shape) == p.x_lens:
            return p.channels_last(x)  # a network's NCHW input
        return x.contiguous(memory_format=cl)

    if out is not None and not plan.in_place and LEAN_CLOSURE:
        return _run_into(made, primitive, (get_x, get_other), source, out)
    n_, c_, h_, w_ = out_lens
    strides = (c_ * h_ * w_, 1, w_ * c_, c_)  # channels-last: `empty_strided` is 0.6 us faster
    empty = torch.empty_strided

    def run() -> Tensor:
        p = primitive()
        x = source(p, get_x())
        if plan.in_place and other:  # oneDNN's sum: the result lands in the add operand
            y = _channels_last(get_other())
        else:
            y = out if out is not None else empty(out_lens, strides, dtype=dtype)
            if other:  # (`o` holds a converted operand until the primitive has read it)
                o = _channels_last(get_other())
                p.point(p.other, 2, o.data_ptr())
        p.execute(x, y)
        return y

    run.primitives = made  # type: ignore[attr-defined]  # thread count -> primitive (tests)
    return run


#: `build` gives a layer with no add operand that writes its arena slot the lean closure of
#: `_run_into` (False: the general one; for A/B, `benchmarks/mnv2b1_ab.py`)
LEAN_CLOSURE = True


def _run_into(
    made: dict[int, Primitive],
    primitive: Callable[[], Primitive],
    getters: tuple[Getter, Getter | None],
    source: Callable[[Primitive, Tensor], Tensor],
    out: Tensor,
) -> Callable[[], Tensor]:
    """`build`'s closure for a layer writing `out` (its arena slot): the output's address is
    set once per primitive, and the source's layout and address (and the add operand's) are
    checked and set only when the getter returns another tensor than at the last call (an
    arena slot is the same tensor every run). In a network each step's Python runs cold (the
    layer's data went through the caches since the last run): MobileNetV2 at batch 1, one
    thread, 13 -> 10 us of thread CPU a convolution step besides oneDNN's own call (with the
    measuring); `benchmarks/results/mnv2b1.md`."""
    threads, ref = torch.get_num_threads, weakref.ref
    get_x, get_other = getters
    # a getter that says which list slot it reads (`conv_fusion.env_getter`) is read in C
    env, index = getattr(get_x, "slot", (None, None))
    fetch = (lambda _: get_x()) if env is None else itemgetter(index)

    def run() -> Tensor:
        p = made.get(threads()) or primitive()
        x = fetch(env)
        seen = p.seen
        if seen is None or seen() is not x:
            x = source(p, x)  # (held until the primitive has read it)
            p.point(p.src, 0, x.data_ptr())
            p.seen = ref(x)
        if get_other is not None:
            o = get_other()
            seen = p.seen_other
            if seen is None or seen() is not o:
                o = _channels_last(o)
                p.point(p.other, 2, o.data_ptr())
                p.seen_other = ref(o)
        status = p.call()
        if status:
            check(status, "convolution")
        return out

    run.primitives = made  # type: ignore[attr-defined]  # thread count -> primitive (tests)
    run.writes = out  # type: ignore[attr-defined]  # (`conv_fusion._into`: nothing to copy)
    return run


def build_sum(
    plans: list[ConvPlan],
    get_xs: list[Getter],
    get_other: Getter | None,
    out: Tensor | None,
    before: Callable[[Tensor], None] | None = None,
) -> Callable[[], Tensor]:
    """A closure running the convolutions `plans` on `get_xs()` into one output and summing
    them there: the parts of a concat along the channels into a 1x1 convolution, each with its
    slice of the weight's input channels, the concat never written (`conv_concat.py`). The
    first plan writes the output (with the bias), each later one adds into it (`accumulate`:
    oneDNN's sum post-op) and the last applies the epilogue (its add operand `get_other()`).
    The output is `out` (a channels-last tensor of the result's lens, written every call)
    or a new channels-last tensor; each primitive is made per thread count, as in `build`.
    `before(y)`, when given, writes the output first (the first plan then accumulates too)."""
    rt = _runtime_for(plans)
    if any(p.in_place for p in plans) or any(not p.accumulate for p in plans[1:]):
        raise OneDnnError("a sum chain's later convolutions accumulate, none in place")
    last = len(plans) - 1
    made: dict[int, list[Primitive]] = {}
    threads = torch.get_num_threads

    def primitives() -> list[Primitive]:
        n = threads()
        prims = made.get(n)
        if prims is None:
            share = next(iter(made.values()), [None] * len(plans))
            prims = made[n] = [
                Primitive(rt, p, get_other is not None and k == last, s)
                for k, (p, s) in enumerate(zip(plans, share, strict=True))
            ]
        return prims

    for plan, prim in zip(plans, primitives(), strict=True):
        _say_if_reference(plan, prim.impl)
    out_lens, dtype = made[threads()][0].out_lens, plans[0].weight.dtype
    if any(p.out_lens != out_lens for p in made[threads()]):
        raise OneDnnError(f"a sum chain's convolutions give different output lens: {out_lens}")
    if out is not None and not _fits(out, out_lens, dtype):
        raise OneDnnError(f"output buffer {list(out.shape)} {out.dtype}: expected a "
                          f"channels-last {out_lens} {dtype}")  # fmt: skip
    n_, c_, h_, w_ = out_lens
    strides = (c_ * h_ * w_, 1, w_ * c_, c_)
    empty = torch.empty_strided

    def run() -> Tensor:
        ps = primitives()
        y = out if out is not None else empty(out_lens, strides, dtype=dtype)
        if before is not None:
            before(y)
        xs = [_channels_last(get()) for get in get_xs]  # (held until every part is read)
        if get_other is not None:
            o = _channels_last(get_other())
            ps[last].point(ps[last].other, 2, o.data_ptr())
        for p, x in zip(ps, xs, strict=True):
            p.execute(x, y)
        return y

    run.primitives = made  # type: ignore[attr-defined]  # thread count -> primitives (tests)
    return run


def _runtime_for(plans: list[ConvPlan]) -> Runtime:
    """oneDNN's runtime, checked to run every plan of `plans` (`OneDnnError` otherwise)."""
    rt = runtime()
    if rt is None:
        raise OneDnnError(f"oneDNN's C API library is not available: {unavailable_reason()}")
    for plan in plans:
        if not supports(plan):
            raise OneDnnError(f"no oneDNN primitive here for a {plan.unary!r} epilogue")
    return rt


def _channels_last(t: Tensor) -> Tensor:
    """`t`, or a dense channels-last copy of it."""
    cl = torch.channels_last
    return t if t.is_contiguous(memory_format=cl) else t.contiguous(memory_format=cl)


def _say_if_reference(plan: ConvPlan, impl: str) -> None:
    """Warn (once per process) when oneDNN runs a layer on its slow reference kernel (no JIT
    kernel for it on this processor; float32 layers never have)."""
    if plan.dw is not None and impl.startswith("ref_fused"):
        if "ref_fused" not in _SAID:  # (as fast as the two steps: the same numbers)
            _SAID.add("ref_fused")
            log.warning(
                "oneDNN runs the fused 1x1 + depthwise convolutions %s * %s at %d threads as "
                "two primitives (%s), not one kernel", plan.x_lens, list(plan.weight.shape),
                torch.get_num_threads(), impl,
            )  # fmt: skip
        return
    if impl.startswith("ref") and "ref" not in _SAID:
        _SAID.add("ref")
        log.warning(
            "oneDNN runs a %s convolution %s * %s on its reference kernel (slow: no JIT kernel "
            "for it on this processor)", plan.weight.dtype, plan.x_lens, list(plan.weight.shape)
        )  # fmt: skip


def _fits(t: Tensor, lens: list[int], dtype: torch.dtype) -> bool:
    """`t` is a dense channels-last tensor of `lens` and `dtype`."""
    return (
        list(t.shape) == lens
        and t.dtype == dtype
        and t.is_contiguous(memory_format=torch.channels_last)
    )


__all__ = [
    "UNARY",
    "Descriptor",
    "Primitive",
    "available",
    "build",
    "build_sum",
    "first_implementation",
    "geometry",
    "implementations",
    "supports",
]
