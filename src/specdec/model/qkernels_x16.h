/* 16-row interleaved layouts for AVX-512 (included by qkernels.c after qkernels_x8.h).
 *
 * Q4KX8 / Q6KX8 put 8 rows in a 32-byte vector; a zmm then holds two steps, and every product pays a
 * vpermd to give each half its step's activations, and the sub-block scales, mins and the float epilogue
 * run on 8 lanes (Q6KX8's AVX-512 kernel, a vpermt2d a product, gave way to the AVX2 one). Here 16 rows
 * share each step: one 64-byte load is one step of 16 rows, a step's 4 activation bytes reach every lane
 * by a broadcast load (no permute), and the scale products, min sums and epilogue cover 16 rows per
 * instruction. Measured on Zen 4 (one thread, weights
 * in L3): Q4_K 8 activation rows 105 -> 159 GMAC/s, 1 row 50 -> 67; the 32-value types (two threads, in L3,
 * alternated in one process) Q5_0 1 / 2 / 4 / 8 rows 86 / 115 / 147 / 165 -> 102 / 169 / 223 / 205 GMAC/s, Q8_0
 * 85 / 109 / 137 / 141 -> 103 / 148 / 180 / 182. The layouts are the X8 ones with
 * every per-row run 16 rows wide (quant.QuantMatrix.interleaved packs them where the kernels are
 * AVX-512 without AMX: clib.wide_groups):
 *
 *   Q4KX16, per super-block of 16 rows (16 x 148 bytes):
 *     [0, 32) d (f16)   [32, 64) dmin   [64, 192) scale[j][row]   [192, 320) min[j][row]
 *     [320, 2368) for pair p < 4, step t < 8: 64 bytes, row i's 4 bytes at 4 i (Q4KX8's nibbles)
 *   Q5KX16, per super-block of 16 rows (16 x 180 bytes):
 *     [0, 320) as Q4KX16's   [320, 832) for step t < 8: 64 bytes, row i's 4 bytes at 4 i = its GGUF qh[4 t ..]
 *     (bit j: the fifth bit of sub-block j's value 4 t + u; read before the nibbles, so they lie first)
 *     [832, 2880) Q4KX16's nibbles (Q5KX8 likewise at 8 rows: qh [160, 416), nibbles [416, 1440))
 *   Q6KX16, per super-block of 16 rows (16 x 210 bytes):
 *     [0, 32) d (f16)   [32, 288) scale[g][row] (int8)
 *     [288, 3648) for quad h < 2, step t < 8: 192 bytes = L0, L1, H, 64 bytes each: value 32c + 4t + u of
 *                 chunk c = 4h + cc has its low 4 bits in L0 (cc 0: low nibble, cc 1: high) or L1 (cc 2, 3)
 *                 and its high 2 bits at bits 2 cc of H (Q6KX8 packed so until the B0, B1, B2 steps)
 *   Q80X16, Q50X16, Q40X16, Q41X16, Q51X16, per block of 32 values of 16 rows: Q80X8's ... with every per-row run
 *     16 rows wide (d [0, 32); Q5_0's H [32, 96); Q4_1's m [32, 64); Q5_1's m [32, 64), H [64, 128); a step or a
 *     nibble pair 64 bytes): 2 x the X8 bytes
 *
 * Bits: the same exact integers and, per lane, the same fused float steps as the X8 kernels and the
 * portable C below (which every other build runs), so a row's bits never depend on its layout either.
 */
enum { FMT_Q4KX16 = 13, FMT_Q6KX16 = 14, FMT_Q80X16 = 15, FMT_Q50X16 = 16, FMT_Q40X16 = 17, FMT_Q41X16 = 18,
       FMT_Q5KX16 = 20, FMT_Q51X16 = 22 };
enum { X16 = 16, Q6KX16_BYTES = 16 * 210 };

INLINE int kx16_layout(int fmt) { return fmt == FMT_Q4KX16 || fmt == FMT_Q5KX16 || fmt == FMT_Q6KX16; }
INLINE int bx16_layout(int fmt) { return (fmt >= FMT_Q80X16 && fmt <= FMT_Q41X16) || fmt == FMT_Q51X16; }
INLINE int x16_layout(int fmt) { return kx16_layout(fmt) || bx16_layout(fmt); }
/* a 32-value 16-row layout's 8-row twin: Q80X16 -> Q80X8, ... */
INLINE int bx16_narrow(int fmt) { return fmt == FMT_Q51X16 ? FMT_Q51X8 : fmt - FMT_Q80X16 + FMT_Q80X8; }

