/* A whole inverted-residual block (MobileNetV2) of float32 channels-last activations in one
 * call (helper mbv14, issue 10):
 *
 *   e = clip(x (1x1) We + be)                 the expansion (or a copy of x: no expansion)
 *   d = clip(dw3x3(e, Wd, stride 1|2, pad 1) + bd)
 *   y = act(d (1x1) Wp + bp [+ r])            the projection, the residual r optional
 *
 * Per job (an image and a range of its output rows), strip by strip of `rows` output rows: the
 * input rows a strip needs are expanded into E (rows x W x m16, in the core's L2; the one or
 * two rows the previous strip expanded too are moved, not recomputed), the depthwise
 * convolution of the strip written to D (rows x Wo x m16), then D projected straight into the
 * channels-last output. The expanded tensor never leaves the cache; the threads split the jobs
 * with one `omp for` (one fork/join for the block instead of one per convolution).
 *
 * The 1x1 products use a register-blocked micro-kernel (6 pixels x 4 vectors of 16 channels:
 * 24 accumulators, the packed weight's 16-wide rows loaded once per input channel). Weights
 * are packed by the caller: a 1x1 weight (N, K) with N padded with zeros to a multiple of 16,
 * per block of 64 output channels starting at n0 (width bw = min(64, N16 - n0)) the (K, bw)
 * matrix at offset n0 * K; the depthwise weight as (9, m16), biases padded to 16 with zeros
 * (padded expanded channels then meet zero projection rows: they never reach the output).
 *
 * Parts (`native_mbconv.PARTS`, appended in order into one translation unit): mbconv_head.c
 * (the network's head and the block chain, split out of this file by mnv18), mbconv_bf16.c
 * (the bf16 block and stem), mbconv_bf16_head.c (the bf16 head and the bf16 block chain).
 */
#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <omp.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

typedef struct {
    const float *x;      /* input (N, H, W, cin) by strides sxn, sxh, sxw; channel stride 1 */
    const float *we;     /* packed expansion weight (m16 of cin), NULL: no expansion (m == cin) */
    const float *be;     /* (m16) */
    const float *wd;     /* (9, m16) */
    const float *bd;     /* (m16) */
    const float *wp;     /* packed projection weight (cout16 of m16) */
    const float *bp;     /* (cout16) */
    float *y;            /* output (N, Ho, Wo, cout) by strides syn, syh, syw; channel stride 1 */
    const float *other;  /* residual (N, Ho, Wo, cout) by strides son, soh, sow, or NULL */
    float *work;         /* threads x mbconv_work_floats(...) floats */
    int64_t n, cin, h, w, m, ho, wo, cout, stride;
    int64_t sxn, sxh, sxw, syn, syh, syw, son, soh, sow;
    double elo, ehi, dlo, dhi, plo, phi;  /* clip bounds (+-inf: none) */
    int64_t rows;        /* output rows per strip */
    int64_t chunks;      /* jobs per image (ranges of output rows) */
    int64_t threads;
    int64_t shared;      /* 1: image by image, E and D whole and shared by the threads, which
                            split the expansion's pixels, the depthwise rows, the projection's
                            pixels (no row expanded twice; two barriers) */
    int64_t stem;        /* mnv15: 0, or the stride (1, 2) of a 3x3 convolution (padding 1) of
                            the image x (N, cin, ih, iw) by strides sxn, sxc, sxh, sxw (any
                            layout) that is the expansion: E = clip(conv3x3(x) We + be), h x w
                            its output; We packed as a 1x1 weight of 9 cin inputs, (c, ky, kx) */
    int64_t ih, iw, sxc;
} mb_args;

/* 1 where this build has the kernel (AVX-512F), 0 where it does not */
int mbconv_supported(void) {
#ifdef __AVX512F__
    return 1;
#else
    return 0;
#endif
}

static int64_t up16(int64_t v) { return (v + 15) / 16 * 16; }

/* floats of a stem's padded input rows (3 of iw + 2 a channel; 0 without a stem) */
static int64_t stem_floats(const mb_args *a) {
    return a->stem ? up16(3 * a->cin * (a->iw + 2)) : 0;
}

/* floats of one thread's workspace (E, D and a zero row), 64-byte multiples */
int64_t mbconv_work_floats(int64_t w, int64_t m, int64_t wo, int64_t stride, int64_t rows) {
    int64_t m16 = up16(m);
    int64_t e = (rows * stride + 2) * w * m16, d = rows * wo * m16, z = w * m16;
    return up16(e) + up16(d) + up16(z) + 16;
}

