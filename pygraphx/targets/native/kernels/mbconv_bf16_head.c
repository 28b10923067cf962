
/* ---- the bf16 network head and the bf16 block chain (helper mnv18, issue 10): the last part of
 * kernel `mbconv` (`native_mbconv.PARTS`: appended to mbconv.c, mbconv_head.c, mbconv_bf16.c,
 * one translation unit), whose hd_args, gemm_bf and block_body_bf it uses.
 *
 * The bf16 program's head, as its oneDNN / torch steps compute it, one rounding to bf16 per
 * instruction's output:
 *
 *   m = bf16(clip(x (1x1) W + b))       x, W bf16 (`_mm512_dpbf16_ps`, float32 sums), b float32
 *   p = bf16(sum over pixels of m / P)  (float32 sums of the rounded map; never written whole)
 *   z = bf16(p Wc)                      (wc != NULL: the classifier, Wc bf16, no bias)
 *
 * y is p (N, C[, 1, 1], by syn, syc) or z (N, K, rows syn apart), bf16 (yb) or float32 holding
 * the bf16 values (the program's convert after the classifier). W and Wc packed as
 * mbconv_bf16.c's 1x1 weights (pairs of input channels; Wc as K outputs of C inputs). The
 * schedule is mbconv_head.c's (jobs: image x 64 channels x a range of pixels; the pooled sums
 * after a barrier; the classifier's 64-column blocks split between the threads); workspace
 * mbhead_work_floats (the pooled rows kept as bf16 in the float32 rows' place). */

#if PGX_MB_BF16

/* one thread's part of the bf16 head (inside a parallel region; ends with the last `omp
 * for`'s implicit barrier) */
static void head_body_bf(const hd_args *a) {
    const int64_t cout16 = up16(a->cout), nblk = (cout16 + 63) / 64, P = a->h * a->w;
    const int64_t pc = a->pchunks, jobs = a->n * nblk * pc;
    const int64_t per = (P + pc - 1) / pc, k2 = (a->cin + 1) / 2;
    float *pooled = (float *)(((uintptr_t)a->work + 63) & ~(uintptr_t)63);
    bf16_t *pooled_bf = (bf16_t *)pooled; /* (N, cout16) bf16 rows for the classifier */
    float *part = pooled + up16(a->n * cout16);
    float *tiles = part + up16(pc * a->n * cout16);
    const __m512 lo = _mm512_set1_ps((float)a->lo), hi = _mm512_set1_ps((float)a->hi);
    const __m512 count = _mm512_set1_ps((float)P); /* (divided, as torch's pooling: a sum
                                                       * halfway between two bf16 values
                                                       * rounds as there, not as sum * 1/P) */
    const bf16_t *wt = (const bf16_t *)a->wt;
    {
        float *tile = tiles + (int64_t)omp_get_thread_num() * up16(per * 64);
#pragma omp for schedule(static)
        for (int64_t j = 0; j < jobs; j++) {
            int64_t img = j / (nblk * pc), r = j % (nblk * pc), blk = r / pc, ch = r % pc;
            int64_t n0 = blk * 64, bw = cout16 - n0 < 64 ? cout16 - n0 : 64;
            int64_t p0 = P * ch / pc, p1 = P * (ch + 1) / pc;
            const bf16_t *xi = (const bf16_t *)a->x + img * a->sxn;
            const bf16_t *wb = wt + n0 * k2 * 2;
            /* the tile: float32 holding the map's bf16 values (gemm_bf, ob 0) */
            if (a->sxh == a->w * a->sxw) {
                gemm_bf(xi + p0 * a->sxw, a->sxw, p1 - p0, a->cin, wb, a->b + n0, bw, bw, tile,
                        64, 0, NULL, 0, lo, hi);
            } else {
                for (int64_t p = p0; p < p1;) {
                    int64_t oy = p / a->w, ox = p % a->w;
                    int64_t q = (oy + 1) * a->w < p1 ? (oy + 1) * a->w : p1;
                    gemm_bf(xi + oy * a->sxh + ox * a->sxw, a->sxw, q - p, a->cin, wb, a->b + n0,
                            bw, bw, tile + (p - p0) * 64, 64, 0, NULL, 0, lo, hi);
                    p = q;
                }
            }
            float *dst = part + (ch * a->n + img) * cout16 + n0;
            for (int64_t v = 0; v < bw; v += 16) {
                __m512 s0 = _mm512_setzero_ps(), s1 = s0;
                int64_t p = 0;
                for (; p + 2 <= p1 - p0; p += 2) {
                    s0 = _mm512_add_ps(s0, _mm512_loadu_ps(tile + p * 64 + v));
                    s1 = _mm512_add_ps(s1, _mm512_loadu_ps(tile + (p + 1) * 64 + v));
                }
                if (p < p1 - p0) s0 = _mm512_add_ps(s0, _mm512_loadu_ps(tile + p * 64 + v));
                _mm512_storeu_ps(dst + v, _mm512_add_ps(s0, s1));
            }
        }
        /* (implicit barrier) the ranges' sums added, scaled, rounded to bf16 */
        const int64_t vecs = a->n * (cout16 / 16);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < vecs; i++) {
            int64_t img = i / (cout16 / 16), c0 = (i % (cout16 / 16)) * 16;
            __m512 s = _mm512_setzero_ps();
            for (int64_t ch = 0; ch < pc; ch++)
                s = _mm512_add_ps(s, _mm512_loadu_ps(part + (ch * a->n + img) * cout16 + c0));
            s = _mm512_div_ps(s, count);
            int64_t valid = a->cout - c0 < 16 ? a->cout - c0 : 16;
            __mmask16 mk = (__mmask16)((1u << valid) - 1);
            __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_mov_ps(mk, s));
            if (a->wc) {
                _mm256_storeu_si256((__m256i *)(pooled_bf + img * cout16 + c0), h);
            } else if (a->yb) {
                bf16_t *y = (bf16_t *)a->y + img * a->syn;
                if (a->syc == 1) {
                    _mm256_mask_storeu_epi16(y + c0, mk, h);
                } else {
                    bf16_t buf[16];
                    _mm256_storeu_si256((__m256i *)buf, h);
                    for (int64_t c = 0; c < valid; c++) y[(c0 + c) * a->syc] = buf[c];
                }
            } else {
                float *y = (float *)a->y + img * a->syn;
                __m512 f = bf_round(s);
                if (a->syc == 1) {
                    _mm512_mask_storeu_ps(y + c0, mk, f);
                } else {
                    float buf[16];
                    _mm512_storeu_ps(buf, f);
                    for (int64_t c = 0; c < valid; c++) y[(c0 + c) * a->syc] = buf[c];
                }
            }
        }
        if (a->wc) { /* (implicit barrier) the classifier, its 64-column blocks split */
            const int64_t ncls16 = up16(a->ncls), cblk = (ncls16 + 63) / 64;
            const int64_t kc2 = (a->cout + 1) / 2;
            const bf16_t *wc = (const bf16_t *)a->wc;
            const __m512 nlo = _mm512_set1_ps(-__builtin_inff());
            const __m512 nhi = _mm512_set1_ps(__builtin_inff());
#pragma omp for schedule(static)
            for (int64_t cb = 0; cb < cblk; cb++) {
                int64_t c0 = cb * 64, bwc = ncls16 - c0 < 64 ? ncls16 - c0 : 64;
                int64_t valid = a->ncls - c0 < bwc ? a->ncls - c0 : bwc;
                void *y = a->yb ? (void *)((bf16_t *)a->y + c0) : (void *)((float *)a->y + c0);
                gemm_bf(pooled_bf, cout16, a->n, a->cout, wc + c0 * kc2 * 2, a->bc + c0, bwc,
                        valid, y, a->syn, (int)a->yb, NULL, 0, nlo, nhi);
            }
        }
    }
}

