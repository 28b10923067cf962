/* A fused attention block for the CPU (cpu target, `native_attention.py`): bf16
   (`pgx_attention_bf16`) and float32 (`pgx_attention_f32`, FMA; attention_f32.c, appended to
   this file as one source) operands.

   out = softmax(scale * (Q @ K^T) + mask) @ V per (batch, head, block of MB query rows), the
   block's scores kept in cache: S = Q K^T (bf16 products summed in float32 by
   `_mm512_dpbf16_ps` on K packed pair-interleaved once per (batch, head)), scale and mask in
   float32, the row softmax in float32 (max subtracted, base 2), the exponentials rounded to bf16
   once, O = P V (V packed pair-interleaved along the keys, float32 sums) times 1 / the sum of
   the rounded exponentials (built with -DPGX_ATTN_RSUM=0: of the unrounded ones, the first
   version; a build flag, as the two paths in one build cost 1-2 % of a block), rounded to
   bf16 once and written through the caller's strides (token-major: the output projection reads
   a view). The weights a row applies sum to one (a constant V comes out exactly): scores
   float32, probabilities bf16 once, as the oneDNN route (which rounds the normalised ones);
   float32 keeps float32.

   Operands: Q (B, H, S, D), K (B, H, T, D) (the caller's K^T view), V (B, H, T, D), out (B, H,
   S, D): strides for batch, head and row, the last axis dense; D even for bf16. The additive
   mask (float32, bf16 or none) has four strides (0 where broadcast), the last 0 or 1. Causal
   (P_CAUSAL, set by the lowering where the mask is a known lower triangle): query row i sees
   keys j <= i + P_COFF only, so a block of rows i0.. reads the first i0 + MB + P_COFF keys (Q
   K^T, softmax and P V over them; the rest weigh 0, not computed), the mask (if any) read only
   there: GPT-2's s128 blocks compute 9/16 of the scores at 16 rows a block (the caller's
   `CAUSAL_ROWS`). The weights equal the full kernel's where every row keeps a finite score
   (masked scores there give exactly 0). Threads: `omp parallel` over (batch, head, query
   block), contiguous per thread, so a thread packs each (batch, head)'s K and V once
   (prefetching the next one's rows meanwhile). Scratch: the caller's (address P_SCRATCH,
   P_SLOT bytes a thread, at least `pgx_attention_scratch()`, 64-aligned), kept between calls:
   the kernel owns no memory, so a thread that exits leaves nothing behind.

   The float32 variant is built where the compiler targets AVX-512 F/BW/VL, the bf16 one where it
   also targets AVX512_BF16: `pgx_attention_supported()` says which (PGX_ATTN_BIT_*). NaN in the
   scores or mask propagates (as in torch / ONNX Runtime): x86's max returns its second operand
   when one is NaN, so the clamps put the value second. */

#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define PGX_ATTN_F32 1
#include <immintrin.h>
#include <omp.h>
#else
#define PGX_ATTN_F32 0
#endif
#if PGX_ATTN_F32 && defined(__AVX512BF16__)
#define PGX_ATTN_BF16 1
#else
#define PGX_ATTN_BF16 0
#endif
#define PGX_ATTN_BIT_F32 1
#define PGX_ATTN_BIT_BF16 2

/* the layout of the parameter array (int64) the caller fills once per operand signature */
enum {
    P_B, P_H, P_S, P_T, P_D,
    P_QB, P_QH, P_QS,
    P_KB, P_KH, P_KT,
    P_VB, P_VH, P_VT,
    P_MB, P_MH, P_MS, P_MT, P_MKIND, /* mask kind: 0 none, 1 float32, 2 bf16 */
    P_OB, P_OH, P_OS,
    P_THREADS, P_ROWS, /* query rows per block (MB), a multiple of 4 */
    P_TILES, /* 0: K packed one element (bf16: pair) at a time, float32 4-row tiles; 1: K
                packed by 16 x 16 transposes (`pack_k`, `pack_k32`), the float32 kernel's
                wider tiles (`tile_rows`) */
    P_CAUSAL, P_COFF, /* 1: query row i sees keys j <= i + COFF only (COFF >= 0), the others
                         weigh 0; a query block reads only the key blocks it sees */
    P_SCRATCH, P_SLOT, /* the caller's scratch: address, bytes per thread */
    P_COUNT
};