INLINE int q6x16_value(const uint8_t *blk, int i, int e) {
    const int c = e / 32, l = e % 32, cc = c % 4;
    const uint8_t *base = blk + 288 + 1536 * (c / 4) + 192 * (l / 4) + 4 * i + l % 4;
    const int low = (cc & 1) ? base[cc >= 2 ? 64 : 0] >> 4 : base[cc >= 2 ? 64 : 0] & 15;
    return low | (((base[128] >> (2 * cc)) & 3) << 4);
}

/* row i of a K-quant group of G = 8 or 16 rows as float32 (the embedding look-up; GGUF's formula): the
 * two widths differ only in where a row's values sit and in the stride of the per-row fields */
static void kgroup_dequantize(int G, int fmt, const uint8_t *grp, int i, int64_t k, float *o) {
    const int five = fmt == FMT_Q5KX8 || fmt == FMT_Q5KX16;
    for (int64_t b = 0; b < k / QK; b++)
        if (fmt != FMT_Q6KX8 && fmt != FMT_Q6KX16) {  /* Q4KX8, Q4KX16, Q5KX8, Q5KX16 */
            const uint8_t *blk = grp + (int64_t)q45_bytes(G, five) * b;
            const float d = f16_to_f32(blk + 2 * i), dmin = f16_to_f32(blk + 2 * G + 2 * i);
            for (int e = 0; e < QK; e++) {
                const int j = e / 32, u = q45_value(G, five, blk, i, e);
                o[QK * b + e] = (d * (float)blk[4 * G + G * j + i]) * (float)u - dmin * (float)blk[12 * G + G * j + i];
            }
        } else {
            const uint8_t *blk = grp + (int64_t)G * 210 * b;
            const float d = f16_to_f32(blk + 2 * i);
            for (int e = 0; e < QK; e++) {
                const int u = G == X8 ? q6x8_value(blk, i, e) : q6x16_value(blk, i, e);
                o[QK * b + e] = (d * (float)(int8_t)blk[2 * G + G * (e / 16) + i]) * (float)(u - 32);
            }
        }
}

#if defined(SD_AVX512) && defined(__AVX512VL__)
/* activation rows per tile, Q4_K's (3 zmm a row: products, super-block sums, float sums) and Q6_K's (its first
 * kernel spilled at 8 rows, so it went 4 at a time: 4 rows 91-96 GMAC/s, 8 rows 72-74). With the pair step
 * (x16_pair_step) Q6_K's 5-8 rows run best as one tile: Zen 4, one core, weights in L1, 5 / 6 / 7 / 8 rows
 * 107 / 111 / 119 / 127 GMAC/s as 4 + the rest, 124 / 136 / 135 / 124 as one; out of cache 8 rows 153 -> 170
 * GMAC/s (two threads), where a second 4-row tile read every group again; the 1.5B's 5-8 token passes 7-12%
 * faster, alternated in one process */
#define X16ROWS 8
#ifndef Q6_NA1
#define Q6_NA1 1
#endif

/* the weights X16_PF_AHEAD bytes on, lines first .. first + n - 1 of this super-block's: a few per
 * sub-block, not prefetch_ahead's burst a super-block (37 or 53 lines here: the burst left 8-row Q4_K
 * passes out of cache at 0.8x the 8-row layout's speed, spread 1.37x; Zen 4). A 1-2 row tile fetches its own
 * super-block's lines a sub-block or two before it reads them instead (X16_PF_AHEAD1 = 0, AMD): 2 KB ahead kept
 * the 1.5B's 1-token pass at 28.4 ms where 0 made it 24.3 (34.4 -> 33.6 ms at the VM's slower memory
 * speed; no prefetch 27.0-31.9), while 8-row passes need the 2 KB (0: 64.5 -> 80.7 ms); alternated in one
 * process, Zen 4. 2-row tiles too: both cores streaming 2 x 4000 groups (scripts/tile_rate.c, alternated four times),
 * Q4_K 146-166 -> 176-220 GMAC/s, Q6_K 101-121 -> 117-157, Q8_0 / Q4_1 / Q5_0 83 / 167 / 160 -> 93 / 210-217 /
 * 166-172; 3-4 rows not (Q6_K 10% slower, Q4_K even) */
