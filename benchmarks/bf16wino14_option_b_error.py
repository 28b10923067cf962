"""Option (b)'s error, simulated (helper bf16wino14): F(4x4, 3x3) with the transformed input V
and / or the transformed weight U rounded to bf16 (what `vdpbf16ps` products, or a bf16-stored
U, would multiply), everything else in float64, against float64 `F.conv2d` on the same bf16
values; the output rounded to bf16 as every bf16 route does.

    PYTHONPATH=. python benchmarks/bf16wino14_option_b_error.py

Printed: the relative RMS error of the bf16 output of direct convolution (one rounding: what
oneDNN's bf16 kernel and option (a) give), F(4,3) in float32 terms (option (a)), U in bf16,
V in bf16, both (option (b)).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from pygraphx.targets.torch_lowering.winograd import TRANSFORMS, weight_transform  # noqa: E402

T = TRANSFORMS[4]
BT = torch.tensor(T.bt, dtype=torch.float64)
AT = torch.tensor(T.at, dtype=torch.float64)


def wino(x: torch.Tensor, w: torch.Tensor, round_v: bool, round_u: bool) -> torch.Tensor:
    """F(4,3) of `x` (N, C, H, W; H, W multiples of 4, pad 1) with `w`, V / U rounded to bf16."""
    n, c, h, wd = x.shape
    k = w.shape[0]
    d = F.pad(x, (1, 1, 1, 1)).unfold(2, 6, 4).unfold(3, 6, 4)  # n c th tw 6 6
    v = torch.einsum("ai,nctuij,bj->abntuc", BT, d, BT).float().double()
    if round_v:
        v = v.to(torch.bfloat16).double()
    u = weight_transform(w.float(), 4).double().view(6, 6, c, k)
    if round_u:
        u = u.to(torch.bfloat16).double()
    m = torch.einsum("abntuc,abck->abntuk", v, u)
    y = torch.einsum("pa,abntuk,qb->ntpuqk", AT, m, AT)
    return y.reshape(n, h, wd, k).permute(0, 3, 1, 2)


def main() -> None:
    torch.manual_seed(0)
    print("| layer (C -> K, map) | direct, out bf16 | (a) | U bf16 | V bf16 | (b) V, U bf16 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for c, k, hw in [(64, 64, 40), (128, 128, 20), (32, 32, 80)]:
        x = torch.randn(1, c, hw, hw).to(torch.bfloat16).double()
        w = (torch.randn(k, c, 3, 3) / (3 * c**0.5)).to(torch.bfloat16).double()
        ref = F.conv2d(x, w, padding=1)

        def rel(y: torch.Tensor) -> str:
            e = y.to(torch.bfloat16).double() - ref
            return f"{(e.norm() / ref.norm()).item():.2e}"

        cells = [rel(ref), rel(wino(x, w, False, False)), rel(wino(x, w, False, True)),
                 rel(wino(x, w, True, False)), rel(wino(x, w, True, True))]  # fmt: skip
        print(f"| {c} -> {k}, {hw}x{hw} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
