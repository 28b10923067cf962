
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
 * the packed bf16, the rest float32. No stem. */

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

/* E rows [r0, r1) of the bf16 image xi: the expansion (float32 holding bf16), or x widened */
static void expand_rows_bf(const mb_args *a, const bf16_t *xi, int64_t r0, int64_t r1, float *e,
                           int64_t m16, __m512 lo, __m512 hi) {
    const int64_t w = a->w;
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
    memset(zero, 0, (size_t)(w * m16) * sizeof(float));
    const __m512 elo = _mm512_set1_ps((float)a->elo), ehi = _mm512_set1_ps((float)a->ehi);
    const __m512 dlo = _mm512_set1_ps((float)a->dlo), dhi = _mm512_set1_ps((float)a->dhi);
    const __m512 plo = _mm512_set1_ps((float)a->plo), phi = _mm512_set1_ps((float)a->phi);
    const bf16_t *xi = (const bf16_t *)a->x + img * a->sxn;
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
        if (from < n1) expand_rows_bf(a, xi, from, n1, e + (from - n0) * w * m16, m16, elo, ehi);
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
    const int64_t per = mbconv_work_floats(a->w, a->m, a->wo, a->stride, a->rows);
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

/* run the bf16 block; 0, or 1 where this build has no bf16 kernel */
int mbconv_bf16_run(const mb_args *a) {
    if (a->stem) return 1;
#pragma omp parallel num_threads((int)a->threads)
    block_body_bf(a, omp_get_thread_num(), omp_get_num_threads());
    return 0;
}

/* mnv17: `count` bf16 blocks in one parallel region (as mbconv.c's mbconv_chain_stamped: the
 * same `stamps`, NULL: none); 0; 1 where this build has no bf16 kernel or a block has a stem;
 * 2, nothing run, where a block is planned for another thread count than blocks[0] */
int mbconv_bf16_chain_stamped(const mb_args *const *blocks, int64_t count, double *stamps) {
    if (count <= 0) return 0;
    for (int64_t i = 0; i < count; i++)
        if (blocks[i]->stem) return 1;
    const int64_t threads = blocks[0]->threads;
    for (int64_t i = 0; i < count; i++)
        if (blocks[i]->threads != threads) return 2;
    if (stamps != NULL) stamps[0] = omp_get_wtime();
#pragma omp parallel num_threads((int)threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        for (int64_t i = 0; i < count; i++) {
            block_body_bf(blocks[i], t, nt);
            if (stamps != NULL && t == 0) stamps[i + 1] = omp_get_wtime();
        }
    }
    return 0;
}

#else

int mbconv_bf16_run(const mb_args *a) {
    (void)a;
    return 1;
}

int mbconv_bf16_chain_stamped(const mb_args *const *blocks, int64_t count, double *stamps) {
    (void)blocks;
    (void)count;
    (void)stamps;
    return 1;
}

#endif
