/* Attention for decode and verify passes (included by qkernels.c; called by kernels.attention, one job
 * per KV head, row chunk and key chunk, on numba's threads).
 *
 * numba's loops ran a job at 70-120 cycles per (row-head, key) pair (Qwen2.5-Coder-1.5B, 8 rows x 6 heads
 * against 300 keys: 355 us a job, 490 us a layer, 13.7 ms of an 8-token pass): a horizontal sum per dot,
 * an exp call per 16 keys, the mask read twice. Here up to 6 row-heads share each key's loads (2 keys at a
 * time, 4 on AVX-512), eight pairs' horizontal sums go as one, the weights are exp'd 8 at a time, and two or
 * three row-heads' weighted values accumulate in registers, in key blocks that stay in L1. The same job:
 * 355 -> 135 us (Zen 4, one thread); 99 -> 83 us with 4 keys and the sums eight at a time (AVX2 build 115 -> 93).
 *
 * Bits: every (row-head, key) score is the same fused steps in the same order whatever the number of
 * rows in the pass, where the row-head sits among the R or the key among the J (hsum8x8 sums a lane's own);
 * a weight is elementwise; the weights' sum and the weighted values run over the keys the row sees, one after another
 * in key order, so where those keys sit in the cache (a tree's branches) changes nothing. A verify row's
 * attention thus equals decoding it alone (tests/test_runner.py pins it).
 */

INLINE float bf16_to_f32(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* cache element i of a row: float32, bfloat16 bits (kind 1) or float16 bits (kind 2; qkernels.c's f16_to_f32) */
INLINE float cache1(const void *row, int kind, int64_t i) {
    if (kind == 1) return bf16_to_f32(((const uint16_t *)row)[i]);
    if (kind == 2) return f16_to_f32((const uint8_t *)((const uint16_t *)row + i));
    return ((const float *)row)[i];
}

/* exp(x): Cephes' expf, about 1 ulp; x clamped to [-87, 88]. exp1 is exp8's steps for one value (fmaf where
 * exp8 fuses), so a value's bits are the same in a lane or alone */
INLINE float exp1(float x) {
    const float v = fminf(fmaxf(x, -87.0f), 88.0f);
    const float k = floorf(fmaf(v, 1.44269504088896341f, 0.5f));
    float r = fmaf(-k, 0.693359375f, v);
    r = fmaf(k, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    const float e = fmaf(p, r * r, r) + 1.0f;
    const int32_t bits = ((int32_t)k + 127) * (1 << 23);
    float scale;
    memcpy(&scale, &bits, 4);
    return e * scale;
}

/* exp1's steps in W-bit lanes (exp8: 256, exp16: 512), the same fused operations: the same bits as exp1 */
#define SD_FLOOR256(v) _mm256_floor_ps(v)
#define SD_FLOOR512(v) _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
#define SD_EXP_LANES(NAME, W)                                                                                   \
    INLINE __m##W NAME(__m##W x) {                                                                              \
        const __m##W v = _mm##W##_min_ps(_mm##W##_max_ps(x, _mm##W##_set1_ps(-87.0f)), _mm##W##_set1_ps(88.0f)); \
        const __m##W k =                                                                                        \
            SD_FLOOR##W(_mm##W##_fmadd_ps(v, _mm##W##_set1_ps(1.44269504088896341f), _mm##W##_set1_ps(0.5f))); \
        __m##W r = _mm##W##_fnmadd_ps(k, _mm##W##_set1_ps(0.693359375f), v);                                    \
        r = _mm##W##_fmadd_ps(k, _mm##W##_set1_ps(2.12194440e-4f), r);                                          \
        __m##W p = _mm##W##_set1_ps(1.9875691500e-4f);                                                          \
        p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(1.3981999507e-3f));                                        \
        p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(8.3334519073e-3f));                                        \
        p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(4.1665795894e-2f));                                        \
        p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(1.6666665459e-1f));                                        \
        p = _mm##W##_fmadd_ps(p, r, _mm##W##_set1_ps(5.0000001201e-1f));                                        \
        const __m##W e = _mm##W##_add_ps(_mm##W##_fmadd_ps(p, _mm##W##_mul_ps(r, r), r), _mm##W##_set1_ps(1.0f)); \
        const __m##W##i scale =                                                                                 \
            _mm##W##_slli_epi32(_mm##W##_add_epi32(_mm##W##_cvtps_epi32(k), _mm##W##_set1_epi32(127)), 23);     \
        return _mm##W##_mul_ps(e, _mm##W##_castsi##W##_ps(scale));                                             \
    }

