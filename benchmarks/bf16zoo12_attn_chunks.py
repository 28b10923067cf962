"""MiniLM's attention shape (8 x 12 heads, 128 x 128, head dim 32) at bf16, 2 threads, in torch:
the whole batch at once (scores [96, 128, 128] float32, 6.3 MB, as our oneDNN block writes
them) against the same three steps run per chunk of heads (scores of a chunk in L2), and
torch's fused SDPA. A signal for chunking our block, not our block itself.

    PYTHONPATH=. python benchmarks/bf16zoo12_attn_chunks.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.mnv2dw_layers import run_wall  # noqa: E402


def med(fn, n: int = 30) -> float:
    """Median wall ms of `n` calls (`mnv2dw_layers.run_wall`)."""
    return run_wall(fn, n)


def main() -> int:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    bh, s, d = 96, 128, 32
    q, k, v = (torch.randn(bh, s, d).bfloat16() for _ in range(3))
    mask = torch.zeros(bh, 1, s)
    mask[:, :, 100:] = -1e4
    scale = d**-0.5

    def three(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        sc = torch.bmm(q, k.transpose(1, 2)).float() * scale + m
        return torch.bmm(torch.softmax(sc, -1).bfloat16(), v)

    def whole() -> torch.Tensor:
        return three(q, k, v, mask)

    def chunks(c: int):
        def run() -> torch.Tensor:
            out = torch.empty(bh, s, d, dtype=torch.bfloat16)
            for i in range(0, bh, c):
                out[i:i + c] = three(q[i:i + c], k[i:i + c], v[i:i + c], mask[i:i + c])
            return out
        return run

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.bfloat16().unsqueeze(1)
                                              .expand(bh, 1, s, s).reshape(bh, s, s))

    ref = whole().float()
    forms = {"whole (96 heads)": whole, "chunks of 12": chunks(12), "chunks of 4": chunks(4),
             "torch sdpa bf16": sdpa}
    best = {k: [] for k in forms}
    for _ in range(3):
        for kname, f in forms.items():
            best[kname].append(med(f))
    for kname, f in forms.items():
        err = (f().float() - ref).abs().max().item()
        print(f"{kname}: {min(best[kname]):.3f} ms a layer (max |diff| vs whole {err:.3g})")
    print("(x 6 layers; our in-graph attention step: 1.67-1.78 ms a layer, OV's MHA 0.95-1.07)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