int pgx_attention_supported(void) {
    return (PGX_ATTN_F32 ? PGX_ATTN_BIT_F32 : 0) | (PGX_ATTN_BF16 ? PGX_ATTN_BIT_BF16 : 0);
}
int pgx_attention_params(void) { return P_COUNT; }

static inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

#define MAX_ROWS 256

/* the scratch bytes (a multiple of 64) one thread needs: float32 operands if `f32`, else bf16 */
int64_t pgx_attention_scratch(const int64_t *prm, int f32) {
    const int64_t T = prm[P_T], D = prm[P_D], MB = prm[P_ROWS];
    const int64_t tn = round_up(T, 16), dn = round_up(D, 16), tp = (T + 1) / 2;
    if (f32) /* packed K, packed V, scores (the exponentials in place), the output block */
        return round_up(tn * D * 4, 64) + round_up(dn * T * 4, 64) + round_up(MB * tn * 4, 64) +
               round_up(MB * dn * 4, 64);
    /* packed K, packed V, scores, probabilities, the float32 output block */
    return round_up(tn * D * 2, 64) + round_up(dn * tp * 4, 64) + round_up(MB * tn * 4, 64) +
           round_up(MB * tn * 2, 64) + round_up(MB * dn * 4, 64);
}

#if PGX_ATTN_F32

typedef uint16_t bf16;

/* this thread's part of the caller's scratch, or NULL when the caller gave none big enough */
static inline char *thread_scratch(const int64_t *prm, int f32) {
    if (!prm[P_SCRATCH] || prm[P_SLOT] < pgx_attention_scratch(prm, f32) || prm[P_SLOT] % 64)
        return NULL;
    return (char *)(intptr_t)prm[P_SCRATCH] + (int64_t)omp_get_thread_num() * prm[P_SLOT];
}

#if PGX_ATTN_BF16

static inline int32_t load_pair(const bf16 *p) {
    int32_t x;
    memcpy(&x, p, 4);
    return x;
}

/* C[MR][NV*16] = A (MR rows lda apart, bf16 pairs) x B (NV blocks bstride apart, [kp][16][2]) */
static inline __attribute__((always_inline)) void tile(const int mr, const int nv,
                                                       const bf16 *a, int64_t lda, int64_t kp,
                                                       const bf16 *b, int64_t bstride,
                                                       float *c, int64_t ldc) {
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r)
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int64_t p = 0; p < kp; ++p) {
        __m512bh bv[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j)
            if (j < nv) bv[j] = (__m512bh)_mm512_loadu_si512(b + j * bstride + p * 32);
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
            if (r < mr) {
                __m512bh av = (__m512bh)_mm512_set1_epi32(load_pair(a + r * lda + 2 * p));
#pragma GCC unroll 4
                for (int j = 0; j < 4; ++j)
                    if (j < nv) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], av, bv[j]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r)
        if (r < mr)
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j)
                if (j < nv) _mm512_storeu_ps(c + r * ldc + j * 16, acc[r][j]);
}

typedef void (*tile_fn)(const bf16 *, int64_t, int64_t, const bf16 *, int64_t, float *, int64_t);
#define TILE(MR, NV)                                                                        \
    static void tile_##MR##_##NV(const bf16 *a, int64_t lda, int64_t kp, const bf16 *b,      \
                                 int64_t bs, float *c, int64_t ldc) {                        \
        tile(MR, NV, a, lda, kp, b, bs, c, ldc);                                            \
    }