#ifndef X16_PF_AHEAD
#define X16_PF_AHEAD 2048
#endif
#ifndef X16_PF_AHEAD1
#if defined(SD_INTEL)
#define X16_PF_AHEAD1 X16_PF_AHEAD  /* (not measured on an Intel CPU without AMX, the one that takes this path) */
#else
#define X16_PF_AHEAD1 0
#endif
#endif
INLINE void x16_prefetch(const int R, const uint8_t *blk, int first, int n) {
    const int64_t ahead = R <= 2 ? X16_PF_AHEAD1 : X16_PF_AHEAD;
    for (int i = first; i < first + n; i++) _mm_prefetch((const char *)(blk + ahead + 64 * i), PF_HINT);
}

INLINE __m512i x16_bcast(const int8_t *p) {  /* 4 activation bytes to every lane: a broadcast load */
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* acc + w . p's 4 bytes in every lane (vpdpbusd), and acc + w . p's two int16 in every lane (vpdpwssd), for a tile
 * of R activation rows. From X16_EMB_ROWS rows the activations go as an embedded broadcast operand ({1to16}): GCC
 * 12 loaded 90% of the intrinsics' set1 broadcasts into a register of their own, a vpbroadcastd beside each
 * product and a register fewer for the 8-row tiles' sums. Zen 4, one core (scripts/tile_rate.c, alternated
 * twice; Q6_K's offset then a vpdpwssd a scale group pair): 8 rows in L1 Q6_K 125 -> 152 GMAC/s, Q4_K 171 -> 176,
 * streamed from memory (4000 groups on 4 KB pages) 96 -> 110 and 150 -> 165; but 2 and 4 rows streamed ran
 * slower with it (Q6_K 42 -> 39 and 85 -> 71), so narrower tiles keep the register broadcast. Whole passes of
 * the 1.5B, the two builds alternated in one process (10 rounds): 8 and 16 tokens 2.6% and 3.0% faster, 1-4
 * tokens within the noise. The same instructions otherwise: the same bits */
#ifndef X16_EMB_ROWS
#define X16_EMB_ROWS 5
#endif
INLINE __m512i x16_dp(const int R, __m512i acc, __m512i w, const int8_t *p) {
#if defined(__GNUC__)
    if (R >= X16_EMB_ROWS) {
        __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)p));
        return acc;
    }
#endif
    return _mm512_dpbusd_epi32(acc, w, x16_bcast(p));
}

INLINE __m512i x16_dpw(const int R, __m512i acc, __m512i w, const int16_t *p) {
#if defined(__GNUC__)
    if (R >= X16_EMB_ROWS) {
        __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)p));
        return acc;
    }
#endif
    return _mm512_dpwssd_epi32(acc, w, x16_bcast((const int8_t *)p));
}

/* two runs of 16 per-row unsigned bytes (Q4_K's mins), p[i] and p[16 + i] for row i, as the int16 halves of lane i
 * (the pair a vpdpwssd meets) */
INLINE __m512i x16_byte_pairs(const uint8_t *p) {
    const __m128i g0 = _mm_loadu_si128((const __m128i *)p), g1 = _mm_loadu_si128((const __m128i *)(p + 16));
    return _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(g0, g1), _mm_unpacklo_epi8(g0, g1)));
}

/* one step's two weight vectors (values 32 apart: a sub-block pair's nibbles, a chunk pair) against R activation
 * rows (x: the first one's 4 bytes; the second's 32 on), into NA independent sums a row (exact, so the same bits:
 * one chain of vpdpbusd a row bound a 1-row pass by its latency) */
INLINE void x16_pair_step(const int R, const int NA, int t, __m512i w0, __m512i w1, const int8_t *x, int64_t k,
                          __m512i *a0, __m512i *a1) {
    for (int r = 0; r < R; r++) {
        const int c = r + R * (t % NA);
        a0[c] = x16_dp(R, a0[c], w0, x + r * k);
        a1[c] = x16_dp(R, a1[c], w1, x + r * k + 32);
    }
}

