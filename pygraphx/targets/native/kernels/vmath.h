/* Vector maths shared by the native kernels (AVX-512F, float32; helper gelu16, issue 10).
 * Included as `#include "vmath.h"`: the compiler pastes it into the kernel's source before
 * hashing and building (`native/compiler.py`, `inline_headers`), so a change here rebuilds
 * every kernel that includes it. Everything is `static inline` and guarded by __AVX512F__.
 *
 * - vm_exp_ps(x): e^x, t = x log2(e), 2^n p(t - n) with p a degree-6 polynomial; the argument
 *   clamped to [-88, 100] (above 88.7 the result is inf, as float32 exp). (gemm15's gelu.c.)
 * - vm_phi_tail_ps(x, &a, &n): q = Phi(-|x|) = erfc(|x| / sqrt 2) / 2 (the normal distribution's
 *   lower tail) with relative accuracy everywhere: q = t H(t) 2^(-x^2 log2(e) / 2),
 *   t = 1 / (1 + 0.35 |x|) (rcp14 and one Newton step), returned as m with q = m 2^n; H a
 *   degree-6 polynomial fitted in float64 to erfcx(|x| / sqrt 2) / (2 t) for |x| in [0, 14]
 *   (relative error 1.8e-7 weighted by 1 + x^2 / 4, the condition number's growth: gelu's own
 *   relative condition number is
 *   ~x^2, so rounding x^2 costs ~x^2 * 6e-8 in the tail anyway), 2^f of degree 5 (7.5e-8).
 *   |x| is clamped to 16: beyond it q underflows to 0 (+-inf give 0, NaN gives NaN).
 * - vm_gelu_erf_ps(x): x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)): a vector whose 16 values are all
 *   in (-1.5, 2) as x (0.5 + x P(x^2)) (vm_gelu_erf_central_ps, 11 operations), any other as
 *   relu(x) - |x| Phi(-|x|) (vm_gelu_erf_tail_ps, ~26). Within 1e-6 max(1, x^2 / 4) of float64
 *   (relative: accurate where the value is tiny; torch's float32 gelu, 1 + erf in float32,
 *   gives 0 or noise below x = -5.5) and 20 float32 units where |y| > 1e-3; gelu(inf) = inf,
 *   gelu(-inf) = 0 (the limit; torch's float32 gives NaN for both), NaN stays NaN.
 * - vm_gelu_erf3_ps(x): vm_gelu_erf_ps with a third form between the two (helper tfov17): a
 *   vector not all central whose 16 values all have |x| < 4 as relu(x) - |x| s(|x|)^8
 *   (vm_gelu_erf_middle_ps, 15 operations; s = Phi(-|x|)^(1/8), a polynomial of degree 9);
 *   the same bounds (checked on every float32 with 1e-4 <= |x| < 4: 0.90 of the relative
 *   bound, 18.45 float32 units; see vm_gelu_erf_middle_ps).
 */
#ifndef PGX_VMATH_H
#define PGX_VMATH_H
#ifdef __AVX512F__
#include <immintrin.h>

static inline __m512 vm_exp_ps(__m512 x) {
    /* above 88.7 the result is inf (scalef overflows), as float32 exp */
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(100.0f)), _mm512_set1_ps(-88.0f));
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.5353362e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3398874e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* 2^f for f in [-0.5, 0.5] (minimax, degree 5: relative error 7.5e-8) */
static inline __m512 vm_exp2_poly5_ps(__m512 f) {
    __m512 p = _mm512_set1_ps(1.3276470e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6755410e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5507135e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022120e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314694e-1f));
    return _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0000001f));
}

/* (|x| clamped to 16, t = 1 / (1 + 0.35 |x|), H(t)): the parts of Phi(-|x|) both of its
 * users need */
static inline __m512 vm_phi_tail_ps(__m512 x, __m512 *a_out, __m512 *n_out) {
    /* |x|, clamped to 16 (min returns its second operand, a, where a is NaN) */
    const __m512 a = _mm512_min_ps(_mm512_set1_ps(16.0f), _mm512_abs_ps(x));
    const __m512 d = _mm512_fmadd_ps(a, _mm512_set1_ps(0.35f), _mm512_set1_ps(1.0f));
    const __m512 r = _mm512_rcp14_ps(d);
    const __m512 t = _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.0f)), r);
    __m512 h = _mm512_set1_ps(0.046261314f);
    h = _mm512_fmadd_ps(h, t, _mm512_set1_ps(-0.19086750f));
    h = _mm512_fmadd_ps(h, t, _mm512_set1_ps(0.22115964f));
    h = _mm512_fmadd_ps(h, t, _mm512_set1_ps(9.2262047e-4f));
    h = _mm512_fmadd_ps(h, t, _mm512_set1_ps(0.14651805f));
    h = _mm512_fmadd_ps(h, t, _mm512_set1_ps(0.13617471f));
    h = _mm512_fmadd_ps(h, t, _mm512_set1_ps(0.13983124f));
    /* w = -x^2 log2(e) / 2 (>= -185: no clamp needed); Phi(-|x|) = t h 2^w */
    const __m512 w = _mm512_mul_ps(_mm512_mul_ps(a, a), _mm512_set1_ps(-0.72134752044448170f));
    const __m512 n = _mm512_roundscale_ps(w, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 e = vm_exp2_poly5_ps(_mm512_sub_ps(w, n));
    *a_out = a;
    *n_out = n;
    return _mm512_mul_ps(e, _mm512_mul_ps(t, h));
}