/* floats a thread's workspace needs for a stem, beyond mbconv_work_floats (mb_args.stem) */
int64_t mbconv_stem_floats(int64_t w, int64_t cin, int64_t iw) {
    (void)w;
    return up16(3 * cin * (iw + 2));
}

/* floats of the shared mode's workspace (E and D of one image, a zero row) */
int64_t mbconv_shared_floats(int64_t h, int64_t w, int64_t m, int64_t ho, int64_t wo) {
    int64_t m16 = up16(m);
    return up16(h * w * m16) + up16(ho * wo * m16) + up16(w * m16) + 16;
}


#ifdef __AVX512F__

#define ACC(P) __m512 c##P##0 = bias0, c##P##1 = bias1, c##P##2 = bias2, c##P##3 = bias3;
/* one product into accumulator c: 512 bits, or 256 for the block's last vector when it
 * holds 8 channels or fewer (H: half the FMA work on cout = 24) */
#define FMAV(V, b, c)                                                                  \
    if (NV > V) {                                                                      \
        if (H && V == NV - 1)                                                          \
            c = _mm512_castps256_ps512(_mm256_fmadd_ps(_mm512_castps512_ps256(av),     \
                _mm512_castps512_ps256(b), _mm512_castps512_ps256(c)));                \
        else                                                                           \
            c = _mm512_fmadd_ps(av, b, c);                                             \
    }
