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


/* ---- v2 (helper norms18): the same numbers, the horizontal sums in vector registers ----
 * v1 stores each 16-lane partial sum and adds the lanes one by one in double (16 dependent
 * scalar adds, twice a row: ~130 cycles of latency a row, more than the row's three passes
 * over L1). v2 widens the 16 float lanes to two 8-lane double vectors and reduces those (a
 * tree of 4 adds): the same double-precision sum of the same 16 float partial sums, in
 * another order. The passes are v1's, the output loop too. */
static inline double hsum_wide(__m512 s) {
    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(s));
    __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
    return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
}

static inline __m512 row_sum_v(const float *x, int64_t n) {
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
    return _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
}

static inline __m512 row_sq_dev_v(const float *x, int64_t n, __m512 m) {
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
    return _mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3));
}

/* a row's mean and 1 / sqrt(var + eps), as v1 computes them */
static inline void row_stats_v2(const float *x, int64_t n, float eps, float *mean_out,
                                float *rstd_out) {
    const float mean = (float)(hsum_wide(row_sum_v(x, n)) / (double)n);
    const double var = hsum_wide(row_sq_dev_v(x, n, _mm512_set1_ps(mean))) / (double)n;
    *mean_out = mean;
    *rstd_out = (float)(1.0 / sqrt(var + (double)eps));
}

static inline void row_norm_v2(const float *x, float *y, uint16_t *yb, const float *w,
                               const float *b, int64_t n, float eps) {
    float mean, rstd;
    row_stats_v2(x, n, eps, &mean, &rstd);
    const __m512 m = _mm512_set1_ps(mean), r = _mm512_set1_ps(rstd);
    /* (v1's output loop, masked: an unmasked body for the whole vectors, tried, made GPT-2's
     * norms 12-21 % slower in its runs, though not warm alone; benchmarks/results/norms18.md) */
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

/* ln_f32's arguments and result, v2's rows (`row_norm_v2`: the horizontal sums in vector
 * registers; helper norms18). */
int ln_f32_v2(const float *x, float *y, uint16_t *yb, const float *w, const float *b,
              int64_t rows, int64_t n, int64_t sx, int64_t sy, int64_t syb, float eps,
              int64_t threads) {
#ifdef __AVX512F__
#ifndef __AVX512BF16__
    if (yb) return -1;
#endif
    if (!y && !yb) return -1;
    if (threads <= 1 || rows < 2) {
        for (int64_t i = 0; i < rows; i++)
            row_norm_v2(x + i * sx, y ? y + i * sy : NULL, yb ? yb + i * syb : NULL, w, b, n,
                        eps);
        return 0;
    }
#pragma omp parallel for num_threads((int)threads) schedule(static)
    for (int64_t i = 0; i < rows; i++)
        row_norm_v2(x + i * sx, y ? y + i * sy : NULL, yb ? yb + i * syb : NULL, w, b, n, eps);
    return 0;
#else
    (void)x; (void)y; (void)yb; (void)w; (void)b; (void)rows; (void)n; (void)sx; (void)sy;
    (void)syb; (void)eps; (void)threads;
    return -1;
#endif
}


/* ---- a layer norm followed by a masked sum over the tokens (helper norms18) ----
 * sentence-transformers' mean pooling after an encoder's last norm (MiniLM's):
 *     sum[b, n] = sum_t mask[b, t] * ((x[b, t, n] - mean_bt) * rstd_bt * w[n] + b[n])
 * and, where `divide`, out[b, n] = sum[b, n] / max(sum_t mask[b, t], clamp), else out = sum;
 * where `l2` too, then out[b, :] /= max(sqrt(sum_n out[b, n]^2), l2eps) (the L2 normalisation
 * of a sentence embedding; the sum of squares in double, rounded to float32 for the sqrt).
 * x: (B, T, N) float32, rows contiguous (row stride sx, batch stride sbx); mask: (B, T), float32
 * or (`mask_i64`) int64, converted to float32 (batch stride sm, token stride 1); out: (B, N)
 * (row stride so). Each row's mean and rstd are v2's (`row_stats_v2`); the row's normalised
 * values, times w, plus b, times the row's mask value, are added to the batch's float32 sums
 * in token order (every token, a zero mask value included: 0 * a finite value is 0, and a
 * non-finite one stays as the unfused program has it); the mask's count is a float32 sum in
 * token order. Threads split the B * T rows in static blocks, each into its own (B, N)
 * partial sums (`scratch`: threads * B * N floats), added in thread order at the end; one
 * thread adds into out directly. Returns 0, or -1 where this build has no kernel. */
#ifdef __AVX512F__
static inline float mask_at(const void *mask, int mask_i64, int64_t k) {
    return mask_i64 ? (float)((const int64_t *)mask)[k] : ((const float *)mask)[k];
}

static void pool_rows(const float *x, const void *mask, int mask_i64, const float *w,
                      const float *bias, float *acc, int64_t lo, int64_t hi, int64_t T,
                      int64_t N, int64_t sx, int64_t sbx, int64_t sm, int64_t so, float eps) {
    for (int64_t i = lo; i < hi; i++) {
        const int64_t bb = i / T, t = i % T;
        const float *row = x + bb * sbx + t * sx;
        float *a = acc + bb * so;
        const float mv = mask_at(mask, mask_i64, bb * sm + t);
        float mean, rstd;
        row_stats_v2(row, N, eps, &mean, &rstd);
        const __m512 m = _mm512_set1_ps(mean), r = _mm512_set1_ps(rstd), k = _mm512_set1_ps(mv);
        for (int64_t j = 0; j < N; j += 16) {
            __mmask16 q = tail_mask(N - j);
            __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(q, row + j), m), r);
            if (w) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(q, w + j));
            if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(q, bias + j));
            v = _mm512_fmadd_ps(v, k, _mm512_maskz_loadu_ps(q, a + j));
            _mm512_mask_storeu_ps(a + j, q, v);
        }
    }
}