#if defined(SD_AVX512)
SD_EXP_LANES(exp16, 512)
#endif

#if defined(SD_AVX2)
SD_EXP_LANES(exp8, 256)

/* 8 values of a cache row from d: float32, or bfloat16 (kind 1) or float16 bits (kind 2) widened */
INLINE __m256 cache8(const void *row, int kind, int64_t d) {
    if (kind) {
        const __m128i b = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + d));
        if (kind == 2) return _mm256_cvtph_ps(b);
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
    }
    return _mm256_loadu_ps((const float *)row + d);
}

/* hsum8 of eight vectors at once, lane k = hsum8(v[k]) bit for bit: the same sums in the same order,
 * ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7)), as 7 vector adds and 12 shuffles where eight hsum8 take 24
 * and 24 (an 8-row job's scores: the horizontal sums were a third of its operations). Lane k adds v[k]'s lanes
 * alone, so a score's bits never depend on the pairs it shares the call with: every score goes through here */
INLINE __m256 hsum8x8(const __m256 v[8]) {
    __m256 h[4];  /* h[k]: v[k]'s four halves' sums, then v[k + 4]'s */
    for (int k = 0; k < 4; k++)
        h[k] = _mm256_add_ps(_mm256_permute2f128_ps(v[k], v[k + 4], 0x20),
                             _mm256_permute2f128_ps(v[k], v[k + 4], 0x31));
    __m256 u[2];  /* u[k]: (x0 + x4) + (x2 + x6), (x1 + x5) + (x3 + x7) of v[2k], v[2k + 1], v[2k + 4], v[2k + 5] */
    for (int k = 0; k < 2; k++) {
        const __m256d a = _mm256_castps_pd(h[2 * k]), b = _mm256_castps_pd(h[2 * k + 1]);
        u[k] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
    }
    return _mm256_add_ps(_mm256_shuffle_ps(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm256_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* scores of R row-heads (q rows, stride dim) against J keys (stride dim): one 8-lane fused sum over dim
 * per pair, then its horizontal sum (eight pairs at a time, hsum8x8); a pair's steps are the same whatever R and J
 * (more keys a row-head's load: 2, or 4 in AVX-512's registers; an 8-row job's dots 16% faster, Zen 4).
 * R up to 6, a job's row-heads split evenly (a 1-row pass of a 6-head group was 4 + 2, the 2 waiting on the
 * FMA latency): Zen 2, the 1.5B, scripts/attention_stream.py alternated twice, 1 row 194 -> 180 us a layer at
 * 2,000 keys, 101 -> 95 at 1,000, 28 -> 27.5 at 300; 2 rows 315 -> 301 at 2,000 */
#if defined(SD_AVX512)
#define DOT_KEYS 4  /* keys a row-head's load meets: 24 sums in AVX-512's 32 registers */
#else
#define DOT_KEYS 2
#endif
INLINE void attend_dots(const int R, const int J, const float *q, int64_t dim, const void *key, int64_t kstride,
                        int kind, float *s, int64_t spad) {
    __m256 a[6][DOT_KEYS];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < J; j++) a[r][j] = _mm256_setzero_ps();
    for (int64_t d = 0; d < dim; d += 8) {
        __m256 k[DOT_KEYS];
        for (int j = 0; j < J; j++) k[j] = cache8((const char *)key + j * kstride, kind, d);
        for (int r = 0; r < R; r++) {
            __m256 x = _mm256_loadu_ps(q + r * dim + d);
            __asm__("" : "+x"(x));  /* one load a row-head, where GCC folded it into each key's FMA */
            for (int j = 0; j < J; j++) a[r][j] = _mm256_fmadd_ps(x, k[j], a[r][j]);
        }
    }
    for (int p0 = 0; p0 < R * J; p0 += 8) {  /* the pairs eight at a time, row-head after row-head (fewer: zeros) */
        __m256 v[8];
        for (int k = 0; k < 8; k++) v[k] = p0 + k < R * J ? a[(p0 + k) / J][(p0 + k) % J] : _mm256_setzero_ps();
        float t[8];
        _mm256_storeu_ps(t, hsum8x8(v));
        for (int k = 0; k < 8 && p0 + k < R * J; k++) s[(p0 + k) / J * spad + (p0 + k) % J] = t[k];
    }
}
#define CALL_DOTS(R) attend_dots(R, J, qi, dim, key, kstride, (int)kind, scores + i0 * pad + j, pad)
#define DOTS_SWITCH                                                                                         \
    switch (R) {                                                                                            \
    case 6: CALL_DOTS(6); break;                                                                            \
    case 5: CALL_DOTS(5); break;                                                                            \
    case 4: CALL_DOTS(4); break;                                                                            \
    case 3: CALL_DOTS(3); break;                                                                            \
    case 2: CALL_DOTS(2); break;                                                                            \
    default: CALL_DOTS(1); break;                                                                           \
    }

/* rows i .. i + R - 1 (R <= VALUE_ROWS) of a [., dim], dims d0 .. d0 + 8 NV, and of total: add one key block's
 * sum over the keys seen, in key order, of w[j] x values[j][d0 ..] (w: the row-heads' weights, stride pad;
 * the sums go on in key order across blocks). Two row-heads of one query row share each value load, three where
 * AVX-512's 32 registers hold their 12 sums (three on AVX2's 16 spilled: Zen 2 no faster, Zen 4 28-35% slower; on
 * Zen 4's AVX-512 path an 8-row job 6-8% faster, the same bits); NV, R and KIND (the cache's element type, as cache8's) are compile-time, so
 * the sums stay in registers */
#if defined(SD_AVX512)
#define VALUE_ROWS 3  /* 32 vector registers: 12 sums */
#else
#define VALUE_ROWS 2
#endif
INLINE void attend_values(const int NV, const int R, const int KIND, const float *w, int64_t pad, const uint8_t *seen,
                          int64_t n_keys, const void *values, int64_t dim, int64_t d0, float *a, float *total) {
    __m256 v[VALUE_ROWS][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NV; c++) v[r][c] = _mm256_loadu_ps(a + r * dim + d0 + 8 * c);
    float t[VALUE_ROWS];
    for (int r = 0; r < R; r++) t[r] = total[r];
    for (int64_t j = 0; j < n_keys; j++) {
        if (!seen[j]) continue;
        if (d0 == 0)  /* the weights' sum, one key after another: its bits never depend on where the keys sit */
            for (int r = 0; r < R; r++) t[r] += w[r * pad + j];
        const void *row = (const char *)values + (size_t)j * dim * (KIND ? 2 : 4);
        for (int c = 0; c < NV; c++) {
            const __m256 x = cache8(row, KIND, d0 + 8 * c);
            for (int r = 0; r < R; r++) v[r][c] = _mm256_fmadd_ps(_mm256_broadcast_ss(w + r * pad + j), x, v[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NV; c++) _mm256_storeu_ps(a + r * dim + d0 + 8 * c, v[r][c]);
    for (int r = 0; r < R; r++) total[r] = t[r];
}
#define CALL_VALUES(NV, R, KIND) attend_values(NV, R, KIND, s, pad, seen, nk, vals, dim, d0, a, total + i)
#define VALUES_SWITCH(R)                                                                                    \
    switch (nv + 4 * kind) {                                                                                \
    case 4: CALL_VALUES(4, R, 0); break;                                                                    \
    case 3: CALL_VALUES(3, R, 0); break;                                                                    \
    case 2: CALL_VALUES(2, R, 0); break;                                                                    \
    case 1: CALL_VALUES(1, R, 0); break;                                                                    \
    case 8: CALL_VALUES(4, R, 1); break;                                                                    \
    case 7: CALL_VALUES(3, R, 1); break;                                                                    \
    case 6: CALL_VALUES(2, R, 1); break;                                                                    \
    case 5: CALL_VALUES(1, R, 1); break;                                                                    \
    case 12: CALL_VALUES(4, R, 2); break;                                                                   \
    case 11: CALL_VALUES(3, R, 2); break;                                                                   \
    case 10: CALL_VALUES(2, R, 2); break;                                                                   \
    default: CALL_VALUES(1, R, 2); break;                                                                   \
    }
#endif

/* the cache rows at p, ``bytes`` of them but no more than ``rows_left`` rows (the job's last key), fetched into L2
 * ahead of use: a pass meets each layer's cache once, out of memory, and the hardware prefetcher alone kept too few
 * lines in flight (Zen 4, 1.5B, 2,000 keys: 270-278 -> 248 us a layer; 8 rows 1007-1023 -> 980 us). The keys go a
 * block ahead, and the values (a job's 512 keys: 128 KB) while the dots run, so the value sweep after them finds
 * them in L2. Against the keys alone a block ahead into L1, a job out of memory (scripts/attention_ab.py, 256
 * caches in turn, Zen 4, one thread): 1 / 2 / 8 rows x 512 keys 34.1 / 57.0 / 166.8 -> 23.9 / 42.6 / 146.7 us;
 * 300 keys 20.9 / 33.0 / 96.5 -> 15.3 / 25.1 / 87.4; in cache within 1-5% */
#if defined(SD_AVX2)
INLINE void prefetch_rows(const char *p, int64_t bytes, int64_t rows_left, int64_t stride) {
    if (rows_left <= 0) return;
    if (bytes > rows_left * stride) bytes = rows_left * stride;
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(p + b, _MM_HINT_T1);
}
#endif

/* One job: n row-heads (q [n, dim], row-head i of query row i / group) against n_keys cache rows
 * (keys, values: from the job's first key, a row every dim elements of the cache's type ``kind``: 0 float32,
 * 1 bfloat16 bits, 2 float16 bits); vis
 * [n / group, n_keys] 1 where the row sees the key; scores [n, n_keys rounded up to 8] scratch.
 * Out: top [n] (the largest score seen; -inf if none), total [n] (the weights' sum, weights
 * exp(score - top)), acc [n, dim] (the weighted values), which kernels.attention combines across jobs. */
void sd_attend(const float *q, int64_t n, int64_t group, int64_t dim, const void *keys, const void *values,
               int64_t kind, int64_t n_keys, const uint8_t *vis, double scale, float *scores, float *top,
               float *total, float *acc) {
    const int64_t pad = (n_keys + 7) & ~(int64_t)7;
    const float sc = (float)scale;
#if defined(SD_AVX2)
    if (dim % 8 == 0) {
        /* keys in blocks that stay in L1 while every row-head meets them */
        const size_t esize = kind ? 2 : 4;
        const int64_t kstride = dim * (int64_t)esize, kb = 8192 / kstride > 8 ? 8192 / kstride : 8;
        const int64_t parts = (n + 5) / 6, most = (n + parts - 1) / parts;  /* up to 6 row-heads, split evenly */
        for (int64_t j0 = 0; j0 < n_keys; j0 += kb)
        for (int64_t i0 = 0; i0 < n; i0 += most) {
            const int R = n - i0 < most ? (int)(n - i0) : (int)most;
            const float *qi = q + i0 * dim;
            const int64_t j1 = n_keys < j0 + kb ? n_keys : j0 + kb;
            for (int64_t j = j0; j < j1; j += DOT_KEYS) {
                const void *key = (const char *)keys + (size_t)(j * kstride);
                if (i0 == 0) {  /* the next block's keys, and these keys' values for the sweep after the dots */
                    prefetch_rows((const char *)key + kb * kstride, DOT_KEYS * kstride, n_keys - j - kb, kstride);
                    prefetch_rows((const char *)values + (size_t)(j * kstride), DOT_KEYS * kstride, n_keys - j,
                                  kstride);
                }
                switch (j1 - j < DOT_KEYS ? j1 - j : DOT_KEYS) {
                case 4: { enum { J = DOT_KEYS > 2 ? 4 : 1 }; DOTS_SWITCH } break;
                case 3: { enum { J = DOT_KEYS > 2 ? 3 : 1 }; DOTS_SWITCH } break;
                case 2: { enum { J = 2 }; DOTS_SWITCH } break;
                default: { enum { J = 1 }; DOTS_SWITCH } break;
                }
            }
        }
        const __m256 ninf = _mm256_set1_ps(-INFINITY), vsc = _mm256_set1_ps(sc);
        for (int64_t i = 0; i < n; i++) {  /* scores to weights: exp(score - top), 0 where unseen */
            float *s = scores + i * pad;
            const uint8_t *seen = vis + (i / group) * n_keys;
            __m256 most8 = ninf;  /* 8 keys at a time: the same products, and a max is a max in any order */
            int64_t j = 0;
            for (; j + 8 <= n_keys; j += 8) {
                const __m128i m = _mm_loadl_epi64((const __m128i *)(seen + j));
                const __m256i seen8 = _mm256_cvtepu8_epi32(m);
                const __m256 on = _mm256_castsi256_ps(_mm256_cmpgt_epi32(seen8, _mm256_setzero_si256()));
                const __m256 x = _mm256_blendv_ps(ninf, _mm256_mul_ps(_mm256_loadu_ps(s + j), vsc), on);
                _mm256_storeu_ps(s + j, x);
                most8 = _mm256_max_ps(x, most8);  /* a NaN score is passed over, as below */
            }
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(most8), _mm256_extractf128_ps(most8, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            float best = _mm_cvtss_f32(m4);
            for (; j < n_keys; j++) {
                s[j] = seen[j] ? s[j] * sc : -INFINITY;
                best = s[j] > best ? s[j] : best;
            }
            for (; j < pad; j++) s[j] = -INFINITY;
            top[i] = best;
            total[i] = 0.0f;
            const __m256 vbest = _mm256_set1_ps(best == -INFINITY ? 0.0f : best);  /* no key seen: all 0 */
            for (int64_t j = 0; j < pad; j += 8) {
                const __m256 x = _mm256_loadu_ps(s + j);
                const __m256 w = _mm256_and_ps(exp8(_mm256_sub_ps(x, vbest)), _mm256_cmp_ps(x, ninf, _CMP_NEQ_OQ));
                _mm256_storeu_ps(s + j, w);
            }
        }
        memset(acc, 0, (size_t)(n * dim) * sizeof(float));
        for (int64_t j0 = 0; j0 < n_keys; j0 += kb)
        for (int64_t i = 0; i < n;) {  /* the weighted values: two or three row-heads of one query row at a time */
            const int64_t rest = group - i % group < n - i ? group - i % group : n - i;  /* of this query row */
            const int R = VALUE_ROWS == 3 && rest >= 3 && rest != 4 ? 3 : rest >= 2 ? 2 : 1;
            const int64_t nk = n_keys - j0 < kb ? n_keys - j0 : kb;
            const uint8_t *seen = vis + (i / group) * n_keys + j0;
            const float *s = scores + i * pad + j0;
            const void *vals = (const char *)values + (size_t)(j0 * dim) * esize;
            float *a = acc + i * dim;
            if (i == 0)  /* the next block's values, while this one's are summed */
                prefetch_rows((const char *)vals + kb * kstride, kb * kstride, n_keys - j0 - kb, kstride);
            for (int64_t d0 = 0; d0 < dim; d0 += 32) {  /* 32 dims in registers */
                const int nv = dim - d0 < 32 ? (int)(dim - d0) / 8 : 4;
                if (VALUE_ROWS == 3 && R == 3) {
                    VALUES_SWITCH(3)
                } else if (R == 2) {
                    VALUES_SWITCH(2)
                } else {
                    VALUES_SWITCH(1)
                }
            }
            i += R;
        }
        return;
    }
#endif
    /* portable C (no AVX2, or a head width not a multiple of 8): the same steps one value at a time */
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *seen = vis + (i / group) * n_keys;
        float *s = scores + i * pad, *a = acc + i * dim;
        float best = -INFINITY;
        for (int64_t j = 0; j < n_keys; j++) {
            float dot = 0.0f;
            for (int64_t d = 0; d < dim; d++) {
                dot = fmaf(q[i * dim + d], cache1(keys, (int)kind, j * dim + d), dot);
            }
            s[j] = seen[j] ? dot * sc : -INFINITY;
            best = s[j] > best ? s[j] : best;
        }
        top[i] = best;
        total[i] = 0.0f;
        for (int64_t d = 0; d < dim; d++) a[d] = 0.0f;
        if (best == -INFINITY) continue;
        for (int64_t j = 0; j < n_keys; j++) {
            if (!seen[j]) continue;
            const float w = expf(s[j] - best);
            total[i] += w;
            for (int64_t d = 0; d < dim; d++) {
                a[d] = fmaf(w, cache1(values, (int)kind, j * dim + d), a[d]);
            }
        }
    }
}