#define FMA_ROW(P)                                                        \
    if (R > P) {                                                          \
        __m512 av = _mm512_set1_ps(a[P * lda + k]);                       \
        FMAV(0, b0, c##P##0) FMAV(1, b1, c##P##1)                         \
        FMAV(2, b2, c##P##2) FMAV(3, b3, c##P##3)                         \
    }
#define ST1(P, V)                                                                     \
    if (R > P && NV > V) {                                                            \
        __mmask16 mk = (V == NV - 1) ? last : (__mmask16)0xFFFF;                     \
        __m512 t = c##P##V;                                                           \
        if (r) t = _mm512_add_ps(t, _mm512_maskz_loadu_ps(mk, r + P * ldr + 16 * V)); \
        t = _mm512_min_ps(_mm512_max_ps(t, lo), hi);                                  \
        _mm512_mask_storeu_ps(c + P * ldc + 16 * V, mk, t);                           \
    }
#define ST(P) ST1(P, 0) ST1(P, 1) ST1(P, 2) ST1(P, 3)

/* c[p][0 : 16 NV] = act(a[p][0 : K] B (K x bw) + bias [+ r[p]]) for p < R <= 6, the last
 * vector stored under the mask `last`; the accumulators named one by one (an array of them
 * goes to the stack), those past R and NV dead code once inlined with constants */
static inline __attribute__((always_inline)) void micro(
    const float *a, int64_t lda, int64_t K, const float *b, int64_t bw, const float *bias,
    float *c, int64_t ldc, const float *r, int64_t ldr, __m512 lo, __m512 hi, __mmask16 last,
    const int R, const int NV, const int H) {
    __m512 bias0 = _mm512_loadu_ps(bias), bias1 = bias0, bias2 = bias0, bias3 = bias0;
    if (NV > 1) bias1 = _mm512_loadu_ps(bias + 16);
    if (NV > 2) bias2 = _mm512_loadu_ps(bias + 32);
    if (NV > 3) bias3 = _mm512_loadu_ps(bias + 48);
    ACC(0) ACC(1) ACC(2) ACC(3) ACC(4) ACC(5)
    for (int64_t k = 0; k < K; k++) {
        const float *bk = b + k * bw;
        __m512 b0 = _mm512_loadu_ps(bk), b1 = b0, b2 = b0, b3 = b0;
        if (NV > 1) b1 = _mm512_loadu_ps(bk + 16);
        if (NV > 2) b2 = _mm512_loadu_ps(bk + 32);
        if (NV > 3) b3 = _mm512_loadu_ps(bk + 48);
        FMA_ROW(0) FMA_ROW(1) FMA_ROW(2) FMA_ROW(3) FMA_ROW(4) FMA_ROW(5)
    }
    ST(0) ST(1) ST(2) ST(3) ST(4) ST(5)
}

typedef void (*micro_fn)(const float *, int64_t, int64_t, const float *, int64_t, const float *,
                         float *, int64_t, const float *, int64_t, __m512, __m512, __mmask16);
#define MK(R, NV, H)                                                                         \
    static void micro_##R##_##NV##_##H(const float *a, int64_t lda, int64_t K,               \
                                       const float *b, int64_t bw, const float *bias,        \
                                       float *c, int64_t ldc, const float *r, int64_t ldr,   \
                                       __m512 lo, __m512 hi, __mmask16 last) {               \
        micro(a, lda, K, b, bw, bias, c, ldc, r, ldr, lo, hi, last, R, NV, H);               \
    }
#define MKR(R, H) MK(R, 1, H) MK(R, 2, H) MK(R, 3, H) MK(R, 4, H)
#define MKH(H) MKR(1, H) MKR(2, H) MKR(3, H) MKR(4, H) MKR(5, H) MKR(6, H)
MKH(0) MKH(1)
#define ROW(R, H) {micro_##R##_1_##H, micro_##R##_2_##H, micro_##R##_3_##H, micro_##R##_4_##H}
#define TABLE(H) {ROW(1, H), ROW(2, H), ROW(3, H), ROW(4, H), ROW(5, H), ROW(6, H)}
static const micro_fn MICRO[2][6][4] = {TABLE(0), TABLE(1)};

/* a stem's products (mnv15): c[p][0 : 16 NV] = clip(sum over (q, kx) of pad[q pw + p s + kx]
 * B[3 q + kx] + bias) for pixels p < R, read straight from the padded input rows (q: channel
 * and kernel row) without an im2col copy; B packed as `micro`'s (K = 3 Q, width bw) */
static inline __attribute__((always_inline)) void stem_micro(
    const float *pad, int64_t pw, int64_t lda, int64_t Q, const float *b, int64_t bw,
    const float *bias, float *c, int64_t ldc, __m512 lo, __m512 hi, const int R, const int NV) {
    const int H = 0;
    const float *r = NULL;
    const int64_t ldr = 0, k = 0;
    const __mmask16 last = (__mmask16)0xFFFF;
    __m512 bias0 = _mm512_loadu_ps(bias), bias1 = bias0, bias2 = bias0, bias3 = bias0;
    if (NV > 1) bias1 = _mm512_loadu_ps(bias + 16);
    if (NV > 2) bias2 = _mm512_loadu_ps(bias + 32);
    if (NV > 3) bias3 = _mm512_loadu_ps(bias + 48);
    ACC(0) ACC(1) ACC(2) ACC(3) ACC(4) ACC(5)
    for (int64_t q = 0; q < Q; q++)
        for (int kx = 0; kx < 3; kx++) {
            const float *a = pad + q * pw + kx;
            const float *bk = b + (3 * q + kx) * bw;
            __m512 b0 = _mm512_loadu_ps(bk), b1 = b0, b2 = b0, b3 = b0;
            if (NV > 1) b1 = _mm512_loadu_ps(bk + 16);
            if (NV > 2) b2 = _mm512_loadu_ps(bk + 32);
            if (NV > 3) b3 = _mm512_loadu_ps(bk + 48);
            FMA_ROW(0) FMA_ROW(1) FMA_ROW(2) FMA_ROW(3) FMA_ROW(4) FMA_ROW(5)
        }
    ST(0) ST(1) ST(2) ST(3) ST(4) ST(5)
}

typedef void (*stem_fn)(const float *, int64_t, int64_t, int64_t, const float *, int64_t,
                        const float *, float *, int64_t, __m512, __m512);
#define MKS(R, NV)                                                                           \
    static void stem_##R##_##NV(const float *pad, int64_t pw, int64_t lda, int64_t Q,        \
                                const float *b, int64_t bw, const float *bias, float *c,     \
                                int64_t ldc, __m512 lo, __m512 hi) {                         \
        stem_micro(pad, pw, lda, Q, b, bw, bias, c, ldc, lo, hi, R, NV);                     \
    }
#define MKSR(R) MKS(R, 1) MKS(R, 2) MKS(R, 3) MKS(R, 4)
MKSR(1) MKSR(2) MKSR(3) MKSR(4) MKSR(5) MKSR(6)
#define SROW(R) {stem_##R##_1, stem_##R##_2, stem_##R##_3, stem_##R##_4}
static const stem_fn STEM[6][4] = {SROW(1), SROW(2), SROW(3), SROW(4), SROW(5), SROW(6)};