/* the pair's NA sums a row folded, times their 16 rows' scales, into sumi */
INLINE void x16_pair_scale(const int R, const int NA, __m512i *a0, __m512i *a1, __m512i s0, __m512i s1, __m512i *sumi) {
    for (int r = R; r < R * NA; r++) {
        a0[r % R] = _mm512_add_epi32(a0[r % R], a0[r]);
        a1[r % R] = _mm512_add_epi32(a1[r % R], a1[r]);
    }
    for (int r = 0; r < R; r++)
        sumi[r] = _mm512_add_epi32(sumi[r], _mm512_add_epi32(_mm512_mullo_epi32(a0[r], s0), _mm512_mullo_epi32(a1[r], s1)));
}

/* R activation rows against one Q4KX16 group: out[r * os + i], i < 16.
 * Up to X16_PAIR_ROWS rows take a sub-block pair's steps together: one load of a step's 64 bytes gives both
 * sub-blocks' weights (low and high nibbles), where the 8-row loop below loads each step twice (its
 * registers hold no second set of sums). Zen 4, two threads, alternated in one process: in L3 1 row 88 ->
 * 98 GB/s, 2 rows 70 -> 75 (3-4 rows lost in whole passes); the 1.5B's 1-token pass 38.7 -> 34.8-35.3 ms
 * at a 32 ms read floor, 24.1 -> 23.6 at 17.4 ms. The same exact integers: the same bits. */
#ifndef X16_PAIR_ROWS
#define X16_PAIR_ROWS 2
#endif
/* R activation rows against one Q4KX16 group, or (FIVE) one Q5KX16 group: the same tile with each weight's fifth
 * bit (the step's qh bytes, bit j for sub-block j) put in bit 4 of its byte before the products */
