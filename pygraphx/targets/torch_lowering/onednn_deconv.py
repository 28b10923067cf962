"""A bf16 2-D deconvolution as oneDNN's own deconvolution primitive (its C API), writing the
step's arena slot: `deconv_bf16.py`'s kernel where oneDNN's library is installed.

The same computation as torch's `mkldnn._convolution_transpose_pointwise` (oneDNN picks the
same `brg_conv` bf16 implementation; float32 accumulation, the bias in its own type, float32
or bf16, a ReLU / clip / SiLU post-op), made once at compile with the weight reordered once,
run with only the data pointers changing: no new result tensor a run, no copy into the slot,
and no pass through torch's dispatcher (whose code is cold after the C API convolutions,
`onednn_pool.py`).
Only an uncropped deconvolution (no IR padding) with a channels-last slot of its own that
shares no memory with its input runs here; `deconv_bf16` keeps torch's op otherwise.
A primitive is made for each thread count the step runs under (the first at compile); where
oneDNN offers only its reference kernel the torch op runs (`OneDnnError` at compile).
"""

from __future__ import annotations

from ctypes import POINTER, byref, c_int, c_void_p

import torch

from pygraphx.targets.torch_lowering.onednn_capi import (
    ARG_BIAS,
    ARG_WEIGHTS,
    DTYPES,
    FORWARD_INFERENCE,
    QUERY_WEIGHTS_MD,
    TAG_A,
    TAG_ANY,
    TAG_NHWC,
    Dims,
    OneDnnError,
    Runtime,
    check,
    release,
)
from pygraphx.targets.torch_lowering.onednn_step import (
    PerThreadCount,
    SourceToDest,
    scratchpad_attr,
)
from pygraphx.targets.torch_lowering.onednn_conv_primitive import UNARY

DECONVOLUTION_DIRECT = 0xA  # dnnl_deconvolution_direct
BF16 = DTYPES[torch.bfloat16]


def _declare(lib: object) -> None:
    fn = lib.dnnl_deconvolution_forward_primitive_desc_create
    fn.restype = c_int
    fn.argtypes = [POINTER(c_void_p), c_void_p, c_int, c_int, c_void_p, c_void_p, c_void_p,
                   c_void_p, Dims, Dims, Dims, Dims, c_void_p]  # fmt: skip
    fn = lib.dnnl_memory_desc_create_with_strides
    fn.restype = c_int
    fn.argtypes = [POINTER(c_void_p), c_int, Dims, c_int, Dims]


class Geometry:
    """What a deconvolution primitive is made of: NCHW lens of input and (uncropped) output,
    the ONNX-layout bf16 weight [Cin, Cout / g, kh, kw], bias, strides, dilations, groups and
    the unary post-op (torch's mkldnn attr name and scalars)."""

    def __init__(self, x_lens: list[int], out_lens: list[int], weight: torch.Tensor,
                 bias: torch.Tensor | None, stride: list[int], dilation: list[int], groups: int,
                 unary: str, scalars: list[float]) -> None:  # fmt: skip
        self.x_lens, self.out_lens, self.weight, self.bias = x_lens, out_lens, weight, bias
        self.stride, self.dilation, self.groups = stride, dilation, groups
        self.unary, self.scalars = unary, scalars


class Primitive(SourceToDest):
    """One deconvolution primitive on channels-last bf16 tensors, with its packed weight, bias,
    scratchpad and memory objects (the oneDNN objects are destroyed with it)."""

    what = "deconvolution"

    def __init__(self, rt: Runtime, g: Geometry) -> None:
        self.start(rt)
        lib, mds = rt.lib, []
        try:
            _declare(lib)
        except AttributeError as exc:  # an older library without the symbol: torch's op runs
            raise OneDnnError(f"oneDNN deconvolution unavailable: {exc}") from exc
        cin, cout_g, kh, kw = g.weight.shape
        grp = g.groups
        cin_g = cin // grp
        if grp == 1:
            w_dims = [cout_g, cin, kh, kw]
            w_strides = [kh * kw, cout_g * kh * kw, kw, 1]
        else:  # [G, O/g, I/g, kh, kw] over the ONNX layout [G * I/g, O/g, kh, kw]
            w_dims = [grp, cout_g, cin_g, kh, kw]
            w_strides = [cin_g * cout_g * kh * kw, kh * kw, cout_g * kh * kw, kw, 1]
        post_ops = c_void_p()
        try:
            src = rt.desc(list(g.x_lens), BF16, TAG_NHWC)
            dst = rt.desc(list(g.out_lens), BF16, TAG_NHWC)
            w_any = rt.desc(w_dims, BF16, TAG_ANY)
            mds += [src, dst, w_any]
            w_plain = c_void_p()
            check(lib.dnnl_memory_desc_create_with_strides(
                byref(w_plain), len(w_dims), Dims(*w_dims), BF16, Dims(*w_strides)), "weight md")
            mds.append(w_plain)
            bias_md = None
            if g.bias is not None:
                bias_md = rt.desc([g.out_lens[1]], DTYPES[g.bias.dtype], TAG_A)  # f32 or bf16
                mds.append(bias_md)
            with scratchpad_attr(lib) as attr:
                check(lib.dnnl_post_ops_create(byref(post_ops)), "post_ops_create")
                if g.unary != "none":
                    alpha, beta = (g.scalars + [0.0, 0.0])[:2] if g.unary == "hardtanh" else (
                        (1.0, 0.0) if g.unary == "swish" else (0.0, 0.0))
                    check(lib.dnnl_post_ops_append_eltwise(post_ops, UNARY[g.unary], alpha, beta),
                          g.unary)  # fmt: skip
                check(lib.dnnl_primitive_attr_set_post_ops(attr, post_ops), "set_post_ops")
                check(
                    lib.dnnl_deconvolution_forward_primitive_desc_create(
                        byref(self.pd), rt.engine, FORWARD_INFERENCE, DECONVOLUTION_DIRECT, src,
                        w_any, bias_md, dst, Dims(*g.stride), Dims(*[d - 1 for d in g.dilation]),
                        Dims(0, 0), Dims(0, 0), attr,
                    ),
                    f"deconvolution {g.x_lens} * {list(g.weight.shape)}",
                )  # fmt: skip
            self.refuse_reference(f"deconvolution {g.x_lens}")  # before the weight reorder
            w_md = lib.dnnl_primitive_desc_query_md(self.pd, QUERY_WEIGHTS_MD, 0)
            self.weight = rt.reorder(g.weight.contiguous(), w_plain, w_md)
            self.bias = None if g.bias is None else g.bias.contiguous()
            constants = [(ARG_WEIGHTS, w_md, self.weight.data_ptr())]
            if self.bias is not None:
                constants.append((ARG_BIAS, bias_md, self.bias.data_ptr()))
            self.bind(f"deconvolution {g.x_lens}", src, dst, constants)
        finally:
            if post_ops.value:
                lib.dnnl_post_ops_destroy(post_ops)
            release(lib, [], None, None, mds)


class Deconv(PerThreadCount):
    """`g` run on channels-last bf16 tensors through a primitive per thread count (the one of
    now made at once: `OneDnnError` when oneDNN cannot run it well)."""

    def __init__(self, rt: Runtime, g: Geometry) -> None:
        self.rt, self.g = rt, g
        super().__init__(lambda: Primitive(rt, g))


__all__ = ["Deconv", "Geometry", "Primitive"]