/* c (P x nvalid, rows ldc apart) = act(a (P x K, rows lda apart) B + bias [+ r]); B packed
 * (see the top), n16 its padded width; per 64-channel block, every 6 pixels */
static void gemm(const float *a, int64_t lda, int64_t P, int64_t K, const float *bp,
                 const float *bias, int64_t n16, int64_t nvalid, float *c, int64_t ldc,
                 const float *r, int64_t ldr, __m512 lo, __m512 hi) {
    for (int64_t n0 = 0; n0 < n16; n0 += 64) {
        int64_t bw = n16 - n0 < 64 ? n16 - n0 : 64;
        int nv = (int)(bw / 16);
        int64_t tail = nvalid - (n0 + bw - 16); /* valid channels of the block's last vector */
        __mmask16 last = tail >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << tail) - 1);
        int half = tail <= 8;
        const float *b = bp + n0 * K;
        for (int64_t p0 = 0; p0 < P; p0 += 6) {
            int rr = (int)(P - p0 < 6 ? P - p0 : 6);
            MICRO[half][rr - 1][nv - 1](a + p0 * lda, lda, K, b, bw, bias + n0,
                                        c + p0 * ldc + n0, ldc, r ? r + p0 * ldr + n0 : NULL,
                                        ldr, lo, hi, last);
        }
    }
}

/* the stem's E rows [r0, r1) (see mb_args.stem): per row, the three input rows of each channel
 * copied with a zero column each side (rows outside the image zero), then the products read
 * from them (`stem_micro`) */
static void stem_rows(const mb_args *a, const float *xi, int64_t r0, int64_t r1, float *e,
                      int64_t m16, __m512 lo, __m512 hi, float *col) {
    const int64_t w = a->w, cin = a->cin, iw = a->iw, s = a->stem, K = 9 * cin, pw = iw + 2;
    float *pad = col;
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t c = 0; c < cin; c++)
            for (int64_t ky = 0; ky < 3; ky++) {
                float *dst = pad + (c * 3 + ky) * pw;
                int64_t iy = r * s - 1 + ky;
                if (iy < 0 || iy >= a->ih) {
                    memset(dst, 0, (size_t)pw * sizeof(float));
                    continue;
                }
                const float *src = xi + c * a->sxc + iy * a->sxh;
                dst[0] = 0.0f;
                dst[pw - 1] = 0.0f;
                if (a->sxw == 1)
                    memcpy(dst + 1, src, (size_t)iw * sizeof(float));
                else
                    for (int64_t jx = 0; jx < iw; jx++) dst[1 + jx] = src[jx * a->sxw];
            }
        float *er = e + (r - r0) * w * m16;
        for (int64_t n0 = 0; n0 < m16; n0 += 64) {
            int64_t bw = m16 - n0 < 64 ? m16 - n0 : 64;
            for (int64_t p0 = 0; p0 < w; p0 += 6) {
                int rr = (int)(w - p0 < 6 ? w - p0 : 6);
                STEM[rr - 1][bw / 16 - 1](pad + p0 * s, pw, s, 3 * cin, a->we + n0 * K, bw,
                                          a->be + n0, er + p0 * m16 + n0, m16, lo, hi);
            }
        }
    }
}

/* E rows [r0, r1) of image `img` into e (row r at e + (r - r0) * w * m16); `col`: a stem's
 * padded rows (stem_floats) */
static void expand_rows(const mb_args *a, const float *xi, int64_t r0, int64_t r1, float *e,
                        int64_t m16, __m512 lo, __m512 hi, float *col) {
    int64_t w = a->w;
    if (a->stem) {
        stem_rows(a, xi, r0, r1, e, m16, lo, hi, col);
        return;
    }
    if (a->we == NULL) { /* no expansion: a copy, channels padded with zeros */
        __mmask16 last = (a->cin % 16) ? (__mmask16)((1u << (a->cin % 16)) - 1) : 0xFFFF;
        for (int64_t r = r0; r < r1; r++)
            for (int64_t ix = 0; ix < w; ix++) {
                const float *src = xi + r * a->sxh + ix * a->sxw;
                float *dst = e + ((r - r0) * w + ix) * m16;
                for (int64_t c0 = 0; c0 < m16; c0 += 16) {
                    __mmask16 mk = (c0 + 16 >= m16) ? last : (__mmask16)0xFFFF;
                    _mm512_storeu_ps(dst + c0, _mm512_maskz_loadu_ps(mk, src + c0));
                }
            }
        return;
    }
    if (a->sxh == w * a->sxw) { /* the rows are one run of pixels */
        gemm(xi + r0 * a->sxh, a->sxw, (r1 - r0) * w, a->cin, a->we, a->be, m16, m16, e, m16,
             NULL, 0, lo, hi);
        return;
    }
    for (int64_t r = r0; r < r1; r++)
        gemm(xi + r * a->sxh, a->sxw, w, a->cin, a->we, a->be, m16, m16, e + (r - r0) * w * m16,
             m16, NULL, 0, lo, hi);
}

