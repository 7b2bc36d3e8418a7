/* Interleaved K-quant layouts: 8 weight rows per group, one 32-bit lane per row (included by qkernels.c).
 *
 * A plain K-quant row (qkernels.c's ktile45/ktile6) sums its products across the lanes of a register
 * and pays a horizontal sum and its own scale shuffles per row. Here 8 weight rows are packed
 * together at load (quant.QuantMatrix.interleaved): each 32-byte load holds 4 consecutive values of
 * each of the 8 rows, the activations' 4 bytes are broadcast to every lane, and lane i accumulates row
 * i alone: no horizontal sums, the scales of 8 rows applied by one instruction, and the weight
 * unpacking shared by every activation row of the pass. The idea is llama.cpp's block_q4_Kx8 and
 * ik_llama.cpp's _R8 types; the code is ours.
 *
 *   Q4KX8, per super-block of 256 values of 8 rows (8 x 148 bytes: GGUF's 144 with the 12 packed
 *   scale bytes unpacked to 16):
 *     [0, 16) d of rows 0..7 (f16)   [16, 32) dmin (f16)   [32, 96) scale[j][row]   [96, 160) min[j][row]
 *     [160, 1184) for pair p < 4, step t < 8: 32 bytes, row i's 4 bytes at 4 i = its GGUF qs[32 p + 4 t ..]
 *                 (low nibbles: sub-block 2p values 4t..4t+3; high nibbles: sub-block 2p + 1)
 *   Q5KX8, per super-block of 8 rows (8 x 180 bytes: GGUF's 176, its scales unpacked as Q4KX8's):
 *     [0, 160) as Q4KX8's   [160, 416) for step t < 8: 32 bytes, row i's 4 bytes at 4 i = its GGUF qh[4 t ..]
 *                 (bit j: the fifth bit of sub-block j's value 4 t + u)   [416, 1440) the nibbles as Q4KX8's
 *   Q6KX8, per super-block of 8 rows (8 x 210 bytes, as GGUF's):
 *     [0, 16) d (f16)   [16, 144) scale[g][row] (int8, g < 16 per 16 values)
 *     [144, 1680) for quad h < 2, step t < 8: 96 bytes = B0, B1, B2, each row i's 4 bytes at 4 i:
 *                 chunk c = 4h + cc holds values 32c..32c+31; value 32c + 4t + u is in bits 0..5 of Bcc
 *                 for cc < 3; for cc = 3 its bits 2j..2j+1 are in bits 6..7 of Bj (qkernels_x16.h's
 *                 Q6KX16 keeps 4-bit halves and a byte of high bits instead).
 *
 * The 32-value types get the same treatment (qkernels_x8.h's second half): per block of 32 values of 8 rows,
 * a row's 4 values of step t < 8 in lane i of a 32-byte vector; value = d (u - OFF) + m
 *   Q80X8 (272 bytes = GGUF's 8 x 34): [0, 16) d (f16)   [16, 272) step t: 32 bytes, row i's 4 signed bytes at 4 i
 *   Q50X8 (176 = 8 x 22): [0, 16) d   [16, 48) H: bit t of byte 4 i + u = the fifth bit of row i's value 4 t + u
 *                         [48, 176) pair p < 4: 32 bytes, byte 4 i + u = value 4 p + u (low nibble), 4 (p + 4) + u (high)
 *   Q40X8 (144 = 8 x 18): [0, 16) d   [16, 144) the nibbles as Q50X8's         (OFF 16 for Q5_0, 8 for Q4_0)
 *   Q41X8 (160 = 8 x 20): [0, 16) d   [16, 32) m (f16)   [32, 160) the nibbles  (Q4_1: value d u + m)
 *   Q51X8 (192 = 8 x 24): [0, 16) d   [16, 32) m   [32, 64) H as Q50X8's   [64, 192) the nibbles  (Q5_1: d u + m)
 * Q8_0's signed bytes go through |w| x sign(x, w); the offsets and Q4_1's mins through the activations'
 * block sums (bs32), the float steps per block the same on every path.
 *
 * Arithmetic: the integers are exact (int16 partial sums are bounded below 2^15 by construction:
 * 8 steps of 2 x 15 x 127 for Q4_K, 4 of 2 x 31 x 127 for Q5_K, 2 of 2 x 63 x 127 for Q6_K), and the float epilogue per
 * super-block is the same fused operations in the same order on every path (AVX2, AVX-512 VL, and the
 * portable C below, which uses fmaf), so a row's bits never depend on how many activation rows share
 * the pass, nor on the ISA the library was built for.
 */
enum { FMT_Q4KX8 = 7, FMT_Q6KX8 = 8, FMT_Q80X8 = 9, FMT_Q50X8 = 10, FMT_Q40X8 = 11, FMT_Q41X8 = 12, FMT_Q5KX8 = 19,
       FMT_Q51X8 = 21 };
enum { X8 = 8, Q6KX8_BYTES = 8 * 210 };

INLINE int kx8_layout(int fmt) { return fmt == FMT_Q4KX8 || fmt == FMT_Q5KX8 || fmt == FMT_Q6KX8; }  /* super-blocks */
INLINE int bx8_layout(int fmt) { return (fmt >= FMT_Q80X8 && fmt <= FMT_Q41X8) || fmt == FMT_Q51X8; }  /* 32-value */
INLINE int x8_layout(int fmt) { return kx8_layout(fmt) || bx8_layout(fmt); }
/* bytes per 32-value block of a group of 8 rows; where its nibbles start; its offset (-OFF) */
INLINE int bx8_bytes(int fmt) {
    return fmt == FMT_Q80X8 ? 272 : fmt == FMT_Q50X8 ? 176 : fmt == FMT_Q40X8 ? 144 : fmt == FMT_Q51X8 ? 192 : 160;
}
INLINE int bx8_nibbles(int fmt) { return fmt == FMT_Q50X8 ? 48 : fmt == FMT_Q40X8 ? 16 : fmt == FMT_Q51X8 ? 64 : 32; }
INLINE float bx8_offset(int fmt) { return fmt == FMT_Q50X8 ? -16.0f : -8.0f; }
INLINE int bx8_min(int fmt) { return fmt == FMT_Q41X8 || fmt == FMT_Q51X8; }  /* a float16 m a block (else an offset) */
INLINE int bx8_fifths(int fmt) { return fmt == FMT_Q51X8 ? 32 : fmt == FMT_Q50X8 ? 16 : 0; }  /* H at (X8), or 0 */

/* bytes per 32-value block of a group of G rows (fmt its X8 layout), and where its nibbles start */
INLINE int bx_bytes(int G, int fmt) { return bx8_bytes(fmt) / X8 * G; }
INLINE int bx_nibbles(int G, int fmt) { return bx8_nibbles(fmt) / X8 * G; }

/* value l (0..31) of row i of a 32-value block of a group of G = 8 rows (fmt an X8 layout) or 16 (qkernels_x16.h's
 * Q80X16 ..: every per-row run G rows wide), as the kernels multiply it (Q8_0 signed, the others unsigned, before OFF) */
INLINE int bx_value(int G, int fmt, const uint8_t *blk, int i, int l) {
    const int t = l / 4, u = l % 4;
    if (fmt == FMT_Q80X8) return (int8_t)blk[2 * G + 4 * G * t + 4 * i + u];
    const uint8_t byte = blk[bx_nibbles(G, fmt) + 4 * G * (t % 4) + 4 * i + u];
    const int low = t < 4 ? byte & 15 : byte >> 4;
    return bx8_fifths(fmt) ? low | (((blk[bx8_fifths(fmt) / X8 * G + 4 * i + u] >> t) & 1) << 4) : low;
}

/* R activation rows against one 32-value group of G = 8 or 16 rows (fmt its X8 layout), in portable C: the
 * integers and fused float steps (fmaf) every ISA's kernel takes per lane, so the reference for both widths */
