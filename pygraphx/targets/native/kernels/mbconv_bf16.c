
/* ---- bf16 blocks (helper bfmb16, issue 10): the second part of kernel `mbconv`, appended to
 * mbconv.c (`native_mbconv.PARTS`: one translation unit), whose mb_args, schedule, workspace
 * sizes and float32 depthwise it uses; not a kernel of its own.
 *
 * The bf16 program's block: x, the residual and y bf16 (channels-last), the 1x1 weights bf16,
 * the biases float32 (a bf16 bias widened, or the float32 one the program kept), as oneDNN's
 * bf16 convolutions run it, one rounding to bf16 per convolution's output:
 *
 *   E = bf16(clip(x We + be))          the 1x1 product on `_mm512_dpbf16_ps` (float32 sums),
 *                                      E kept as float32 holding bf16 values (or x widened)
 *   D = bf16(clip(dw3x3(E) + bd))      the depthwise convolution in float32 (mbconv.c's
 *                                      `depthwise_ch`), its results stored rounded to bf16
 *   y = bf16(clip(D Wp + bp [+ r]))    dpbf16 again, the residual added to the float32 sum
 *
 * The 1x1 weights are packed as mbconv.c's, in bf16 pairs: per block of 64 output channels
 * from n0 (width bw) the (K2, bw, 2) array at n0 * K2 * 2 (K2 = ceil(K / 2), the odd K's last
 * pair's second element zero); a row's last input channel of an odd K is read alone (never
 * past the row). Same mb_args: x, other and y point to bf16 (element strides), we and wp to
 * the packed bf16, the rest float32.
 *
 * Stem (mnv18, mb_args.stem as mbconv.c's): the network's first 3x3 convolution as the first
 * block's expansion, x the float32 image (any layout: strides sxn, sxc, sxh, sxw), each value
 * rounded to bf16 as its rows are copied (the program's float32 -> bf16 convert: round to
 * nearest even, as the oneDNN reorder that step ran), the products on the bf16 dot product
 * (`stem_rows_bf`; We packed by `native_mbconv.pack_stem_bf16`), E = bf16(clip(conv + be)) as
 * float32 holding bf16 values. Not in the shared mode. */

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__)
#define PGX_MB_BF16 1
#else
#define PGX_MB_BF16 0
#endif

/* 1 where this build has the bf16 block (AVX512_BF16), 0 where it does not */
int mbconv_bf16_supported(void) { return PGX_MB_BF16; }

#if PGX_MB_BF16

typedef uint16_t bf16_t;