#define TAP(r, o, t) acc = _mm512_fmadd_ps(_mm512_loadu_ps((r) + (o)), k[t], acc)

/* 16 results at element `off` of d: float32, or (ob, bfmb16) rounded to bf16 */
static inline void dstore(void *d, int ob, int64_t off, __m512 v) {
#ifdef __AVX512BF16__
    if (ob) {
        _mm256_storeu_si256((__m256i *)((uint16_t *)d + off), (__m256i)_mm512_cvtneps_pbh(v));
        return;
    }
#endif
    (void)ob;
    _mm512_storeu_ps((float *)d + off, v);
}

/* the depthwise convolution of output rows [oy0, oy1), channels [ca, cb) (multiples of 16),
 * into d (Wo x m16 a row; float32, or bf16 where ob) from the rows of E (row r at
 * e + (r - b0) * er, pixels ep floats apart; rows outside the image read `zero`); the
 * interior four pixels at a time (four independent accumulators); inlined where it is called,
 * so that `ob` is a constant there (the float32 kernel's code without the bf16 branch) */
static inline __attribute__((always_inline)) void depthwise_ch(
    const mb_args *a, const float *e, int64_t b0, int64_t er, int64_t ep, const float *zero,
    int64_t oy0, int64_t oy1, void *d, int64_t m16, __m512 lo, __m512 hi, int64_t ca, int64_t cb,
    const int ob) {
    const int64_t w = a->w, s = a->stride, wo = a->wo;
    /* interior outputs: [1, last) read columns ox * s - 1 .. ox * s + 1 inside the image */
    int64_t last = (w - 2) / s + 1;
    if (last > wo) last = wo;
    for (int64_t oy = oy0; oy < oy1; oy++) {
        const float *rw[3];
        int64_t rp[3];
        for (int ky = 0; ky < 3; ky++) {
            int64_t iy = oy * s - 1 + ky;
            int out = iy < 0 || iy >= a->h;
            rw[ky] = out ? zero : e + (iy - b0) * er;
            rp[ky] = out ? m16 : ep;
        }
        const int64_t drow = (oy - oy0) * wo * m16; /* (an offset into d) */
        for (int64_t c0 = ca; c0 < cb; c0 += 16) {
            __m512 k[9];
            for (int t = 0; t < 9; t++) k[t] = _mm512_loadu_ps(a->wd + t * m16 + c0);
            const __m512 bias = _mm512_loadu_ps(a->bd + c0);
            const float *r0 = rw[0] + c0, *r1 = rw[1] + c0, *r2 = rw[2] + c0;
            const int64_t p0 = rp[0], p1 = rp[1], p2 = rp[2];
            int64_t ox = 0;
            /* the first output (its window starts left of the image) with column checks */
            for (; ox < 1 && ox < wo; ox++) {
                __m512 acc = bias;
                for (int kx = 0; kx < 3; kx++) {
                    int64_t jx = ox * s - 1 + kx;
                    if (jx < 0 || jx >= w) continue;
                    TAP(r0, jx * p0, kx);
                    TAP(r1, jx * p1, 3 + kx);
                    TAP(r2, jx * p2, 6 + kx);
                }
                dstore(d, ob, drow + ox * m16 + c0, _mm512_min_ps(_mm512_max_ps(acc, lo), hi));
            }
            if (s == 1) /* four outputs read six columns a row: each input loaded once */
                for (; ox + 4 <= last; ox += 4) {
                    const int64_t jx = ox - 1;
                    __m512 q0 = bias, q1 = bias, q2 = bias, q3 = bias;
                    const float *rr[3] = {r0 + jx * p0, r1 + jx * p1, r2 + jx * p2};
                    const int64_t pp[3] = {p0, p1, p2};
                    for (int ky = 0; ky < 3; ky++) {
                        const float *r = rr[ky];
                        const int64_t q = pp[ky];
                        __m512 v0 = _mm512_loadu_ps(r), v1 = _mm512_loadu_ps(r + q);
                        __m512 v2 = _mm512_loadu_ps(r + 2 * q), v3 = _mm512_loadu_ps(r + 3 * q);
                        __m512 v4 = _mm512_loadu_ps(r + 4 * q), v5 = _mm512_loadu_ps(r + 5 * q);
                        const __m512 ka = k[3 * ky], kb = k[3 * ky + 1], kc = k[3 * ky + 2];
                        q0 = _mm512_fmadd_ps(v0, ka, q0);
                        q1 = _mm512_fmadd_ps(v1, ka, q1);
                        q2 = _mm512_fmadd_ps(v2, ka, q2);
                        q3 = _mm512_fmadd_ps(v3, ka, q3);
                        q0 = _mm512_fmadd_ps(v1, kb, q0);
                        q1 = _mm512_fmadd_ps(v2, kb, q1);
                        q2 = _mm512_fmadd_ps(v3, kb, q2);
                        q3 = _mm512_fmadd_ps(v4, kb, q3);
                        q0 = _mm512_fmadd_ps(v2, kc, q0);
                        q1 = _mm512_fmadd_ps(v3, kc, q1);
                        q2 = _mm512_fmadd_ps(v4, kc, q2);
                        q3 = _mm512_fmadd_ps(v5, kc, q3);
                    }
                    const int64_t o = drow + ox * m16 + c0;
                    dstore(d, ob, o, _mm512_min_ps(_mm512_max_ps(q0, lo), hi));
                    dstore(d, ob, o + m16, _mm512_min_ps(_mm512_max_ps(q1, lo), hi));
                    dstore(d, ob, o + 2 * m16, _mm512_min_ps(_mm512_max_ps(q2, lo), hi));
                    dstore(d, ob, o + 3 * m16, _mm512_min_ps(_mm512_max_ps(q3, lo), hi));
                }
            for (; ox + 4 <= last; ox += 4) {
                __m512 q[4];
                for (int u = 0; u < 4; u++) {
                    const int64_t jx = (ox + u) * s - 1;
                    __m512 acc = bias;
                    TAP(r0, jx * p0, 0); TAP(r0, (jx + 1) * p0, 1); TAP(r0, (jx + 2) * p0, 2);
                    TAP(r1, jx * p1, 3); TAP(r1, (jx + 1) * p1, 4); TAP(r1, (jx + 2) * p1, 5);
                    TAP(r2, jx * p2, 6); TAP(r2, (jx + 1) * p2, 7); TAP(r2, (jx + 2) * p2, 8);
                    q[u] = acc;
                }
                for (int u = 0; u < 4; u++)
                    dstore(d, ob, drow + (ox + u) * m16 + c0,
                                     _mm512_min_ps(_mm512_max_ps(q[u], lo), hi));
            }
            for (; ox < wo; ox++) {
                __m512 acc = bias;
                for (int kx = 0; kx < 3; kx++) {
                    int64_t jx = ox * s - 1 + kx;
                    if (jx < 0 || jx >= w) continue;
                    TAP(r0, jx * p0, kx);
                    TAP(r1, jx * p1, 3 + kx);
                    TAP(r2, jx * p2, 6 + kx);
                }
                dstore(d, ob, drow + ox * m16 + c0, _mm512_min_ps(_mm512_max_ps(acc, lo), hi));
            }
        }
    }
}