static inline void bgroup_product(int G, int fmt, int R, const uint8_t *grp, int64_t k, const int8_t *xq,
                                  const float *dx8, const float *bs32, float *out, int64_t os) {
    const int64_t nb = k / 32;
    for (int r = 0; r < R; r++)
        for (int i = 0; i < G; i++) {
            float acc = 0.0f, macc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = grp + (int64_t)bx_bytes(G, fmt) * b;
                const int8_t *x = xq + r * k + 32 * b;
                int32_t dot = 0;
                for (int l = 0; l < 32; l++) dot += bx_value(G, fmt, blk, i, l) * x[l];
                const float d = f16_to_f32(blk + 2 * i);
                acc = fmaf((float)dot, d * dx8[r * (k / 4) + 8 * b], acc);
                const float m = bx8_min(fmt) ? f16_to_f32(blk + 2 * G + 2 * i) : d * bx8_offset(fmt);
                if (fmt != FMT_Q80X8) macc = fmaf(m, bs32[r * nb + b], macc);
            }
            out[r * os + i] = fmt == FMT_Q80X8 ? acc : acc + macc;
        }
}

/* a Q4_K super-block of a group of G = 8 or 16 rows (five: Q5_K's, its qh between the mins, at 20 G, and the
 * nibbles): its bytes, and where its nibbles start */
INLINE int q45_bytes(int G, int five) { return G * (five ? 180 : 148); }
INLINE int q45_nibbles(int G, int five) { return G * (five ? 52 : 20); }

/* value e (0..255) of row i of such a super-block, unsigned: its nibble (a step's 4 G bytes hold 4 values of each
 * row, sub-blocks 2p and 2p + 1 in the low and high halves) and, for Q5_K, its fifth bit (qh, a step at a time at
 * [20 G, 52 G): bit j is sub-block j's) */
INLINE int q45_value(int G, int five, const uint8_t *blk, int i, int e) {
    const int j = e / 32, l = e % 32, at = 4 * G * (l / 4) + 4 * i + l % 4;
    const uint8_t byte = blk[q45_nibbles(G, five) + 32 * G * (j / 2) + at];
    const int nibble = (j & 1) ? byte >> 4 : byte & 15;
    return five ? nibble | (((blk[20 * G + at] >> j) & 1) << 4) : nibble;
}

/* value e (0..255) of row i of a Q6KX8 super-block, unsigned (before its -32); q6x16_value the Q6KX16 one */
INLINE int q6x8_value(const uint8_t *blk, int i, int e) {
    const int c = e / 32, l = e % 32, cc = c % 4;
    const uint8_t *base = blk + 144 + 768 * (c / 4) + 96 * (l / 4) + 4 * i + l % 4;
    return cc < 3 ? base[32 * cc] & 63 : (base[0] >> 6) | ((base[32] >> 6) << 2) | ((base[64] >> 6) << 4);
}

#if defined(SD_AVX2)
/* activation rows per tile: their accumulators must stay in registers (16 ymm, or 32 with AVX-512 VL).
 * AVX2 without VNNI keeps 8 too: its Q4_K tile holds only int16 sums in registers (x8_q4k), and its Q6_K and
 * 32-value tiles share their unpacking among more rows. Zen 2, two threads, out of cache, alternated with 4-row
 * tiles (scripts/kernel_stream.py --rows 6,8): Q6_K 8 rows 83-84 -> 99-101 GMAC/s, Q5_0 93 -> 104, Q8_0 77 -> 80 */
#ifndef XROWS
#if defined(__AVX512VL__) || !defined(SD_VNNI)
#define XROWS 8
#else
#define XROWS 4
#endif
#endif

/* the weights PF_AHEAD bytes on, fetched while this super-block computes: a 1-row pass streams the
 * weights and the hardware prefetcher alone keeps too few lines in flight (a prefetch never faults,
 * so reading past the matrix's end is harmless). Measured per vendor (clib passes SD_INTEL), 1-row
 * products of 509 MB of Q4_K / 723 MB of Q6_K out of cache, two threads: on a Sapphire Rapids VM
 * into L1 4 KB ahead 17 / 21 GB/s, none 21 / 19, into L2 2 KB ahead 23 / 25 (floor 34-39): an L1
 * prefetch holds one of the core's few fill buffers for a whole memory round trip; on Zen 3 into
 * L1 4 KB ahead took 13.7 -> 15.1 GB/s (AMD fills L1 and L2 for every hint). On AMD a 1-row tile now
 * prefetches nothing (PF_AHEAD1 < 0): on Zen 4, alternated in one process, the 1.5B's 1-token pass on
 * the AVX2 build 35.3 -> 32.7 ms (4 KB ahead -> none; 1 KB 33.5), the 0.5B's 13.7 -> 13.1 ms; wider
 * passes keep the 4 KB. AMD cores without AVX-512 (Zen 1-3: clib passes SD_AMD_PF1) keep it at 1 row
 * too: on Zen 2, alternated in one process, the 1.5B's 1-token pass 47.4 -> 42.8 ms and 49.8 -> 47.8
 * (none -> 4 KB; 8 KB as 4), and 2 threads streamed 425 MB of Q4_K at 24.6 -> 26.1 GB/s. */
#if defined(SD_INTEL)
#define PF_HINT _MM_HINT_T1
#else
#define PF_HINT _MM_HINT_T0
#endif
#ifndef PF_AHEAD
#if defined(SD_INTEL)
#define PF_AHEAD 2048
#else
#define PF_AHEAD 4096
#endif
#endif
#ifndef PF_AHEAD1
#if defined(SD_INTEL) || defined(SD_AMD_PF1)
#define PF_AHEAD1 PF_AHEAD
#else
#define PF_AHEAD1 (-1)
#endif
#endif
INLINE void prefetch_ahead(const int R, const uint8_t *p, int bytes) {
    const int ahead = R == 1 ? PF_AHEAD1 : PF_AHEAD;
    if (ahead < 0) return;
    for (int i = 0; i < bytes; i += 64) _mm_prefetch((const char *)(p + ahead + i), PF_HINT);
}

INLINE __m256i x4_bcast(const int8_t *p) {  /* 4 activation bytes to every lane */
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

INLINE __m256i dup16(__m256i v) {  /* a 16-bit value in the low half of each lane, into both halves */
    return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v, 16));
}

/* bit `bit` of each byte of h at bit 4, the rest cleared (a fifth bit: Q5_K's qh, Q5_0's and Q5_1's H): a 16-bit
 * shift by at most 4 never carries another byte's bit into a byte's bit 4 */
INLINE __m256i fifth_bits(__m256i h, int bit) {
    const __m256i v = bit < 4 ? _mm256_slli_epi16(h, 4 - bit) : bit == 4 ? h : _mm256_srli_epi16(h, bit - 4);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

#if defined(SD_VNNI)
/* acc + the sums of 4 products u8 w x s8 x per 32-bit lane (exact: at most 4 x 15 x 128 a step) */
INLINE __m256i dot4_acc(__m256i acc, __m256i w, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, w, x);
#else
    return _mm256_dpbusd_avx_epi32(acc, w, x);
#endif
}
#endif

INLINE __m256i u8x8_epi32(const uint8_t *p) {  /* 8 unsigned bytes (one per row) as int32 lanes */
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* 8 unsigned bytes (one per row) in both 16-bit halves of their lanes, as vpmaddwd meets int16 pairs:
 * dup16(u8x8_epi32(p)) in a broadcast load and one vpshufb (five operations) */
INLINE __m256i u8x8_dup16(const uint8_t *p) {
    int64_t v;
    memcpy(&v, p, 8);
    const __m256i ctl = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,
                                         4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);
    return _mm256_shuffle_epi8(_mm256_set1_epi64x(v), ctl);
}

