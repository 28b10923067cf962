"""The polynomial coefficients of `native/kernels/vmath.h`'s erf-GELU, fitted in float64
(helper gelu16): Lawson's iteratively reweighted least squares (near-minimax) on Chebyshev
nodes, printed as float32 (highest degree first), with the fit's maximum weighted error.

    PYTHONPATH=. python benchmarks/gelu16_fit.py

- H(t), degree 6: erfcx(a / sqrt 2) / (2 t), t = 1 / (1 + 0.35 a), a = |x| in [0, 14], the
  relative error weighted by 1 / (1 + a^2 / 4) (gelu's condition number grows like x^2);
  q = Phi(-a) = t H(t) 2^(-a^2 log2(e) / 2). (`--scan` tries other degrees and p.)
- 2^f on [-0.5, 0.5], degrees 5 and 6, relative.
- P(u), degree 7: (Phi(x) - 0.5) / x, u = x^2, x in [0, 2], the error relative to Phi(-x)
  (the value for negative x), for gelu(x) = x (0.5 + x P(x^2)).
"""

from __future__ import annotations

import sys

import numpy as np
from scipy.special import erfcx, ndtr

N = 4000


def lawson(v: np.ndarray, rhs: np.ndarray, rounds: int = 100) -> tuple[np.ndarray, float]:
    w = np.ones(len(rhs))
    for _ in range(rounds):
        c = np.linalg.lstsq(v * np.sqrt(w)[:, None], rhs * np.sqrt(w), rcond=None)[0]
        w *= np.abs(v @ c - rhs)
        w /= w.sum()
    return c, float(np.abs(v @ c - rhs).max())


def fit_h(p: float, degree: int, top: float = 14.0) -> tuple[np.ndarray, float]:
    tmin = 1 / (1 + p * top)
    t = (tmin + 1) / 2 + (1 - tmin) / 2 * np.cos(np.pi * (np.arange(N) + 0.5) / N)
    a = (1 / t - 1) / p
    g, tol = erfcx(a / np.sqrt(2)) / 2 / t, 1 + a * a / 4
    return lawson(np.vander(t, degree + 1) / (g * tol)[:, None], 1 / tol)


def show(name: str, c: np.ndarray, err: float) -> None:
    print(f"{name}: max error {err:.3g}\n  " + ", ".join(f"{np.float32(v)!r}" for v in c))


def main() -> None:
    if "--scan" in sys.argv:
        for degree in (5, 6, 7, 8):
            err, p = min((fit_h(p, degree)[1], p) for p in np.arange(0.1, 1.01, 0.05))
            print(f"H degree {degree}: best p {p:.2f}, weighted error {err:.3g}")
    show("H(t), p = 0.35, degree 6", *fit_h(0.35, 6))
    f = np.cos(np.pi * (np.arange(N) + 0.5) / N) * 0.5
    for degree in (5, 6):
        show(f"2^f, degree {degree}", *lawson(np.vander(f, degree + 1) / (2**f)[:, None],
                                              np.ones(N)))  # fmt: skip
    x = 2 * np.cos(np.pi * (np.arange(N) + 0.5) / (2 * N))
    wt = 1 / ndtr(-x)
    show("P(u), x in [0, 2], degree 7",
         *lawson(np.vander(x * x, 8) * (x * wt)[:, None], (ndtr(x) - 0.5) * wt))  # fmt: skip


if __name__ == "__main__":
    main()