/* the depthwise convolution of all channels (`depthwise_ch` of [0, m16)) */
static void depthwise(const mb_args *a, const float *e, int64_t b0, int64_t er, int64_t ep,
                      const float *zero, int64_t oy0, int64_t oy1, float *d, int64_t m16,
                      __m512 lo, __m512 hi) {
    depthwise_ch(a, e, b0, er, ep, zero, oy0, oy1, d, m16, lo, hi, 0, m16, 0);
}

/* output rows [oa, ob) of image `img`, strip by strip */
static void job(const mb_args *a, int64_t img, int64_t oa, int64_t ob, float *work) {
    const int64_t m16 = up16(a->m), cout16 = up16(a->cout), w = a->w, s = a->stride;
    const int64_t rows = a->rows;
    float *e = work;
    float *d = e + up16((rows * s + 2) * w * m16);
    float *zero = d + up16(rows * a->wo * m16);
    float *col = zero + up16(w * m16);
    memset(zero, 0, (size_t)(w * m16) * sizeof(float));
    const __m512 elo = _mm512_set1_ps((float)a->elo), ehi = _mm512_set1_ps((float)a->ehi);
    const __m512 dlo = _mm512_set1_ps((float)a->dlo), dhi = _mm512_set1_ps((float)a->dhi);
    const __m512 plo = _mm512_set1_ps((float)a->plo), phi = _mm512_set1_ps((float)a->phi);
    const float *xi = a->x + img * a->sxn;
    float *yi = a->y + img * a->syn;
    const float *oi = a->other ? a->other + img * a->son : NULL;
    int64_t b0 = 0, b1 = 0; /* the input rows E holds: [b0, b1) */
    const int direct = a->we == NULL && a->cin % 16 == 0;
    for (int64_t oy0 = oa; oy0 < ob; oy0 += rows) {
        int64_t oy1 = oy0 + rows < ob ? oy0 + rows : ob;
        int64_t n0 = oy0 * s - 1, n1 = (oy1 - 1) * s + 2; /* needed rows [n0, n1) */
        if (n0 < 0) n0 = 0;
        if (n1 > a->h) n1 = a->h;
        if (direct) { /* no expansion, channels a multiple of 16: the depthwise reads x */
            depthwise(a, xi, 0, a->sxh, a->sxw, zero, oy0, oy1, d, m16, dlo, dhi);
            goto project;
        }
        int64_t from = n0;
        if (b1 > n0 && b0 <= n0) { /* rows [n0, b1) are there: moved to the front */
            memmove(e, e + (n0 - b0) * w * m16, (size_t)((b1 - n0) * w * m16) * sizeof(float));
            from = b1;
        }
        if (from < n1)
            expand_rows(a, xi, from, n1, e + (from - n0) * w * m16, m16, elo, ehi, col);
        b0 = n0, b1 = n1;
        depthwise(a, e, b0, w * m16, m16, zero, oy0, oy1, d, m16, dlo, dhi);
    project:;
        int64_t pix = (oy1 - oy0) * a->wo;
        int one = a->syh == a->wo * a->syw && (!oi || a->soh == a->wo * a->sow);
        if (one) {
            gemm(d, m16, pix, m16, a->wp, a->bp, cout16, a->cout, yi + oy0 * a->syh, a->syw,
                 oi ? oi + oy0 * a->soh : NULL, a->sow, plo, phi);
        } else {
            for (int64_t oy = oy0; oy < oy1; oy++)
                gemm(d + (oy - oy0) * a->wo * m16, m16, a->wo, m16, a->wp, a->bp, cout16,
                     a->cout, yi + oy * a->syh, a->syw, oi ? oi + oy * a->soh : NULL, a->sow,
                     plo, phi);
        }
    }
}

