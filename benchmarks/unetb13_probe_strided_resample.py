"""Can oneDNN's bf16 linear resampling write a channel window of a wider channels-last tensor
(a concat's output) with a jit kernel? (helper unetb13) Prints the implementation oneDNN picks
for UNet-small's two decoder resizes with such a strided destination; here: `ref:any` only.

    PYTHONPATH=. python benchmarks/unetb13_probe_strided_resample.py
"""
from ctypes import byref, c_void_p, c_float, c_int, POINTER
import torch
from pygraphx.targets.torch_lowering import onednn_resample as rs
from pygraphx.targets.torch_lowering.onednn_capi import Dims, check
rt = rs.runtime()
lib = rt.lib
rs._declare(lib)
from pygraphx.targets.torch_lowering.onednn_resample import DTYPES, TAG_NHWC, FORWARD_INFERENCE, RESAMPLING_LINEAR
dt = DTYPES[torch.bfloat16]
for C, h in ((64, 64), (32, 128)):
    H = 2 * h
    src = rt.desc([1, C, h, h], dt, TAG_NHWC)
    dst = c_void_p()
    # window of channels [C, 2C) of a (1, 2C, H, H) channels-last tensor
    strides = [2 * C * H * H, 1, H * 2 * C, 2 * C]
    lib.dnnl_memory_desc_create_with_strides.argtypes = [POINTER(c_void_p), c_int, Dims, c_int, Dims]
    check(lib.dnnl_memory_desc_create_with_strides(byref(dst), 4, Dims(1, C, H, H), dt, Dims(*strides)), "strided")
    pd = c_void_p()
    st = lib.dnnl_resampling_forward_primitive_desc_create(byref(pd), rt.engine, FORWARD_INFERENCE, RESAMPLING_LINEAR, (c_float * 2)(2.0, 2.0), src, dst, None)
    print(C, h, "status", st, rt.impl_name(pd) if st == 0 else None)
