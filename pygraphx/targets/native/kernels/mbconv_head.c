
/* ---- the network's head and the block chain (mnv15, mnv17): the second part of kernel
 * `mbconv` (`native_mbconv.PARTS`: appended to mbconv.c, one translation unit), split out of
 * mbconv.c (mnv18, no change): it uses mbconv.c's mb_args, gemm and block_body. */

/* The network's head (helper mnv15): a 1x1 convolution + bias + clip averaged over the image
 * (global average pooling), optionally followed by a classifier (a matrix product + bias):
 *
 *   p[c] = mean over pixels of clip(x (1x1) W + b)[c]      (the map is never written whole)
 *   z    = p Wc + bc                                        (wc != NULL)
 *
 * Jobs: an image x a 64-channel block of the convolution x a range of its pixels (pchunks
 * ranges); each job's products go to a small tile (pixels x 64, in L1/L2) whose columns are
 * summed; then the ranges' sums are added and scaled (barrier), then the classifier's 64-column
 * blocks are split between the threads (each reads its part of Wc). One parallel region. */
typedef struct {
    const float *x;      /* input (N, H, W, cin) by strides sxn, sxh, sxw; channel stride 1 */
    const float *wt;     /* packed 1x1 weight (cout16 of cin) */
    const float *b;      /* (cout16) */
    const float *wc;     /* packed classifier weight (ncls16 of cout16, K padded), or NULL */
    const float *bc;     /* (ncls16) */
    float *y;            /* (N, ncls) rows syn apart, or the pooled (N, cout) by syn, syc */
    float *work;         /* mbhead_work_floats(...) floats */
    int64_t n, cin, h, w, cout, ncls;
    int64_t sxn, sxh, sxw, syn, syc;
    double lo, hi;
    int64_t pchunks, threads;
    int64_t yb;          /* mnv18, the bf16 head (mbconv_bf16_head.c): 1, y bf16; 0, float32 */
} hd_args;

/* floats of the head's workspace: the pooled rows, the ranges' partial sums, a tile a thread */
int64_t mbhead_work_floats(int64_t n, int64_t h, int64_t w, int64_t cout, int64_t pchunks,
                           int64_t threads) {
    int64_t cout16 = up16(cout), p = h * w, per = (p + pchunks - 1) / pchunks;
    return up16(n * cout16) + up16(pchunks * n * cout16) + threads * up16(per * 64) + 16;
}

#ifdef __AVX512F__

/* one thread's part of the head (inside a parallel region of the head's threads; ends with
 * the last `omp for`'s implicit barrier) */