/* float32 -> bf16 (round to nearest even) -> float32 */
static inline __m512 bf_round(__m512 v) {
    __m256bh h = _mm512_cvtneps_pbh(v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
}

/* 16 bf16 (those of `mk`, the rest zero) widened to float32 */
static inline __m512 bf_load(const bf16_t *p, __mmask16 mk) {
    __m256i h = _mm256_maskz_loadu_epi16(mk, p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline __m512i pair_at(const bf16_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32((int)v);
}

#define BACC(P) __m512 c##P##0 = bias0, c##P##1 = bias1, c##P##2 = bias2, c##P##3 = bias3;
#define BDOT(P, AV)                                                      \
    if (R > P) {                                                         \
        __m512bh av = (__m512bh)(AV);                                    \
        c##P##0 = _mm512_dpbf16_ps(c##P##0, av, b0);                     \
        if (NV > 1) c##P##1 = _mm512_dpbf16_ps(c##P##1, av, b1);         \
        if (NV > 2) c##P##2 = _mm512_dpbf16_ps(c##P##2, av, b2);         \
        if (NV > 3) c##P##3 = _mm512_dpbf16_ps(c##P##3, av, b3);         \
    }
#define BROW(P) BDOT(P, pair_at(a + P * lda + 2 * k2))
#define BLAST(P) BDOT(P, _mm512_set1_epi32((int)(uint32_t)a[P * lda + K - 1]))
#define BST1(P, V)                                                                    \
    if (R > P && NV > V) {                                                            \
        __mmask16 mk = (V == NV - 1) ? last : (__mmask16)0xFFFF;                     \
        __m512 t = c##P##V;                                                           \
        if (r) t = _mm512_add_ps(t, bf_load(r + P * ldr + 16 * V, mk));               \
        t = _mm512_min_ps(_mm512_max_ps(t, lo), hi);                                  \
        if (OB)                                                                       \
            _mm256_mask_storeu_epi16((bf16_t *)c + P * ldc + 16 * V, mk,              \
                                     (__m256i)_mm512_cvtneps_pbh(t));                 \
        else                                                                          \
            _mm512_mask_storeu_ps((float *)c + P * ldc + 16 * V, mk, bf_round(t));    \
    }
#define BST(P) BST1(P, 0) BST1(P, 1) BST1(P, 2) BST1(P, 3)
#define BLOADB(off)                                                                   \
    const bf16_t *bk = b + (off);                                                     \
    __m512bh b0 = (__m512bh)_mm512_loadu_si512(bk), b1 = b0, b2 = b0, b3 = b0;        \
    if (NV > 1) b1 = (__m512bh)_mm512_loadu_si512(bk + 32);                           \
    if (NV > 2) b2 = (__m512bh)_mm512_loadu_si512(bk + 64);                           \
    if (NV > 3) b3 = (__m512bh)_mm512_loadu_si512(bk + 96);

/* c[p][0 : 16 NV] = act(a[p][0 : K] B + bias [+ r[p]]) for p < R <= 6: a bf16 rows lda apart,
 * B packed in pairs (K2 x bw x 2), r bf16; c bf16 (OB) or float32 holding bf16 values */
static inline __attribute__((always_inline)) void micro_bf(
    const bf16_t *a, int64_t lda, int64_t K, const bf16_t *b, int64_t bw, const float *bias,
    void *c, int64_t ldc, const bf16_t *r, int64_t ldr, __m512 lo, __m512 hi, __mmask16 last,
    const int R, const int NV, const int OB) {
    __m512 bias0 = _mm512_loadu_ps(bias), bias1 = bias0, bias2 = bias0, bias3 = bias0;
    if (NV > 1) bias1 = _mm512_loadu_ps(bias + 16);
    if (NV > 2) bias2 = _mm512_loadu_ps(bias + 32);
    if (NV > 3) bias3 = _mm512_loadu_ps(bias + 48);
    BACC(0) BACC(1) BACC(2) BACC(3) BACC(4) BACC(5)
    const int64_t kp = K / 2;
    for (int64_t k2 = 0; k2 < kp; k2++) {
        BLOADB(k2 * bw * 2)
        BROW(0) BROW(1) BROW(2) BROW(3) BROW(4) BROW(5)
    }
    if (K & 1) { /* the last input channel alone (its pair's weight zero) */
        BLOADB(kp * bw * 2)
        BLAST(0) BLAST(1) BLAST(2) BLAST(3) BLAST(4) BLAST(5)
    }
    BST(0) BST(1) BST(2) BST(3) BST(4) BST(5)
}

typedef void (*micro_bf_fn)(const bf16_t *, int64_t, int64_t, const bf16_t *, int64_t,
                            const float *, void *, int64_t, const bf16_t *, int64_t, __m512,
                            __m512, __mmask16);
#define MKB(R, NV, OB)                                                                       \
    static void micro_bf_##R##_##NV##_##OB(const bf16_t *a, int64_t lda, int64_t K,          \
                                           const bf16_t *b, int64_t bw, const float *bias,   \
                                           void *c, int64_t ldc, const bf16_t *r,            \
                                           int64_t ldr, __m512 lo, __m512 hi,                \
                                           __mmask16 last) {                                 \
        micro_bf(a, lda, K, b, bw, bias, c, ldc, r, ldr, lo, hi, last, R, NV, OB);           \
    }
#define MKBR(R, OB) MKB(R, 1, OB) MKB(R, 2, OB) MKB(R, 3, OB) MKB(R, 4, OB)
#define MKBO(OB) MKBR(1, OB) MKBR(2, OB) MKBR(3, OB) MKBR(4, OB) MKBR(5, OB) MKBR(6, OB)
MKBO(0) MKBO(1)
#define BROWT(R, OB) \
    {micro_bf_##R##_1_##OB, micro_bf_##R##_2_##OB, micro_bf_##R##_3_##OB, micro_bf_##R##_4_##OB}
#define BTABLE(OB) \
    {BROWT(1, OB), BROWT(2, OB), BROWT(3, OB), BROWT(4, OB), BROWT(5, OB), BROWT(6, OB)}
static const micro_bf_fn MICRO_BF[2][6][4] = {BTABLE(0), BTABLE(1)};

/* c (P x nvalid, rows ldc apart; bf16 where ob, else float32) = act(a (P x K bf16, rows lda
 * apart) B + bias [+ r]); per 64-channel block, every 6 pixels */
static void gemm_bf(const bf16_t *a, int64_t lda, int64_t P, int64_t K, const bf16_t *bp,
                    const float *bias, int64_t n16, int64_t nvalid, void *c, int64_t ldc, int ob,
                    const bf16_t *r, int64_t ldr, __m512 lo, __m512 hi) {
    const int64_t k2 = (K + 1) / 2;
    for (int64_t n0 = 0; n0 < n16; n0 += 64) {
        int64_t bw = n16 - n0 < 64 ? n16 - n0 : 64;
        int nv = (int)(bw / 16);
        int64_t tail = nvalid - (n0 + bw - 16);
        __mmask16 last = tail >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << tail) - 1);
        const bf16_t *b = bp + n0 * k2 * 2;
        for (int64_t p0 = 0; p0 < P; p0 += 6) {
            int rr = (int)(P - p0 < 6 ? P - p0 : 6);
            void *cp = ob ? (void *)((bf16_t *)c + p0 * ldc + n0)
                          : (void *)((float *)c + p0 * ldc + n0);
            MICRO_BF[ob][rr - 1][nv - 1](a + p0 * lda, lda, K, b, bw, bias + n0, cp, ldc,
                                         r ? r + p0 * ldr + n0 : NULL, ldr, lo, hi, last);
        }
    }
}

/* a bf16 stem's products (mnv18): c[p][0 : 16 NV] = bf16(clip(sum over (j, kx) of the pair at
 * rows[j][p s + kx] . B[3 j + kx] + bias)) for pixels p < R (float32 holding bf16 values),
 * `rows` the J interleaved pairs of padded input rows (`stem_rows_bf`: the 32-bit element x of
 * pair row j holds rows 2j and 2j + 1 at column x, pw2 bf16 a pair row), B packed as a bf16 1x1
 * weight of K2 = 3 J pairs (pair 3 j + kx: the taps (2j, kx), (2j + 1, kx)) */
static inline __attribute__((always_inline)) void stem_micro_bf(
    const bf16_t *rows, int64_t pw2, int64_t s, int64_t J, const bf16_t *b, int64_t bw,
    const float *bias, float *c, int64_t ldc, __m512 lo, __m512 hi, const int R, const int NV) {
    const int OB = 0;
    const bf16_t *r = NULL;
    const int64_t ldr = 0;
    const __mmask16 last = (__mmask16)0xFFFF;
    __m512 bias0 = _mm512_loadu_ps(bias), bias1 = bias0, bias2 = bias0, bias3 = bias0;
    if (NV > 1) bias1 = _mm512_loadu_ps(bias + 16);
    if (NV > 2) bias2 = _mm512_loadu_ps(bias + 32);
    if (NV > 3) bias3 = _mm512_loadu_ps(bias + 48);
    BACC(0) BACC(1) BACC(2) BACC(3) BACC(4) BACC(5)
    for (int64_t j = 0; j < J; j++)
        for (int kx = 0; kx < 3; kx++) {
            const bf16_t *a = rows + j * pw2 + 2 * kx;
            BLOADB((j * 3 + kx) * bw * 2)
#define SROWB(P) BDOT(P, pair_at(a + 2 * P * s))
            SROWB(0) SROWB(1) SROWB(2) SROWB(3) SROWB(4) SROWB(5)
        }
    BST(0) BST(1) BST(2) BST(3) BST(4) BST(5)
}

typedef void (*stem_bf_fn)(const bf16_t *, int64_t, int64_t, int64_t, const bf16_t *, int64_t,
                           const float *, float *, int64_t, __m512, __m512);
#define MKSB(R, NV)                                                                          \
    static void stem_bf_##R##_##NV(const bf16_t *rows, int64_t pw2, int64_t s, int64_t J,    \
                                   const bf16_t *b, int64_t bw, const float *bias, float *c, \
                                   int64_t ldc, __m512 lo, __m512 hi) {                      \
        stem_micro_bf(rows, pw2, s, J, b, bw, bias, c, ldc, lo, hi, R, NV);                  \
    }