/* the Q4KX8 min term of a super-block, sum_j min_j S_j with S_j = bk[2j] + bk[2j + 1] (sub-block j's
 * activation sum, |S_j| <= 32 x 128 < 2^15), for R activation rows; each lane one weight row. Two sub-blocks a
 * vpmaddwd: lane i holds (min_2p, min_2p+1) of row i against the broadcast pair (S_2p, S_2p+1) (a vpmaddwd a
 * sub-block before). Exact integers, the same bits. Zen 2, one thread, in L2, alternated: the narrow tile 1 row
 * 20.3-20.9 -> 27.6-27.8 GB/s, 2 rows 14.8 -> 17.5, the wide tile 4 rows 62.8-63.1 -> 64.3-64.8 GMAC/s */
INLINE void q4x8_min_sums(const int R, const uint8_t *blk, const int16_t *bk, int64_t k, int64_t b, __m256i *msum) {
    const __m256i pairs = _mm256_setr_epi8(0, -1, 8, -1, 1, -1, 9, -1, 2, -1, 10, -1, 3, -1, 11, -1,
                                           4, -1, 12, -1, 5, -1, 13, -1, 6, -1, 14, -1, 7, -1, 15, -1);
    __m256i mn[4];  /* sub-blocks 2p, 2p + 1: their 16 min bytes in both halves, row i's two as lane i's int16s */
    for (int p = 0; p < 4; p++)
        mn[p] = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 96 + 16 * p))), pairs);
    for (int r = 0; r < R; r++) {
        const __m256i s = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(bk + r * (k / 16) + 16 * b)),
                                            _mm256_set1_epi16(1));  /* S_0 .. S_7 */
        int32_t sp[8];  /* (S_0, S_1), (S_2, S_3), .., (S_4, S_5), (S_6, S_7), .. as int16 pairs */
        _mm256_storeu_si256((__m256i *)sp, _mm256_packs_epi32(s, s));
        __m256i m = _mm256_madd_epi16(mn[0], _mm256_set1_epi32(sp[0]));
        m = madd_acc(m, mn[1], _mm256_set1_epi32(sp[1]));
        m = madd_acc(m, mn[2], _mm256_set1_epi32(sp[4]));
        msum[r] = madd_acc(m, mn[3], _mm256_set1_epi32(sp[5]));
    }
}

/* a Q4KX8 super-block's float epilogue: the same fused steps, in the same order, on every path */
INLINE __m256 q4x8_epilogue(const uint8_t *blk, __m256i sumi, __m256i msum, float dx, __m256 acc) {
    const __m256 vd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
    const __m256 vm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16)));
    const __m256 t = _mm256_fmsub_ps(vd, _mm256_cvtepi32_ps(sumi), _mm256_mul_ps(vm, _mm256_cvtepi32_ps(msum)));
    return _mm256_fmadd_ps(_mm256_set1_ps(dx), t, acc);
}

#if defined(SD_AVX512) && defined(__AVX512VL__)
/* w with 16 added to every byte where h's byte has the bit set in mask's (a fifth bit: Q5_K's qh, Q5_0's and
 * Q5_1's H; any bit, no shifts; qkernels_x16.h's tiles too). In the 16-row 32-value tile, against a shift and a
 * vpternlogd a step: Zen 4, one core, L1 (scripts/tile_rate.c, three runs) Q5_0 1 row 70-71 -> 76 GMAC/s, 2 rows
 * 114-118 -> 113-114, 8 rows even */
INLINE __m512i fifth_zmm(__m512i w, __m512i h, __m512i mask) {
    return _mm512_mask_add_epi8(w, _mm512_test_epi8_mask(h, mask), w, _mm512_set1_epi8(0x10));
}

/* R activation rows against one Q4KX8 group, AVX-512 VNNI: a zmm holds two steps (4 values of 8 rows
 * each), one vpdpbusd sums them into int32 against the two steps' activations (vpermd spreads a
 * row's 8 bytes over the halves), and a sub-block's sums meet its 8 scales in one vpmulld; the
 * halves are added at the end of a super-block (exact integers: the AVX2 and portable bits) */
INLINE void x8_q45k(const int R, const int FIVE, const uint8_t *grp, int64_t k, const int8_t *xk, const float *dk,
                    const int16_t *bk, float *out, int64_t os) {
    const int64_t nsb = k / QK;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i spread[4] = {  /* step pair tt: lanes 0..7 <- x dword 2 tt, lanes 8..15 <- 2 tt + 1 */
        _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
        _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2),
        _mm512_set_epi32(5, 5, 5, 5, 5, 5, 5, 5, 4, 4, 4, 4, 4, 4, 4, 4),
        _mm512_set_epi32(7, 7, 7, 7, 7, 7, 7, 7, 6, 6, 6, 6, 6, 6, 6, 6)};
    __m256 acc[XROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *blk = grp + q45_bytes(X8, FIVE) * b;
        prefetch_ahead(R, blk, q45_bytes(X8, FIVE));
        __m512i sumi[XROWS];
        for (int r = 0; r < R; r++) sumi[r] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            int64_t sc8;
            memcpy(&sc8, blk + 32 + 8 * j, 8);
            const __m512i sc = _mm512_cvtepu8_epi32(_mm_set1_epi64x(sc8));  /* rows 0..7 in both halves */
            const uint8_t *qs = blk + q45_nibbles(X8, FIVE) + 256 * (j / 2);
            __m512i a[XROWS];
            for (int r = 0; r < R; r++) a[r] = _mm512_setzero_si512();
            for (int tt = 0; tt < 4; tt++) {
                const __m512i v = _mm512_loadu_si512((const void *)(qs + 64 * tt));
                __m512i w = _mm512_and_si512((j & 1) ? _mm512_srli_epi16(v, 4) : v, m4);
                if (FIVE)  /* steps 2 tt and 2 tt + 1's qh bytes */
                    w = fifth_zmm(w, _mm512_loadu_si512((const void *)(blk + 160 + 64 * tt)),
                                  _mm512_set1_epi8((char)(1 << j)));
                for (int r = 0; r < R; r++) {
                    const __m256i x = _mm256_loadu_si256((const __m256i *)(xk + r * k + QK * b + 32 * j));
                    a[r] = _mm512_dpbusd_epi32(a[r], w, _mm512_permutexvar_epi32(spread[tt], _mm512_castsi256_si512(x)));
                }
            }
            for (int r = 0; r < R; r++) sumi[r] = _mm512_add_epi32(sumi[r], _mm512_mullo_epi32(a[r], sc));
        }
        __m256i msum[XROWS];
        q4x8_min_sums(R, blk, bk, k, b, msum);
        for (int r = 0; r < R; r++) {
            const __m256i s = _mm256_add_epi32(_mm512_castsi512_si256(sumi[r]), _mm512_extracti64x4_epi64(sumi[r], 1));
            acc[r] = q4x8_epilogue(blk, s, msum[r], dk[r * nsb + b], acc[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(out + r * os, acc[r]);
}
#elif defined(SD_VNNI)
/* R activation rows against one Q4KX8 group (AVX-VNNI): out[r * os + i] for weight rows i < 8; a step's
 * 4 products go straight to int32 (vpdpbusd) and meet the sub-block's scales in one vpmulld */
INLINE void x8_q45k(const int R, const int FIVE, const uint8_t *grp, int64_t k, const int8_t *xk, const float *dk,
                    const int16_t *bk, float *out, int64_t os) {
    const int64_t nsb = k / QK;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[XROWS];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *blk = grp + q45_bytes(X8, FIVE) * b;
        prefetch_ahead(R, blk, q45_bytes(X8, FIVE));
        __m256i sumi[XROWS];
        for (int r = 0; r < R; r++) sumi[r] = _mm256_setzero_si256();
        for (int j = 0; j < 8; j++) {
            const uint8_t *qs = blk + q45_nibbles(X8, FIVE) + 256 * (j / 2);
            __m256i a[XROWS];
            for (int r = 0; r < R; r++) a[r] = _mm256_setzero_si256();
            for (int t = 0; t < 8; t++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * t));
                __m256i w = _mm256_and_si256((j & 1) ? _mm256_srli_epi16(v, 4) : v, m4);
                if (FIVE)
                    w = _mm256_or_si256(w, fifth_bits(_mm256_loadu_si256((const __m256i *)(blk + 160 + 32 * t)), j));
                for (int r = 0; r < R; r++) a[r] = dot4_acc(a[r], w, x4_bcast(xk + r * k + QK * b + 32 * j + 4 * t));
            }
            const __m256i sc = u8x8_epi32(blk + 32 + 8 * j);
            for (int r = 0; r < R; r++) sumi[r] = _mm256_add_epi32(sumi[r], _mm256_mullo_epi32(a[r], sc));
        }
        __m256i msum[XROWS];
        q4x8_min_sums(R, blk, bk, k, b, msum);
        for (int r = 0; r < R; r++) acc[r] = q4x8_epilogue(blk, sumi[r], msum[r], dk[r * nsb + b], acc[r]);
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(out + r * os, acc[r]);
}
#else
/* sub-block j's int16 sums of R activation rows over steps t0 .. t0 + N - 1 (HIGH: its nibbles are the high ones
 * of the pair's loads; FIVE: Q5KX8, its fifth bits in qh): vpmaddubsw's int16 pairs of at most 8 steps of Q4_K
 * (8 x 2 x 15 x 128 < 2^15) or 4 of Q5_K (4 x 2 x 31 x 128) */