static void head_body(const hd_args *a) {
    const int64_t cout16 = up16(a->cout), nblk = (cout16 + 63) / 64, P = a->h * a->w;
    const int64_t pc = a->pchunks, jobs = a->n * nblk * pc;
    const int64_t per = (P + pc - 1) / pc;
    float *pooled = (float *)(((uintptr_t)a->work + 63) & ~(uintptr_t)63);
    float *part = pooled + up16(a->n * cout16);
    float *tiles = part + up16(pc * a->n * cout16);
    const __m512 lo = _mm512_set1_ps((float)a->lo), hi = _mm512_set1_ps((float)a->hi);
    const float scale = (float)(1.0 / (double)P);
    {
        float *tile = tiles + (int64_t)omp_get_thread_num() * up16(per * 64);
#pragma omp for schedule(static)
        for (int64_t j = 0; j < jobs; j++) {
            int64_t img = j / (nblk * pc), r = j % (nblk * pc), blk = r / pc, ch = r % pc;
            int64_t n0 = blk * 64, bw = cout16 - n0 < 64 ? cout16 - n0 : 64;
            int64_t p0 = P * ch / pc, p1 = P * (ch + 1) / pc;
            const float *xi = a->x + img * a->sxn;
            const float *wb = a->wt + n0 * a->cin;
            if (a->sxh == a->w * a->sxw) {
                gemm(xi + p0 * a->sxw, a->sxw, p1 - p0, a->cin, wb, a->b + n0, bw, bw, tile, 64,
                     NULL, 0, lo, hi);
            } else {
                for (int64_t p = p0; p < p1;) {
                    int64_t oy = p / a->w, ox = p % a->w;
                    int64_t q = (oy + 1) * a->w < p1 ? (oy + 1) * a->w : p1;
                    gemm(xi + oy * a->sxh + ox * a->sxw, a->sxw, q - p, a->cin, wb, a->b + n0,
                         bw, bw, tile + (p - p0) * 64, 64, NULL, 0, lo, hi);
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
        /* (implicit barrier) the ranges' sums added and scaled; padded channels zero */
        const int64_t vecs = a->n * (cout16 / 16);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < vecs; i++) {
            int64_t img = i / (cout16 / 16), c0 = (i % (cout16 / 16)) * 16;
            __m512 s = _mm512_setzero_ps();
            for (int64_t ch = 0; ch < pc; ch++)
                s = _mm512_add_ps(s, _mm512_loadu_ps(part + (ch * a->n + img) * cout16 + c0));
            s = _mm512_mul_ps(s, _mm512_set1_ps(scale));
            int64_t valid = a->cout - c0 < 16 ? a->cout - c0 : 16;
            __mmask16 mk = (__mmask16)((1u << valid) - 1);
            if (a->wc) {
                _mm512_storeu_ps(pooled + img * cout16 + c0, _mm512_maskz_mov_ps(mk, s));
            } else if (a->syc == 1) {
                _mm512_mask_storeu_ps(a->y + img * a->syn + c0, mk, s);
            } else {
                float buf[16];
                _mm512_storeu_ps(buf, s);
                for (int64_t c = 0; c < valid; c++) a->y[img * a->syn + (c0 + c) * a->syc] = buf[c];
            }
        }
        if (a->wc) { /* (implicit barrier) the classifier, its 64-column blocks split */
            const int64_t ncls16 = up16(a->ncls), cblk = (ncls16 + 63) / 64;
            const __m512 nlo = _mm512_set1_ps(-__builtin_inff()), nhi = _mm512_set1_ps(__builtin_inff());
#pragma omp for schedule(static)
            for (int64_t cb = 0; cb < cblk; cb++) {
                int64_t c0 = cb * 64, bwc = ncls16 - c0 < 64 ? ncls16 - c0 : 64;
                int64_t valid = a->ncls - c0 < bwc ? a->ncls - c0 : bwc;
                gemm(pooled, cout16, a->n, cout16, a->wc + c0 * cout16, a->bc + c0, bwc, valid,
                     a->y + c0, a->syn, NULL, 0, nlo, nhi);
            }
        }
    }
}

/* run the head; 0, or 1 where this build has no kernel */
int mbhead_run(const hd_args *a) {
#pragma omp parallel num_threads((int)a->threads)
    head_body(a);
    return 0;
}

/* mnv17: run `count` blocks one after the other in one parallel region, then the network's
 * head where `head` is not NULL (one fork/join and one call for all of them; each block, and
 * the head, ends with a barrier, so the next one reads a finished output). The blocks and the
 * head run at one thread count, blocks[0]'s (the head's where there are no blocks), each
 * planned for it (its `threads`: its schedule and work buffer are per planned thread; checked
 * here), and the blocks may share the work buffer (a block is done with it at its last
 * barrier). `stamps` (chainfix17; NULL: none): `count` + (head != NULL) + 1 doubles:
 * stamps[0] omp_get_wtime() before the fork, stamps[i + 1] thread 0's omp_get_wtime() after
 * member i's closing barrier (`perf --cpu`: each member's time in the chain as it runs). 0; 1
 * where this build has no kernel; 2, nothing run, where a member is planned for another
 * thread count. */
int mbconv_chain_stamped(const mb_args *const *blocks, int64_t count, const hd_args *head,
                         double *stamps) {
    if (count <= 0 && head == NULL) return 0;
    const int64_t threads = count > 0 ? blocks[0]->threads : head->threads;
    for (int64_t i = 0; i < count; i++)
        if (blocks[i]->threads != threads) return 2;
    if (head != NULL && head->threads != threads) return 2;
    if (stamps != NULL) stamps[0] = omp_get_wtime();
#pragma omp parallel num_threads((int)threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        for (int64_t i = 0; i < count; i++) {
            block_body(blocks[i], t, nt);
            if (stamps != NULL && t == 0) stamps[i + 1] = omp_get_wtime();
        }
        if (head != NULL) {
            head_body(head);
            if (stamps != NULL && t == 0) stamps[count + 1] = omp_get_wtime();
        }
    }
    return 0;
}

#else

int mbconv_chain_stamped(const mb_args *const *blocks, int64_t count, const hd_args *head,
                         double *stamps) {
    (void)blocks;
    (void)count;
    (void)head;
    (void)stamps;
    return 1;
}

int mbhead_run(const hd_args *a) {
    (void)a;
    return 1;
}

#endif