INLINE void x16_q45k(const int R, const int FIVE, const uint8_t *grp, int64_t k, const int8_t *xk, const float *dk,
                     const int32_t *bw, float *out, int64_t os) {
    const int64_t nsb = k / QK;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const int lines = FIVE ? 48 : 40;  /* a super-block's lines (37 or 45) rounded up to 8 a sub-block (x16_prefetch) */
    __m512 acc[X16ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *blk = grp + q45_bytes(X16, FIVE) * b;
        const uint8_t *qh = blk + 320, *nibbles = blk + q45_nibbles(X16, FIVE);  /* Q5KX16: qh, a step 64 bytes */
        __m512i sumi[X16ROWS];
        for (int r = 0; r < R; r++) sumi[r] = _mm512_setzero_si512();
        if (R <= X16_PAIR_ROWS) {  /* a step's 64 bytes loaded once for both its sub-blocks (low, high nibbles) */
            for (int p = 0; p < 4; p++) {
                x16_prefetch(R, blk, lines / 4 * p, lines / 4);
                const __m512i sc0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 64 + 32 * p)));
                const __m512i sc1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 80 + 32 * p)));
                const uint8_t *qs = nibbles + 512 * p;
                const int NA = R == 1 ? 2 : 1;
                __m512i a0[2 * X16_PAIR_ROWS], a1[2 * X16_PAIR_ROWS];  /* R * NA sums, whatever X16_PAIR_ROWS is */
                for (int r = 0; r < R * NA; r++) a0[r] = a1[r] = _mm512_setzero_si512();
                for (int t = 0; t < 8; t++) {
                    const __m512i v = _mm512_loadu_si512((const void *)(qs + 64 * t));
                    __m512i w0 = _mm512_and_si512(v, m4), w1 = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                    if (FIVE) {
                        const __m512i h = _mm512_loadu_si512((const void *)(qh + 64 * t));
                        w0 = fifth_zmm(w0, h, _mm512_set1_epi8((char)(1 << (2 * p))));
                        w1 = fifth_zmm(w1, h, _mm512_set1_epi8((char)(2 << (2 * p))));
                    }
                    x16_pair_step(R, NA, t, w0, w1, xk + QK * b + 64 * p + 4 * t, k, a0, a1);
                }
                x16_pair_scale(R, NA, a0, a1, sc0, sc1, sumi);
            }
        } else
        for (int j = 0; j < 8; j++) {
            x16_prefetch(R, blk, lines / 8 * j, lines / 8);
            const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 64 + 16 * j)));
            const uint8_t *qs = nibbles + 512 * (j / 2);
            /* NA independent sums a row (exact, so the same bits): one chain of 8 vpdpbusd a sub-block bound
             * a 1-row pass by its latency */
            const int NA = R == 1 ? 4 : R == 2 ? 2 : 1;
            __m512i a[X16ROWS];
            for (int r = 0; r < R * NA; r++) a[r] = _mm512_setzero_si512();
            for (int t = 0; t < 8; t++) {
                const __m512i v = _mm512_loadu_si512((const void *)(qs + 64 * t));
                __m512i w = _mm512_and_si512((j & 1) ? _mm512_srli_epi16(v, 4) : v, m4);
                if (FIVE)
                    w = fifth_zmm(w, _mm512_loadu_si512((const void *)(qh + 64 * t)), _mm512_set1_epi8((char)(1 << j)));
                for (int r = 0; r < R; r++)
                    a[r + R * (t % NA)] = x16_dp(R, a[r + R * (t % NA)], w, xk + r * k + QK * b + 32 * j + 4 * t);
            }
            for (int r = R; r < R * NA; r++) a[r % R] = _mm512_add_epi32(a[r % R], a[r]);
            for (int r = 0; r < R; r++) sumi[r] = _mm512_add_epi32(sumi[r], _mm512_mullo_epi32(a[r], sc));
        }
        /* the min term, sum_j min_j x sub-block j's sum: sub-blocks 2 jp and 2 jp + 1 in one vpdpwssd (their mins
         * as a lane's int16 halves against bw's word of their two 32-value sums), where a vpdpwssd a sub-block took
         * its two 16-value sums (bk): the same integers, half the products on the vpdpbusd pipe. Zen 4, one core,
         * L1 (scripts/tile_rate.c): 2 / 4 / 8 rows 158 / 171 / 176 -> 168 / 177 / 184 GMAC/s, 1 row unchanged. The
         * 1.5B's products, 28 layers each, old and new tiles alternated in one process: 8 rows wqkv, wo, gate/up
         * 1.06, 1.05, 1.03x faster (down, half Q4_K, 1.03), 1 row wqkv and wo 1.07 and 1.15, gate/up and down
         * 1.00; whole passes 1.00-1.03 (1-16 tokens) */
        __m512i msum[X16ROWS];
        for (int r = 0; r < R; r++) msum[r] = _mm512_setzero_si512();
        for (int jp = 0; jp < 4; jp++) {
            const __m512i mn2 = x16_byte_pairs(blk + 192 + 32 * jp);
            for (int r = 0; r < R; r++)
                msum[r] = x16_dpw(R, msum[r], mn2, (const int16_t *)(bw + r * BW_WORDS(k) + 4 * b + jp));
        }
        /* q4x8_epilogue's fused steps, per lane */
        const __m512 vd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        const __m512 vm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)));
        for (int r = 0; r < R; r++) {
            const __m512 t = _mm512_fmsub_ps(vd, _mm512_cvtepi32_ps(sumi[r]), _mm512_mul_ps(vm, _mm512_cvtepi32_ps(msum[r])));
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(dk[r * nsb + b]), t, acc[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(out + r * os, acc[r]);
}

/* R activation rows against one Q6KX16 group. A quad's chunk pair (c0, c0 + 1 from L0's nibbles, or
 * c0 + 2, c0 + 3 from L1's) and half of its steps meet one scale group per chunk: the 4 steps' int32
 * sums (vpdpbusd) meet their 16 rows' scales in one vpmulld */
INLINE void x16_q6k(const int R, const uint8_t *grp, int64_t k, const int8_t *xk, const float *dk, const int16_t *bk,
                    float *out, int64_t os) {
    const int64_t nsb = k / QK;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    __m512 acc[X16ROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *blk = grp + Q6KX16_BYTES * b;
        __m512i sumi[X16ROWS];
        for (int r = 0; r < R; r++) sumi[r] = _mm512_setzero_si512();
        /* values are q - 32: a scale group's sums start at -32 x its 16 activations' sum (bk), so its scale's vpmulld
         * takes 32 x scale_g x bk_g back too (sums mod 2^32: the same bits as q6x8_epilogue's subtraction). Where a
         * vpdpwssd a group pair did it after the quads (its scales widened to int16 pairs, ~9 operations a pair): Zen 4,
         * one core, L1 (scripts/tile_rate.c) 1 / 2 / 4 / 8 rows 65.0 / 100.1 / 132.7 / 151.8 -> 75.3 / 109.0 / 141.0 /
         * 158.9 GMAC/s */
        int32_t off[X16ROWS][16] __attribute__((aligned(64)));
        for (int r = 0; r < R; r++)
            _mm512_store_si512((void *)off[r], _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(
                _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)(bk + r * (k / 16) + 16 * b))), 5)));
        /* quad qh / 4, steps 4 ((qh / 2) % 2) .. + 3, chunk pair qh % 2: a half-quad's 12 lines (L0, L1, H of 4 steps)
         * both pairs at a time, in reading order (pairs outer took L0 and H of all 8 steps, then came back for L1):
         * Zen 4, both cores streaming 8 rows, alternated three times 242-248 -> 254-259 GMAC/s; the same integers */
        for (int qh = 0; qh < 8; qh++) {
            const int quad = qh / 4, pair = qh % 2, half = (qh / 2) % 2;
            const int c0 = 4 * quad + 2 * pair;  /* chunks c0, c0 + 1 */
            x16_prefetch(R, blk, 7 * qh, 7);
            const uint8_t *base = blk + 288 + 1536 * quad;
            const int NA = R == 1 ? Q6_NA1 : 1;  /* independent sums a row, as x16_q4k's */
            __m512i a0[X16ROWS], a1[X16ROWS];
            const int g0 = 2 * c0 + half;  /* the scale groups of chunks c0 and c0 + 1 */
            for (int r = 0; r < R; r++) {
                a0[r] = _mm512_set1_epi32(off[r][g0]);
                a1[r] = _mm512_set1_epi32(off[r][g0 + 2]);
            }
            for (int r = R; r < R * NA; r++) a0[r] = a1[r] = _mm512_setzero_si512();
            /* a constant trip count: t from 4 half to 4 half + 3 left GCC a loop with run-time bounds and scalar
             * glue between the steps (Zen 4, one core, weights in L1: 1 / 2 / 3 / 8 rows 66 / 89 / 110 / 124 ->
             * 68 / 99 / 116 / 130 GMAC/s, 4 rows 127 -> 125) */
            for (int s = 0; s < 4; s++) {
                const int t = 4 * half + s;
                const __m512i l = _mm512_loadu_si512((const void *)(base + 192 * t + 64 * pair));
                const __m512i h = _mm512_loadu_si512((const void *)(base + 192 * t + 128));
                /* high bits of chunk cc (bits 2 cc .. 2 cc + 1 of H) to bits 4..5 */
                const __m512i h0 = pair ? h : _mm512_slli_epi16(h, 4);
                const __m512i h1 = pair ? _mm512_srli_epi16(h, 2) : _mm512_slli_epi16(h, 2);
                const __m512i w0 = _mm512_ternarylogic_epi32(_mm512_and_si512(l, m4), h0, m30, 0xF8);  /* a | (b & c) */
                const __m512i w1 = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4), h1, m30, 0xF8);
                x16_pair_step(R, NA, t, w0, w1, xk + QK * b + 32 * c0 + 4 * t, k, a0, a1);
            }
            const uint8_t *sg = blk + 32 + 16 * (2 * c0 + half);  /* scale group of chunk c0 (+ 32: of c0 + 1) */
            const __m512i s0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)sg));
            const __m512i s1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sg + 32)));
            x16_pair_scale(R, NA, a0, a1, s0, s1, sumi);
        }
        /* q6x8_epilogue's float steps per lane */
        const __m512 vd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        for (int r = 0; r < R; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(dk[r * nsb + b]), _mm512_mul_ps(vd, _mm512_cvtepi32_ps(sumi[r])), acc[r]);
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(out + r * os, acc[r]);
}
/* R activation rows against one 16-row group of a 32-value layout (Q80X16, Q50X16, Q40X16, Q41X16): x8_b32's
 * integers and per-lane float steps (acc += (d dx) sum, macc += m bs32, out = acc + macc), a step of 16 rows a zmm
 * and its 4 activation bytes a broadcast load. Q8_0's signed weights go as |w| against x negated where w < 0
 * (vpsignb has no zmm form): the same products */