INLINE void q4x8_sub_sums(const int R, const int HIGH, const int FIVE, const int N, const uint8_t *qs, const uint8_t *qh,
                          int j, int t0, const int8_t *x, int64_t k, __m256i *a) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int r = 0; r < R; r++) a[r] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int t = t0; t < t0 + N; t++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * t));
        __m256i w = _mm256_and_si256(HIGH ? _mm256_srli_epi16(v, 4) : v, m4);
        if (FIVE) w = _mm256_or_si256(w, fifth_bits(_mm256_loadu_si256((const __m256i *)(qh + 32 * t)), j));
        for (int r = 0; r < R; r++) a[r] = _mm256_add_epi16(a[r], _mm256_maddubs_epi16(w, x4_bcast(x + r * k + 4 * t)));
    }
}

/* 5-8 activation rows (1-4: x8_q4k_narrow) against one Q4KX8 group, AVX2 without VNNI: the 16 ymm registers
 * hold the rows' int16 sums, a step's weights and an activation, while each row's int32 sums and float
 * accumulators stay on the stack (touched once a sub-block and once a super-block), so the hot loop neither
 * spills nor branches (a sub-block's nibble half is a constant). Zen 2, two threads, 127 MB out of cache
 * (scripts/kernel_stream.py, alternated with the 4-row tiles whose 2 x R sums lived in registers): 6 rows
 * 124-125 -> 140-142 GMAC/s, 8 rows 127-128 -> 143-144, 3-4 rows equal. The same integers and epilogue */
INLINE void x8_q45k(const int R, const int FIVE, const uint8_t *grp, int64_t k, const int8_t *xk, const float *dk,
                    const int16_t *bk, float *out, int64_t os) {
    const int64_t nsb = k / QK;
    const int N = FIVE ? 4 : 8;  /* steps a set of int16 sums holds (q4x8_sub_sums) */
    __m256i msum[XROWS];
    int32_t sumi[XROWS][8] __attribute__((aligned(32)));
    float acc[XROWS][8] __attribute__((aligned(32)));
    for (int r = 0; r < R; r++) _mm256_store_ps(acc[r], _mm256_setzero_ps());
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *blk = grp + q45_bytes(X8, FIVE) * b;
        prefetch_ahead(R, blk, q45_bytes(X8, FIVE));
        for (int r = 0; r < R; r++) _mm256_store_si256((__m256i *)sumi[r], _mm256_setzero_si256());
        for (int j = 0; j < 8; j++) {
            const uint8_t *qs = blk + q45_nibbles(X8, FIVE) + 256 * (j / 2);
            for (int t0 = 0; t0 < 8; t0 += N) {
                __m256i a[XROWS];
                if (j & 1) q4x8_sub_sums(R, 1, FIVE, N, qs, blk + 160, j, t0, xk + QK * b + 32 * j, k, a);
                else q4x8_sub_sums(R, 0, FIVE, N, qs, blk + 160, j, t0, xk + QK * b + 32 * j, k, a);
                const __m256i sc = u8x8_dup16(blk + 32 + 8 * j);  /* after the steps: no register held through them */
                for (int r = 0; r < R; r++)
                    _mm256_store_si256((__m256i *)sumi[r], _mm256_add_epi32(_mm256_load_si256((const __m256i *)sumi[r]),
                                                                             _mm256_madd_epi16(a[r], sc)));
            }
        }
        q4x8_min_sums(R, blk, bk, k, b, msum);
        for (int r = 0; r < R; r++)
            _mm256_store_ps(acc[r], q4x8_epilogue(blk, _mm256_load_si256((const __m256i *)sumi[r]), msum[r],
                                                  dk[r * nsb + b], _mm256_load_ps(acc[r])));
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(out + r * os, _mm256_load_ps(acc[r]));
}
#endif

#if !defined(SD_VNNI)
/* 1-4 activation rows against one Q4KX8 group, AVX2 without VNNI. Few rows share the unpacking, so its
 * overhead decides: the two sub-blocks of a pair share each 32-byte load (low and high nibbles), and
 * the sums stay one chain each. The same exact integers as x8_q4k (int16 sums of 8 steps,
 * then int32), the same epilogue: the same bits. Measured on Zen 2 (one thread, weights in L2): 1 row
 * 21.9 -> 29.4-31.0 GB/s, 2 rows 16.1 -> 20.3. In whole 1-token passes, alternated in one process, -1% to
 * -7% (the weights stream from memory there). 3-4 rows (against x8_q4k; two threads, 255 MB out of cache,
 * alternated): 3 rows 104-106 -> 107 GMAC/s, 4 rows 124-125 -> 130; the 1.5B's 3- and 4-token passes
 * 54.7-55.1 -> 53.1 ms and 63.4-64.7 -> 62.8 at like read floors. */
#define NARROW_ROWS 4
INLINE void x8_q45k_narrow_span(const int R, const int FIVE, const uint8_t *grp, int64_t k, const int8_t *xk,
                                const float *dk, const int16_t *bk, float *out, int64_t os, int64_t b0, int64_t b1,
                                int pf) {
    const int64_t nsb = k / QK;
    const int N = FIVE ? 4 : 8;  /* steps a set of int16 sums holds (q4x8_sub_sums) */
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[NARROW_ROWS];
    for (int r = 0; r < R; r++) acc[r] = b0 ? _mm256_loadu_ps(out + r * os) : _mm256_setzero_ps();
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *blk = grp + q45_bytes(X8, FIVE) * b;
        if (pf) prefetch_ahead(R, blk, q45_bytes(X8, FIVE));
        __m256i sumi[NARROW_ROWS], msum[NARROW_ROWS];
        for (int r = 0; r < R; r++) sumi[r] = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {  /* sub-blocks 2p (low nibbles) and 2p + 1 (high) */
          const uint8_t *qs = blk + q45_nibbles(X8, FIVE) + 256 * p;
          for (int t0 = 0; t0 < 8; t0 += N) {
            __m256i a0[NARROW_ROWS], a1[NARROW_ROWS];
            for (int r = 0; r < R; r++) a0[r] = a1[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int t = t0; t < t0 + N; t++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * t));
                __m256i w0 = _mm256_and_si256(v, m4), w1 = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if (FIVE) {
                    const __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 160 + 32 * t));
                    w0 = _mm256_or_si256(w0, fifth_bits(h, 2 * p));
                    w1 = _mm256_or_si256(w1, fifth_bits(h, 2 * p + 1));
                }
                for (int r = 0; r < R; r++) {
                    const int8_t *x = xk + r * k + QK * b + 64 * p + 4 * t;
                    a0[r] = _mm256_add_epi16(a0[r], _mm256_maddubs_epi16(w0, x4_bcast(x)));
                    a1[r] = _mm256_add_epi16(a1[r], _mm256_maddubs_epi16(w1, x4_bcast(x + 32)));
                    /* keep each sum one chain: GCC regroups the adds into trees whose products spill */
                    __asm__("" : "+x"(a0[r]), "+x"(a1[r]));
                }
            }
            const __m256i sc0 = u8x8_dup16(blk + 32 + 16 * p), sc1 = u8x8_dup16(blk + 40 + 16 * p);
            for (int r = 0; r < R; r++)
                sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(_mm256_madd_epi16(a0[r], sc0),
                                                                     _mm256_madd_epi16(a1[r], sc1)));
          }
        }
        q4x8_min_sums(R, blk, bk, k, b, msum);
        for (int r = 0; r < R; r++) acc[r] = q4x8_epilogue(blk, sumi[r], msum[r], dk[r * nsb + b], acc[r]);
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(out + r * os, acc[r]);
}
INLINE void x8_q45k_narrow(const int R, const int FIVE, const uint8_t *grp, int64_t k, const int8_t *xk,
                           const float *dk, const int16_t *bk, float *out, int64_t os) {
    x8_q45k_narrow_span(R, FIVE, grp, k, xk, dk, bk, out, os, 0, k / QK, 1);
}
#endif

