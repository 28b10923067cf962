/* A float32 product with a fixed, very wide weight (helper gemm18, issue 10): C = A @ B (+ bias),
 * A (M x K, row stride lda), B packed once (gemm_wide_pack) into panels of 48 columns, each panel
 * [K][48] (zero-padded past N), C (M x N, row stride ldc).
 *
 * Why: GPT-2's LM head (128 x 768 x 50257 at batch 1: 30 % of the run) streams its 154 MB
 * weight from memory once a run; oneDNN 3.2's brgemm ran it at 107-108 GFLOP/s a core on the
 * 2-core EPYC (Zen 4) against a register FMA peak of 116, the same kernel 115 on a 768-column
 * weight that stays in cache. This kernel is an 8 x 48 register block (24 zmm accumulators,
 * 3 weight vectors, 8 broadcasts of A a step over the whole K), A's rows packed per call in
 * blocks of 8 ([K][8]), the panels split over the threads (static: each thread streams a
 * contiguous run of panels), and while a panel is computed the next panel is prefetched into
 * L2 (one line every 4 steps of K, spread over the row blocks), a block's lines of C for
 * writing before its K loop: 110-111 GFLOP/s
 * (benchmarks/results/gemm18.md). Rows are taken in chunks (chunk_rows) that keep a chunk of
 * packed A in L2 next to a panel (a 1024-row batch re-streams the weight once per chunk).
 * Helper gemm18b: A packed by 8 x 8 transposes; a K-blocked form with a residual sum
 * (gemm_wide_f32_kb, 0.98-1.00x oneDNN on FFN-down's K = 3072: not routed) and a column-parts
 * form (gemm_wide_f32_parts: Q / K / V as three dense blocks).
 */
#include <stdint.h>
#include <string.h>
#include <omp.h>

#define MR 8
#define NR 48
/* a block prefetches K / 4 lines of the next panel: PF_BLOCKS blocks cover its K x NR floats,
 * (NR / 4 blocks); later blocks go over them again (in L2 by then: cheap) */
#define PF_BLOCKS (NR / 4)
#ifndef CHUNK_MAX
#define CHUNK_MAX 256
#endif

/* 1 where this build has the kernel (AVX-512F), else 0 */
int gemm_wide_supported(void) {
#ifdef __AVX512F__
    return 1;
#else
    return 0;
#endif
}

/* the panel width (columns) and the floats gemm_wide_pack writes for a K x N weight */
int64_t gemm_wide_panel(void) { return NR; }
int64_t gemm_wide_packed_size(int64_t K, int64_t N) { return (N + NR - 1) / NR * NR * K; }

/* B (K x N, row stride ldb) into panels of NR columns, panel p = [K][NR], zero past N */
void gemm_wide_pack(const float *B, int64_t K, int64_t N, int64_t ldb, float *P) {
    const int64_t np = (N + NR - 1) / NR;
    for (int64_t p = 0; p < np; p++) {
        float *dst = P + p * K * NR;
        const int64_t n0 = p * NR, w = N - n0 < NR ? N - n0 : NR;
        for (int64_t k = 0; k < K; k++) {
            memcpy(dst + k * NR, B + k * ldb + n0, (size_t)w * sizeof(float));
            for (int64_t j = w; j < NR; j++) dst[k * NR + j] = 0.f;
        }
    }
}

/* rows of a chunk: a chunk of packed A (rows x K floats) within ~1 MB, a multiple of MR, 8 to
 * CHUNK_MAX rows (GPT-2's head at batch 8, 1024 x 768 x 50257, one thread: chunks of 256 rows
 * 1.02x oneDNN's speed, of 128 rows 1.00x, the whole 1024 rows at once 1.015x) */
static int64_t chunk_rows(int64_t K) {
    int64_t r = (CHUNK_MAX * 1024) / (K > 0 ? K : 1) / MR * MR;
    return r < MR ? MR : r > CHUNK_MAX ? CHUNK_MAX : r;
}