#define MKSBR(R) MKSB(R, 1) MKSB(R, 2) MKSB(R, 3) MKSB(R, 4)
MKSBR(1) MKSBR(2) MKSBR(3) MKSBR(4) MKSBR(5) MKSBR(6)
#define SBROW(R) {stem_bf_##R##_1, stem_bf_##R##_2, stem_bf_##R##_3, stem_bf_##R##_4}
static const stem_bf_fn STEM_BF[6][4] = {SBROW(1), SBROW(2), SBROW(3), SBROW(4), SBROW(5),
                                         SBROW(6)};

/* 16 float32 (those of mk, the rest zero) of an image row from `src` (elements sx apart)
 * rounded to bf16, each in the low half of a 32-bit lane */
static inline __m512i stem_load(const float *src, int64_t sx, __mmask16 mk) {
    __m512 v;
    if (sx == 1) {
        v = _mm512_maskz_loadu_ps(mk, src);
    } else {
        float buf[16];
        for (int i = 0; i < 16; i++) buf[i] = (mk >> i) & 1 ? src[i * sx] : 0.0f;
        v = _mm512_loadu_ps(buf);
    }
    return _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v));
}

/* a bf16 stem's E rows [r0, r1) of the float32 image xi (mbconv.c's `stem_rows`, bf16): per
 * row, the 3 cin input rows (q = 3 c + ky; rows outside the image zero) rounded to bf16 and
 * interleaved in pairs (`stem_micro_bf`'s J = ceil(3 cin / 2) pair rows of iw + 2 columns, a
 * zero column each side, the last pair's second row zero where 3 cin is odd) in `col`; then the
 * products on AVX512_BF16's dot product, two taps an instruction */
