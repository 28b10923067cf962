"""UNet-small's two upsampling kinds at bf16, 2 threads, in torch: what our lowering calls
(`conv_transpose2d`, `F.interpolate(bilinear, half_pixel)`) against candidate forms.

`lower_nn.lower_deconvolution` computes a bf16 deconvolution in float32 (`_float_compute`:
input and weight converted each run, result converted back) on the channels-last input a
convolution leaves: `ours (f32 compute, NHWC)` mirrors that; the other forms stay in bf16.

    PYTHONPATH=. python benchmarks/bf16zoo12_upsample_probe.py

ConvTranspose 2x2 stride 2, no padding = one GEMM [HW, Cin] x [Cin, Cout*4] and a pixel
shuffle; checked against conv_transpose2d in float32 (max |diff| printed). Median ms of 50
calls after 5 warm-ups, the forms alternating in blocks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.mnv2dw_layers import run_wall  # noqa: E402


def med(fn, n: int = 50) -> float:
    """Median wall ms of `n` calls (`mnv2dw_layers.run_wall`)."""
    return run_wall(fn, n)


def main() -> int:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    for cin, cout, hw in ((512, 256, 16), (256, 128, 32)):
        x = torch.randn(1, cin, hw, hw).bfloat16()
        w = torch.randn(cin, cout, 2, 2).bfloat16() * 0.05
        wm = w.reshape(cin, cout * 4).contiguous()  # [Cin, Cout*2*2]

        def deconv() -> torch.Tensor:
            return F.conv_transpose2d(x, w, stride=2)

        def gemm_shuffle() -> torch.Tensor:
            y = x.reshape(cin, hw * hw).t() @ wm  # [HW, Cout*4]
            y = y.reshape(hw, hw, cout, 2, 2).permute(2, 0, 3, 1, 4)
            return y.reshape(1, cout, hw * 2, hw * 2)

        xl = x.contiguous(memory_format=torch.channels_last)

        def ours() -> torch.Tensor:
            return F.conv_transpose2d(xl.float(), w.float(), None, 2).bfloat16()

        def deconv_nhwc() -> torch.Tensor:
            return F.conv_transpose2d(xl, w, stride=2)

        forms = {"ours (f32 compute, NHWC)": ours, "conv_transpose2d bf16 NCHW": deconv,
                 "conv_transpose2d bf16 NHWC": deconv_nhwc, "gemm+shuffle bf16": gemm_shuffle}
        ref = F.conv_transpose2d(x.float(), w.float(), stride=2)
        err = max((f().float() - ref).abs().max().item() for f in forms.values())
        best = {k: [] for k in forms}
        for _ in range(3):
            for k, f in forms.items():
                best[k].append(med(f))
        print(f"deconv {cin}->{cout} @{hw}: "
              + ", ".join(f"{k} {min(v):.3f} ms" for k, v in best.items())
              + f" (max |diff| vs f32 {err:.3g})")
    for c, hw in ((128, 64), (64, 128)):
        x = torch.randn(1, c, hw, hw).bfloat16()
        xs = {"bf16 NCHW": x, "f32 NCHW": x.float(),
              "bf16 NHWC": x.contiguous(memory_format=torch.channels_last),
              "f32 NHWC": x.float().contiguous(memory_format=torch.channels_last)}
        fns = {k: (lambda t=t: F.interpolate(t, scale_factor=2, mode="bilinear"))
               for k, t in xs.items()}
        xl = xs["bf16 NHWC"]
        fns["bf16 NHWC via f32 (convert, resize, convert)"] = lambda: F.interpolate(
            xl.float(), scale_factor=2, mode="bilinear").bfloat16()
        best = {k: [] for k in fns}
        for _ in range(3):
            for k, f in fns.items():
                best[k].append(med(f))
        print(f"resize bilinear x2 {c}ch @{hw}: "
              + ", ".join(f"{k} {min(v):.3f} ms" for k, v in best.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