#define TILE_ROW(MR) TILE(MR, 1) TILE(MR, 2) TILE(MR, 3) TILE(MR, 4)
TILE_ROW(1) TILE_ROW(2) TILE_ROW(3) TILE_ROW(4)
#define TILE_FNS(MR) {tile_##MR##_1, tile_##MR##_2, tile_##MR##_3, tile_##MR##_4}
static const tile_fn TILES[4][4] = {TILE_FNS(1), TILE_FNS(2), TILE_FNS(3), TILE_FNS(4)};

/* C (m x nvt*16 floats) = A (m rows) x B (nvt column blocks) */
static void gemm(int64_t m, int64_t nvt, const bf16 *a, int64_t lda, int64_t kp, const bf16 *b,
                 int64_t bstride, float *c, int64_t ldc) {
    for (int64_t r = 0; r < m; r += 4) {
        int mr = m - r < 4 ? (int)(m - r) : 4;
        for (int64_t j = 0; j < nvt; j += 4) {
            int nv = nvt - j < 4 ? (int)(nvt - j) : 4;
            TILES[mr - 1][nv - 1](a + r * lda, lda, kp, b + j * bstride, bstride,
                                  c + r * ldc + j * 16, ldc);
        }
    }
}

#endif /* PGX_ATTN_BF16 */

/* 2^x for float32 lanes: 2^round(x) (`vscalefps`) times a degree-6 Taylor polynomial of the
   rest (relative error below 2e-7); below -150 it is 0 or a denormal, unseen by a row's sum of
   at least 1. The softmax works in base 2 (log2(e) folded into the block's scale). */
static inline __m512 exp2_512(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x); /* NaN stays NaN */
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3333558146428443e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.6181291076284772e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.5504108664821580e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4022650695910071e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.9314718055994531e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

static inline __m512 load_mask(const void *m, int kind, int64_t t, int64_t mt, __mmask16 k) {
    if (mt == 0) {
        float x;
        if (kind == 1) {
            x = *(const float *)m;
        } else {
            uint32_t bits = (uint32_t)(*(const bf16 *)m) << 16;
            memcpy(&x, &bits, 4);
        }
        return _mm512_set1_ps(x);
    }
    if (kind == 1) return _mm512_maskz_loadu_ps(k, (const float *)m + t);
    __m256i h = _mm256_maskz_loadu_epi16(k, (const bf16 *)m + t);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* a row's first pass: s (1 <= t <= tn floats) <- scale * s + mask in base 2, -inf past t
   (only the vectors up to t are read); returns the row's max. s is read and written in whole
   vectors: a masked store does not forward to the load that reads it back (a fifth of
   MiniLM's block, one thread). */
static inline __attribute__((always_inline)) float softmax_max(
    float *s, int64_t t, float scale, const void *m, int kind, int64_t mt) {
    const float log2e = 1.44269504088896341f;
    const __m512 vs = _mm512_set1_ps(scale * log2e), vl = _mm512_set1_ps(log2e);
    const __m512 ninf = _mm512_set1_ps(-__builtin_inff()), lowest = _mm512_set1_ps(-FLT_MAX);
    const int64_t tv = round_up(t, 16);
    __m512 vmax = ninf;
    for (int64_t j = 0; j < tv; j += 16) {
        __mmask16 k = t - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (t - j)) - 1);
        __m512 x = _mm512_mul_ps(_mm512_load_ps(s + j), vs);
        if (kind) /* a -FLT_MAX fill times log2(e) stays finite: a row masked out everywhere
                     gets uniform weights, as the unscaled scores would; NaN stays NaN */
            x = _mm512_max_ps(lowest, _mm512_fmadd_ps(load_mask(m, kind, j, mt, k), vl, x));
        x = _mm512_mask_blend_ps(k, ninf, x);
        _mm512_store_ps(s + j, x);
        vmax = _mm512_max_ps(vmax, x);
    }
    return _mm512_reduce_max_ps(vmax);
}

