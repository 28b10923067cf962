/* Winograd F(4x4, 3x3) convolution of float32 channels-last activations, one pass per block of
 * tiles (helper wino13, issue 10).
 *
 * The torch route (torch_lowering/winograd.py) runs the input transform, the 36 products and
 * the output transform as separate passes over megabyte temporaries; here one job does all
 * three for a block of `tb` 4x4 output tiles, its buffers inside the core's L2:
 *
 *   1. input transform: each tile's 6x6 window (zero outside the image: no padded copy) into
 *      V[p][t][c] (p = a * 6 + b the point of the transformed tile, t the tile in the block),
 *   2. per block of 64 output channels, the 36 products V[p] (tb x C) x U[p] (C x 64) into
 *      M[p][t][64] with a register-blocked micro-kernel (6 tiles x 4 vectors of 16 channels:
 *      24 accumulators, the transformed weight's 16-wide rows loaded once per input channel),
 *   3. the output transform A^T M A of each tile, the bias and the epilogue (the add of a
 *      residual before or after the activation, relu, clip or silu) written straight into the
 *      channels-last output, cropped to the image.
 *
 * Threads split jobs = (tile block, range of 64-channel output blocks): `omp for` over them.
 * The transformed weight U is packed by the caller: per 64-channel block kb (its width kw, a
 * multiple of 16, the last one possibly narrower, K padded with zeros to a multiple of 16),
 * the 36 matrices (C, kw) one after another.
 */
#include <stdint.h>
#include <stddef.h>
#include <omp.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

typedef struct {
    const void *x;       /* input (N, H, W, C) by strides sxn, sxh, sxw; channel stride 1 */
    const float *wt;     /* packed transformed weight (see above) */
    const float *bias;   /* (K) or NULL */
    void *y;             /* output (N, Ho, Wo, K) by strides syn, syh, syw; channel stride 1 */
    const void *other;   /* add operand (N, Ho, Wo, K) by strides son, soh, sow, or NULL */
    float *work;         /* threads x (36 * tb * cs + 36 * tb * 64) floats */
    int64_t n, c, h, w, top, left, ho, wo, k;
    int64_t sxn, sxh, sxw, syn, syh, syw, son, soh, sow;
    int64_t act;         /* 0 none, 1 relu, 2 clip(lo, hi), 3 silu (swish) */
    int64_t add;         /* 0 none, 1 before the activation, 2 after it */
    double lo, hi;
    int64_t tb;          /* tiles per block */
    int64_t ksplit;      /* ranges of 64-channel output blocks per tile block */
    int64_t threads;
    /* element types of x, y and other, all the same: 0 float32, 1 bf16 (bf16 read and
     * widened to float32 inside the transforms, the result rounded to bf16 (nearest even) as
     * it is stored; only where wino_f43_bf16_supported()) */
    int64_t xbf16, ybf16, obf16;
} wino_args;

/* 1 where this build has the kernel (AVX-512F), 0 where it does not (the caller's library
 * route runs instead) */
int wino_f43_supported(void) {
#ifdef __AVX512F__
    return 1;
#else
    return 0;
#endif
}

/* 1 where this build reads and writes bf16 activations (AVX-512 BF16, BW, VL), else 0 */
int wino_f43_bf16_supported(void) {
#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__)
    return 1;
#else
    return 0;
#endif
}

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__)
#define WINO_BF16 1
#else
#define WINO_BF16 0
#endif

/* floats of one thread's workspace */
int64_t wino_f43_work_floats(int64_t c, int64_t tb) {
    int64_t cs = (c + 15) / 16 * 16;
    return 36 * tb * cs + 36 * tb * 64 + 16;
}

#ifdef __AVX512F__

#define KB 64

/* M[r][0 : 16 NV] = sum over c of V[r][c] U[c][0 : 16 NV] for R <= 6 tile rows: 6 x 4
 * accumulators named one by one (GCC keeps an array of them on the stack around the loop);
 * those past R and NV are dead code once inlined with constant R and NV */