/* the projection of D's pixels [p0, p1) of image `img` (rows Wo apart; in runs of a row
 * where the output or the residual is not one run of pixels) */
static void project(const mb_args *a, const float *d, int64_t img, int64_t p0, int64_t p1,
                    __m512 lo, __m512 hi) {
    const int64_t m16 = up16(a->m), cout16 = up16(a->cout), wo = a->wo;
    float *yi = a->y + img * a->syn;
    const float *oi = a->other ? a->other + img * a->son : NULL;
    if (a->syh == wo * a->syw && (!oi || a->soh == wo * a->sow)) {
        gemm(d + p0 * m16, m16, p1 - p0, m16, a->wp, a->bp, cout16, a->cout, yi + p0 * a->syw,
             a->syw, oi ? oi + p0 * a->sow : NULL, a->sow, lo, hi);
        return;
    }
    for (int64_t p = p0; p < p1;) {
        int64_t oy = p / wo, ox = p % wo, q = (oy + 1) * wo < p1 ? (oy + 1) * wo : p1;
        gemm(d + p * m16, m16, q - p, m16, a->wp, a->bp, cout16, a->cout,
             yi + oy * a->syh + ox * a->syw, a->syw,
             oi ? oi + oy * a->soh + ox * a->sow : NULL, a->sow, lo, hi);
        p = q;
    }
}