/* the scales of 16-value group g of 8 rows, each in both 16-bit halves of its lane */
INLINE __m256i q6x8_scales(const uint8_t *blk, int g) {
    return dup16(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 16 + 8 * g))));
}

/* chunk cc's 6-bit weights of a step's B0, B1, B2 at p: Bcc's bits 0..5, or for chunk 3 the three
 * bits 6..7 fields gathered by 16-bit shifts (the 0xC0 masks leave nothing to carry into a byte's
 * 0..5); a step's four chunks take 11 operations (17 with 4-bit halves and a byte of high bits) */
INLINE __m256i q6x8_chunk(const uint8_t *p, int cc) {
    const __m256i m3f = _mm256_set1_epi8(0x3F), mc0 = _mm256_set1_epi8((char)0xC0);
    if (cc < 3) return _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(p + 32 * cc)), m3f);
    __m256i v = _mm256_srli_epi16(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)p), mc0), 2);
    v = _mm256_srli_epi16(_mm256_or_si256(v, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(p + 32)), mc0)), 2);
    return _mm256_srli_epi16(_mm256_or_si256(v, _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(p + 64)), mc0)), 2);
}

/* the Q6KX8 offset and float epilogue of a super-block: values are q - 32, so take 32 x sum_g scale_g x
 * bk_g back; then the same fused float steps on every path */
INLINE __m256 q6x8_epilogue(const uint8_t *blk, __m256i sumi, const int16_t *bk, float dx, __m256 acc) {
    for (int gp = 0; gp < 8; gp++) {
        const __m128i pair = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(blk + 16 + 16 * gp)),
                                               _mm_loadl_epi64((const __m128i *)(blk + 24 + 16 * gp)));
        const __m256i sc2 = _mm256_cvtepi8_epi16(pair);  /* row i: (scale 2gp, scale 2gp + 1) */
        const __m256i off = _mm256_madd_epi16(sc2, x4_bcast((const int8_t *)(bk + 2 * gp)));
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(off, 5));
    }
    const __m256 vd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
    return _mm256_fmadd_ps(_mm256_set1_ps(dx), _mm256_mul_ps(vd, _mm256_cvtepi32_ps(sumi)), acc);
}

/* R activation rows against one Q6KX8 group (AVX2, and AVX-512 builds for the odd 8-row groups the 16-row
 * layout leaves). A quad of chunks c0 .. c0 + 3 and half of its steps meet one scale group per chunk;
 * vpmaddubsw's int16 pairs of two steps (2 x 2 x 63 x 128 < 2^15) meet it in one vpmaddwd. The loops unroll
 * (constant offsets: the quad loop's address arithmetic cost as much as the unpacking). Zen 2, one thread,
 * in L2, against 4-bit halves and a byte of high bits, a vpmaddwd a step and rolled loops: 1 row 26.5 ->
 * 32.0 GMAC/s, 2 rows 32.3 -> 40.3, 4 rows 37.3 -> 45 (two threads out of cache, 1 row 16.5 -> 18.2-19.6 GB/s).
 * (A ymm vpdpbusd variant over the older layout measured 3-7% slower at 1 and 8 rows on Sapphire Rapids:
 * the 6-bit unpacking, not the products, bounds it.) Exact integers: the same bits on every path.
 * At 1-5 rows GCC unrolls a quad whole and regrouped each row's sums into a tree of all its vpmaddwd results,
 * spilling most of them (148 stores a super-block at 4 rows); one chain a row keeps them in registers. Zen 2,
 * two threads, kernel_stream.py in cache 2/3/5 rows 75/81-82/88 -> 81-82/94-95/95 GMAC/s (6-8 rows lose:
 * 106 -> 99), out of cache, alternated three times, 2 rows 61-63 -> 64-67, 5 rows 82-83 -> 87-90, 1/3/4 rows
 * within 2%. */
/* quad Q of a super-block (chunks 4Q .. 4Q + 3, 768 bytes) into R rows' int32 sums */
INLINE void q6x8_quad(const int R, const int Q, const uint8_t *blk, const int8_t *xk, int64_t k, int64_t b,
                      __m256i *sumi) {
#pragma GCC unroll 2
    for (int half = 0; half < 2; half++) {  /* steps 4 half .. + 3 meet one scale group per chunk */
        const int c0 = 4 * Q;
        const uint8_t *quad = blk + 144 + 768 * Q;
        __m256i sc[4];
        for (int cc = 0; cc < 4; cc++) sc[cc] = q6x8_scales(blk, 2 * (c0 + cc) + half);
#pragma GCC unroll 2
        for (int t = 4 * half; t < 4 * half + 4; t += 2) {  /* steps t and t + 1 summed in int16 first */
            const uint8_t *base = quad + 96 * t;
            for (int cc = 0; cc < 4; cc++) {
                const __m256i w0 = q6x8_chunk(base, cc), w1 = q6x8_chunk(base + 96, cc);
                for (int r = 0; r < R; r++) {
                    const int8_t *x = xk + r * k + QK * b + 32 * (c0 + cc) + 4 * t;
                    const __m256i a = _mm256_add_epi16(_mm256_maddubs_epi16(w0, x4_bcast(x)),
                                                       _mm256_maddubs_epi16(w1, x4_bcast(x + 4)));
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(a, sc[cc]));
                    if (R <= 5) __asm__("" : "+x"(sumi[r]));  /* one chain a row (above) */
                }
            }
        }
    }
}

/* quads h0 .. h1 (two a super-block) of one group: a span that ends inside a super-block leaves its int32 sums
 * in carry [R, 8] and its float sums in out, where the next span takes them up (the same bits as one call) */