/* a row's second pass: p (tn bf16, or floats if `f32`; may be s) <- exp2(s - mx) (rounded to
   bf16), 0 past t (a causal row's last vectors zeroed); returns 1 / the row's sum
   (unrounded), applied by the caller to the output: probabilities rounded once, as in the
   oneDNN route, before the division (one pass less) */
static inline __attribute__((always_inline)) float softmax_exp(
    const float *s, int64_t t, int64_t tn, float mxs, void *p, const int f32) {
    const int64_t tv = round_up(t, 16);
    const __m512 mx = _mm512_set1_ps(mxs);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t j = 0; j < tv; j += 16) {
        __mmask16 k = t - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (t - j)) - 1);
        __m512 e = _mm512_maskz_mov_ps(k, exp2_512(_mm512_sub_ps(_mm512_load_ps(s + j), mx)));
        if (f32)
            _mm512_store_ps((float *)p + j, e);
#if PGX_ATTN_BF16
        else
            _mm256_store_si256((__m256i *)((bf16 *)p + j), (__m256i)_mm512_cvtneps_pbh(e));
#endif
        vsum = _mm512_add_ps(vsum, e);
    }
    for (int64_t j = tv; j < tn; j += 16) { /* keys a causal row does not see */
        if (f32)
            _mm512_store_ps((float *)p + j, _mm512_setzero_ps());
#if PGX_ATTN_BF16
        else
            _mm256_store_si256((__m256i *)((bf16 *)p + j), _mm256_setzero_si256());
#endif
    }
    return 1.0f / _mm512_reduce_add_ps(vsum);
}

#ifndef PGX_ATTN_RSUM
#define PGX_ATTN_RSUM 1
#endif
#if PGX_ATTN_BF16
/* a bf16 row's second pass (PGX_ATTN_RSUM): as `softmax_exp`, but 32 keys at a time (one
   `vcvtne2ps2bf16`, one 64-byte store) and 1 / the sum of the *rounded* exponentials returned,
   summed by `vdpbf16ps` against ones (the products' own arithmetic: the second product's
   weights then sum to one) */
static inline __attribute__((always_inline)) float softmax_exp_rounded(
    const float *s, int64_t t, int64_t tn, float mxs, bf16 *p) {
    const int64_t tv = round_up(t, 16);
    const __m512 mx = _mm512_set1_ps(mxs);
    const __m512bh one = (__m512bh)_mm512_set1_epi16(0x3F80);
    __m512 vsum = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 32 <= tv; j += 32) {
        __mmask16 k0 = t - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (t - j)) - 1);
        __mmask16 k1 = t - j >= 32 ? (__mmask16)0xFFFF : (__mmask16)((1u << (t - j - 16)) - 1);
        __m512 e0 = _mm512_maskz_mov_ps(k0, exp2_512(_mm512_sub_ps(_mm512_load_ps(s + j), mx)));
        __m512 e1 =
            _mm512_maskz_mov_ps(k1, exp2_512(_mm512_sub_ps(_mm512_load_ps(s + j + 16), mx)));
        __m512bh r = _mm512_cvtne2ps_pbh(e1, e0);
        _mm512_storeu_si512(p + j, (__m512i)r);
        vsum = _mm512_dpbf16_ps(vsum, r, one);
    }
    if (j < tv) { /* an odd 16 */
        __mmask16 k = t - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (t - j)) - 1);
        __m512 e = _mm512_maskz_mov_ps(k, exp2_512(_mm512_sub_ps(_mm512_load_ps(s + j), mx)));
        __m256bh r = _mm512_cvtneps_pbh(e);
        _mm256_storeu_si256((__m256i *)(p + j), (__m256i)r);
        vsum = _mm512_dpbf16_ps(vsum, (__m512bh)_mm512_zextsi256_si512((__m256i)r), one);
        j += 16;
    }
    for (; j < tn; j += 16) /* keys a causal row does not see */
        _mm256_storeu_si256((__m256i *)(p + j), _mm256_setzero_si256());
    return 1.0f / _mm512_reduce_add_ps(vsum);
}
#endif