static inline __attribute__((always_inline)) void micro(
    const float *v, int64_t vs, const float *w, int64_t kw, int64_t c, float *m,
    const int R, const int NV) {
    __m512 c00 = _mm512_setzero_ps(), c01 = _mm512_setzero_ps(), c02 = _mm512_setzero_ps(), c03 = _mm512_setzero_ps();
    __m512 c10 = _mm512_setzero_ps(), c11 = _mm512_setzero_ps(), c12 = _mm512_setzero_ps(), c13 = _mm512_setzero_ps();
    __m512 c20 = _mm512_setzero_ps(), c21 = _mm512_setzero_ps(), c22 = _mm512_setzero_ps(), c23 = _mm512_setzero_ps();
    __m512 c30 = _mm512_setzero_ps(), c31 = _mm512_setzero_ps(), c32 = _mm512_setzero_ps(), c33 = _mm512_setzero_ps();
    __m512 c40 = _mm512_setzero_ps(), c41 = _mm512_setzero_ps(), c42 = _mm512_setzero_ps(), c43 = _mm512_setzero_ps();
    __m512 c50 = _mm512_setzero_ps(), c51 = _mm512_setzero_ps(), c52 = _mm512_setzero_ps(), c53 = _mm512_setzero_ps();
    for (int64_t ci = 0; ci < c; ci++) {
        const float *wc = w + ci * kw;
        __m512 b0 = _mm512_loadu_ps(wc), b1, b2, b3;
        if (NV > 1) b1 = _mm512_loadu_ps(wc + 16);
        if (NV > 2) b2 = _mm512_loadu_ps(wc + 32);
        if (NV > 3) b3 = _mm512_loadu_ps(wc + 48);
        if (R > 0) {
            __m512 a = _mm512_set1_ps(v[0 * vs + ci]);
            c00 = _mm512_fmadd_ps(a, b0, c00);
            if (NV > 1) c01 = _mm512_fmadd_ps(a, b1, c01);
            if (NV > 2) c02 = _mm512_fmadd_ps(a, b2, c02);
            if (NV > 3) c03 = _mm512_fmadd_ps(a, b3, c03);
        }
        if (R > 1) {
            __m512 a = _mm512_set1_ps(v[1 * vs + ci]);
            c10 = _mm512_fmadd_ps(a, b0, c10);
            if (NV > 1) c11 = _mm512_fmadd_ps(a, b1, c11);
            if (NV > 2) c12 = _mm512_fmadd_ps(a, b2, c12);
            if (NV > 3) c13 = _mm512_fmadd_ps(a, b3, c13);
        }
        if (R > 2) {
            __m512 a = _mm512_set1_ps(v[2 * vs + ci]);
            c20 = _mm512_fmadd_ps(a, b0, c20);
            if (NV > 1) c21 = _mm512_fmadd_ps(a, b1, c21);
            if (NV > 2) c22 = _mm512_fmadd_ps(a, b2, c22);
            if (NV > 3) c23 = _mm512_fmadd_ps(a, b3, c23);
        }
        if (R > 3) {
            __m512 a = _mm512_set1_ps(v[3 * vs + ci]);
            c30 = _mm512_fmadd_ps(a, b0, c30);
            if (NV > 1) c31 = _mm512_fmadd_ps(a, b1, c31);
            if (NV > 2) c32 = _mm512_fmadd_ps(a, b2, c32);
            if (NV > 3) c33 = _mm512_fmadd_ps(a, b3, c33);
        }
        if (R > 4) {
            __m512 a = _mm512_set1_ps(v[4 * vs + ci]);
            c40 = _mm512_fmadd_ps(a, b0, c40);
            if (NV > 1) c41 = _mm512_fmadd_ps(a, b1, c41);
            if (NV > 2) c42 = _mm512_fmadd_ps(a, b2, c42);
            if (NV > 3) c43 = _mm512_fmadd_ps(a, b3, c43);
        }
        if (R > 5) {
            __m512 a = _mm512_set1_ps(v[5 * vs + ci]);
            c50 = _mm512_fmadd_ps(a, b0, c50);
            if (NV > 1) c51 = _mm512_fmadd_ps(a, b1, c51);
            if (NV > 2) c52 = _mm512_fmadd_ps(a, b2, c52);
            if (NV > 3) c53 = _mm512_fmadd_ps(a, b3, c53);
        }
    }
    if (R > 0) _mm512_storeu_ps(m + 0 * KB + 0, c00);
    if (R > 0 && NV > 1) _mm512_storeu_ps(m + 0 * KB + 16, c01);
    if (R > 0 && NV > 2) _mm512_storeu_ps(m + 0 * KB + 32, c02);
    if (R > 0 && NV > 3) _mm512_storeu_ps(m + 0 * KB + 48, c03);
    if (R > 1) _mm512_storeu_ps(m + 1 * KB + 0, c10);
    if (R > 1 && NV > 1) _mm512_storeu_ps(m + 1 * KB + 16, c11);
    if (R > 1 && NV > 2) _mm512_storeu_ps(m + 1 * KB + 32, c12);
    if (R > 1 && NV > 3) _mm512_storeu_ps(m + 1 * KB + 48, c13);
    if (R > 2) _mm512_storeu_ps(m + 2 * KB + 0, c20);
    if (R > 2 && NV > 1) _mm512_storeu_ps(m + 2 * KB + 16, c21);
    if (R > 2 && NV > 2) _mm512_storeu_ps(m + 2 * KB + 32, c22);
    if (R > 2 && NV > 3) _mm512_storeu_ps(m + 2 * KB + 48, c23);
    if (R > 3) _mm512_storeu_ps(m + 3 * KB + 0, c30);
    if (R > 3 && NV > 1) _mm512_storeu_ps(m + 3 * KB + 16, c31);
    if (R > 3 && NV > 2) _mm512_storeu_ps(m + 3 * KB + 32, c32);
    if (R > 3 && NV > 3) _mm512_storeu_ps(m + 3 * KB + 48, c33);
    if (R > 4) _mm512_storeu_ps(m + 4 * KB + 0, c40);
    if (R > 4 && NV > 1) _mm512_storeu_ps(m + 4 * KB + 16, c41);
    if (R > 4 && NV > 2) _mm512_storeu_ps(m + 4 * KB + 32, c42);
    if (R > 4 && NV > 3) _mm512_storeu_ps(m + 4 * KB + 48, c43);
    if (R > 5) _mm512_storeu_ps(m + 5 * KB + 0, c50);
    if (R > 5 && NV > 1) _mm512_storeu_ps(m + 5 * KB + 16, c51);
    if (R > 5 && NV > 2) _mm512_storeu_ps(m + 5 * KB + 32, c52);
    if (R > 5 && NV > 3) _mm512_storeu_ps(m + 5 * KB + 48, c53);
}