INLINE void x16_b32(const int R, const int FMT, const uint8_t *grp, int64_t k, const int8_t *xq, const float *dx8,
                    const float *bs32, float *out, int64_t os) {
    const int F8 = bx16_narrow(FMT);
    const int64_t nb = k / 32;
    const int bytes = bx_bytes(X16, F8), nib = bx_nibbles(X16, F8);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const int NA = R == 1 ? 4 : R == 2 ? 2 : 1;  /* independent sums a row, as x16_q4k's */
    __m512 acc[X16ROWS], macc[X16ROWS];
    for (int r = 0; r < R; r++) acc[r] = macc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = grp + (int64_t)bytes * b;
        x16_prefetch(R, blk, 0, (bytes + 63) / 64);  /* 1-2 rows: this block's lines (AMD; 2 KB on alike) */
        __m512i a[X16ROWS];  /* R x NA <= 8 */
        for (int r = 0; r < R * NA; r++) a[r] = _mm512_setzero_si512();
        const __m512i h = bx8_fifths(F8) ? _mm512_loadu_si512((const void *)(blk + 2 * bx8_fifths(F8)))
                                         : _mm512_setzero_si512();
        for (int t = 0; t < 8; t++) {
            __m512i w;
            __mmask64 neg = 0;
            if (F8 == FMT_Q80X8) {
                const __m512i v = _mm512_loadu_si512((const void *)(blk + 32 + 64 * t));
                neg = _mm512_movepi8_mask(v);
                w = _mm512_abs_epi8(v);
            } else {
                const __m512i v = _mm512_loadu_si512((const void *)(blk + nib + 64 * (t % 4)));
                w = _mm512_and_si512(t < 4 ? v : _mm512_srli_epi16(v, 4), m4);
                if (bx8_fifths(F8)) w = fifth_zmm(w, h, _mm512_set1_epi8((char)(1 << t)));  /* bit t of H's bytes */
            }
            for (int r = 0; r < R; r++) {
                __m512i xv = x16_bcast(xq + r * k + 32 * b + 4 * t);
                if (F8 == FMT_Q80X8) xv = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
                const int c = r + R * (t % NA);
                a[c] = _mm512_dpbusd_epi32(a[c], w, xv);
            }
        }
        for (int r = R; r < R * NA; r++) a[r % R] = _mm512_add_epi32(a[r % R], a[r]);
        const __m512 vd = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        const __m512 vm = bx8_min(F8) ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)))
                        : _mm512_mul_ps(vd, _mm512_set1_ps(bx8_offset(F8)));
        for (int r = 0; r < R; r++) {
            const __m512 scale = _mm512_mul_ps(vd, _mm512_set1_ps(dx8[r * (k / 4) + 8 * b]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[r]), scale, acc[r]);
            if (F8 != FMT_Q80X8) macc[r] = _mm512_fmadd_ps(vm, _mm512_set1_ps(bs32[r * nb + b]), macc[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(out + r * os, F8 == FMT_Q80X8 ? acc[r] : _mm512_add_ps(acc[r], macc[r]));
}
#define CALL_Q4KX16(R) x16_q45k(R, 0, g, k, xk, dk, bw, out, os)
#define CALL_Q5KX16(R) x16_q45k(R, 1, g, k, xk, dk, bw, out, os)
#define CALL_Q6KX16(R) x16_q6k(R, g, k, xk, dk, bk, out, os)
#define CALL_BX16(R) x16_b32(R, FMT, g, k, xq, dx8, bs32, out, os)
B32TILES(tiles_q80x16, FMT_Q80X16, ROWS_SWITCH, CALL_BX16)  /* qkernels_x8.h's macro */
B32TILES(tiles_q50x16, FMT_Q50X16, ROWS_SWITCH, CALL_BX16)
B32TILES(tiles_q40x16, FMT_Q40X16, ROWS_SWITCH, CALL_BX16)
B32TILES(tiles_q41x16, FMT_Q41X16, ROWS_SWITCH, CALL_BX16)
B32TILES(tiles_q51x16, FMT_Q51X16, ROWS_SWITCH, CALL_BX16)
static void tiles_x16(int fmt, int R, const uint8_t *g, int64_t k, const int8_t *xq, const float *dx8, const float *bs32,
                      const int8_t *xk, const float *dk, const int16_t *bk, const int32_t *bw, float *out, int64_t os) {
    switch (fmt) {
    case FMT_Q4KX16: ROWS_SWITCH(CALL_Q4KX16) break;
    case FMT_Q5KX16: ROWS_SWITCH(CALL_Q5KX16) break;
    case FMT_Q6KX16: ROWS_SWITCH(CALL_Q6KX16) break;
    case FMT_Q80X16: tiles_q80x16(R, g, k, xq, dx8, bs32, out, os); break;
    case FMT_Q50X16: tiles_q50x16(R, g, k, xq, dx8, bs32, out, os); break;
    case FMT_Q40X16: tiles_q40x16(R, g, k, xq, dx8, bs32, out, os); break;
    case FMT_Q51X16: tiles_q51x16(R, g, k, xq, dx8, bs32, out, os); break;
    default: tiles_q41x16(R, g, k, xq, dx8, bs32, out, os); break;
    }
}
#else
/* portable C (every build without AVX-512 VL; the packer picks these layouts only for AVX-512, so here
 * they are the reference the AVX-512 bits are tested against): Q4KX8's and Q6KX8's integers and fused
 * float steps at the 16-row offsets */
#define X16ROWS 1
static void tiles_x16(int fmt, int R, const uint8_t *grp, int64_t k, const int8_t *xq, const float *dx8, const float *bs32,
                      const int8_t *xk, const float *dk, const int16_t *bk, const int32_t *bw, float *out, int64_t os) {
    const int64_t nsb = k / QK;
    (void)R;
    (void)bw;
    if (bx16_layout(fmt)) {
        bgroup_product(X16, bx16_narrow(fmt), 1, grp, k, xq, dx8, bs32, out, os);
        return;
    }
    for (int i = 0; i < X16; i++) {
        float acc = 0.0f;
        for (int64_t b = 0; b < nsb; b++) {
            const int8_t *x = xk + QK * b;
            const int16_t *sums = bk + 16 * b;
            int32_t sumi = 0, msum = 0;
            if (fmt != FMT_Q6KX16) {  /* Q4KX16, Q5KX16 */
                const int five = fmt == FMT_Q5KX16;
                const uint8_t *blk = grp + q45_bytes(X16, five) * b;
                for (int j = 0; j < 8; j++) {
                    int32_t dot = 0;
                    for (int l = 0; l < 32; l++)
                        dot += q45_value(X16, five, blk, i, 32 * j + l) * x[32 * j + l];
                    sumi += blk[64 + 16 * j + i] * dot;
                    msum += blk[192 + 16 * j + i] * (sums[2 * j] + sums[2 * j + 1]);
                }
                const float d = f16_to_f32(blk + 2 * i), dmin = f16_to_f32(blk + 32 + 2 * i);
                acc = fmaf(dk[b], fmaf(d, (float)sumi, -(dmin * (float)msum)), acc);
            } else {
                const uint8_t *blk = grp + Q6KX16_BYTES * b;
                for (int g = 0; g < 16; g++) {
                    int32_t dot = 0;
                    for (int l = 0; l < 16; l++) dot += q6x16_value(blk, i, 16 * g + l) * x[16 * g + l];
                    sumi += (int8_t)blk[32 + 16 * g + i] * (dot - 32 * sums[g]);
                }
                acc = fmaf(dk[b], f16_to_f32(blk + 2 * i) * (float)sumi, acc);
            }
        }
        out[i] = acc;
    }
}
#endif

/* one group (weight rows n .. n + 15, at qn: sd_qmatmul's segments place it) against every activation row */
static void x16_group(int fmt, const uint8_t *grp, int64_t k, const int8_t *xq, const float *dx8, const float *bs32,
                      const int8_t *xk, const float *dk, const int16_t *bk, const int32_t *bw, int64_t rows, float *out,
                      int64_t out_stride) {
    for (int64_t r0 = 0; r0 < rows; r0 += X16ROWS) {
        const int R = rows - r0 < X16ROWS ? (int)(rows - r0) : X16ROWS;
        tiles_x16(fmt, R, grp, k, xq + r0 * k, dx8 + r0 * (k / 4), bs32 + r0 * (k / 32), xk + r0 * k,
                  dk + r0 * (k / QK), bk + r0 * (k / 16), bw + r0 * BW_WORDS(k), out + r0 * out_stride, out_stride);
    }
}