/* a row's second pass: `softmax_exp_rounded` for bf16 (PGX_ATTN_RSUM), else `softmax_exp` */
static inline __attribute__((always_inline)) float row_exp(
    const float *s, int64_t t, int64_t tn, float mx, void *p, const int f32) {
#if PGX_ATTN_BF16
    if (!f32 && PGX_ATTN_RSUM) return softmax_exp_rounded(s, t, tn, mx, (bf16 *)p);
#endif
    return softmax_exp(s, t, tn, mx, p, f32);
}

/* the block's softmax (m rows of `sc`, tn apart; the probabilities p, ldp apart, in place
   for float32): each row's first pass, then each row's second (`PGX_ATTN_ROWWISE` 0, the
   default: the rows' independent chains overlap, no row waits for its own max), or both
   passes row by row (1, the first version, a build flag for A/B); inv[i] <- 1 / row i's sum
   (bf16 with PGX_ATTN_RSUM: of its rounded weights).
   Row i's keys: t (all) or, causal, up to i0 + i + coff; tbn: the block's score columns. */
#ifndef PGX_ATTN_ROWWISE
#define PGX_ATTN_ROWWISE 0
#endif
static inline __attribute__((always_inline)) void softmax_block(
    float *sc, int64_t tn, int64_t m, int64_t i0, int64_t t, int causal, int64_t coff,
    int64_t tbn, float scale, const char *mrow0, int64_t mrow_step, int kind, int64_t mt,
    void *p, int64_t ldp, float *inv, const int f32) {
    const int64_t psize = f32 ? 4 : 2;
#define PGX_ROW_T(i) (causal && i0 + (i) + coff + 1 < t ? i0 + (i) + coff + 1 : t)
#define PGX_ROW_M(i) (kind ? mrow0 + (i) * mrow_step : NULL)
    if (PGX_ATTN_ROWWISE) {
        for (int64_t i = 0; i < m; ++i) {
            const float mx = softmax_max(sc + i * tn, PGX_ROW_T(i), scale, PGX_ROW_M(i), kind, mt);
            inv[i] = row_exp(sc + i * tn, PGX_ROW_T(i), tbn, mx, (char *)p + i * ldp * psize,
                             f32);
        }
        return;
    }
    float mx[MAX_ROWS];
    for (int64_t i = 0; i < m; ++i)
        mx[i] = softmax_max(sc + i * tn, PGX_ROW_T(i), scale, PGX_ROW_M(i), kind, mt);
    for (int64_t i = 0; i < m; ++i)
        inv[i] = row_exp(sc + i * tn, PGX_ROW_T(i), tbn, mx[i], (char *)p + i * ldp * psize,
                         f32);
#undef PGX_ROW_T
#undef PGX_ROW_M
}

/* dst[c * 16 + r] = src[r * ld + c] for a 16 x 16 block of 32-bit values (unpack, in-lane
   shuffles, two rounds of 128-bit lane shuffles; only moves bits: also bf16 pairs) */
static inline void transpose16(const float *src, int64_t ld, float *dst) {
    __m512 r[16], t[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ld);
#pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
#pragma GCC unroll 2
    for (int h = 0; h < 16; h += 8)
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
            t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
        }
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
        _mm512_store_ps(dst + i * 16, _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88));
        _mm512_store_ps(dst + (i + 8) * 16, _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd));
    }
}

