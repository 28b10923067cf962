/* The float32 variant of the native attention kernel (`pgx_attention_f32`): the second part of
   kernel `attention`, appended to attention.c (`native_attention.PARTS`: one translation unit,
   hashed as one), whose parameter layout, scratch sizes, softmax and packing helpers it uses;
   not a kernel of its own. */

#if PGX_ATTN_F32

/* ---- float32: the same block with FMA (scores, probabilities and output in float32) ---- */

/* C[MR][NV*16] = sum over k of A (MR rows, lda apart) times B (NV blocks bstride apart, each
   [k][16] floats); MR up to 12, NV up to 4, MR * NV accumulators (at most 24 of the 32 zmm) */
static inline __attribute__((always_inline)) void tile32(const int mr, const int nv,
                                                         const float *a, int64_t lda, int64_t kk,
                                                         const float *b, int64_t bstride,
                                                         float *c, int64_t ldc) {
    __m512 acc[12][4];
#pragma GCC unroll 12
    for (int r = 0; r < 12; ++r)
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j)
            if (r < mr && j < nv) acc[r][j] = _mm512_setzero_ps();
    for (int64_t p = 0; p < kk; ++p) {
        __m512 bv[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j)
            if (j < nv) bv[j] = _mm512_load_ps(b + j * bstride + p * 16);
#pragma GCC unroll 12
        for (int r = 0; r < 12; ++r) {
            if (r < mr) {
                __m512 av = _mm512_set1_ps(a[r * lda + p]);
#pragma GCC unroll 4
                for (int j = 0; j < 4; ++j)
                    if (j < nv) acc[r][j] = _mm512_fmadd_ps(av, bv[j], acc[r][j]);
            }
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < 12; ++r)
        if (r < mr)
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j)
                if (j < nv) _mm512_storeu_ps(c + r * ldc + j * 16, acc[r][j]);
}

typedef void (*tile32_fn)(const float *, int64_t, int64_t, const float *, int64_t, float *,
                          int64_t);
#define TILE32(MR, NV)                                                                      \
    static void tile32_##MR##_##NV(const float *a, int64_t lda, int64_t kk, const float *b,  \
                                   int64_t bs, float *c, int64_t ldc) {                      \
        tile32(MR, NV, a, lda, kk, b, bs, c, ldc);                                          \
    }
#define TILE32_ROW(MR) TILE32(MR, 1) TILE32(MR, 2) TILE32(MR, 3) TILE32(MR, 4)
TILE32_ROW(1) TILE32_ROW(2) TILE32_ROW(3) TILE32_ROW(4) TILE32_ROW(5) TILE32_ROW(6)
TILE32_ROW(7) TILE32_ROW(8) TILE32_ROW(9) TILE32_ROW(10) TILE32_ROW(11) TILE32_ROW(12)
#define TILE32_FNS(MR) {tile32_##MR##_1, tile32_##MR##_2, tile32_##MR##_3, tile32_##MR##_4}
static const tile32_fn TILES32[12][4] = {
    TILE32_FNS(1), TILE32_FNS(2), TILE32_FNS(3), TILE32_FNS(4), TILE32_FNS(5), TILE32_FNS(6),
    TILE32_FNS(7), TILE32_FNS(8), TILE32_FNS(9), TILE32_FNS(10), TILE32_FNS(11), TILE32_FNS(12),
};

/* the rows of a register tile over nvt column vectors: `wide` 0 (the first version) 4 rows;
   else 6 rows at 3-4 vectors (24 accumulators), 8 at 2, 12 at 1: fewer loads per FMA. With K
   packed by 16 x 16 transposes (`pack_k32`), one thread, us a block, 4 rows / wide: MiniLM b8
   3171 / 2553, BERT-base b1 715 / 561, b8 6219 / 5093, ViT-B/16 b1 1594 / 1365
   (`benchmarks/minilm13_tiles.py`). bf16 keeps 4-row tiles (wider: 0.99-1.02). */
static inline int tile_rows(int64_t nvt, int64_t wide) {
    if (!wide) return 4;
    return nvt >= 3 ? 6 : nvt == 2 ? 8 : 12;
}

static void gemm32(int64_t m, int64_t nvt, const float *a, int64_t lda, int64_t kk,
                   const float *b, int64_t bstride, float *c, int64_t ldc, int64_t wide) {
    const int rows = tile_rows(nvt, wide);
    for (int64_t r = 0; r < m; r += rows) {
        int mr = m - r < rows ? (int)(m - r) : rows;
        for (int64_t j = 0; j < nvt; j += 4) {
            int nv = nvt - j < 4 ? (int)(nvt - j) : 4;
            TILES32[mr - 1][nv - 1](a + r * lda, lda, kk, b + j * bstride, bstride,
                                    c + r * ldc + j * 16, ldc);
        }
    }
}

/* K (t rows kt apart, d dense) -> [ceil(t/16)][d][16] floats, zero past t; `vec`: whole
   16 x 16 blocks by `transpose16` (the rest element by element, as all of it when 0) */
static void pack_k32(const float *k, int64_t t, int64_t d, int64_t kt, float *pk, int64_t vec) {
    const int64_t nb = (t + 15) / 16;
    for (int64_t b = 0; b < nb; ++b) {
        float *dst = pk + b * d * 16;
        int64_t rows = t - b * 16 < 16 ? t - b * 16 : 16;
        if (rows < 16) memset(dst, 0, (size_t)d * 16 * 4);
        int64_t p0 = 0;
        if (vec && rows == 16)
            for (; p0 + 16 <= d; p0 += 16) transpose16(k + b * 16 * kt + p0, kt, dst + p0 * 16);
        for (int64_t r = 0; r < rows; ++r) {
            const float *src = k + (b * 16 + r) * kt;
            for (int64_t p = p0; p < d; ++p) dst[p * 16 + r] = src[p];
        }
    }
}

