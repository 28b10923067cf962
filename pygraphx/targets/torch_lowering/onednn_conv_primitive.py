"""One oneDNN convolution through its C API: the layer's descriptors and primitive
(`Descriptor`, `Primitive`), its post-ops (bias, add operand, activation, a fused depthwise
convolution), its weight packed once and its memory objects. `onednn_conv.py` makes them and
runs them as steps; the module docstring there says why and how the layouts, epilogues and
implementation choices work.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from contextlib import nullcontext
from ctypes import byref, c_int, c_void_p
from functools import partial
from typing import Protocol

import torch

from pygraphx.targets.torch_lowering.onednn_capi import (
    ARG_BIAS,
    ARG_DST,
    ARG_SCRATCHPAD,
    ARG_SRC,
    ARG_SRC_1,
    ARG_WEIGHTS,
    BINARY_ADD,
    CONVOLUTION_DIRECT,
    DATA_UNDEF,
    DTYPES,
    ELTWISE_CLIP,
    ELTWISE_RELU,
    ELTWISE_SWISH,
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
)

__all__ = ["DTYPES", "UNARY", "ConvPlan", "Descriptor", "Primitive", "geometry"]

Tensor = torch.Tensor
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


#: the activations a primitive fuses (torch's post-op names), and oneDNN's algorithm for each
UNARY = {"relu": ELTWISE_RELU, "hardtanh": ELTWISE_CLIP, "swish": ELTWISE_SWISH}


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