#if PGX_ATTN_BF16
/* K (t rows kt apart, d dense) -> [ceil(t/16)][d/2][16] bf16 pairs, zero past t */
static void pack_k(const bf16 *k, int64_t t, int64_t d, int64_t kt, int32_t *pk, int64_t vec) {
    const int64_t kp = d / 2, nb = (t + 15) / 16;
    for (int64_t b = 0; b < nb; ++b) {
        int32_t *dst = pk + b * kp * 16;
        int64_t rows = t - b * 16 < 16 ? t - b * 16 : 16;
        if (rows < 16) memset(dst, 0, (size_t)kp * 16 * 4);
        int64_t p0 = 0;
        if (vec && rows == 16 && kt % 2 == 0) /* 16 keys x 16 pairs: a 32-bit transpose */
            for (; p0 + 16 <= kp; p0 += 16)
                transpose16((const float *)(k + b * 16 * kt + 2 * p0), kt / 2,
                            (float *)(dst + p0 * 16));
        for (int64_t r = 0; r < rows; ++r) {
            const bf16 *src = k + (b * 16 + r) * kt;
            for (int64_t p = p0; p < kp; ++p) dst[p * 16 + r] = load_pair(src + 2 * p);
        }
    }
}

/* V (t rows vt apart, d dense) -> [ceil(d/16)][ceil(t/2)][16][2] bf16, zero past t and d */
static void pack_v(const bf16 *v, int64_t t, int64_t d, int64_t vt, bf16 *pv) {
    const int64_t tp = (t + 1) / 2, nb = (d + 15) / 16;
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                         24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                         16, 0);
    for (int64_t b = 0; b < nb; ++b) {
        int64_t cols = d - b * 16 < 16 ? d - b * 16 : 16;
        __mmask16 k = cols == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cols) - 1);
        bf16 *dst = pv + b * tp * 32;
        for (int64_t p = 0; p < tp; ++p) {
            __m256i lo = _mm256_maskz_loadu_epi16(k, v + 2 * p * vt + b * 16);
            __m256i hi = 2 * p + 1 < t ? _mm256_maskz_loadu_epi16(k, v + (2 * p + 1) * vt + b * 16)
                                       : _mm256_setzero_si256();
            __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            _mm512_storeu_si512(dst + p * 32, _mm512_permutexvar_epi16(idx, both));
        }
    }
}

#endif /* PGX_ATTN_BF16 */

/* ask for rows (n of them, `ld` bytes apart, `d` bytes each) to be brought into L2 */
static void prefetch_rows(const void *x, int64_t n, int64_t ld, int64_t d) {
    const char *c = x;
    for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < d; j += 64) _mm_prefetch(c + r * ld + j, _MM_HINT_T1);
}

