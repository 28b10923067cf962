/* GELU, tanh approximation, in place over a float32 array (helper gemm15, issue 10):
 * y = 0.5 x (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2 / pi), computed as the same function
 * written x / (1 + exp(-2 c (x + 0.044715 x^3))) (0.5 (1 + tanh(u)) = sigmoid(2u)), exp as
 * 2^n * p(f) (n = round(t), f = t - n in [-0.5, 0.5], p a degree-6 polynomial of 2^f, t =
 * x log2(e), the exponent argument clamped to [-88, 100]: exp overflows to inf as float32's
 * does): within 17 float32 units of the float64 function where |y| > 1e-3 and 1.4e-5 relative
 * in the far negative tail (torch's own float32 GELU: up to 437 units; review15b).
 *
 * Why: GPT-2's FFN-up product applied oneDNN 3.2's gelu_tanh post-op at ~4 cycles an element
 * (128 x 3072 float32, one thread, the 2-core EPYC: 6024 us with it against 5669 without);
 * this pass over the product's result takes ~110 us.
 *
 * GELU, erf form (helper gelu16): y = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), vmath.h's
 * vm_gelu_erf_ps (Phi(-|x|) as t H(t) 2^(-x^2 log2(e) / 2): relative accuracy in the negative
 * tail as well), in place over float32 (gelu_erf_f32) for BERT / ViT / MiniLM's FFN-up.
 */
#include <stdint.h>
#include <omp.h>
#include "vmath.h"

/* the bf16 pass: AVX-512F, BW and VL (masked 16-bit stores) and AVX512_BF16 (the rounding) */
#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__)
#define GELU_BF16 1
#else
#define GELU_BF16 0
#endif

/* 1 where this build has the kernel (AVX-512F), else 0 */
int gelu_supported(void) {
#ifdef __AVX512F__
    return 1;
#else
    return 0;
#endif
}

#ifdef __AVX512F__
static inline __m512 gelu_tanh_ps(__m512 v) {
    const __m512 c2 = _mm512_set1_ps(-2.0f * 0.7978845608028654f);
    const __m512 a = _mm512_set1_ps(0.044715f);
    const __m512 v2 = _mm512_mul_ps(v, v);
    const __m512 u = _mm512_mul_ps(_mm512_fmadd_ps(_mm512_mul_ps(a, v2), v, v), c2);
    return _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), vm_exp_ps(u)));
}

#define GELU_RANGE(name, fn)                                                                \
    static void name(float *x, int64_t begin, int64_t end) {                                \
        int64_t i = begin;                                                                  \
        for (; i + 16 <= end; i += 16) _mm512_storeu_ps(x + i, fn(_mm512_loadu_ps(x + i))); \
        if (i < end) {                                                                      \
            const __mmask16 k = (__mmask16)((1u << (end - i)) - 1u);                        \
            _mm512_mask_storeu_ps(x + i, k, fn(_mm512_maskz_loadu_ps(k, x + i)));           \
        }                                                                                   \
    }
GELU_RANGE(gelu_range, gelu_tanh_ps)
GELU_RANGE(gelu_erf_range, vm_gelu_erf_ps)
GELU_RANGE(gelu_erf3_range, vm_gelu_erf3_ps)

/* over `threads` threads in blocks of 4096 floats */
static void gelu_blocks(void (*range)(float *, int64_t, int64_t), float *x, int64_t n,
                        int64_t threads) {
    const int64_t block = 4096, blocks = (n + block - 1) / block;
    if (threads <= 1 || blocks < 2) {
        range(x, 0, n);
        return;
    }
#pragma omp parallel for num_threads((int)threads) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t end = (b + 1) * block < n ? (b + 1) * block : n;
        range(x, b * block, end);
    }
}
#endif

/* x[0 .. n) = gelu_tanh(x) in place, over `threads` threads (blocks of 4096 floats). Returns 0,
 * or -1 where this build has no kernel. */
int gelu_tanh_f32(float *x, int64_t n, int64_t threads) {
#ifdef __AVX512F__
    gelu_blocks(gelu_range, x, n, threads);
    return 0;
#else
    (void)x; (void)n; (void)threads;
    return -1;
#endif
}

/* 1 where this build has gelu_erf_f32_bf16 and gelu_erf_two_f32_bf16 (AVX-512F, BW, VL and
 * AVX512_BF16), else 0 */
int gelu_bf16_supported(void) {
#if GELU_BF16
    return 1;
#else
    return 0;
#endif
}