/* V (t rows vt apart, d dense) -> [ceil(d/16)][t][16] floats, zero past d */
static void pack_v32(const float *v, int64_t t, int64_t d, int64_t vt, float *pv) {
    const int64_t nb = (d + 15) / 16;
    for (int64_t b = 0; b < nb; ++b) {
        int64_t cols = d - b * 16 < 16 ? d - b * 16 : 16;
        __mmask16 k = cols == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cols) - 1);
        float *dst = pv + b * t * 16;
        for (int64_t p = 0; p < t; ++p)
            _mm512_store_ps(dst + p * 16, _mm512_maskz_loadu_ps(k, v + p * vt + b * 16));
    }
}

int pgx_attention_f32(const int64_t *prm, double scale_d, const void *qv, const void *kv,
                      const void *vv, const void *mv, void *ov) {
    const float *q = qv, *k = kv, *v = vv;
    float *out = ov;
    const char *mask = mv;
    const int64_t B = prm[P_B], H = prm[P_H], S = prm[P_S], T = prm[P_T], D = prm[P_D];
    const int64_t MB = prm[P_ROWS];
    const int kind = (int)prm[P_MKIND];
    const int64_t msize = kind == 1 ? 4 : 2;
    const float scale = (float)scale_d;
    const int causal = prm[P_CAUSAL] != 0;
    const int64_t coff = prm[P_COFF];
    if (MB <= 0 || MB > MAX_ROWS || (kind && !mask) || (causal && coff < 0)) return -2;
    const int64_t nqb = (S + MB - 1) / MB, tasks = B * H * nqb;
    const int64_t tn = round_up(T, 16), dn = round_up(D, 16);
    /* per thread: packed K, packed V, scores (the exponentials in place), the output block */
    const size_t szk = round_up(tn * D * 4, 64), szv = round_up(dn * T * 4, 64);
    const size_t szs = round_up(MB * tn * 4, 64);
    if (!thread_scratch(prm, 1)) return -1;
#pragma omp parallel num_threads((int)prm[P_THREADS])
    {
        char *buf = thread_scratch(prm, 1);
        float *pk = (float *)buf, *pv = (float *)(buf + szk);
        float *sc = (float *)(buf + szk + szv), *ob = (float *)(buf + szk + szv + szs);
        int64_t packed = -1;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; ++task) {
            const int64_t bh = task / nqb, qb = task % nqb;
            const int64_t b = bh / H, h = bh % H;
            if (bh != packed) {
                if (bh + 1 < B * H) {
                    const int64_t nb = (bh + 1) / H, nh = (bh + 1) % H;
                    prefetch_rows(k + nb * prm[P_KB] + nh * prm[P_KH], T, 4 * prm[P_KT], 4 * D);
                    prefetch_rows(v + nb * prm[P_VB] + nh * prm[P_VH], T, 4 * prm[P_VT], 4 * D);
                    prefetch_rows(q + nb * prm[P_QB] + nh * prm[P_QH], S, 4 * prm[P_QS], 4 * D);
                }
                pack_k32(k + b * prm[P_KB] + h * prm[P_KH], T, D, prm[P_KT], pk, prm[P_TILES]);
                pack_v32(v + b * prm[P_VB] + h * prm[P_VH], T, D, prm[P_VT], pv);
                packed = bh;
            }
            const int64_t i0 = qb * MB, m = S - i0 < MB ? S - i0 : MB;
            const float *qa = q + b * prm[P_QB] + h * prm[P_QH] + i0 * prm[P_QS];
            const int64_t tb = causal && i0 + m + coff < T ? i0 + m + coff : T;
            const int64_t tbn = round_up(tb, 16);
            gemm32(m, tbn / 16, qa, prm[P_QS], D, pk, D * 16, sc, tn, prm[P_TILES]);
            float inv[MAX_ROWS];
            const char *mrow =
                kind ? mask + (b * prm[P_MB] + h * prm[P_MH] + i0 * prm[P_MS]) * msize : NULL;
            softmax_block(sc, tn, m, i0, T, causal, coff, tbn, scale, mrow, prm[P_MS] * msize,
                          kind, prm[P_MT], sc, tn, inv, 1);
            gemm32(m, dn / 16, sc, tn, tb, pv, T * 16, ob, dn, prm[P_TILES]);
            float *orow = out + b * prm[P_OB] + h * prm[P_OH] + i0 * prm[P_OS];
            for (int64_t i = 0; i < m; ++i) {
                const __m512 r = _mm512_set1_ps(inv[i]);
                for (int64_t j = 0; j < D; j += 16) {
                    __mmask16 km = D - j >= 16 ? (__mmask16)0xFFFF
                                               : (__mmask16)((1u << (D - j)) - 1);
                    _mm512_mask_storeu_ps(orow + i * prm[P_OS] + j, km,
                                          _mm512_mul_ps(_mm512_load_ps(ob + i * dn + j), r));
                }
            }
        }
    }
    return 0;
}

#else
int pgx_attention_f32(const int64_t *prm, double scale, const void *q, const void *k,
                      const void *v, const void *m, void *o) {
    (void)prm; (void)scale; (void)q; (void)k; (void)v; (void)m; (void)o;
    return -3;
}
#endif /* PGX_ATTN_F32 */