INLINE void x8_q6k_span(const int R, const uint8_t *grp, int64_t k, const int8_t *xk, const float *dk,
                        const int16_t *bk, float *out, int64_t os, int64_t h0, int64_t h1, int pf, int32_t *carry) {
    const int64_t nsb = k / QK;
    __m256 acc[XROWS];
    for (int r = 0; r < R; r++) acc[r] = h0 ? _mm256_loadu_ps(out + r * os) : _mm256_setzero_ps();
    for (int64_t b = h0 / 2; 2 * b < h1; b++) {
        const uint8_t *blk = grp + Q6KX8_BYTES * b;
        if (pf) prefetch_ahead(R, blk, Q6KX8_BYTES);
        __m256i sumi[XROWS];
        for (int r = 0; r < R; r++)
            sumi[r] = 2 * b < h0 ? _mm256_loadu_si256((const __m256i *)(carry + 8 * r)) : _mm256_setzero_si256();
        if (2 * b >= h0) q6x8_quad(R, 0, blk, xk, k, b, sumi);
        if (!carry || 2 * b + 1 < h1) {  /* a whole group (carry NULL) ends every super-block */
            q6x8_quad(R, 1, blk, xk, k, b, sumi);
            for (int r = 0; r < R; r++)
                acc[r] = q6x8_epilogue(blk, sumi[r], bk + r * (k / 16) + 16 * b, dk[r * nsb + b], acc[r]);
        } else {
            for (int r = 0; r < R; r++) _mm256_storeu_si256((__m256i *)(carry + 8 * r), sumi[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(out + r * os, acc[r]);
}
INLINE void x8_q6k(const int R, const uint8_t *grp, int64_t k, const int8_t *xk, const float *dk, const int16_t *bk,
                   float *out, int64_t os) {
    x8_q6k_span(R, grp, k, xk, dk, bk, out, os, 0, 2 * (k / QK), 1, NULL);
}
/* R activation rows against one group of a 32-value interleaved layout (Q80X8, Q50X8, Q40X8, Q41X8, Q51X8):
 * per block the 8 steps' weights are unpacked once; each activation row's products are summed in int32
 * (vpdpbusd; or vpmaddubsw's int16 pairs, 4 steps of 2 x 31 x 127 < 2^15, then vpmaddwd), then
 * acc += (d dx) sum and, for an offset or a min, macc += m bs32; out = acc + macc */
/* blocks b0 .. b1 of the group; a span that does not end the row keeps its sums in out (acc) and mcarry
 * [R, 8] (macc), where the next span takes them up: the same float steps, the same bits */
INLINE void x8_b32_span(const int R, const int FMT, const uint8_t *grp, int64_t k, const int8_t *xq,
                        const float *dx8, const float *bs32, float *out, int64_t os, int64_t b0, int64_t b1, int pf,
                        float *mcarry) {
    const int64_t nb = k / 32;
    const int bytes = bx8_bytes(FMT), nib = bx8_nibbles(FMT);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[XROWS], macc[XROWS];
    for (int r = 0; r < R; r++) {
        acc[r] = b0 ? _mm256_loadu_ps(out + r * os) : _mm256_setzero_ps();
        macc[r] = b0 ? _mm256_loadu_ps(mcarry + 8 * r) : _mm256_setzero_ps();
    }
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *blk = grp + (int64_t)bytes * b;
        if (pf) prefetch_ahead(R, blk, bytes);
        __m256i w[8], wa[8];  /* step t's weights (Q8_0: signed, and their magnitudes wa) */
        if (FMT == FMT_Q80X8) {
            for (int t = 0; t < 8; t++) {
                w[t] = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * t));
                wa[t] = _mm256_abs_epi8(w[t]);
            }
        } else {
            for (int p = 0; p < 4; p++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(blk + nib + 32 * p));
                w[p] = _mm256_and_si256(v, m4);
                w[p + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            }
            if (bx8_fifths(FMT)) {
                const __m256i h = _mm256_loadu_si256((const __m256i *)(blk + bx8_fifths(FMT)));
                for (int t = 0; t < 8; t++) w[t] = _mm256_or_si256(w[t], fifth_bits(h, t));
            }
        }
        const __m256 vd = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
        const __m256 vm = bx8_min(FMT) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16)))
                        : _mm256_mul_ps(vd, _mm256_set1_ps(bx8_offset(FMT)));
        for (int r = 0; r < R; r++) {
            const int8_t *x = xq + r * k + 32 * b;
            __m256i dot = _mm256_setzero_si256();
#if defined(SD_VNNI)
            /* independent sums of 2 or 4 steps (exact, so the same bits): one chain of 8 vpdpbusd bound a
             * 1-row pass by its latency (Q5_0 streamed at half the read floor on Zen 4) */
            const int NA = R == 1 ? 4 : 2;
            __m256i part[4];
            for (int a = 0; a < NA; a++) part[a] = _mm256_setzero_si256();
            for (int t = 0; t < 8; t++) {
                const __m256i xv = x4_bcast(x + 4 * t);
                part[t % NA] = FMT == FMT_Q80X8 ? dot4_acc(part[t % NA], wa[t], _mm256_sign_epi8(xv, w[t]))
                                                : dot4_acc(part[t % NA], w[t], xv);
            }
            for (int a = 0; a < NA; a++) dot = _mm256_add_epi32(dot, part[a]);
#else
            const __m256i ones = _mm256_set1_epi16(1);
            if (FMT == FMT_Q80X8) {  /* 2 x 128 x 127 fills int16: each step to int32 */
                for (int t = 0; t < 8; t++) {
                    const __m256i xv = x4_bcast(x + 4 * t);
                    dot = _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(wa[t], _mm256_sign_epi8(xv, w[t])), ones));
                }
            } else {
                for (int half = 0; half < 2; half++) {
                    __m256i a = _mm256_setzero_si256();
                    for (int t = 4 * half; t < 4 * half + 4; t++) a = _mm256_add_epi16(a, _mm256_maddubs_epi16(w[t], x4_bcast(x + 4 * t)));
                    dot = _mm256_add_epi32(dot, _mm256_madd_epi16(a, ones));
                }
            }
#endif
            const __m256 scale = _mm256_mul_ps(vd, _mm256_set1_ps(dx8[r * (k / 4) + 8 * b]));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r]);
            if (FMT != FMT_Q80X8) macc[r] = _mm256_fmadd_ps(vm, _mm256_set1_ps(bs32[r * nb + b]), macc[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        if (b1 == nb) {
            _mm256_storeu_ps(out + r * os, FMT == FMT_Q80X8 ? acc[r] : _mm256_add_ps(acc[r], macc[r]));
        } else {
            _mm256_storeu_ps(out + r * os, acc[r]);
            _mm256_storeu_ps(mcarry + 8 * r, macc[r]);
        }
    }
}
INLINE void x8_b32(const int R, const int FMT, const uint8_t *grp, int64_t k, const int8_t *xq, const float *dx8,
                   const float *bs32, float *out, int64_t os) {
    x8_b32_span(R, FMT, grp, k, xq, dx8, bs32, out, os, 0, k / 32, 1, NULL);
}
#else  /* portable C: the same integers and the same fused float steps (fmaf), row by row */
#define XROWS 4
INLINE void x8_q45k(const int R, const int FIVE, const uint8_t *grp, int64_t k, const int8_t *xk, const float *dk,
                    const int16_t *bk, float *out, int64_t os) {
    const int64_t nsb = k / QK;
    for (int r = 0; r < R; r++)
        for (int i = 0; i < X8; i++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nsb; b++) {
                const uint8_t *blk = grp + q45_bytes(X8, FIVE) * b;
                const int8_t *x = xk + r * k + QK * b;
                const int16_t *sums = bk + r * (k / 16) + 16 * b;
                int32_t sumi = 0, msum = 0;
                for (int j = 0; j < 8; j++) {
                    int32_t dot = 0;
                    for (int l = 0; l < 32; l++)
                        dot += q45_value(X8, FIVE, blk, i, 32 * j + l) * x[32 * j + l];
                    sumi += blk[32 + 8 * j + i] * dot;
                    msum += blk[96 + 8 * j + i] * (sums[2 * j] + sums[2 * j + 1]);
                }
                const float d = f16_to_f32(blk + 2 * i), dmin = f16_to_f32(blk + 16 + 2 * i);
                acc = fmaf(dk[r * nsb + b], fmaf(d, (float)sumi, -(dmin * (float)msum)), acc);
            }
            out[r * os + i] = acc;
        }
}