/* out[b, :] /= max(count of b's mask, clamp) for rows b0 .. b1, then (`l2`) by the row's
 * max(L2 norm, l2eps) */
static void pool_divide(const void *mask, int mask_i64, float *out, int64_t b0, int64_t b1,
                        int64_t T, int64_t N, int64_t sm, int64_t so, float clamp, int l2,
                        float l2eps) {
    for (int64_t bb = b0; bb < b1; bb++) {
        float c = 0.0f;
        for (int64_t t = 0; t < T; t++) c += mask_at(mask, mask_i64, bb * sm + t);
        const float d = c > clamp ? c : clamp;  /* max(count, clamp) */
        const __m512 dv = _mm512_set1_ps(d);
        float *o = out + bb * so;
        for (int64_t j = 0; j < N; j += 16) {
            __mmask16 q = tail_mask(N - j);
            _mm512_mask_storeu_ps(o + j, q, _mm512_div_ps(_mm512_maskz_loadu_ps(q, o + j), dv));
        }
        if (!l2) continue;
        double ss = 0.0;
        for (int64_t j = 0; j < N; j++) ss += (double)o[j] * (double)o[j];
        const float nrm = sqrtf((float)ss);
        const __m512 nv = _mm512_set1_ps(nrm > l2eps ? nrm : l2eps);  /* max(norm, eps) */
        for (int64_t j = 0; j < N; j += 16) {
            __mmask16 q = tail_mask(N - j);
            _mm512_mask_storeu_ps(o + j, q, _mm512_div_ps(_mm512_maskz_loadu_ps(q, o + j), nv));
        }
    }
}
#endif

int ln_pool_f32(const float *x, const void *mask, int64_t mask_i64, const float *w,
                const float *b, float *out, float *scratch, int64_t B, int64_t T, int64_t N,
                int64_t sx, int64_t sbx, int64_t sm, int64_t so, float eps, int64_t divide,
                float clamp, int64_t l2, float l2eps, int64_t threads) {
#ifdef __AVX512F__
    const int mi = mask_i64 != 0;
    for (int64_t bb = 0; bb < B; bb++)
        for (int64_t j = 0; j < N; j++) out[bb * so + j] = 0.0f;
    const int64_t rows = B * T;
    if (threads <= 1 || rows < 2 || !scratch) {
        pool_rows(x, mask, mi, w, b, out, 0, rows, T, N, sx, sbx, sm, so, eps);
        if (divide) pool_divide(mask, mi, out, 0, B, T, N, sm, so, clamp, l2 != 0, l2eps);
        return 0;
    }
    const int64_t nt = threads;
#pragma omp parallel num_threads((int)nt)
    {
        const int64_t tid = omp_get_thread_num(), team = omp_get_num_threads();
        float *acc = scratch + tid * B * N;
        for (int64_t j = 0; j < B * N; j++) acc[j] = 0.0f;
        const int64_t lo = rows * tid / team, hi = rows * (tid + 1) / team;
        pool_rows(x, mask, mi, w, b, acc, lo, hi, T, N, sx, sbx, sm, N, eps);
#pragma omp barrier
        /* the sums: thread tid adds its share of the (B, N) values */
        const int64_t total = B * N, c0 = total * tid / team, c1 = total * (tid + 1) / team;
        for (int64_t c = c0; c < c1; c++) {
            float s = 0.0f;
            for (int64_t u = 0; u < team; u++) s += scratch[u * total + c];
            out[(c / N) * so + c % N] = s;
        }
        if (divide) {
#pragma omp barrier
            pool_divide(mask, mi, out, B * tid / team, B * (tid + 1) / team, T, N, sm, so, clamp,
                        l2 != 0, l2eps);
        }
    }
    return 0;
#else
    (void)x; (void)mask; (void)mask_i64; (void)w; (void)b; (void)out; (void)scratch; (void)B;
    (void)T; (void)N; (void)sx; (void)sbx; (void)sm; (void)so; (void)eps; (void)divide;
    (void)clamp; (void)l2; (void)l2eps; (void)threads;
    return -1;
#endif
}