static void stem_rows_bf(const mb_args *a, const float *xi, int64_t r0, int64_t r1, float *e,
                         int64_t m16, __m512 lo, __m512 hi, float *col) {
    const int64_t w = a->w, cin = a->cin, iw = a->iw, s = a->stem, pw = iw + 2;
    const int64_t Q = 3 * cin, J = (Q + 1) / 2, k2 = 3 * J;
    const __mmask16 tail = (iw % 16) ? (__mmask16)((1u << (iw % 16)) - 1) : (__mmask16)0xFFFF;
    uint32_t *pairs = (uint32_t *)col; /* J x pw 32-bit elements */
    const bf16_t *we = (const bf16_t *)a->we;
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t j = 0; j < J; j++) {
            const float *src[2] = {NULL, NULL};
            for (int t = 0; t < 2; t++) {
                int64_t q = 2 * j + t, iy = r * s - 1 + q % 3;
                if (q < Q && iy >= 0 && iy < a->ih) src[t] = xi + (q / 3) * a->sxc + iy * a->sxh;
            }
            uint32_t *dst = pairs + j * pw;
            dst[0] = 0;
            dst[pw - 1] = 0;
            for (int64_t x = 0; x < iw; x += 16) {
                __mmask16 mk = x + 16 <= iw ? (__mmask16)0xFFFF : tail;
                __m512i lo16 = src[0] ? stem_load(src[0] + x * a->sxw, a->sxw, mk)
                                      : _mm512_setzero_si512();
                __m512i hi16 = src[1] ? stem_load(src[1] + x * a->sxw, a->sxw, mk)
                                      : _mm512_setzero_si512();
                _mm512_mask_storeu_epi32(dst + 1 + x, mk,
                                         _mm512_or_si512(lo16, _mm512_slli_epi32(hi16, 16)));
            }
        }
        float *er = e + (r - r0) * w * m16;
        for (int64_t n0 = 0; n0 < m16; n0 += 64) {
            int64_t bw = m16 - n0 < 64 ? m16 - n0 : 64;
            for (int64_t p0 = 0; p0 < w; p0 += 6) {
                int rr = (int)(w - p0 < 6 ? w - p0 : 6);
                STEM_BF[rr - 1][bw / 16 - 1]((const bf16_t *)pairs + 2 * p0 * s, 2 * pw, s, J,
                                             we + n0 * k2 * 2, bw, a->be + n0,
                                             er + p0 * m16 + n0, m16, lo, hi);
            }
        }
    }
}