#ifdef __AVX512F__
#include <immintrin.h>

/* 8 rows x 8 columns of A (row stride lda) into 8 columns x 8 rows at P */
static inline void tr8(const float *src, int64_t lda, float *P) {
    const __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + lda),
                 r2 = _mm256_loadu_ps(src + 2 * lda), r3 = _mm256_loadu_ps(src + 3 * lda),
                 r4 = _mm256_loadu_ps(src + 4 * lda), r5 = _mm256_loadu_ps(src + 5 * lda),
                 r6 = _mm256_loadu_ps(src + 6 * lda), r7 = _mm256_loadu_ps(src + 7 * lda);
    const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
                 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3),
                 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE),
                 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE),
                 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE),
                 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(P, _mm256_permute2f128_ps(s0, s4, 0x20));
    _mm256_storeu_ps(P + 8, _mm256_permute2f128_ps(s1, s5, 0x20));
    _mm256_storeu_ps(P + 16, _mm256_permute2f128_ps(s2, s6, 0x20));
    _mm256_storeu_ps(P + 24, _mm256_permute2f128_ps(s3, s7, 0x20));
    _mm256_storeu_ps(P + 32, _mm256_permute2f128_ps(s0, s4, 0x31));
    _mm256_storeu_ps(P + 40, _mm256_permute2f128_ps(s1, s5, 0x31));
    _mm256_storeu_ps(P + 48, _mm256_permute2f128_ps(s2, s6, 0x31));
    _mm256_storeu_ps(P + 56, _mm256_permute2f128_ps(s3, s7, 0x31));
}

/* rows r0 .. r0 + MR - 1 of A into [K][MR], zero rows past M (a full block: 8 x 8 transposes,
 * helper gemm18b: the element loop cost ~3 % of FFN-down's product, which packs 4x the A of
 * FFN-up's for the same work) */
static void pack_a(const float *A, int64_t M, int64_t K, int64_t lda, int64_t r0, float *P) {
    if (r0 + MR <= M) {
        const float *src = A + r0 * lda;
        int64_t k = 0;
        for (; k + 8 <= K; k += 8) tr8(src + k, lda, P + k * MR);
        for (; k < K; k++)
            for (int r = 0; r < MR; r++) P[k * MR + r] = src[r * lda + k];
        return;
    }
    for (int r = 0; r < MR; r++) {
        if (r0 + r < M) {
            const float *src = A + (r0 + r) * lda;
            for (int64_t k = 0; k < K; k++) P[k * MR + r] = src[k];
        } else {
            for (int64_t k = 0; k < K; k++) P[k * MR + r] = 0.f;
        }
    }
}

#define DECL(r) __m512 c##r##0 = i0, c##r##1 = i1, c##r##2 = i2;
#define ROW(r)                                         \
    {                                                  \
        const __m512 a = _mm512_set1_ps(ap[r]);        \
        c##r##0 = _mm512_fmadd_ps(a, b0, c##r##0);     \
        c##r##1 = _mm512_fmadd_ps(a, b1, c##r##1);     \
        c##r##2 = _mm512_fmadd_ps(a, b2, c##r##2);     \
    }
#define STEP                                                             \
    {                                                                    \
        const __m512 b0 = _mm512_loadu_ps(bp), b1 = _mm512_loadu_ps(bp + 16), \
                     b2 = _mm512_loadu_ps(bp + 32);                      \
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7)          \
        ap += MR;                                                        \
        bp += NR;                                                        \
    }