/* ---- embeddings summed, then a layer norm (helper norms18) ----
 * An encoder's first norm over its embeddings (BERT's, MiniLM's): for each of the `rows` =
 * B * T rows (row i: batch i / T, token t = i % T)
 *     e = part_0 + part_1 + ... (float32, added in that order)
 *     y[i, :] = (e - mean) * rstd * w + b        (v2's row statistics)
 * part k: with idx[k] (int64, B * T), row idx[k][i] of the table tab[k] (vocab[k] rows of N;
 * a negative index counts from the end), else row t of tab[k] (a (T, N) table, the position
 * embeddings). Each row summed into the thread's N floats of `scratch` (threads * N), then
 * normalised into y (row stride sy). Returns 0, -1 where this build has no kernel, -2 where an
 * index is out of range (y then partly written). */
#ifndef EMBED_AHEAD
#define EMBED_AHEAD 4
#endif
#ifdef __AVX512F__
static int embed_rows(float *y, const float *w, const float *b, int64_t lo, int64_t hi,
                      int64_t T, int64_t N, int64_t sy, float eps, int64_t nparts,
                      const float *const *tab, const int64_t *const *idx, const int64_t *vocab,
                      float *e) {
    for (int64_t i = lo; i < hi; i++) {
        const int64_t t = i % T;
        if (i + EMBED_AHEAD < hi) {  /* the gathered rows a few rows ahead: random rows */
            for (int64_t k = 0; k < nparts; k++) {
                if (!idx[k]) continue;
                int64_t ix = idx[k][i + EMBED_AHEAD];
                if (ix < 0) ix += vocab[k];
                if (ix < 0 || ix >= vocab[k]) continue;  /* (said when that row is reached) */
                const char *p = (const char *)(tab[k] + ix * N);
                for (int64_t j = 0; j < N * 4; j += 64) _mm_prefetch(p + j, _MM_HINT_T0);
            }
        }
        for (int64_t k = 0; k < nparts; k++) {
            const float *src;
            if (idx[k]) {
                int64_t ix = idx[k][i];
                if (ix < 0) ix += vocab[k];
                if (ix < 0 || ix >= vocab[k]) return -2;
                src = tab[k] + ix * N;
            } else {
                src = tab[k] + t * N;
            }
            for (int64_t j = 0; j < N; j += 16) {
                __mmask16 q = tail_mask(N - j);
                __m512 v = _mm512_maskz_loadu_ps(q, src + j);
                if (k) v = _mm512_add_ps(_mm512_maskz_loadu_ps(q, e + j), v);
                _mm512_mask_storeu_ps(e + j, q, v);
            }
        }
        row_norm_v2(e, y + i * sy, NULL, w, b, N, eps);
    }
    return 0;
}
#endif

int ln_embed_f32(float *y, const float *w, const float *b, int64_t rows, int64_t T, int64_t N,
                 int64_t sy, float eps, int64_t nparts, const float *const *tab,
                 const int64_t *const *idx, const int64_t *vocab, float *scratch,
                 int64_t threads) {
#ifdef __AVX512F__
    if (threads <= 1 || rows < 2)
        return embed_rows(y, w, b, 0, rows, T, N, sy, eps, nparts, tab, idx, vocab, scratch);
    int rc = 0;
#pragma omp parallel num_threads((int)threads) reduction(min : rc)
    {
        const int64_t tid = omp_get_thread_num(), team = omp_get_num_threads();
        rc = embed_rows(y, w, b, rows * tid / team, rows * (tid + 1) / team, T, N, sy, eps,
                        nparts, tab, idx, vocab, scratch + tid * N);
    }
    return rc;
#else
    (void)y; (void)w; (void)b; (void)rows; (void)T; (void)N; (void)sy; (void)eps; (void)nparts;
    (void)tab; (void)idx; (void)vocab; (void)scratch; (void)threads;
    return -1;
#endif
}