/* E rows [r0, r1) of the bf16 image xi: the expansion (float32 holding bf16), or x widened;
 * a stem's (mnv18) from the float32 image `xf` into its padded rows `col` */
static void expand_rows_bf(const mb_args *a, const bf16_t *xi, int64_t r0, int64_t r1, float *e,
                           int64_t m16, __m512 lo, __m512 hi, const float *xf, float *col) {
    const int64_t w = a->w;
    if (a->stem) {
        stem_rows_bf(a, xf, r0, r1, e, m16, lo, hi, col);
        return;
    }
    const bf16_t *we = (const bf16_t *)a->we;
    if (we == NULL) {
        __mmask16 lastm = (a->cin % 16) ? (__mmask16)((1u << (a->cin % 16)) - 1) : 0xFFFF;
        for (int64_t r = r0; r < r1; r++)
            for (int64_t ix = 0; ix < w; ix++) {
                const bf16_t *src = xi + r * a->sxh + ix * a->sxw;
                float *dst = e + ((r - r0) * w + ix) * m16;
                for (int64_t c0 = 0; c0 < m16; c0 += 16)
                    _mm512_storeu_ps(dst + c0,
                                     bf_load(src + c0, c0 + 16 >= m16 ? lastm : (__mmask16)0xFFFF));
            }
        return;
    }
    if (a->sxh == w * a->sxw) {
        gemm_bf(xi + r0 * a->sxh, a->sxw, (r1 - r0) * w, a->cin, we, a->be, m16, m16, e, m16, 0,
                NULL, 0, lo, hi);
        return;
    }
    for (int64_t r = r0; r < r1; r++)
        gemm_bf(xi + r * a->sxh, a->sxw, w, a->cin, we, a->be, m16, m16, e + (r - r0) * w * m16,
                m16, 0, NULL, 0, lo, hi);
}

/* the projection of Dh's pixels [p0, p1) (bf16, m16 apart, pixel p0 at dh) of image img */
static void project_bf(const mb_args *a, const bf16_t *dh, int64_t img, int64_t p0, int64_t p1,
                       __m512 lo, __m512 hi) {
    const int64_t m16 = up16(a->m), cout16 = up16(a->cout), wo = a->wo;
    bf16_t *yi = (bf16_t *)a->y + img * a->syn;
    const bf16_t *oi = a->other ? (const bf16_t *)a->other + img * a->son : NULL;
    const bf16_t *wp = (const bf16_t *)a->wp;
    if (a->syh == wo * a->syw && (!oi || a->soh == wo * a->sow)) {
        gemm_bf(dh, m16, p1 - p0, m16, wp, a->bp, cout16, a->cout, yi + p0 * a->syw,
                a->syw, 1, oi ? oi + p0 * a->sow : NULL, a->sow, lo, hi);
        return;
    }
    for (int64_t p = p0; p < p1;) {
        int64_t oy = p / wo, ox = p % wo, q = (oy + 1) * wo < p1 ? (oy + 1) * wo : p1;
        gemm_bf(dh + (p - p0) * m16, m16, q - p, m16, wp, a->bp, cout16, a->cout,
                yi + oy * a->syh + ox * a->syw, a->syw, 1,
                oi ? oi + oy * a->soh + ox * a->sow : NULL, a->sow, lo, hi);
        p = q;
    }
}

