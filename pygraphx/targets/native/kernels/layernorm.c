/* Layer normalisation over the last axis of a float32 (rows, n) matrix (helper gemm14, issue
 * 10): y = (x - mean) / sqrt(var + eps) * w + b, the mean and the (biased) variance of each
 * row, written in float32 and, where asked, also rounded to bf16 in the same pass (a post-norm
 * transformer's norm in a bf16 program: the float32 result feeds the next residual sum, the
 * bf16 copy the next products).
 *
 * One row at a time (a row of a transformer is a few KB: it stays in L1 between the passes):
 * the sum, then the sum of squared deviations (two passes: no cancellation), then the output.
 * Sums run in 4 x 16 float lanes, each lane's partial sums then added in double. Threads split
 * the rows (`omp for`, static); one thread runs no parallel region.
 */
#include <stdint.h>
#include <stddef.h>
#include <math.h>
#include <omp.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

/* 1 where this build has the float32 kernel (AVX-512F), else 0 */
int ln_supported(void) {
#ifdef __AVX512F__
    return 1;
#else
    return 0;
#endif
}

/* 1 where this build also writes bf16 (AVX-512 BF16's rounding instruction), else 0 */
int ln_bf16_supported(void) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    return 1;
#else
    return 0;
#endif
}

#ifdef __AVX512F__

static inline __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

static inline double row_sum(const float *x, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        s0 = _mm512_add_ps(s0, _mm512_loadu_ps(x + j));
        s1 = _mm512_add_ps(s1, _mm512_loadu_ps(x + j + 16));
        s2 = _mm512_add_ps(s2, _mm512_loadu_ps(x + j + 32));
        s3 = _mm512_add_ps(s3, _mm512_loadu_ps(x + j + 48));
    }
    for (; j < n; j += 16)
        s0 = _mm512_add_ps(s0, _mm512_maskz_loadu_ps(tail_mask(n - j), x + j));
    __m512 s = _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
    float lanes[16];
    _mm512_storeu_ps(lanes, s);
    double total = 0.0;
    for (int i = 0; i < 16; i++) total += lanes[i];
    return total;
}

static inline double row_sq_dev(const float *x, int64_t n, float mean) {
    const __m512 m = _mm512_set1_ps(mean);
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(x + j), m);
        __m512 d1 = _mm512_sub_ps(_mm512_loadu_ps(x + j + 16), m);
        __m512 d2 = _mm512_sub_ps(_mm512_loadu_ps(x + j + 32), m);
        __m512 d3 = _mm512_sub_ps(_mm512_loadu_ps(x + j + 48), m);
        s0 = _mm512_fmadd_ps(d0, d0, s0);
        s1 = _mm512_fmadd_ps(d1, d1, s1);
        s2 = _mm512_fmadd_ps(d2, d2, s2);
        s3 = _mm512_fmadd_ps(d3, d3, s3);
    }
    for (; j < n; j += 16) {
        __mmask16 k = tail_mask(n - j);
        __m512 d = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, x + j), m);
        s0 = _mm512_fmadd_ps(d, d, s0);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
    float lanes[16];
    _mm512_storeu_ps(lanes, s);
    double total = 0.0;
    for (int i = 0; i < 16; i++) total += lanes[i];
    return total;
}

/* one row: y (and yb when not NULL) from x */
static inline void row_norm(const float *x, float *y, uint16_t *yb, const float *w,
                            const float *b, int64_t n, float eps) {
    const float mean = (float)(row_sum(x, n) / (double)n);
    const double var = row_sq_dev(x, n, mean) / (double)n;
    const float rstd = (float)(1.0 / sqrt(var + (double)eps));
    const __m512 m = _mm512_set1_ps(mean), r = _mm512_set1_ps(rstd);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 k = tail_mask(n - j);
        __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), m), r);
        if (w) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(k, w + j));
        if (b) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, b + j));
        if (y) _mm512_mask_storeu_ps(y + j, k, v);
#ifdef __AVX512BF16__
        if (yb) {
            __m256bh h = _mm512_cvtneps_pbh(v);
            _mm256_mask_storeu_epi16(yb + j, k, (__m256i)h);
        }
#endif
    }
}

#endif /* __AVX512F__ */

/* Normalise `rows` rows of `n` floats: x (row stride sx) into y (row stride sy) and, where yb
 * is not NULL, its bf16 rounding into yb (row stride syb); y may be NULL where yb is not (the
 * bf16 result alone: a pre-norm transformer's norm in a bf16 program, GPT-2's; helper
 * gemm15); w and b: (n) or NULL. Returns 0, or -1 where this build has no kernel (or no bf16
 * one and yb is given, or neither output is given). */
int ln_f32(const float *x, float *y, uint16_t *yb, const float *w, const float *b,
           int64_t rows, int64_t n, int64_t sx, int64_t sy, int64_t syb, float eps,
           int64_t threads) {
#ifdef __AVX512F__
#ifndef __AVX512BF16__
    if (yb) return -1;
#endif
    if (!y && !yb) return -1;
    if (threads <= 1 || rows < 2) {
        for (int64_t i = 0; i < rows; i++)
            row_norm(x + i * sx, y ? y + i * sy : NULL, yb ? yb + i * syb : NULL, w, b, n, eps);
        return 0;
    }
#pragma omp parallel for num_threads((int)threads) schedule(static)
    for (int64_t i = 0; i < rows; i++)
        row_norm(x + i * sx, y ? y + i * sy : NULL, yb ? yb + i * syb : NULL, w, b, n, eps);
    return 0;
#else
    (void)x; (void)y; (void)yb; (void)w; (void)b; (void)rows; (void)n; (void)sx; (void)sy;
    (void)syb; (void)eps; (void)threads;
    return -1;
#endif
}