#define STORE(r)                                              \
    if (r < rows) {                                           \
        float *cr = C + (int64_t)r * ldc;                     \
        _mm512_mask_storeu_ps(cr, m0, c##r##0);               \
        _mm512_mask_storeu_ps(cr + 16, m1, c##r##1);          \
        _mm512_mask_storeu_ps(cr + 32, m2, c##r##2);          \
    }

static inline __mmask16 lane_mask(int64_t cols, int64_t from) {
    const int64_t n = cols - from;
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

/* one MR x NR block of C (rows <= MR, cols <= NR valid) over the whole K; `pf` walks the next
 * panel, one line every 4 steps (into L2) */
#define LOADC(r)                                                   \
    if (r < rows) {                                                \
        const float *cr = C + (int64_t)r * ldc;                    \
        c##r##0 = _mm512_add_ps(c##r##0, _mm512_maskz_loadu_ps(m0, cr));      \
        c##r##1 = _mm512_add_ps(c##r##1, _mm512_maskz_loadu_ps(m1, cr + 16)); \
        c##r##2 = _mm512_add_ps(c##r##2, _mm512_maskz_loadu_ps(m2, cr + 32)); \
    }

/* `load_c`: the block adds its product (and `bias`) to what C holds (a later K block, or a
 * residual sum), else it stores it (over the whole K, or a first K block) */
static inline void block(const float *ap, const float *bp, int64_t K, const float *bias,
                         float *C, int64_t ldc, int rows, int64_t cols, const char *pf,
                         int load_c) {
    const __mmask16 m0 = lane_mask(cols, 0), m1 = lane_mask(cols, 16), m2 = lane_mask(cols, 32);
    const __m512 i0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
    const __m512 i1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
    const __m512 i2 = bias ? _mm512_maskz_loadu_ps(m2, bias + 32) : _mm512_setzero_ps();
    DECL(0) DECL(1) DECL(2) DECL(3) DECL(4) DECL(5) DECL(6) DECL(7)
    if (load_c) {
        LOADC(0) LOADC(1) LOADC(2) LOADC(3) LOADC(4) LOADC(5) LOADC(6) LOADC(7)
    }
    /* the block's lines of C, for writing: their reads for ownership overlap the K loop (the
     * head's result, 26 MB at batch 1, is not in cache: 1.036x -> 1.057x oneDNN's speed) */
    for (int r = 0; r < rows; r++) {
        const char *cr = (const char *)(C + (int64_t)r * ldc);
        _mm_prefetch(cr, _MM_HINT_ET0);
        _mm_prefetch(cr + 64, _MM_HINT_ET0);
        _mm_prefetch(cr + 128, _MM_HINT_ET0);
        _mm_prefetch(cr + 4 * cols - 1, _MM_HINT_ET0);
    }
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) {
        _mm_prefetch(pf, _MM_HINT_T1);
        pf += 64;
        STEP STEP STEP STEP
    }
    for (; k < K; k++) STEP
    STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5) STORE(6) STORE(7)
}
#endif

/* C = A @ B (+ bias) over `threads` threads; P from gemm_wide_pack(B, K, N); `bias` N floats or
 * NULL; `apack` scratch of chunk rows (rounded up to MR) x K floats: gemm_wide_scratch(M, K).
 * Returns 0, or -1 where this build has no kernel. */
int64_t gemm_wide_scratch(int64_t M, int64_t K) {
    const int64_t c = chunk_rows(K), m = (M + MR - 1) / MR * MR;
    return (m < c ? m : c) * K;
}

/* the K-blocked form (helper gemm18b): K taken in blocks of `kc` (<= 0 or >= K: one block);
 * each K block packs its slice of a chunk of A's rows, then runs every panel's slice of that
 * K block ([kc][48] in the panel: contiguous) over the chunk's row blocks, the first K block
 * storing C (with the bias), the later ones adding into it. `residual`: C += A @ B (+ bias)
 * (C's values on entry are added, a residual sum). `apack`: gemm_wide_scratch(M, kc) floats.
 * Why: a 3072-deep weight (GPT-2's FFN-down) has 590 KB panels, which with a chunk of packed A
 * overflow the 1 MB L2 (0.91x oneDNN's speed unblocked). */
int64_t gemm_wide_scratch_kb(int64_t M, int64_t K, int64_t kc) {
    return gemm_wide_scratch(M, kc > 0 && kc < K ? kc : K);
}

static int wide_run(const float *A, int64_t M, int64_t K, int64_t lda, const float *P,
                    const float *bias, int64_t N, float *C, int64_t ldc, float *apack,
                    int64_t threads, int64_t kc, int residual, int64_t part_cols,
                    int64_t part_stride) {
#ifdef __AVX512F__
    if (kc <= 0 || kc > K) kc = K;
    const int64_t np = (N + NR - 1) / NR, chunk = chunk_rows(kc);
#pragma omp parallel num_threads((int)(threads > 0 ? threads : 1))
    for (int64_t c0 = 0; c0 < M; c0 += chunk) {
        const int64_t rows_c = M - c0 < chunk ? M - c0 : chunk, mb = (rows_c + MR - 1) / MR;
        for (int64_t k0 = 0; k0 < K; k0 += kc) {
            const int64_t kb = K - k0 < kc ? K - k0 : kc;
            const int first = k0 == 0;
#pragma omp for schedule(static)
            for (int64_t b = 0; b < mb; b++)
                pack_a(A + k0, M, kb, lda, c0 + b * MR, apack + b * MR * kb);
#pragma omp for schedule(static)
            for (int64_t p = 0; p < np; p++) {
                const float *bp = P + p * K * NR + k0 * NR;
                /* the next panel's slice (past the last: this one again, harmless) */
                const char *next = (const char *)(p + 1 < np ? bp + K * NR : bp);
                const int64_t n0 = p * NR, cols = N - n0 < NR ? N - n0 : NR;
                for (int64_t b = 0; b < mb; b++) {
                    const int64_t r0 = c0 + b * MR, rows = M - r0 < MR ? M - r0 : MR;
                    block(apack + b * MR * kb, bp, kb, bias && first ? bias + n0 : 0,
                          C + n0 / part_cols * part_stride + r0 * ldc + n0 % part_cols, ldc,
                          (int)rows, cols,
                          next + (b % PF_BLOCKS) * (kb / 4) * 64, residual || !first);
                }
            }
        }
    }
    return 0;
#else
    (void)A; (void)M; (void)K; (void)lda; (void)P; (void)bias; (void)N; (void)C; (void)ldc;
    (void)apack; (void)threads; (void)kc; (void)residual; (void)part_cols; (void)part_stride;
    return -1;
#endif
}

int gemm_wide_f32_kb(const float *A, int64_t M, int64_t K, int64_t lda, const float *P,
                     const float *bias, int64_t N, float *C, int64_t ldc, float *apack,
                     int64_t threads, int64_t kc, int residual) {
    return wide_run(A, M, K, lda, P, bias, N, C, ldc, apack, threads, kc, residual, N, 0);
}

/* the product in column parts of `part_cols` columns each (a multiple of the panel width, 48:
 * else -2), part j of C at C + j * part_stride ((M, part_cols) with row stride ldc): Q / K / V
 * as three dense blocks (helper gemm18b) */
int gemm_wide_f32_parts(const float *A, int64_t M, int64_t K, int64_t lda, const float *P,
                        const float *bias, int64_t N, float *C, int64_t ldc, float *apack,
                        int64_t threads, int64_t part_cols, int64_t part_stride) {
    if (part_cols <= 0 || part_cols % NR) return -2;
    return wide_run(A, M, K, lda, P, bias, N, C, ldc, apack, threads, K, 0, part_cols,
                    part_stride);
}

int gemm_wide_f32(const float *A, int64_t M, int64_t K, int64_t lda, const float *P,
                  const float *bias, int64_t N, float *C, int64_t ldc, float *apack,
                  int64_t threads) {
    return gemm_wide_f32_kb(A, M, K, lda, P, bias, N, C, ldc, apack, threads, K, 0);
}