#define MK(R, NV) \
    static void micro_##R##_##NV(const float *v, int64_t vs, const float *w, int64_t kw, \
                                 int64_t c, float *m) { micro(v, vs, w, kw, c, m, R, NV); }
#define MKR(R) MK(R, 1) MK(R, 2) MK(R, 3) MK(R, 4)
MKR(1) MKR(2) MKR(3) MKR(4) MKR(5) MKR(6)

/* The activations' element type is a compile-time constant BF of the always-inlined
 * functions below (0 float32, 1 bf16): the float32 path is the code it was before bf16 */
#define ES(BF) ((BF) ? 2 : 4) /* bytes an element */

/* 16 (masked) values at p as float32: float32, or bf16 widened (a shift: exact) */
static inline __attribute__((always_inline)) __m512 load16(const char *p, __mmask16 mask,
                                                          const int BF) {
#if WINO_BF16
    if (BF) {
        __m256i h = _mm256_maskz_loadu_epi16(mask, p);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
#endif
    return _mm512_maskz_loadu_ps(mask, p);
}

/* r stored (masked) at p: float32, or rounded to bf16 (nearest even) */
static inline __attribute__((always_inline)) void store16(char *p, __mmask16 mask, __m512 r,
                                                         const int BF) {
#if WINO_BF16
    if (BF) {
        _mm256_mask_storeu_epi16(p, mask, (__m256i)_mm512_cvtneps_pbh(r));
        return;
    }
#endif
    _mm512_mask_storeu_ps(p, mask, r);
}

typedef void (*micro_fn)(const float *, int64_t, const float *, int64_t, int64_t, float *);
#define ROW(R) {micro_##R##_1, micro_##R##_2, micro_##R##_3, micro_##R##_4}
static const micro_fn MICRO[6][4] = {ROW(1), ROW(2), ROW(3), ROW(4), ROW(5), ROW(6)};

/* tile t of the block: its 6x6 window transformed into V[p][t][0 : cs] (XBF: x is bf16) */
static inline __attribute__((always_inline)) void input_tile_t(
    const wino_args *a, int64_t g, float *v, int64_t t, int64_t tb, int64_t cs, const int XBF) {
    int64_t th = (a->ho + 3) / 4, tw = (a->wo + 3) / 4;
    int64_t img = g / (th * tw), rem = g % (th * tw);
    int64_t y0 = (rem / tw) * 4 - a->top, x0 = (rem % tw) * 4 - a->left;
    const char *base = (const char *)a->x + img * a->sxn * ES(XBF);
    const char *rows[6];
    int okc[6];
    for (int i = 0; i < 6; i++) {
        int64_t r = y0 + i;
        rows[i] = (r >= 0 && r < a->h) ? base + r * a->sxh * ES(XBF) : NULL;
        okc[i] = (x0 + i >= 0 && x0 + i < a->w);
    }
    const __m512 four = _mm512_set1_ps(4.f), five = _mm512_set1_ps(5.f);
    const __m512 two = _mm512_set1_ps(2.f);
    for (int64_t c0 = 0; c0 < a->c; c0 += 16) {
        __mmask16 mask = (a->c - c0 >= 16) ? (__mmask16)0xFFFF
                                           : (__mmask16)((1u << (a->c - c0)) - 1);
        __m512 tmp[6][6]; /* [row i][point b]: the row pass */
        for (int i = 0; i < 6; i++) {
            __m512 d[6];
            for (int j = 0; j < 6; j++)
                d[j] = (rows[i] && okc[j])
                           ? load16(rows[i] + ((x0 + j) * a->sxw + c0) * ES(XBF), mask, XBF)
                           : _mm512_setzero_ps();
            __m512 t0 = _mm512_fnmadd_ps(four, d[2], d[4]);  /* d4 - 4 d2 */
            __m512 t1 = _mm512_fnmadd_ps(four, d[1], d[3]);  /* d3 - 4 d1 */
            __m512 t2 = _mm512_sub_ps(d[4], d[2]);
            __m512 t3 = _mm512_mul_ps(two, _mm512_sub_ps(d[3], d[1]));
            tmp[i][0] = _mm512_fmadd_ps(four, d[0], _mm512_fnmadd_ps(five, d[2], d[4]));
            tmp[i][1] = _mm512_add_ps(t0, t1);
            tmp[i][2] = _mm512_sub_ps(t0, t1);
            tmp[i][3] = _mm512_add_ps(t2, t3);
            tmp[i][4] = _mm512_sub_ps(t2, t3);
            tmp[i][5] = _mm512_fmadd_ps(four, d[1], _mm512_fnmadd_ps(five, d[3], d[5]));
        }
        for (int b = 0; b < 6; b++) {
            __m512 t0 = _mm512_fnmadd_ps(four, tmp[2][b], tmp[4][b]);
            __m512 t1 = _mm512_fnmadd_ps(four, tmp[1][b], tmp[3][b]);
            __m512 t2 = _mm512_sub_ps(tmp[4][b], tmp[2][b]);
            __m512 t3 = _mm512_mul_ps(two, _mm512_sub_ps(tmp[3][b], tmp[1][b]));
            __m512 o[6];
            o[0] = _mm512_fmadd_ps(four, tmp[0][b], _mm512_fnmadd_ps(five, tmp[2][b], tmp[4][b]));
            o[1] = _mm512_add_ps(t0, t1);
            o[2] = _mm512_sub_ps(t0, t1);
            o[3] = _mm512_add_ps(t2, t3);
            o[4] = _mm512_sub_ps(t2, t3);
            o[5] = _mm512_fmadd_ps(four, tmp[1][b], _mm512_fnmadd_ps(five, tmp[3][b], tmp[5][b]));
            for (int aa = 0; aa < 6; aa++)
                _mm512_storeu_ps(v + ((aa * 6 + b) * tb + t) * cs + c0, o[aa]);
        }
    }
}

/* exp(x) for x in [-88, 88] (the caller clamps): x = n ln2 + r, |r| <= ln2 / 2, e^r by its
 * degree-6 Taylor polynomial (relative error about 1e-7 after float32 rounding), times 2^n */
static inline __m512 exp512(__m512 x) {
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 ln2hi = _mm512_set1_ps(0.693359375f), ln2lo = _mm512_set1_ps(-2.12194440e-4f);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, ln2hi, x);
    r = _mm512_fnmadd_ps(n, ln2lo, r);
    __m512 p = _mm512_set1_ps(1.f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}

/* silu(x) = x / (1 + exp(-x)); exp(-x) clamped to [-88, 100]: above 88 it overflows to +inf
   as in torch (silu(-3e38) = -0, silu(-inf) = NaN) */
static inline __m512 silu512(__m512 x) {
    __m512 t = _mm512_min_ps(_mm512_max_ps(_mm512_sub_ps(_mm512_setzero_ps(), x),
                                           _mm512_set1_ps(-88.f)), _mm512_set1_ps(100.f));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.f), exp512(t)));
}