#if PGX_ATTN_BF16
int pgx_attention_bf16(const int64_t *prm, double scale_d, const void *qv, const void *kv,
                       const void *vv, const void *mv, void *ov) {
    const bf16 *q = qv, *k = kv, *v = vv;
    bf16 *out = ov;
    const char *mask = mv;
    const int64_t B = prm[P_B], H = prm[P_H], S = prm[P_S], T = prm[P_T], D = prm[P_D];
    const int64_t MB = prm[P_ROWS];
    const int kind = (int)prm[P_MKIND];
    const int64_t msize = kind == 1 ? 4 : 2;
    const float scale = (float)scale_d;
    const int causal = prm[P_CAUSAL] != 0;
    const int64_t coff = prm[P_COFF];
    if (D % 2 || MB <= 0 || MB > MAX_ROWS || (kind && !mask) || (causal && coff < 0)) return -2;
    const int64_t nqb = (S + MB - 1) / MB, tasks = B * H * nqb;
    const int64_t tn = round_up(T, 16), tp = (T + 1) / 2, dn = round_up(D, 16);
    const int64_t ldp = tn;
    /* per thread (`pgx_attention_scratch`): packed K, packed V, scores, probabilities, the
       float32 output block */
    const size_t szk = round_up(tn * D * 2, 64), szv = round_up(dn * tp * 4, 64);
    const size_t szs = round_up(MB * tn * 4, 64), szp = round_up(MB * ldp * 2, 64);
    if (!thread_scratch(prm, 0)) return -1;
#pragma omp parallel num_threads((int)prm[P_THREADS])
    {
        char *buf = thread_scratch(prm, 0);
        int32_t *pk = (int32_t *)buf;
        bf16 *pv = (bf16 *)(buf + szk);
        float *sc = (float *)(buf + szk + szv);
        bf16 *pr = (bf16 *)(buf + szk + szv + szs);
        float *ob = (float *)(buf + szk + szv + szs + szp);
        int64_t packed = -1;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; ++task) {
            const int64_t bh = task / nqb, qb = task % nqb;
            const int64_t b = bh / H, h = bh % H;
            if (bh != packed) {
                if (bh + 1 < B * H) { /* the next head's operands, while this one computes:
                                         strided rows the hardware prefetcher does not see */
                    const int64_t nb = (bh + 1) / H, nh = (bh + 1) % H;
                    prefetch_rows(k + nb * prm[P_KB] + nh * prm[P_KH], T, 2 * prm[P_KT], 2 * D);
                    prefetch_rows(v + nb * prm[P_VB] + nh * prm[P_VH], T, 2 * prm[P_VT], 2 * D);
                    prefetch_rows(q + nb * prm[P_QB] + nh * prm[P_QH], S, 2 * prm[P_QS], 2 * D);
                }
                pack_k(k + b * prm[P_KB] + h * prm[P_KH], T, D, prm[P_KT], pk, prm[P_TILES]);
                pack_v(v + b * prm[P_VB] + h * prm[P_VH], T, D, prm[P_VT], pv);
                packed = bh;
            }
            const int64_t i0 = qb * MB, m = S - i0 < MB ? S - i0 : MB;
            const bf16 *qa = q + b * prm[P_QB] + h * prm[P_QH] + i0 * prm[P_QS];
            /* the keys the block reads (tb), their 16-wide vectors (tbn): all, or causal */
            const int64_t tb = causal && i0 + m + coff < T ? i0 + m + coff : T;
            const int64_t tbn = round_up(tb, 16);
            gemm(m, tbn / 16, qa, prm[P_QS], D / 2, (const bf16 *)pk, (D / 2) * 32, sc, tn);
            float inv[MAX_ROWS];
            const char *mrow =
                kind ? mask + (b * prm[P_MB] + h * prm[P_MH] + i0 * prm[P_MS]) * msize : NULL;
            softmax_block(sc, tn, m, i0, T, causal, coff, tbn, scale, mrow, prm[P_MS] * msize,
                          kind, prm[P_MT], pr, ldp, inv, 0);
            gemm(m, dn / 16, pr, ldp, (tb + 1) / 2, pv, tp * 32, ob, dn);
            bf16 *orow = out + b * prm[P_OB] + h * prm[P_OH] + i0 * prm[P_OS];
            for (int64_t i = 0; i < m; ++i) {
                const __m512 r = _mm512_set1_ps(inv[i]);
                for (int64_t j = 0; j < D; j += 16) {
                    __mmask16 km = D - j >= 16 ? (__mmask16)0xFFFF
                                               : (__mmask16)((1u << (D - j)) - 1);
                    __m256bh y = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_load_ps(ob + i * dn + j), r));
                    _mm256_mask_storeu_epi16(orow + i * prm[P_OS] + j, km, (__m256i)y);
                }
            }
        }
    }
    return 0;
}

#endif /* PGX_ATTN_BF16 */

#endif /* PGX_ATTN_F32 (the float32 variant: attention_f32.c) */

#if !PGX_ATTN_BF16 /* (built without AVX512_BF16: -3, as the float32 variant without AVX-512) */
int pgx_attention_bf16(const int64_t *prm, double scale, const void *q, const void *k,
                       const void *v, const void *m, void *o) {
    (void)prm; (void)scale; (void)q; (void)k; (void)v; (void)m; (void)o;
    return -3;
}
#endif