/* gelu(x) = relu(x) - |x| Phi(-|x|) (x >= 0: x (1 - q); x < 0: x q), every x */
static inline __m512 vm_gelu_erf_tail_ps(__m512 x) {
    __m512 a, n;
    const __m512 m = vm_phi_tail_ps(x, &a, &n);
    /* max returns its second operand, x, where x is NaN */
    const __m512 relu = _mm512_max_ps(_mm512_setzero_ps(), x);
    return _mm512_fnmadd_ps(a, _mm512_scalef_ps(m, n), relu);
}

/* gelu(x) for |x| < 2: x (0.5 + x P(x^2)), P of degree 7 fitted in float64 to
 * (Phi(x) - 0.5) / x on [0, 2] (relative to Phi(-|x|): 2e-8); in float32 within ~9e-7 of the
 * value for x in (-1.5, 0) (P's own rounding against Phi(-1.5) = 0.067; 3.9e-6 at -2, so
 * vm_gelu_erf_ps takes it above -1.5 only), ~3e-7 elsewhere */
static inline __m512 vm_gelu_erf_central_ps(__m512 x) {
    const __m512 u = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(-1.5412642e-08f);
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(5.0220416e-07f));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(-8.831692e-06f));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(1.1404998e-04f));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(-1.1854707e-03f));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(9.972171e-03f));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(-6.648988e-02f));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(0.39894223f));
    return _mm512_mul_ps(x, _mm512_fmadd_ps(x, p, _mm512_set1_ps(0.5f)));
}

/* the central form where every lane has -1.5 < x < 2 (one test a vector: a transformer's
 * FFN-up values are mostly small; below -1.5 its relative error would pass 1e-6), else the
 * tail form */
static inline __m512 vm_gelu_erf_ps(__m512 x) {
    const __mmask16 below = _mm512_cmp_ps_mask(x, _mm512_set1_ps(2.0f), _CMP_LT_OQ);
    const __mmask16 small = _mm512_mask_cmp_ps_mask(below, x, _mm512_set1_ps(-1.5f), _CMP_GT_OQ);
    if (small == 0xFFFF) return vm_gelu_erf_central_ps(x);
    return vm_gelu_erf_tail_ps(x);
}

/* gelu(x) for |x| < 4 (helper tfov17): relu(x) - |x| s(|x|)^8, s(a) = Phi(-a)^(1/8) a
 * polynomial of degree 9 in u = a - 2 (float64 relative minimax on [0, 4], 1e-9; s runs from
 * 0.917 to 0.275, so the eighth power, three squarings, keeps Phi(-a)'s relative accuracy:
 * `benchmarks/tfov17_gelu_fit.py --limit 4 --degree 9 --center 2`). 15 operations against the
 * tail form's ~26. Every float32 with 1e-4 <= |x| < 4, both signs, through this form (a
 * vector: lane 0 = -3, 15 such values), against float64 (review17c, rerun by gelufix17): at
 * worst 0.902 of the 1e-6 max(1, x^2 / 4) relative bound the other forms keep (x = -1.5142369,
 * relative error 9.0e-7; the largest relative error, 1.75e-6 at x = -3.9734950, is 0.44 of
 * it there) and 18.45 float32 units where |y| > 1e-3 (x = -3.2436037; bound 20);
 * a trained model's FFN-up values (MiniLM's: median -0.7, 10 % below -2.2) fall in it far more
 * often than in the central form's (-1.5, 2). */
static inline __m512 vm_gelu_erf_middle_ps(__m512 x, __m512 a) {
    const __m512 u = _mm512_sub_ps(a, _mm512_set1_ps(2.0f));
    __m512 p = _mm512_set1_ps(-6.17287199e-09f);
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(-3.05625832e-07f));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(2.79113669e-06f));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(1.14010727e-05f));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(-0.000193142507f));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(-5.43452461e-06f));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(0.00675185025f));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(-0.0070772171f));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(-0.184871584f));
    p = _mm512_fmadd_ps(p, u, _mm512_set1_ps(0.623193622f));
    p = _mm512_mul_ps(p, p);
    p = _mm512_mul_ps(p, p);
    p = _mm512_mul_ps(p, p);
    return _mm512_fnmadd_ps(a, p, _mm512_max_ps(_mm512_setzero_ps(), x));
}

/* vm_gelu_erf_ps with a third form: the central form where every lane has -1.5 < x < 2, else
 * the middle form where every lane has |x| < 4 (NaN is not), else the tail form */
static inline __m512 vm_gelu_erf3_ps(__m512 x) {
    const __mmask16 below = _mm512_cmp_ps_mask(x, _mm512_set1_ps(2.0f), _CMP_LT_OQ);
    const __mmask16 small = _mm512_mask_cmp_ps_mask(below, x, _mm512_set1_ps(-1.5f), _CMP_GT_OQ);
    if (small == 0xFFFF) return vm_gelu_erf_central_ps(x);
    const __m512 a = _mm512_abs_ps(x);
    if (_mm512_cmp_ps_mask(a, _mm512_set1_ps(4.0f), _CMP_LT_OQ) == 0xFFFF)
        return vm_gelu_erf_middle_ps(x, a);
    return vm_gelu_erf_tail_ps(x);
}

#endif /* __AVX512F__ */
#endif /* PGX_VMATH_H */