/* the epilogue on r; o: the add operand's 16 values */
static inline __attribute__((always_inline)) __m512 epilogue(
    const wino_args *a, __m512 r, const char *o, __mmask16 mask, const int BF) {
    if (a->add == 1) r = _mm512_add_ps(r, load16(o, mask, BF));
    /* (max / min return their second operand where either is NaN: r second, so that a NaN
     * stays NaN as in torch's relu and clamp) */
    if (a->act == 1) {
        r = _mm512_max_ps(_mm512_setzero_ps(), r);
    } else if (a->act == 2) {
        r = _mm512_min_ps(_mm512_set1_ps((float)a->hi),
                          _mm512_max_ps(_mm512_set1_ps((float)a->lo), r));
    } else if (a->act == 3) {
        r = silu512(r);
    }
    if (a->add == 2) r = _mm512_add_ps(r, load16(o, mask, BF));
    return r;
}

/* tile t's output channels [k0, k0 + 16 * nv) from M[p][t][0 : 16 * nv] */
static inline __attribute__((always_inline)) void output_tile(
    const wino_args *a, int64_t g, const float *m, int64_t t, int64_t tb, int64_t k0, int nv,
    const int BF) {
    int64_t th = (a->ho + 3) / 4, tw = (a->wo + 3) / 4;
    int64_t img = g / (th * tw), rem = g % (th * tw);
    int64_t oy = (rem / tw) * 4, ox = (rem % tw) * 4;
    int rows = (int)(a->ho - oy < 4 ? a->ho - oy : 4);
    int cols = (int)(a->wo - ox < 4 ? a->wo - ox : 4);
    const __m512 two = _mm512_set1_ps(2.f), four = _mm512_set1_ps(4.f);
    const __m512 eight = _mm512_set1_ps(8.f);
    for (int j = 0; j < nv; j++) {
        int64_t kk = k0 + 16 * j;
        if (kk >= a->k) break;
        __mmask16 mask = (a->k - kk >= 16) ? (__mmask16)0xFFFF
                                           : (__mmask16)((1u << (a->k - kk)) - 1);
        __m512 bias = a->bias ? _mm512_maskz_loadu_ps(mask, a->bias + kk) : _mm512_setzero_ps();
        __m512 tmp[4][6]; /* [output row p][point b] */
        for (int b = 0; b < 6; b++) {
            __m512 mm[6];
            for (int aa = 0; aa < 6; aa++)
                mm[aa] = _mm512_loadu_ps(m + ((aa * 6 + b) * tb + t) * KB + 16 * j);
            __m512 s12 = _mm512_add_ps(mm[1], mm[2]), d12 = _mm512_sub_ps(mm[1], mm[2]);
            __m512 s34 = _mm512_add_ps(mm[3], mm[4]), d34 = _mm512_sub_ps(mm[3], mm[4]);
            tmp[0][b] = _mm512_add_ps(_mm512_add_ps(mm[0], s12), s34);
            tmp[1][b] = _mm512_fmadd_ps(two, d34, d12);
            tmp[2][b] = _mm512_fmadd_ps(four, s34, s12);
            tmp[3][b] = _mm512_add_ps(_mm512_fmadd_ps(eight, d34, d12), mm[5]);
        }
        for (int p = 0; p < rows; p++) {
            __m512 *q = tmp[p];
            __m512 s12 = _mm512_add_ps(q[1], q[2]), d12 = _mm512_sub_ps(q[1], q[2]);
            __m512 s34 = _mm512_add_ps(q[3], q[4]), d34 = _mm512_sub_ps(q[3], q[4]);
            __m512 o[4];
            o[0] = _mm512_add_ps(_mm512_add_ps(q[0], s12), s34);
            o[1] = _mm512_fmadd_ps(two, d34, d12);
            o[2] = _mm512_fmadd_ps(four, s34, s12);
            o[3] = _mm512_add_ps(_mm512_fmadd_ps(eight, d34, d12), q[5]);
            char *yrow = (char *)a->y + (img * a->syn + (oy + p) * a->syh + kk) * ES(BF);
            const char *orow = a->other ? (const char *)a->other +
                                              (img * a->son + (oy + p) * a->soh + kk) * ES(BF)
                                        : NULL;
            for (int qq = 0; qq < cols; qq++) {
                __m512 r = _mm512_add_ps(o[qq], bias);
                r = epilogue(a, r, orow ? orow + (ox + qq) * a->sow * ES(BF) : NULL, mask, BF);
                store16(yrow + (ox + qq) * a->syw * ES(BF), mask, r, BF);
            }
        }
    }
}

