"""Weights in the native MobileNetV2 kernels' layouts (`mbconv.c`, `mbconv_bf16.c`, the heads):
1x1 weights per block of 64 output channels, bf16 input-channel pairs, the bf16 stem's taps,
depthwise taps, padded biases. Made once at compile by `native_mbconv` / `native_mbhead`
(which re-export them from `native_mbconv`).
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def _pad16(n: int) -> int:
    return -(-n // 16) * 16


def pack_1x1(weight: Tensor, pad_k: bool = False) -> Tensor:
    """A 1x1 weight (N, K, 1, 1) in the kernel's layout: N padded with zeros to a multiple of
    16 (K too with `pad_k`: the projection reads the padded depthwise channels), per block of
    64 output channels from n0 (its width bw) the (K, bw) matrix at n0 * K."""
    n, k = weight.shape[:2]
    w = torch.zeros(_pad16(n), _pad16(k) if pad_k else k, dtype=torch.float32)
    w[:n, :k] = weight.reshape(n, k).float()
    n16 = w.shape[0]
    return torch.cat([w[n0 : n0 + 64].t().contiguous().view(-1) for n0 in range(0, n16, 64)])


def pack_1x1_bf16(weight: Tensor) -> Tensor:
    """A 1x1 weight (N, K, 1, 1) in the bf16 kernel's layout (`mbconv_bf16.c`): N padded with
    zeros to a multiple of 16, K to an even count, per block of 64 output channels from n0 (its
    width bw) the (K2, bw, 2) bf16 array at n0 * K2 * 2 (input channel pairs together)."""
    n, k = weight.shape[:2]
    k2 = -(-k // 2)
    w = torch.zeros(_pad16(n), 2 * k2, dtype=torch.bfloat16)
    w[:n, :k] = weight.reshape(n, k).to(torch.bfloat16)
    n16 = w.shape[0]
    blocks = [w[n0 : n0 + 64].view(-1, k2, 2).transpose(0, 1).contiguous().view(-1)
              for n0 in range(0, n16, 64)]  # fmt: skip
    return torch.cat(blocks)


def pad_vector(v: Tensor | None, n: int) -> Tensor:
    """A bias (or zeros for None) padded with zeros to a multiple of 16."""
    out = torch.zeros(_pad16(n), dtype=torch.float32)
    if v is not None:
        out[:n] = v.float().reshape(-1)
    return out


def pack_stem_bf16(weight: Tensor) -> Tensor:
    """A bf16 stem's 3x3 weight (M, C, 3, 3) in `mbconv_bf16.c`'s `stem_micro_bf` layout (mnv18):
    the taps (q = 3 c + ky, kx) paired as (2j, kx), (2j + 1, kx) (J = ceil(3 C / 2) pairs of
    kernel rows, the last one's second row zero where 3 C is odd), pair 3 j + kx, packed as a
    bf16 1x1 weight of 6 J inputs (`pack_1x1_bf16`)."""
    m, c = weight.shape[:2]
    q = 3 * c
    j = -(-q // 2)
    rows = torch.zeros(m, 2 * j, 3, dtype=torch.float32)  # (m, kernel row q, kx)
    rows[:, :q] = weight.reshape(m, q, 3).float()
    taps = rows.view(m, j, 2, 3).permute(0, 1, 3, 2).reshape(m, 6 * j, 1, 1)  # (j, kx, t)
    return pack_1x1_bf16(taps)


def _pad_k(wp: Tensor) -> Tensor:
    """A projection weight (K, M, 1, 1) with M padded with zeros to a multiple of 16 (it reads
    the padded depthwise channels)."""
    k, m = wp.shape[:2]
    out = torch.zeros(k, _pad16(m), 1, 1, dtype=wp.dtype)
    out[:, :m] = wp.reshape(k, m, 1, 1)
    return out


def pack_dw(weight: Tensor) -> Tensor:
    """A depthwise 3x3 weight (M, 1, 3, 3) as (9, m16)."""
    m = weight.shape[0]
    out = torch.zeros(9, _pad16(m), dtype=torch.float32)
    out[:, :m] = weight.reshape(m, 9).t().float()
    return out.contiguous()
