"""Choosing the next token from logits: greedy, or sampling with temperature, top-k and top-p.

Sampling draws from a numpy `Generator` seeded once per `generate` call, so a seed reproduces
the same tokens. Top-k keeps the k largest logits; top-p keeps the smallest set of most likely
tokens whose probabilities sum to at least p (the most likely token always stays).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingConfig:
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1.0: no top-p filter

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(
                f"temperature must be > 0 (got {self.temperature}); "
                "use do_sample=False for greedy decoding"
            )
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (got {self.top_k})")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")


def filtered_probs(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """Probabilities [batch, vocab] after temperature, top-k and top-p (float64)."""
    x = logits.astype(np.float64) / cfg.temperature
    if cfg.top_k and cfg.top_k < x.shape[-1]:
        kth = np.partition(x, -cfg.top_k, axis=-1)[:, -cfg.top_k][:, None]
        x = np.where(x < kth, -np.inf, x)
    x = x - x.max(axis=-1, keepdims=True)
    p = np.exp(x)
    p /= p.sum(axis=-1, keepdims=True)
    if cfg.top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(sorted_p, axis=-1) - sorted_p  # mass of the tokens ranked above
        drop_sorted = before >= cfg.top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        p = np.where(drop, 0.0, p)
        p /= p.sum(axis=-1, keepdims=True)
    return p


def next_tokens(logits: np.ndarray, cfg: SamplingConfig, rng: np.random.Generator) -> np.ndarray:
    """One token per row of `logits` [batch, vocab] (int64 [batch])."""
    if not cfg.do_sample:
        return logits.argmax(axis=-1).astype(np.int64)
    p = filtered_probs(logits, cfg)
    u = rng.random(p.shape[0])
    cdf = np.cumsum(p, axis=-1)
    idx = (cdf < u[:, None] * cdf[:, -1:]).sum(axis=-1)
    return np.minimum(idx, p.shape[-1] - 1).astype(np.int64)
