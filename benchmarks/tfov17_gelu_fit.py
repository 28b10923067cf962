"""Coefficients of the erf-GELU's middle form (helper tfov17): s(a) = Phi(-a)^(1/8) on
[0, L] as a polynomial in a (float64 relative minimax by Lawson's iteration on a Chebyshev
least-squares fit), so that gelu(x) = relu(x) - |x| s(|x|)^8 (three squarings) for a vector
whose lanes all have |x| < L; prints the C constants and the float32 (Horner with FMA,
emulated in float64 then rounded each step) errors of q = s^8 and of gelu against float64.

    PYTHONPATH=. python benchmarks/tfov17_gelu_fit.py --limit 4 --degree 9
"""

from __future__ import annotations

import argparse
from math import erfc, sqrt

import numpy as np


def fit(limit: float, degree: int, root: int = 8, center: float = 0.0) -> np.ndarray:
    a = np.linspace(0, limit, 40001)
    s = np.array([0.5 * erfc(v / sqrt(2)) for v in a]) ** (1.0 / root)
    t = a / limit * 2 - 1
    w = np.ones_like(a)
    for _ in range(60):
        c = np.polynomial.chebyshev.chebfit(t, s, degree, w=np.sqrt(w) / s)
        r = (np.polynomial.chebyshev.chebval(t, c) - s) / s
        w = w * np.abs(r) + 1e-300
        w /= w.sum()
    # to powers of u = a - center: p(t) with t = 2a/L - 1 = 2(u + center)/L - 1
    pt = np.polynomial.Polynomial(np.polynomial.chebyshev.cheb2poly(c))
    pa = pt(np.polynomial.Polynomial([2.0 * center / limit - 1.0, 2.0 / limit]))
    return pa.coef  # lowest power first


def horner32(coef32: np.ndarray, a: np.ndarray) -> np.ndarray:
    a64 = a.astype(np.float64)
    p = np.full_like(a64, float(coef32[-1]))
    for c in coef32[-2::-1]:
        p = (p * a64 + float(c)).astype(np.float32).astype(np.float64)  # one rounding (FMA)
    return p.astype(np.float32)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=4.0)
    ap.add_argument("--degree", type=int, default=9)
    ap.add_argument("--center", type=float, default=0.0, help="powers of u = |x| - center")
    ap.add_argument("--squarings", type=int, default=3, help="s = Phi(-a)^(1/2^squarings)")
    args = ap.parse_args()
    root = 2**args.squarings
    coef = fit(args.limit, args.degree, root=root, center=args.center)
    coef32 = coef.astype(np.float32)
    print("/* s(a) = Phi(-a)^(1/%d), a in [0, %g], degree %d in u = a - %g, highest power "
          "first */" % (root, args.limit, args.degree, args.center))  # fmt: skip
    print(", ".join(f"{float(c):.9g}f" for c in coef32[::-1]))
    x = np.linspace(-args.limit, args.limit, 400001).astype(np.float32)
    x = x[np.abs(x) < args.limit]
    a = np.abs(x)
    s = horner32(coef32, (a - np.float32(args.center)).astype(np.float32))
    q = s
    for _ in range(args.squarings):
        q = q * q  # float32 squarings
    relu = np.maximum(x, 0).astype(np.float64)
    g = (relu - a.astype(np.float64) * q.astype(np.float64)).astype(np.float32)  # one FMA
    x64 = x.astype(np.float64)
    q64 = np.array([0.5 * erfc(v / sqrt(2)) for v in np.abs(x64)])
    g64 = x64 * np.array([0.5 * erfc(-v / sqrt(2)) for v in x64])
    rq = np.abs(q.astype(np.float64) - q64) / q64
    big = np.abs(g64) > 1e-30
    rg = np.abs(g.astype(np.float64)[big] - g64[big]) / np.abs(g64[big])
    ulp = np.spacing(np.abs(g64[big]).astype(np.float32)).astype(np.float64)
    units = np.abs(g.astype(np.float64)[big] - g64[big]) / ulp
    xs = x64[big]
    bound = 1e-6 * np.maximum(1, xs**2 / 4)
    print(f"worst of the bound 1e-6 max(1, x^2 / 4): {(rg / bound).max():.2f}")
    print(f"q rel err max {rq.max():.2e}; gelu rel err max {rg.max():.2e} at x = "
          f"{x64[big][rg.argmax()]:.4f}; float32 units max {units.max():.1f}, "
          f"where |y| > 1e-3: {units[np.abs(g64[big]) > 1e-3].max():.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