/* run the bf16 head; 0, or 1 where this build has no bf16 kernel */
int mbhead_bf16_run(const hd_args *a) {
#pragma omp parallel num_threads((int)a->threads)
    head_body_bf(a);
    return 0;
}

/* mnv17: `count` bf16 blocks in one parallel region, then (mnv18) the bf16 head where `head`
 * is not NULL (as mbconv_head.c's mbconv_chain_stamped: the same `stamps`, NULL: none); 0; 1
 * where this build has no bf16 kernel or a block has a stem in the shared mode; 2, nothing
 * run, where a member is planned for another thread count than the first */
int mbconv_bf16_chain_stamped(const mb_args *const *blocks, int64_t count, const hd_args *head,
                              double *stamps) {
    if (count <= 0 && head == NULL) return 0;
    for (int64_t i = 0; i < count; i++)
        if (blocks[i]->stem && blocks[i]->shared) return 1;
    const int64_t threads = count > 0 ? blocks[0]->threads : head->threads;
    for (int64_t i = 0; i < count; i++)
        if (blocks[i]->threads != threads) return 2;
    if (head != NULL && head->threads != threads) return 2;
    if (stamps != NULL) stamps[0] = omp_get_wtime();
#pragma omp parallel num_threads((int)threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        for (int64_t i = 0; i < count; i++) {
            block_body_bf(blocks[i], t, nt);
            if (stamps != NULL && t == 0) stamps[i + 1] = omp_get_wtime();
        }
        if (head != NULL) {
            head_body_bf(head);
            if (stamps != NULL && t == 0) stamps[count + 1] = omp_get_wtime();
        }
    }
    return 0;
}

#else

int mbhead_bf16_run(const hd_args *a) {
    (void)a;
    return 1;
}

int mbconv_bf16_chain_stamped(const mb_args *const *blocks, int64_t count, const hd_args *head,
                              double *stamps) {
    (void)blocks;
    (void)count;
    (void)head;
    (void)stamps;
    return 1;
}

#endif