/* output rows [oa, ob) of image `img`, strip by strip (mbconv.c's `job`, bf16) */
static void job_bf(const mb_args *a, int64_t img, int64_t oa, int64_t ob, float *work) {
    const int64_t m16 = up16(a->m), w = a->w, s = a->stride, rows = a->rows;
    float *e = work;
    float *d = e + up16((rows * s + 2) * w * m16);
    float *zero = d + up16(rows * a->wo * m16);
    float *col = zero + up16(w * m16); /* a stem's padded input rows (stem_floats) */
    memset(zero, 0, (size_t)(w * m16) * sizeof(float));
    const __m512 elo = _mm512_set1_ps((float)a->elo), ehi = _mm512_set1_ps((float)a->ehi);
    const __m512 dlo = _mm512_set1_ps((float)a->dlo), dhi = _mm512_set1_ps((float)a->dhi);
    const __m512 plo = _mm512_set1_ps((float)a->plo), phi = _mm512_set1_ps((float)a->phi);
    const bf16_t *xi = (const bf16_t *)a->x + img * a->sxn;
    const float *xf = (const float *)a->x + img * a->sxn; /* (a stem's float32 image) */
    int64_t b0 = 0, b1 = 0;
    for (int64_t oy0 = oa; oy0 < ob; oy0 += rows) {
        int64_t oy1 = oy0 + rows < ob ? oy0 + rows : ob;
        int64_t n0 = oy0 * s - 1, n1 = (oy1 - 1) * s + 2;
        if (n0 < 0) n0 = 0;
        if (n1 > a->h) n1 = a->h;
        int64_t from = n0;
        if (b1 > n0 && b0 <= n0) {
            memmove(e, e + (n0 - b0) * w * m16, (size_t)((b1 - n0) * w * m16) * sizeof(float));
            from = b1;
        }
        if (from < n1)
            expand_rows_bf(a, xi, from, n1, e + (from - n0) * w * m16, m16, elo, ehi, xf, col);
        b0 = n0, b1 = n1;
        depthwise_ch(a, e, b0, w * m16, m16, zero, oy0, oy1, d, m16, dlo, dhi, 0, m16, 1);
        project_bf(a, (const bf16_t *)d, img, oy0 * a->wo, oy1 * a->wo,
                   plo, phi);
    }
}

/* shared mode (mb_args.shared), bf16: the threads split the expanded channels (64 at a
 * time, the packed weight's blocks), each expanding and convolving its channels of every pixel
 * (no barrier between: the depthwise convolution is per channel) into Dh (bf16, after the
 * float32 D, unused here; mbconv_bf16_shared_floats); then, after one barrier, the
 * projection's pixels */