#if GELU_BF16
/* y[begin .. end) = bf16(fn(x)) */
#define GELU_BF16_RANGE(name, fn)                                                           \
    static void name(const float *x, uint16_t *y, int64_t begin, int64_t end) {             \
        int64_t i = begin;                                                                  \
        for (; i + 16 <= end; i += 16) {                                                    \
            const __m256bh r = _mm512_cvtneps_pbh(fn(_mm512_loadu_ps(x + i)));              \
            _mm256_storeu_si256((__m256i *)(y + i), (__m256i)r);                            \
        }                                                                                   \
        if (i < end) {                                                                      \
            const __mmask16 k = (__mmask16)((1u << (end - i)) - 1u);                        \
            const __m256bh r = _mm512_cvtneps_pbh(fn(_mm512_maskz_loadu_ps(k, x + i)));     \
            _mm256_mask_storeu_epi16(y + i, k, (__m256i)r);                                 \
        }                                                                                   \
    }
GELU_BF16_RANGE(gelu_erf_bf16_range, vm_gelu_erf3_ps)
GELU_BF16_RANGE(gelu_erf_two_bf16_range, vm_gelu_erf_ps)
#endif

/* the body of a bf16 entry point: `range` over `threads` threads in blocks of 4096 floats
 * (a macro, not a function pointer: each entry point's loop calls its range directly) */
#define GELU_BF16_BLOCKS(range)                                                             \
    do {                                                                                    \
        const int64_t block = 4096, blocks = (n + block - 1) / block;                       \
        if (threads <= 1 || blocks < 2) {                                                   \
            range(x, y, 0, n);                                                              \
            return 0;                                                                       \
        }                                                                                   \
        _Pragma("omp parallel for num_threads((int)threads) schedule(static)")              \
        for (int64_t b = 0; b < blocks; b++) {                                              \
            const int64_t end = (b + 1) * block < n ? (b + 1) * block : n;                  \
            range(x, y, b * block, end);                                                    \
        }                                                                                   \
        return 0;                                                                           \
    } while (0)

/* y[0 .. n) = bf16(gelu(x)) (erf form; one rounding, to nearest even) from the float32 x (a
 * product's float32 result) into the bf16 y, over `threads` threads (blocks of 4096); a denormal
 * value (x < -13.2) becomes a zero of its sign (vcvtneps2bf16 flushes them). Returns
 * 0, or -1 where this build has no kernel. GELU in the three forms (vm_gelu_erf3_ps, helper
 * tfov17): gelu_erf_middle_f32's value rounded once. */
int gelu_erf_f32_bf16(const float *x, uint16_t *y, int64_t n, int64_t threads) {
#if GELU_BF16
    GELU_BF16_BLOCKS(gelu_erf_bf16_range);
#else
    (void)x; (void)y; (void)n; (void)threads;
    return -1;
#endif
}

/* gelu_erf_f32_bf16 in the two forms (vm_gelu_erf_ps: PGX_CPU_GELU_ERF_MIDDLE=0; review17c):
 * gelu_erf_f32's value rounded once. Returns 0, or -1 where this build has no kernel. */
int gelu_erf_two_f32_bf16(const float *x, uint16_t *y, int64_t n, int64_t threads) {
#if GELU_BF16
    GELU_BF16_BLOCKS(gelu_erf_two_bf16_range);
#else
    (void)x; (void)y; (void)n; (void)threads;
    return -1;
#endif
}

/* x[0 .. n) = gelu(x) (erf form) in place, over `threads` threads (blocks of 4096 floats).
 * Returns 0, or -1 where this build has no kernel. */
int gelu_erf_f32(float *x, int64_t n, int64_t threads) {
#ifdef __AVX512F__
    gelu_blocks(gelu_erf_range, x, n, threads);
    return 0;
#else
    (void)x; (void)n; (void)threads;
    return -1;
#endif
}

/* gelu_erf_f32 with vmath.h's three forms (vm_gelu_erf3_ps: the middle form, |x| < 4, between
 * the central and the tail form; helper tfov17). Returns 0, or -1 where this build has no
 * kernel. */
int gelu_erf_middle_f32(float *x, int64_t n, int64_t threads) {
#ifdef __AVX512F__
    gelu_blocks(gelu_erf3_range, x, n, threads);
    return 0;
#else
    (void)x; (void)n; (void)threads;
    return -1;
#endif
}