/* shared mode: image `img` by thread t of nt (see mb_args.shared) */
static void shared_image(const mb_args *a, int64_t img, int t, int nt, float *work) {
    const int64_t m16 = up16(a->m), w = a->w, h = a->h;
    float *e = work;
    float *d = e + up16(h * w * m16);
    float *zero = d + up16(a->ho * a->wo * m16);
    const __m512 elo = _mm512_set1_ps((float)a->elo), ehi = _mm512_set1_ps((float)a->ehi);
    const __m512 dlo = _mm512_set1_ps((float)a->dlo), dhi = _mm512_set1_ps((float)a->dhi);
    const __m512 plo = _mm512_set1_ps((float)a->plo), phi = _mm512_set1_ps((float)a->phi);
    const float *xi = a->x + img * a->sxn;
    const int direct = a->we == NULL && a->cin % 16 == 0;
    if (t == 0) memset(zero, 0, (size_t)(w * m16) * sizeof(float));
    if (a->stem) { /* the stem's rows split between the threads, each its own padded rows */
        float *col = zero + up16(w * m16) + (int64_t)t * stem_floats(a);
        int64_t r0 = h * t / nt, r1 = h * (t + 1) / nt;
        if (r0 < r1) stem_rows(a, xi, r0, r1, e + r0 * w * m16, m16, elo, ehi, col);
    } else if (!direct) { /* the expansion (or the padded copy) of pixels [p0, p1), row run by run */
        int64_t p0 = h * w * t / nt, p1 = h * w * (t + 1) / nt;
        for (int64_t p = p0; p < p1;) {
            int64_t r = p / w, q = (r + 1) * w < p1 ? (r + 1) * w : p1;
            if (a->sxh == w * a->sxw) q = p1; /* the rows are one run of pixels */
            const float *src = xi + r * a->sxh + (p % w) * a->sxw;
            if (a->we == NULL) {
                __mmask16 last = (a->cin % 16) ? (__mmask16)((1u << (a->cin % 16)) - 1) : 0xFFFF;
                for (int64_t i = 0; i < q - p; i++)
                    for (int64_t c0 = 0; c0 < m16; c0 += 16) {
                        __mmask16 mk = (c0 + 16 >= m16) ? last : (__mmask16)0xFFFF;
                        _mm512_storeu_ps(e + (p + i) * m16 + c0,
                                         _mm512_maskz_loadu_ps(mk, src + i * a->sxw + c0));
                    }
            } else {
                gemm(src, a->sxw, q - p, a->cin, a->we, a->be, m16, m16, e + p * m16, m16, NULL,
                     0, elo, ehi);
            }
            p = q;
        }
    }
#pragma omp barrier
    int64_t oy0 = a->ho * t / nt, oy1 = a->ho * (t + 1) / nt;
    if (direct)
        depthwise(a, xi, 0, a->sxh, a->sxw, zero, oy0, oy1, d + oy0 * a->wo * m16, m16, dlo,
                  dhi);
    else
        depthwise(a, e, 0, w * m16, m16, zero, oy0, oy1, d + oy0 * a->wo * m16, m16, dlo, dhi);
#pragma omp barrier
    const int64_t pix = a->ho * a->wo;
    project(a, d, img, pix * t / nt, pix * (t + 1) / nt, plo, phi);
#pragma omp barrier
}

/* one thread's part of a block (inside a parallel region of the block's threads; ends with a
 * barrier: the `omp for`'s implicit one, or `shared_image`'s last) */
static void block_body(const mb_args *a, int t, int nt) {
    const int64_t per = mbconv_work_floats(a->w, a->m, a->wo, a->stride, a->rows) +
                        stem_floats(a);
    const int64_t chunks = a->chunks, jobs = a->n * chunks;
    if (a->shared) {
        float *work = (float *)(((uintptr_t)a->work + 63) & ~(uintptr_t)63);
        for (int64_t img = 0; img < a->n; img++) shared_image(a, img, t, nt, work);
    } else {
        float *work = a->work + (int64_t)t * per;
        work = (float *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
#pragma omp for schedule(static)
        for (int64_t j = 0; j < jobs; j++) {
            int64_t img = j / chunks, ch = j % chunks;
            int64_t oa = ch * a->ho / chunks, ob = (ch + 1) * a->ho / chunks;
            if (oa < ob) job(a, img, oa, ob, work);
        }
    }
}

/* run the block; 0, or 1 where this build has no kernel */
int mbconv_run(const mb_args *a) {
#pragma omp parallel num_threads((int)a->threads)
    block_body(a, omp_get_thread_num(), omp_get_num_threads());
    return 0;
}

#else

int mbconv_run(const mb_args *a) {
    (void)a;
    return 1;
}

#endif
