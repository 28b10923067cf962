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
 */
#include <stdint.h>
#include <omp.h>
#ifdef __AVX512F__
#include <immintrin.h>
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
static inline __m512 exp_ps(__m512 x) {
    /* above 88.7 the result is inf (scalef overflows), as float32 exp: then gelu(-inf) is
     * -inf / inf = NaN and a large negative x gives -0, as torch's float32 gelu */
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

static inline __m512 gelu_tanh_ps(__m512 v) {
    const __m512 c2 = _mm512_set1_ps(-2.0f * 0.7978845608028654f);
    const __m512 a = _mm512_set1_ps(0.044715f);
    const __m512 v2 = _mm512_mul_ps(v, v);
    const __m512 u = _mm512_mul_ps(_mm512_fmadd_ps(_mm512_mul_ps(a, v2), v, v), c2);
    return _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), exp_ps(u)));
}

static void gelu_range(float *x, int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + 16 <= end; i += 16) _mm512_storeu_ps(x + i, gelu_tanh_ps(_mm512_loadu_ps(x + i)));
    if (i < end) {
        const __mmask16 k = (__mmask16)((1u << (end - i)) - 1u);
        _mm512_mask_storeu_ps(x + i, k, gelu_tanh_ps(_mm512_maskz_loadu_ps(k, x + i)));
    }
}
#endif

/* x[0 .. n) = gelu_tanh(x) in place, over `threads` threads (blocks of 4096 floats). Returns 0,
 * or -1 where this build has no kernel. */
int gelu_tanh_f32(float *x, int64_t n, int64_t threads) {
#ifdef __AVX512F__
    const int64_t block = 4096, blocks = (n + block - 1) / block;
    if (threads <= 1 || blocks < 2) {
        gelu_range(x, 0, n);
        return 0;
    }
#pragma omp parallel for num_threads((int)threads) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t end = (b + 1) * block < n ? (b + 1) * block : n;
        gelu_range(x, b * block, end);
    }
    return 0;
#else
    (void)x; (void)n; (void)threads;
    return -1;
#endif
}
