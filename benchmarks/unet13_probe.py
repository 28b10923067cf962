"""UNet-small's upsampling at bf16, 2 threads: candidate kernels for the two ConvTranspose
(2x2 stride 2) and the two bilinear x2 half_pixel resizes, channels-last bf16 in and out.

    PYTHONPATH=. python benchmarks/unet13_probe.py [--threads 2]

Deconvolution: ours before (float32 compute: input and weight converted each call), torch's
bf16 `conv_transpose2d` (weight a bf16 constant, bias passed in), oneDNN through torch's
`mkldnn._convolution_transpose_pointwise` with the weight prepacked once (also copied into an
output slot, as in a run), and oneDNN's own deconvolution primitive writing the slot
(`onednn_deconv.py`, the default path). Resize: torch's bf16 channels-last bilinear kernel
(ours before), float32 round trip, oneDNN's bf16 resampling primitive through our C API
layer. Median ms of 50 calls (`mnv2dw_layers.run_wall`), best of 3
alternating blocks; max |diff| against a float32 torch reference on the same bf16 inputs.
"""

from __future__ import annotations

import argparse
import sys
from ctypes import byref, c_void_p
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.mnv2dw_layers import run_wall  # noqa: E402

CL = torch.channels_last


def onednn_resampler(x: torch.Tensor, out_lens: list[int]):
    """A oneDNN linear resampling primitive bf16 NHWC -> bf16 NHWC (callable(x, y))."""
    from pygraphx.targets.torch_lowering import onednn_resample

    plan = onednn_resample.ResamplePlan(tuple(x.shape), tuple(out_lens), torch.bfloat16)
    return onednn_resample.Resample(onednn_resample.runtime(), plan)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    for cin, cout, hw in ((512, 256, 16), (256, 128, 32)):
        x = torch.randn(1, cin, hw, hw).bfloat16().contiguous(memory_format=CL)
        w = (torch.randn(cin, cout, 2, 2) * 0.05).bfloat16()
        b = (torch.randn(cout) * 0.1).bfloat16()
        wf, bf = w.float(), b.float()
        ref = F.conv_transpose2d(x.float(), wf, bf, 2)
        packed = torch.ops.mkldnn._reorder_convolution_transpose_weight(
            w, [0, 0], [0, 0], [2, 2], [1, 1], 1, list(x.shape))

        def ours():
            return F.conv_transpose2d(x.float(), wf, None, 2).bfloat16() + b.view(1, -1, 1, 1)

        def torch_bf16():
            return F.conv_transpose2d(x, w, b, 2)

        def mkldnn_packed():
            return torch.ops.mkldnn._convolution_transpose_pointwise(
                x, packed, b, [0, 0], [0, 0], [2, 2], [1, 1], 1, "none", [], "")

        from pygraphx.targets.torch_lowering import onednn_capi, onednn_deconv

        out_lens = [1, cout, 2 * hw, 2 * hw]
        geometry = onednn_deconv.Geometry(list(x.shape), out_lens, w, b, [2, 2], [1, 1], 1,
                                          "none", [])  # fmt: skip
        primitive = onednn_deconv.Deconv(onednn_capi.runtime(), geometry)
        slot = torch.empty(out_lens, dtype=torch.bfloat16).contiguous(memory_format=CL)

        def mkldnn_into_slot():
            slot.copy_(mkldnn_packed())
            return slot

        def capi():
            primitive(x, slot)
            return slot

        forms = {"ours f32 compute (+bias add)": ours,
                 "torch bf16 conv_transpose2d+bias": torch_bf16,
                 "mkldnn prepacked+bias": mkldnn_packed,
                 "mkldnn prepacked+bias, copied to a slot": mkldnn_into_slot,
                 "oneDNN C API primitive into the slot": capi}
        errs = {k: (f().float() - ref).abs().max().item() for k, f in forms.items()}
        layouts = {k: f().is_contiguous(memory_format=CL) for k, f in forms.items()}
        best = {k: [] for k in forms}
        for _ in range(3):
            for k, f in forms.items():
                best[k].append(run_wall(f, 50))
        print(f"deconv {cin}->{cout} @{hw}:")
        for k in forms:
            print(f"  {k:40s} {min(best[k]):.3f} ms  max|diff| {errs[k]:.3g}  "
                  f"NHWC out {layouts[k]}")
    for c, hw in ((128, 64), (64, 128)):
        x = torch.randn(1, c, hw, hw).bfloat16().contiguous(memory_format=CL)
        out_lens = [1, c, 2 * hw, 2 * hw]
        ref = F.interpolate(x.float(), scale_factor=2, mode="bilinear")
        y = torch.empty(out_lens, dtype=torch.bfloat16).contiguous(memory_format=CL)
        kern = torch._C._nn.upsample_bilinear2d
        rs = onednn_resampler(x, out_lens)

        def torch_bf16():
            kern(x, out_lens[2:], False, None, None, out=y)
            return y

        def via_f32():
            y.copy_(F.interpolate(x.float(), scale_factor=2, mode="bilinear"))
            return y

        def onednn():
            rs(x, y)
            return y

        forms = {"torch bf16 NHWC (ours before)": torch_bf16, "f32 round trip": via_f32,
                 "oneDNN resampling bf16": onednn}
        errs = {k: (f().float() - ref).abs().max().item() for k, f in forms.items()}
        best = {k: [] for k in forms}
        for _ in range(3):
            for k, f in forms.items():
                best[k].append(run_wall(f, 50))
        print(f"resize bilinear x2 {c}ch @{hw} (impl {rs.impl}):")
        for k in forms:
            print(f"  {k:40s} {min(best[k]):.3f} ms  max|diff| {errs[k]:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