INLINE void x8_q6k(const int R, const uint8_t *grp, int64_t k, const int8_t *xk, const float *dk, const int16_t *bk,
                   float *out, int64_t os) {
    const int64_t nsb = k / QK;
    for (int r = 0; r < R; r++)
        for (int i = 0; i < X8; i++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nsb; b++) {
                const uint8_t *blk = grp + Q6KX8_BYTES * b;
                const int8_t *x = xk + r * k + QK * b;
                int32_t sumi = 0;
                for (int g = 0; g < 16; g++) {
                    int32_t dot = 0;
                    for (int l = 0; l < 16; l++) dot += q6x8_value(blk, i, 16 * g + l) * x[16 * g + l];
                    sumi += (int8_t)blk[16 + 8 * g + i] * (dot - 32 * bk[r * (k / 16) + 16 * b + g]);
                }
                acc = fmaf(dk[r * nsb + b], f16_to_f32(blk + 2 * i) * (float)sumi, acc);
            }
            out[r * os + i] = acc;
        }
}
INLINE void x8_b32(const int R, const int FMT, const uint8_t *grp, int64_t k, const int8_t *xq, const float *dx8,
                   const float *bs32, float *out, int64_t os) {
    bgroup_product(X8, FMT, R, grp, k, xq, dx8, bs32, out, os);
}
#endif

/* a tile function's switch from its run-time row count R to the kernel's compile-time one; CALL(R)
 * names the kernel and its arguments */
#if XROWS == 8
#define X8WIDE(CALL) case 8: CALL(8); break; case 7: CALL(7); break; case 6: CALL(6); break; case 5: CALL(5); break;
#else
#define X8WIDE(CALL)
#endif
#define X8SWITCH(CALL)                                                                                      \
    switch (R) {                                                                                            \
    X8WIDE(CALL)                                                                                            \
    case 4: CALL(4); break;                                                                                 \
    case 3: CALL(3); break;                                                                                 \
    case 2: CALL(2); break;                                                                                 \
    default: CALL(1); break;                                                                                \
    }
#if defined(SD_AVX2) && !defined(SD_VNNI)
/* 1-4 rows: the narrow tile (R is a constant here, so the choice folds away) */
#define CALL_Q4KX8(R) ((R) <= NARROW_ROWS ? x8_q45k_narrow : x8_q45k)(R, 0, g, k, xk, dk, bk, out, os)
#define CALL_Q5KX8(R) ((R) <= NARROW_ROWS ? x8_q45k_narrow : x8_q45k)(R, 1, g, k, xk, dk, bk, out, os)
#else
#define CALL_Q4KX8(R) x8_q45k(R, 0, g, k, xk, dk, bk, out, os)
#define CALL_Q5KX8(R) x8_q45k(R, 1, g, k, xk, dk, bk, out, os)
#endif
#define CALL_Q6KX8(R) x8_q6k(R, g, k, xk, dk, bk, out, os)
#define CALL_BX8(R) x8_b32(R, FMT, g, k, xq, dx8, bs32, out, os)
static void tiles_q4kx8(int R, const uint8_t *g, int64_t k, const int8_t *xk, const float *dk, const int16_t *bk,
                        float *out, int64_t os) {
    X8SWITCH(CALL_Q4KX8)
}
static void tiles_q5kx8(int R, const uint8_t *g, int64_t k, const int8_t *xk, const float *dk, const int16_t *bk,
                        float *out, int64_t os) {
    X8SWITCH(CALL_Q5KX8)
}
static void tiles_q6kx8(int R, const uint8_t *g, int64_t k, const int8_t *xk, const float *dk, const int16_t *bk,
                        float *out, int64_t os) {
    X8SWITCH(CALL_Q6KX8)
}
/* one function per 32-value layout (8 or 16 rows a group): FMT a constant the inlined kernel CALL folds, SWITCH
 * the row count's switch */
#define B32TILES(NAME, F, SWITCH, CALL)                                                                     \
    static void NAME(int R, const uint8_t *g, int64_t k, const int8_t *xq, const float *dx8, const float *bs32, \
                     float *out, int64_t os) {                                                              \
        const int FMT = F;                                                                                  \
        SWITCH(CALL)                                                                                        \
    }
B32TILES(tiles_q80x8, FMT_Q80X8, X8SWITCH, CALL_BX8)
B32TILES(tiles_q50x8, FMT_Q50X8, X8SWITCH, CALL_BX8)
B32TILES(tiles_q40x8, FMT_Q40X8, X8SWITCH, CALL_BX8)
B32TILES(tiles_q41x8, FMT_Q41X8, X8SWITCH, CALL_BX8)
B32TILES(tiles_q51x8, FMT_Q51X8, X8SWITCH, CALL_BX8)

/* activation rows per tile, by layout (at most XROWS). AVX-512 builds keep Q6_K at 4 rows: the zmm Q6KX8
 * tile that kept two int32 sums a row spilled at 8, and 4-row tiles ran 8 and 16 rows at 97-106 GMAC/s
 * against 86-89 on Zen 4 (scripts/kernel_stream.py; Q4_K's 8-row tile stays faster than two of 4). The
 * ymm tile that replaced it (a sum a row) was not measured at 8 rows on an AVX-512 CPU. */
#ifndef Q6_XROWS
#if defined(SD_AVX512) && defined(__AVX512VL__)
#define Q6_XROWS 4
#else
#define Q6_XROWS XROWS
#endif
#endif
#ifndef Q4_XROWS
#define Q4_XROWS XROWS
#endif
#ifndef B_XROWS
#define B_XROWS XROWS
#endif

/* one interleaved group (weight rows n .. n + 7, at qn: sd_qmatmul's segments place it) against every activation row */
static void x8_group(int fmt, const uint8_t *grp, int64_t k, const int8_t *xq, const float *dx8, const float *bs32,
                     const int8_t *xk, const float *dk, const int16_t *bk, int64_t rows, float *out, int64_t out_stride) {
    const int step = fmt == FMT_Q6KX8 ? Q6_XROWS : fmt == FMT_Q4KX8 || fmt == FMT_Q5KX8 ? Q4_XROWS : B_XROWS;
    for (int64_t r0 = 0; r0 < rows; r0 += step) {
        const int R = rows - r0 < step ? (int)(rows - r0) : step;
        float *o = out + r0 * out_stride;
        const int8_t *x = xq + r0 * k;
        const float *d = dx8 + r0 * (k / 4), *b32 = bs32 + r0 * (k / 32);
        if (fmt == FMT_Q80X8) tiles_q80x8(R, grp, k, x, d, b32, o, out_stride);
        else if (fmt == FMT_Q50X8) tiles_q50x8(R, grp, k, x, d, b32, o, out_stride);
        else if (fmt == FMT_Q40X8) tiles_q40x8(R, grp, k, x, d, b32, o, out_stride);
        else if (fmt == FMT_Q41X8) tiles_q41x8(R, grp, k, x, d, b32, o, out_stride);
        else if (fmt == FMT_Q51X8) tiles_q51x8(R, grp, k, x, d, b32, o, out_stride);
        else if (fmt == FMT_Q4KX8)
            tiles_q4kx8(R, grp, k, xk + r0 * k, dk + r0 * (k / QK), bk + r0 * (k / 16), out + r0 * out_stride, out_stride);
        else if (fmt == FMT_Q5KX8)
            tiles_q5kx8(R, grp, k, xk + r0 * k, dk + r0 * (k / QK), bk + r0 * (k / 16), out + r0 * out_stride, out_stride);
        else
            tiles_q6kx8(R, grp, k, xk + r0 * k, dk + r0 * (k / QK), bk + r0 * (k / 16), out + r0 * out_stride, out_stride);
    }
}

#if defined(SD_AVX2) && !defined(SD_VNNI)
/* A 1-2 row pass reads a chunk's K-quant groups as STREAMS runs, about a KB of each in turn (a Q4_K
 * super-block, half a Q6_K one: 1680-byte turns read as slowly as one run), with no software prefetch: one
 * run a core, even prefetched, left memory idle (the hardware prefetcher keeps few lines in flight for a
 * stream it sees consumed slowly), and four runs keep four streams going. Zen 2, two
 * threads, 255 MB of Q4_K / 361 MB of Q6_K out of cache (scripts/kernel_stream.py, alternated): 1 row
 * 22.6-23.6 -> 31.0-32.7 GB/s / 20.4-20.7 -> 26.3-26.7; the 1.5B's 1-token pass 47.7-48.5 -> 35.9-40.0 ms.
 * The 32-value layouts too, at 1 row (below). Measured worse: 8 runs (22-26 GB/s), two super-blocks a turn
 * (23-24), 3-4 rows (the 4-row pass 64 -> 83 ms: compute-bound there), whole groups in turn (a C loop over
 * plain reads: no gain past ~1 KB a turn; 1664 bytes 38-40 GB/s against 43 at 1152), prefetching runs (Q6_K
 * 1 row 26.5 -> 21 GB/s). Q6_K in half super-blocks: 1 row 25.9-26.4 -> 31.4-32.3 GB/s, 2 rows 20.2 -> 22.5. */