/* the two per-tile passes as functions of their own per type (called, not inlined into the
 * job loop: the float32 path then compiles as it did before bf16, 3 % faster than inlined) */
#define TILE_FNS(NAME, BF)                                                                     \
    static __attribute__((noinline)) void input_tile_##NAME(                                  \
        const wino_args *a, int64_t g, float *v, int64_t t, int64_t tb, int64_t cs) {          \
        input_tile_t(a, g, v, t, tb, cs, BF);                                                  \
    }                                                                                          \
    static __attribute__((noinline)) void output_tile_##NAME(                                 \
        const wino_args *a, int64_t g, const float *m, int64_t t, int64_t tb, int64_t k0,      \
        int nv) {                                                                              \
        output_tile(a, g, m, t, tb, k0, nv, BF);                                               \
    }
TILE_FNS(f32, 0)
TILE_FNS(bf16, 1)

/* the convolution of activations of one type BF (a constant once inlined) */
static inline __attribute__((always_inline)) void run_t(const wino_args *a, const int BF) {
    int64_t th = (a->ho + 3) / 4, tw = (a->wo + 3) / 4;
    int64_t tiles = a->n * th * tw, tb = a->tb;
    int64_t nblocks = (tiles + tb - 1) / tb;
    int64_t k16 = (a->k + 15) / 16 * 16, nkb = (k16 + KB - 1) / KB;
    int64_t ksplit = a->ksplit < 1 ? 1 : (a->ksplit > nkb ? nkb : a->ksplit);
    int64_t jobs = nblocks * ksplit;
    int64_t cs = (a->c + 15) / 16 * 16;
    int64_t per = wino_f43_work_floats(a->c, tb);
#pragma omp parallel num_threads((int)a->threads)
    {
        float *v = a->work + (int64_t)omp_get_thread_num() * per;
        v = (float *)(((uintptr_t)v + 63) & ~(uintptr_t)63);
        float *m = v + 36 * tb * cs;
#pragma omp for schedule(static)
        for (int64_t job = 0; job < jobs; job++) {
            int64_t blk = job / ksplit, s = job % ksplit;
            int64_t g0 = blk * tb, cnt = tiles - g0 < tb ? tiles - g0 : tb;
            for (int64_t t = 0; t < cnt; t++) {
                if (BF)
                    input_tile_bf16(a, g0 + t, v, t, tb, cs);
                else
                    input_tile_f32(a, g0 + t, v, t, tb, cs);
            }
            int64_t kb0 = s * nkb / ksplit, kb1 = (s + 1) * nkb / ksplit;
            for (int64_t kb = kb0; kb < kb1; kb++) {
                int64_t k0 = kb * KB;
                int64_t kw = k16 - k0 < KB ? k16 - k0 : KB;
                int nv = (int)(kw / 16);
                const float *wk = a->wt + 36 * a->c * k0;
                for (int p = 0; p < 36; p++) {
                    const float *wp = wk + p * a->c * kw;
                    for (int64_t t0 = 0; t0 < cnt; t0 += 6) {
                        int r = (int)(cnt - t0 < 6 ? cnt - t0 : 6);
                        MICRO[r - 1][nv - 1](v + (p * tb + t0) * cs, cs, wp, kw, a->c,
                                             m + (p * tb + t0) * KB);
                    }
                }
                for (int64_t t = 0; t < cnt; t++) {
                    if (BF)
                        output_tile_bf16(a, g0 + t, m, t, tb, k0, nv);
                    else
                        output_tile_f32(a, g0 + t, m, t, tb, k0, nv);
                }
            }
        }
    }
}

static void run_f32(const wino_args *a) { run_t(a, 0); }
#if WINO_BF16
static void run_bf16(const wino_args *a) { run_t(a, 1); }
#endif

/* the convolution; 0 done, -1 not built for this machine (or bf16 asked of a build without
 * it), -2 activations of mixed types (x, y and other are all float32 or all bf16) */
int wino_f43_run(const wino_args *a) {
    if (a->xbf16 != a->ybf16 || (a->other && a->obf16 != a->xbf16)) return -2;
    if (!a->xbf16) {
        run_f32(a);
        return 0;
    }
#if WINO_BF16
    run_bf16(a);
    return 0;
#else
    return -1;
#endif
}

#else /* no AVX-512F: not built for this machine */

int wino_f43_run(const wino_args *a) {
    (void)a;
    return -1;
}

#endif