static void shared_image_bf(const mb_args *a, int64_t img, int t, int nt, float *work) {
    const int64_t m16 = up16(a->m), w = a->w, h = a->h;
    float *e = work;
    float *d = e + up16(h * w * m16);
    float *zero = d + up16(a->ho * a->wo * m16);
    bf16_t *dh = (bf16_t *)(zero + up16(w * m16));
    const __m512 elo = _mm512_set1_ps((float)a->elo), ehi = _mm512_set1_ps((float)a->ehi);
    const __m512 dlo = _mm512_set1_ps((float)a->dlo), dhi = _mm512_set1_ps((float)a->dhi);
    const __m512 plo = _mm512_set1_ps((float)a->plo), phi = _mm512_set1_ps((float)a->phi);
    const bf16_t *xi = (const bf16_t *)a->x + img * a->sxn;
    const int64_t blocks = (m16 + 63) / 64, pix = a->ho * a->wo;
    int64_t ca = blocks * t / nt * 64, cb = blocks * (t + 1) / nt * 64;
    if (cb > m16) cb = m16;
    if (ca < cb) {
        for (int64_t ix = 0; ix < w; ix++) /* (the zero row's channels this thread reads) */
            memset(zero + ix * m16 + ca, 0, (size_t)(cb - ca) * sizeof(float));
        const bf16_t *we = (const bf16_t *)a->we;
        if (we == NULL) { /* x widened: the channels [ca, cb) of each pixel */
            __mmask16 lastm = (a->cin % 16) ? (__mmask16)((1u << (a->cin % 16)) - 1) : 0xFFFF;
            for (int64_t r = 0; r < h; r++)
                for (int64_t ix = 0; ix < w; ix++) {
                    const bf16_t *src = xi + r * a->sxh + ix * a->sxw;
                    float *dst = e + (r * w + ix) * m16;
                    for (int64_t c0 = ca; c0 < cb; c0 += 16) {
                        __mmask16 mk = c0 + 16 >= m16 ? lastm : (__mmask16)0xFFFF;
                        _mm512_storeu_ps(dst + c0, bf_load(src + c0, mk));
                    }
                }
        } else {
            const int64_t k2 = (a->cin + 1) / 2;
            for (int64_t r = 0; r < h;) {
                int64_t q = a->sxh == w * a->sxw ? h : r + 1; /* rows one run of pixels: all */
                gemm_bf(xi + r * a->sxh, a->sxw, (q - r) * w, a->cin, we + ca * k2 * 2,
                        a->be + ca, cb - ca, cb - ca, e + r * w * m16 + ca, m16, 0, NULL, 0, elo,
                        ehi);
                r = q;
            }
        }
        depthwise_ch(a, e, 0, w * m16, m16, zero, 0, a->ho, dh, m16, dlo, dhi, ca, cb, 1);
    }
#pragma omp barrier
    const int64_t p0 = pix * t / nt, p1 = pix * (t + 1) / nt;
    project_bf(a, dh + p0 * m16, img, p0, p1, plo, phi);
#pragma omp barrier
}

/* floats of the bf16 shared mode's workspace: the float32 one's and Dh (ho wo m16 bf16) */
int64_t mbconv_bf16_shared_floats(int64_t h, int64_t w, int64_t m, int64_t ho, int64_t wo) {
    return mbconv_shared_floats(h, w, m, ho, wo) + up16((ho * wo * up16(m) + 1) / 2) + 16;
}

/* one thread's part of a bf16 block (inside a parallel region of the block's threads; ends
 * with a barrier: the `omp for`'s implicit one, or `shared_image_bf`'s last) */
static void block_body_bf(const mb_args *a, int t, int nt) {
    const int64_t per = mbconv_work_floats(a->w, a->m, a->wo, a->stride, a->rows) +
                        stem_floats(a);
    const int64_t chunks = a->chunks, jobs = a->n * chunks;
    if (a->shared) {
        float *work = (float *)(((uintptr_t)a->work + 63) & ~(uintptr_t)63);
        for (int64_t img = 0; img < a->n; img++) shared_image_bf(a, img, t, nt, work);
    } else {
        float *work = a->work + (int64_t)t * per;
        work = (float *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
#pragma omp for schedule(static)
        for (int64_t j = 0; j < jobs; j++) {
            int64_t img = j / chunks, ch = j % chunks;
            int64_t oa = ch * a->ho / chunks, ob = (ch + 1) * a->ho / chunks;
            if (oa < ob) job_bf(a, img, oa, ob, work);
        }
    }
}

/* run the bf16 block; 0, or 1 where this build has no bf16 kernel (or a stem in the shared
 * mode) */
int mbconv_bf16_run(const mb_args *a) {
    if (a->stem && a->shared) return 1; /* (a stem only image rows by thread) */
#pragma omp parallel num_threads((int)a->threads)
    block_body_bf(a, omp_get_thread_num(), omp_get_num_threads());
    return 0;
}

#else

int mbconv_bf16_run(const mb_args *a) {
    (void)a;
    return 1;
}
#endif