#ifndef STREAMS
#define STREAMS 4
#endif
#ifndef STREAM_TURN
#define STREAM_TURN 1152  /* bytes of a group a run advances a turn, as the nearest whole units of a span */
#endif
#ifndef STREAM_ROWS
#define STREAM_ROWS 2
#endif
#if STREAM_ROWS > 2
#error "x8_streams instantiates 1- and 2-row spans only"
#endif
/* the 32-value layouts at 1 row only: Q5_0 24.3-25.3 -> 27.3-27.6 GB/s, Q8_0 24.2-25.6 -> 30.0-31.7; at 2 rows
 * Q5_0 23.5-24.5 -> 17.9-18.4 and Q8_0 24.7-27.2 -> 24.4-24.6 (its products bound it there, not the reading) */
#define STREAM_B32_ROWS 1
/* units b0 .. b1 of one group (x8_streams' units) against R activation rows, its sums carried in out and
 * carry (the same float steps in the same order as one call over the group) */
INLINE void x8_span(const int fmt, const int R, const uint8_t *grp, int64_t k, const int8_t *xq, const float *dx8,
                    const float *bs32, const int8_t *xk, const float *dk, const int16_t *bk, float *out, int64_t os,
                    int64_t b0, int64_t b1, __m256 *carry) {
    if (fmt == FMT_Q4KX8) x8_q45k_narrow_span(R, 0, grp, k, xk, dk, bk, out, os, b0, b1, 0);
    else if (fmt == FMT_Q5KX8) x8_q45k_narrow_span(R, 1, grp, k, xk, dk, bk, out, os, b0, b1, 0);
    else if (fmt == FMT_Q6KX8) x8_q6k_span(R, grp, k, xk, dk, bk, out, os, b0, b1, 0, (int32_t *)carry);
    else x8_b32_span(R, fmt, grp, k, xq, dx8, bs32, out, os, b0, b1, 0, (float *)carry);
}

/* `groups` consecutive groups of one interleaved layout (q0, gstride bytes apart; outputs from out)
 * against R <= 2 activation rows, read as STREAMS runs advanced about STREAM_TURN bytes at a time in turn */
INLINE void x8_streams_of(const int fmt, const int R, const uint8_t *q0, int64_t gstride, int64_t groups, int64_t k,
                          const int8_t *xq, const float *dx8, const float *bs32, const int8_t *xk, const float *dk,
                          const int16_t *bk, float *out, int64_t os) {
    /* a span's units: Q4_K / Q5_K super-blocks (1184 / 1440 bytes), Q6_K half super-blocks (840), 32-value blocks
     * (144-272) */
    const int64_t nb = fmt == FMT_Q4KX8 || fmt == FMT_Q5KX8 ? k / QK : fmt == FMT_Q6KX8 ? 2 * (k / QK) : k / 32;
    const int unit = fmt == FMT_Q4KX8 || fmt == FMT_Q5KX8 ? q45_bytes(X8, fmt == FMT_Q5KX8)
                   : fmt == FMT_Q6KX8                     ? Q6KX8_BYTES / 2
                                                          : bx8_bytes(fmt);
    const int64_t turn = (STREAM_TURN + unit / 2) / unit;  /* the whole units nearest STREAM_TURN bytes */
    __m256 carry[STREAMS][2];  /* a span's sums left for the next: Q6_K's int32, the 32-value layouts' min sums */
    int64_t first[STREAMS + 1];
    for (int s = 0; s <= STREAMS; s++) first[s] = s * groups / STREAMS;
    for (int64_t i = 0; i < (groups + STREAMS - 1) / STREAMS; i++) {
        const uint8_t *g[STREAMS];
        float *o[STREAMS];
        int live = 0;
        for (int s = 0; s < STREAMS; s++)
            if (first[s] + i < first[s + 1]) {
                g[live] = q0 + (first[s] + i) * gstride;
                o[live++] = out + (first[s] + i) * X8;
            }
        for (int64_t b = 0; b < nb; b += turn)
            for (int s = 0; s < live; s++)
                x8_span(fmt, R, g[s], k, xq, dx8, bs32, xk, dk, bk, o[s], os, b, b + turn < nb ? b + turn : nb,
                        carry[s]);
    }
}
/* x8_streams_of with its layout and row count constants, so each turn's span is inlined into the loop (it was a
 * call a turn: 15 arguments and a switch). Zen 2, two threads (scripts/kernel_stream.py, alternated twice): in
 * cache Q4_K 1 row 41-42 -> 45.5-46 GB/s, Q6_K 2 rows 26.7 -> 31.5; out of cache Q4_K 1 row 29-32 -> 33-34,
 * Q6_K 1 row 30-32 -> 34.3, 2 rows 22.7 -> 26.2, Q5_0 and Q8_0 1 row +5-7% */
#define STREAMS_OF(F, R) x8_streams_of(F, R, q0, gstride, groups, k, xq, dx8, bs32, xk, dk, bk, out, os)
static void x8_streams(int fmt, const uint8_t *q0, int64_t gstride, int64_t groups, int64_t k, const int8_t *xq,
                       const float *dx8, const float *bs32, const int8_t *xk, const float *dk, const int16_t *bk,
                       int R, float *out, int64_t os) {
    switch (fmt) {
    case FMT_Q4KX8: if (R == 1) STREAMS_OF(FMT_Q4KX8, 1); else STREAMS_OF(FMT_Q4KX8, 2); break;
    case FMT_Q5KX8: if (R == 1) STREAMS_OF(FMT_Q5KX8, 1); else STREAMS_OF(FMT_Q5KX8, 2); break;
    case FMT_Q6KX8: if (R == 1) STREAMS_OF(FMT_Q6KX8, 1); else STREAMS_OF(FMT_Q6KX8, 2); break;
    case FMT_Q80X8: STREAMS_OF(FMT_Q80X8, 1); break;  /* 1 row only (STREAM_B32_ROWS) */
    case FMT_Q50X8: STREAMS_OF(FMT_Q50X8, 1); break;
    case FMT_Q40X8: STREAMS_OF(FMT_Q40X8, 1); break;
    case FMT_Q51X8: STREAMS_OF(FMT_Q51X8, 1); break;
    default: STREAMS_OF(FMT_Q41X8, 1); break;
    }
}
#endif

/* row i of a 32-value interleaved group of G = 8 or 16 rows (fmt its X8 layout) as float32 (the embedding look-up;
 * GGUF's dequantization formula; the K-quant groups: qkernels_x16.h's kgroup_dequantize) */
static void bgroup_dequantize(int G, int fmt, const uint8_t *grp, int i, int64_t k, float *o) {
    for (int64_t b = 0; b < k / 32; b++) {  /* d (u - OFF), Q4_1 d u + m, Q8_0 d q */
        const uint8_t *blk = grp + (int64_t)bx_bytes(G, fmt) * b;
        const float d = f16_to_f32(blk + 2 * i);
        for (int l = 0; l < 32; l++) {
            const float v = (float)bx_value(G, fmt, blk, i, l);
            o[32 * b + l] = fmt == FMT_Q80X8 ? d * v : bx8_min(fmt) ? d * v + f16_to_f32(blk + 2 * G + 2 * i)
                          : d * (v + bx8_offset(fmt));
        }
    }
}
