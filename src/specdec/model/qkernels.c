/* Products of GGUF-quantized weight rows with a few activation rows, as integer dot products.
 *
 * Compiled on first use for the CPU at hand (cc -O3 -march=native, see clib.py) and called
 * from the numba layer stack (kernels.qmatmul). Weights keep their blocks' integers and scales
 * (quant.py), in one of six layouts (and two interleaved ones, qkernels_x8.h); a row has K values,
 * K a multiple of 64:
 *
 *   U4M  4-bit q; 32 bytes per two 32-blocks (byte j: block 2p's value j in the low nibble,
 *        block 2p+1's value j in the high one); value = s[b] * q + m[b]  (Q4_0, Q4_1)
 *   U8M  one byte per q (0..31); value = s[b] * q + m[b]               (Q5_0, Q5_1)
 *   I8   one byte per q + 128; value = s[b] * q per 32-block           (Q8_0)
 *   Q4K, Q5K, Q6K  the GGUF super-blocks themselves, byte for byte (144 / 176 / 210 bytes per
 *        256 values: 4.5 / 5.5 / 6.5 bits a weight); s and m are unused
 *
 * Activation rows are quantized per 32-block to int8 (llama.cpp's q8_0 route: d = max|x| / 127),
 * so each block's product is one exact integer dot (vpdpbusd with VNNI, else vpmaddubsw +
 * vpmaddwd) scaled once in float. The +128 of I8 is taken back inside the integer accumulator
 * (it starts at -128 x the activations' 4-byte sums), the min term of U4M/U8M uses each block's
 * sum of quantized x. AVX-512 (VNNI) takes two blocks per instruction, AVX2 one.
 *
 * For the K-quant super-blocks the activations are quantized a second time, per 256 values
 * (llama.cpp's q8_K route, with sums per 16): the 6-bit (Q4_K/Q5_K) or 8-bit (Q6_K) sub-block
 * scales then multiply in the integer domain (vpmaddwd after vpmaddubsw), the mins and Q6_K's
 * -32 offset go through the per-16 sums, and a super-block costs one float FMA per row.
 *
 * Bit-identity: every output element (weight row n, activation row r) is computed by the
 * same instruction sequence whatever the number of rows in the pass and wherever r sits in
 * its 4-row tile (the tile only shares the weight unpacking), so a verify row's logits equal
 * decoding it alone. Built with -ffp-contract=off so that the compiler never fuses float
 * ops differently between the tile sizes.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SD_AVX2 1
#endif
#if defined(SD_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define SD_AVX512 1
#endif
#if defined(SD_AVX2) && (defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)))
#define SD_VNNI 1
#endif

enum { FMT_U4M = 0, FMT_U8M = 1, FMT_I8 = 2, FMT_Q4K = 4, FMT_Q5K = 5, FMT_Q6K = 6 };
enum { QK = 256 };  /* values per K-quant super-block */
/* activation rows per Q4_K/Q5_K tile: AVX-512's 32 registers hold 8 rows' accumulators; KMAX
 * bounds every K-quant tile's arrays (a tile runs with R <= KROWS rows) */
#if defined(SD_AVX512)
#define KROWS 8
#else
#define KROWS 4
#endif
#define KMAX 8

#define INLINE static inline __attribute__((always_inline))

/* -- activations: x [rows, k] -> xq int8 [rows, k]; dx8 [rows, k/4] (each block's scale d =
 * max|x| / 127, 8 times: one per lane of its products); bs32 [rows, k/32] (d x the block's sum of
 * xq: the min term then sees the same x as the integer term, so an offset such as Q4_0's -8 s
 * cancels exactly); nxl [rows, k/4] (-128 x each 4 values' sum of xq, the I8 bias). Where
 * k % 256 == 0 also the q8_K copy for the K-quants: xk int8 [rows, k] (one scale per 256 values),
 * dk [rows, k/256] those scales, bk int16 [rows, k/16] sums of xk per 16 values, and bw int32 [rows, k/64]
 * each 64 values' two 32-value sums as the int16 halves of a word (the 16-row Q4_K tiles' min term). ``need`` says which
 * the matrix reads (bit 0: the 32-value blocks, bit 1: q8_K): a product runs this on one thread while
 * the other waits, and a K-quant model's 8-token pass spent 4% of its time here. -- */

/* the largest |v[i]| of n (a multiple of 8); a NaN is skipped by both paths */
INLINE float abs_max(const float *v, int n) {
#if defined(SD_AVX2)
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) mx = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)), mx);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    return _mm_cvtss_f32(m4);
#else
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = fabsf(v[i]);
        amax = a > amax ? a : amax;
    }
    return amax;
#endif
}

/* q[i] = clamp(round-to-nearest-even(v[i] * id), -127, 127) for n values (a multiple of 16) */
INLINE void quantize_values(const float *v, int n, float id, int8_t *q) {
#if defined(SD_AVX2)
    const __m256 vid = _mm256_set1_ps(id), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    for (int i = 0; i < n; i += 16) {
        __m256 a = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 b = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i + 8), vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        a = _mm256_min_ps(_mm256_max_ps(a, lo), hi);
        b = _mm256_min_ps(_mm256_max_ps(b, lo), hi);
        const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(_mm256_cvtps_epi32(a), _mm256_cvtps_epi32(b)), 0xD8);
        _mm_storeu_si128((__m128i *)(q + i), _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
    }
#else
    for (int i = 0; i < n; i++) {
        float t = nearbyintf(v[i] * id);
        t = t > 127.0f ? 127.0f : (t < -127.0f ? -127.0f : t);
        q[i] = (int8_t)t;
    }
#endif
}

/* one 256-value block of q8_K: its scale and its 16 sums. AVX2 gives the scalar loops' bits: the
 * maximum, the product v * id and round-to-nearest-even are exact or correctly rounded alike */
INLINE void quantize_k_block(const float *v, int8_t *q, float *d, int16_t *sums) {
    const float amax = abs_max(v, QK);
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    *d = amax / 127.0f;
    quantize_values(v, QK, id, q);
    for (int g = 0; g < QK / 16; g++) {
        int32_t sum = 0;
        for (int i = 0; i < 16; i++) sum += q[16 * g + i];
        sums[g] = (int16_t)sum;
    }
}

#define BW_WORDS(k) ((k) / 64)

/* bw's row from bk's (above) */
INLINE void k_sum_words(int64_t k, const int16_t *sums, int32_t *w) {
    for (int64_t p = 0; p < k / 64; p++) {
        const int32_t lo = sums[4 * p] + sums[4 * p + 1], hi = sums[4 * p + 2] + sums[4 * p + 3];
        w[p] = (int32_t)(((uint32_t)(uint16_t)lo) | ((uint32_t)(uint16_t)hi << 16));
    }
}

void sd_prepare(const float *x, int64_t rows, int64_t k, int8_t *xq, float *dx8, float *bs32, int32_t *nxl,
                int8_t *xk, float *dk, int16_t *bk, int32_t *bw, int64_t need) {
    const int64_t nb = k / 32;
    for (int64_t r = 0; r < rows && (need & 1); r++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *v = x + r * k + 32 * b;
            int8_t *q = xq + r * k + 32 * b;
            const float amax = abs_max(v, 32);
            const float d = amax / 127.0f;
            const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
            quantize_values(v, 32, id, q);
            int32_t sum = 0;
            for (int i = 0; i < 8; i++) {
                const int32_t lane = q[4 * i] + q[4 * i + 1] + q[4 * i + 2] + q[4 * i + 3];
                nxl[r * (k / 4) + 8 * b + i] = -128 * lane;
                dx8[r * (k / 4) + 8 * b + i] = d;
                sum += lane;
            }
            bs32[r * nb + b] = d * (float)sum;
        }
    }
    if (k % QK || !(need & 2)) return;  /* no K-quant row has this width, or the matrix has none */
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < k / QK; b++)
            quantize_k_block(x + r * k + QK * b, xk + r * k + QK * b, dk + r * (k / QK) + b, bk + r * (k / 16) + (QK / 16) * b);
        k_sum_words(k, bk + r * (k / 16), bw + r * BW_WORDS(k));
    }
}

#if defined(SD_AVX512)
INLINE float hsum256(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

INLINE float hsum(__m512 v) {
    return hsum256(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

/* sum_i m[i] * bs[i] for i < n, 16 lanes, the tail masked (a masked lane adds an exact 0) */
INLINE float min_dot(const float *m, const float *bs, int64_t n) {
    __m512 a = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(m + i), _mm512_loadu_ps(bs + i), a);
    if (i < n) {
        const __mmask16 mask = (__mmask16)((1u << (n - i)) - 1u);
        a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, m + i), _mm512_maskz_loadu_ps(mask, bs + i), a);
    }
    return hsum(a);
}

/* R activation rows (R <= 4, a compile-time constant after inlining) against one weight row;
 * each step takes two 32-blocks (64 values) */
INLINE void tile(const int R, const int FMT, const uint8_t *q, const float *s, const float *m, int64_t k,
                 const int8_t *xq, const float *dx8, const float *bs32, const int32_t *nxl,
                 float *out, int64_t out_stride) {
    const int64_t np = k / 64;
    const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    const __m512i pair_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    __m512 acc[4];
    for (int j = 0; j < R; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t p = 0; p < np; p++) {
        __m512i w;
        __m512 sv;
        if (FMT == FMT_U4M) {
            const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(q + 32 * p)));
            w = _mm512_and_si512(_mm512_srlv_epi16(v, shift), _mm512_set1_epi8(0x0F));
        } else {
            w = _mm512_loadu_si512((const void *)(q + 64 * p));
        }
        sv = _mm512_permutexvar_ps(pair_idx, _mm512_castps128_ps512(
                 _mm_castpd_ps(_mm_load_sd((const double *)(s + 2 * p)))));
        for (int j = 0; j < R; j++) {
            const __m512i xv = _mm512_loadu_si512((const void *)(xq + j * k + 64 * p));
            const __m512i init = FMT == FMT_I8
                ? _mm512_loadu_si512((const void *)(nxl + j * (k / 4) + 16 * p)) : _mm512_setzero_si512();
            const __m512i dot = _mm512_dpbusd_epi32(init, w, xv);
            const __m512 scale = _mm512_mul_ps(sv, _mm512_loadu_ps(dx8 + j * (k / 4) + 16 * p));
            acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[j]);
        }
    }
    for (int j = 0; j < R; j++) {
        float t = hsum(acc[j]);
        if (FMT == FMT_U4M || FMT == FMT_U8M) t = t + min_dot(m, bs32 + j * (k / 32), k / 32);
        out[j * out_stride] = t;
    }
}
#elif defined(SD_AVX2)
INLINE float hsum(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

INLINE float min_dot(const float *m, const float *bs, int64_t n) {
    __m256 a = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(m + i), _mm256_loadu_ps(bs + i), a);
    if (i < n) {
        const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), lane);
        a = _mm256_fmadd_ps(_mm256_maskload_ps(m + i, mask), _mm256_maskload_ps(bs + i, mask), a);
    }
    return hsum(a);
}

/* the exact integer dot of one 32-block: weights w (u8, or q + 128 for I8), activations xv */
INLINE __m256i block_dot(const int FMT, __m256i w, __m256i xv, const int32_t *nxl) {
    const int is_signed = FMT == FMT_I8;
#if defined(SD_VNNI)
    const __m256i init = is_signed ? _mm256_loadu_si256((const __m256i *)nxl) : _mm256_setzero_si256();
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(init, w, xv);
#else
    return _mm256_dpbusd_avx_epi32(init, w, xv);
#endif
#else  /* vpmaddubsw saturates at 16 bits: take signed weights back and use |w| x sign(x, w) */
    (void)nxl;
    if (is_signed) {
        const __m256i ws = _mm256_xor_si256(w, _mm256_set1_epi8((char)0x80));
        return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(ws), _mm256_sign_epi8(xv, ws)),
                                 _mm256_set1_epi16(1));
    }
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), _mm256_set1_epi16(1));
#endif
}

INLINE void tile(const int R, const int FMT, const uint8_t *q, const float *s, const float *m, int64_t k,
                 const int8_t *xq, const float *dx8, const float *bs32, const int32_t *nxl,
                 float *out, int64_t out_stride) {
    const int64_t nb = k / 32;
    __m256 acc[4];
    for (int j = 0; j < R; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i w;
        __m256 sv;
        if (FMT == FMT_U4M) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(q + 32 * (b / 2)));
            w = _mm256_and_si256((b & 1) ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0F));
        } else {
            w = _mm256_loadu_si256((const __m256i *)(q + 32 * b));
        }
        sv = _mm256_set1_ps(s[b]);
        for (int j = 0; j < R; j++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + j * k + 32 * b));
            const __m256i dot = block_dot(FMT, w, xv, nxl + j * (k / 4) + 8 * b);
            const __m256 scale = _mm256_mul_ps(sv, _mm256_loadu_ps(dx8 + j * (k / 4) + 8 * b));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[j]);
        }
    }
    for (int j = 0; j < R; j++) {
        float t = hsum(acc[j]);
        if (FMT == FMT_U4M || FMT == FMT_U8M) t = t + min_dot(m, bs32 + j * nb, nb);
        out[j * out_stride] = t;
    }
}
#else  /* portable C: the same arithmetic per element, one value at a time */
INLINE int32_t weight_at(const int FMT, const uint8_t *q, int64_t e) {
    const int64_t b = e / 32, j = e % 32;
    if (FMT == FMT_U4M) return (b & 1) ? (q[32 * (b / 2) + j] >> 4) : (q[32 * (b / 2) + j] & 15);
    if (FMT == FMT_U8M) return q[e];
    return (int32_t)q[e] - 128;
}

INLINE void tile(const int R, const int FMT, const uint8_t *q, const float *s, const float *m, int64_t k,
                 const int8_t *xq, const float *dx8, const float *bs32, const int32_t *nxl,
                 float *out, int64_t out_stride) {
    const int64_t nb = k / 32;
    (void)nxl;
    for (int j = 0; j < R; j++) {
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            const int8_t *x = xq + j * k + 32 * b;
            int32_t isum = 0;
            for (int i = 0; i < 32; i++) isum += weight_at(FMT, q, 32 * b + i) * x[i];
            acc = acc + (float)isum * (s[b] * dx8[j * (k / 4) + 8 * b]);
        }
        if (FMT == FMT_U4M || FMT == FMT_U8M)
            for (int64_t b = 0; b < nb; b++) acc = acc + m[b] * bs32[j * nb + b];
        out[j * out_stride] = acc;
    }
}
#endif

/* -- K-quant super-blocks (Q4_K, Q5_K, Q6_K as GGUF stores them) against the q8_K activations --
 * Per super-block and activation row: sumi = sum_j scale_j * dot(q_j, xk_j) in int32 (the mins'
 * or Q6_K's -32 offset through the per-16 sums bk), then one float step acc += (d * dk) * sumi.
 * As for the other layouts, a row's instruction sequence never depends on R or its place in the
 * tile, so its bits equal its product alone. */
INLINE float f16_to_f32(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(SD_AVX2) && defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1F, f = h & 0x3FF;
    uint32_t bits;
    if (e == 0x1F) bits = sign | 0x7F800000u | (f << 13);
    else if (e) bits = sign | ((e + 112) << 23) | (f << 13);
    else if (!f) bits = sign;
    else {  /* subnormal: normalise */
        int shift = 0;
        uint32_t m = f;
        while (!(m & 0x400)) { m <<= 1; shift++; }
        bits = sign | ((uint32_t)(113 - shift) << 23) | ((m & 0x3FF) << 13);
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
#endif
}

/* Q4_K/Q5_K: 12 bytes -> 8 six-bit scales (bytes 0..7) and 8 six-bit mins (bytes 8..15), as
 * llama.cpp's get_scale_min_k4 */
INLINE void k4_scales(const uint8_t *packed, uint8_t out[16]) {
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    uint32_t u[4];
    memcpy(u, packed, 12);
    u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
    const uint32_t a = u[1] & kmask1;
    u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
    u[2] = a;
    u[0] &= kmask1;
    memcpy(out, u, 16);
}

/* value e (0..255) of a super-block, unsigned (Q6_K's before its -32); *group: its scale's index */
INLINE int32_t k_weight(const int FMT, const uint8_t *blk, int e, int *group) {
    if (FMT == FMT_Q6K) {  /* e in 0..255 */
        const int n = e / 128, l = e % 32, quarter = (e % 128) / 32;
        const uint8_t lo = blk[64 * n + l + (quarter & 1) * 32];
        const int low = (quarter < 2) ? (lo & 15) : (lo >> 4);
        const int high = (blk[128 + 32 * n + l] >> (2 * quarter)) & 3;
        *group = e / 16;
        return low | (high << 4);
    }
    const int j = e / 32, l = e % 32;
    const uint8_t *qs = blk + (FMT == FMT_Q5K ? 48 : 16);
    int v = (j & 1) ? (qs[32 * (j / 2) + l] >> 4) : (qs[32 * (j / 2) + l] & 15);
    if (FMT == FMT_Q5K) v |= ((blk[16 + l] >> j) & 1) << 4;
    *group = j;
    return v;
}

#if defined(SD_AVX2)
INLINE float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* acc + the pairwise products of a and b (int16 -> int32): one vpdpwssd with VNNI; exact either way */
INLINE __m256i madd_acc(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
    return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

/* Q4_K/Q5_K: each of 8 mins twice, one per 16-sum of its sub-block */
INLINE __m256i k45_mins(const uint8_t sm[16]) {
    const __m128i m = _mm_loadl_epi64((const __m128i *)(sm + 8));
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m));
}

/* Q4_K/Q5_K, one super-block of one row: acc + (d x sumi - dmin x mins . sums) x dx, one FMA into acc */
INLINE __m256 k45_step(__m256 acc, __m256i sumi, __m256i mins, const int16_t *sums, __m256 vd, __m256 vm,
                       const float *dx) {
    const __m256i msum = _mm256_madd_epi16(mins, _mm256_loadu_si256((const __m256i *)sums));
    const __m256 t = _mm256_fmsub_ps(vd, _mm256_cvtepi32_ps(sumi), _mm256_mul_ps(vm, _mm256_cvtepi32_ps(msum)));
    return _mm256_fmadd_ps(_mm256_broadcast_ss(dx), t, acc);
}

/* R activation rows against one weight row of Q4_K (HIGH = 0) or Q5_K (HIGH = 1) super-blocks */
INLINE void ktile45(const int R, const int HIGH, const uint8_t *q, int64_t k, const int8_t *xk, const float *dk,
                    const int16_t *bk, float *out, int64_t out_stride) {
    const int64_t nsb = k / QK, size = HIGH ? 176 : 144;
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    __m256 acc[KMAX];
    for (int j = 0; j < R; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *blk = q + size * b;
        const float d = f16_to_f32(blk), dmin = f16_to_f32(blk + 2);
        uint8_t sm[16];
        k4_scales(blk + 4, sm);
        const __m256i sm16 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)sm));
        const __m256i scales = _mm256_permute2x128_si256(sm16, sm16, 0x00);  /* scales 0..7 in both halves */
        const __m256i mins = k45_mins(sm);
        const uint8_t *qs = blk + (HIGH ? 48 : 16);
        const __m256i hbits = HIGH ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
        __m256i sumi[KMAX];
        for (int r = 0; r < R; r++) sumi[r] = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {  /* sub-blocks 2p (low nibbles) and 2p + 1 (high) */
            const __m256i scale_l = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)((4 * p + 1) << 8 | 4 * p)));
            const __m256i scale_h = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)((4 * p + 3) << 8 | (4 * p + 2))));
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
            __m256i wl = _mm256_and_si256(bits, m4), wh = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            if (HIGH) {
                wl = _mm256_or_si256(wl, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * p), one), 4));
                wh = _mm256_or_si256(wh, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * p + 1), one), 4));
            }
            for (int r = 0; r < R; r++) {
                const int8_t *x = xk + r * k + QK * b + 64 * p;
                sumi[r] = madd_acc(sumi[r], scale_l, _mm256_maddubs_epi16(wl, _mm256_loadu_si256((const __m256i *)x)));
                sumi[r] = madd_acc(sumi[r], scale_h, _mm256_maddubs_epi16(wh, _mm256_loadu_si256((const __m256i *)(x + 32))));
            }
        }
        const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(dmin);
        for (int r = 0; r < R; r++)
            acc[r] = k45_step(acc[r], sumi[r], mins, bk + r * (k / 16) + 16 * b, vd, vm, dk + r * nsb + b);
    }
    for (int r = 0; r < R; r++) out[r * out_stride] = hsum8(acc[r]);
}

/* R activation rows against one weight row of Q6_K super-blocks: ql 128, qh 64, scales 16, d */
INLINE void ktile6(const int R, const uint8_t *q, int64_t k, const int8_t *xk, const float *dk, const int16_t *bk,
                   float *out, int64_t out_stride) {
    const int64_t nsb = k / QK;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    __m256 acc[KMAX];
    for (int j = 0; j < R; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *blk = q + 210 * b;
        const __m256 vd = _mm256_set1_ps(f16_to_f32(blk + 208));
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)(blk + 192));
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        __m256i sumi[KMAX];
        for (int r = 0; r < R; r++) sumi[r] = _mm256_setzero_si256();
        for (int n = 0; n < 2; n++) {  /* halves of 128 values: sub-blocks 4n .. 4n + 3 */
            const __m256i b1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * n));
            const __m256i b2 = _mm256_loadu_si256((const __m256i *)(blk + 64 * n + 32));
            const __m256i bh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
            __m256i w[4], s[4];
            w[0] = _mm256_or_si256(_mm256_and_si256(b1, m4), _mm256_slli_epi16(_mm256_and_si256(bh, m2), 4));
            w[1] = _mm256_or_si256(_mm256_and_si256(b2, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 2), m2), 4));
            w[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 4), m2), 4));
            w[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(bh, 6), m2), 4));
            for (int i = 0; i < 4; i++) {  /* scales of 16 values: 8n + 2i (lanes 0..7), 8n + 2i + 1 */
                const int g = 8 * n + 2 * i;
                s[i] = _mm256_set_m128i(_mm_set1_epi16((short)(int8_t)blk[192 + g + 1]),
                                        _mm_set1_epi16((short)(int8_t)blk[192 + g]));
            }
            for (int r = 0; r < R; r++) {
                const int8_t *x = xk + r * k + QK * b + 128 * n;
                for (int i = 0; i < 4; i++)
                    sumi[r] = madd_acc(sumi[r], s[i], _mm256_maddubs_epi16(w[i], _mm256_loadu_si256((const __m256i *)(x + 32 * i))));
            }
        }
        for (int r = 0; r < R; r++) {  /* values are q - 32: take 32 x sum_g scale_g x bk_g back */
            const __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)(bk + r * (k / 16) + 16 * b)));
            const __m256i total = _mm256_sub_epi32(sumi[r], _mm256_slli_epi32(off, 5));
            acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(dk + r * nsb + b), _mm256_mul_ps(vd, _mm256_cvtepi32_ps(total)), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r * out_stride] = hsum8(acc[r]);
}
#else  /* portable C: the same integers, one value at a time */
INLINE void ktile(const int R, const int FMT, const uint8_t *q, int64_t k, const int8_t *xk, const float *dk,
                  const int16_t *bk, float *out, int64_t out_stride) {
    const int64_t nsb = k / QK, size = FMT == FMT_Q4K ? 144 : (FMT == FMT_Q5K ? 176 : 210);
    for (int r = 0; r < R; r++) {
        float acc = 0.0f, accm = 0.0f;
        for (int64_t b = 0; b < nsb; b++) {
            const uint8_t *blk = q + size * b;
            const int8_t *x = xk + r * k + QK * b;
            const int16_t *sums = bk + r * (k / 16) + 16 * b;
            int32_t sumi = 0, msum = 0;
            if (FMT == FMT_Q6K) {
                for (int e = 0; e < QK; e++) {
                    int g;
                    const int32_t w = k_weight(FMT, blk, e, &g);
                    sumi += (int8_t)blk[192 + g] * w * x[e];
                }
                for (int g = 0; g < 16; g++) sumi -= 32 * (int8_t)blk[192 + g] * sums[g];
                acc = acc + (float)sumi * (f16_to_f32(blk + 208) * dk[r * nsb + b]);
            } else {
                uint8_t sm[16];
                k4_scales(blk + 4, sm);
                for (int e = 0; e < QK; e++) {
                    int j;
                    const int32_t w = k_weight(FMT, blk, e, &j);
                    sumi += sm[j] * w * x[e];
                }
                for (int g = 0; g < 16; g++) msum += sm[8 + g / 2] * sums[g];
                acc = acc + (float)sumi * (f16_to_f32(blk) * dk[r * nsb + b]);
                accm = accm + (float)msum * (f16_to_f32(blk + 2) * dk[r * nsb + b]);
            }
        }
        out[r * out_stride] = acc - accm;
    }
}
#define ktile45(R, HIGH, ...) ktile(R, (HIGH) ? FMT_Q5K : FMT_Q4K, __VA_ARGS__)
#define ktile6(R, ...) ktile(R, FMT_Q6K, __VA_ARGS__)
#endif

#if defined(SD_AVX512)
/* AVX-512: two sub-blocks (64 values) per instruction; the same integers as the AVX2 route */
INLINE void ktile45_512(const int R, const int HIGH, const uint8_t *q, int64_t k, const int8_t *xk, const float *dk,
                        const int16_t *bk, float *out, int64_t out_stride) {
    const int64_t nsb = k / QK, size = HIGH ? 176 : 144;
    const __m512i m4 = _mm512_set1_epi8(0x0F), one = _mm512_set1_epi8(1);
    const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    __m256 acc[KMAX];
    for (int j = 0; j < R; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *blk = q + size * b;
        const float d = f16_to_f32(blk), dmin = f16_to_f32(blk + 2);
        uint8_t sm[16];
        k4_scales(blk + 4, sm);
        const __m512i scales = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)sm)));
        const __m256i mins = k45_mins(sm);
        const uint8_t *qs = blk + (HIGH ? 48 : 16);
        const __m512i hbits = HIGH ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 16)))
                                   : _mm512_setzero_si512();
        __m512i sumi[KMAX];
        for (int r = 0; r < R; r++) sumi[r] = _mm512_setzero_si512();
        for (int p = 0; p < 4; p++) {  /* sub-blocks 2p (low 256 bits) and 2p + 1 (high) */
            const __m512i idx = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * p)), _mm256_set1_epi16((short)(2 * p + 1)), 1);
            const __m512i sc = _mm512_permutexvar_epi16(idx, scales);
            const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * p)));
            __m512i w = _mm512_and_si512(_mm512_srlv_epi16(v, shift), m4);
            if (HIGH) {
                const __m512i hs = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * p)), _mm256_set1_epi16((short)(2 * p + 1)), 1);
                w = _mm512_or_si512(w, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(hbits, hs), one), 4));
            }
            for (int r = 0; r < R; r++) {
                const __m512i x = _mm512_loadu_si512((const void *)(xk + r * k + QK * b + 64 * p));
                sumi[r] = _mm512_dpwssd_epi32(sumi[r], sc, _mm512_maddubs_epi16(w, x));
            }
        }
        const __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(dmin);
        for (int r = 0; r < R; r++) {
            const __m256i s256 = _mm256_add_epi32(_mm512_castsi512_si256(sumi[r]), _mm512_extracti64x4_epi64(sumi[r], 1));
            acc[r] = k45_step(acc[r], s256, mins, bk + r * (k / 16) + 16 * b, vd, vm, dk + r * nsb + b);
        }
    }
    for (int r = 0; r < R; r++) out[r * out_stride] = hsum8(acc[r]);
}

INLINE void ktile6_512(const int R, const uint8_t *q, int64_t k, const int8_t *xk, const float *dk, const int16_t *bk,
                       float *out, int64_t out_stride) {
    const int64_t nsb = k / QK;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(3);
    const __m512i sh01 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i sh23 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    __m256 acc[KMAX];
    for (int j = 0; j < R; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *blk = q + 210 * b;
        const __m256 vd = _mm256_set1_ps(f16_to_f32(blk + 208));
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
        const __m512i sc512 = _mm512_castsi256_si512(sc16);
        __m512i sumi[KMAX];
        for (int r = 0; r < R; r++) sumi[r] = _mm512_setzero_si512();
        for (int n = 0; n < 2; n++) {  /* 128 values: sub-blocks 4n, 4n + 1 (w01) and 4n + 2, 4n + 3 (w23) */
            const __m512i bits = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 64 * n))),
                _mm256_loadu_si256((const __m256i *)(blk + 64 * n + 32)), 1);
            const __m512i bh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n)));
            const __m512i w01 = _mm512_or_si512(_mm512_and_si512(bits, m4),
                                                _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(bh, sh01), m2), 4));
            const __m512i w23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(bits, 4), m4),
                                                _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(bh, sh23), m2), 4));
            /* i16 lane L of a product covers values 2L, 2L + 1: group 8n + L / 8 (+ 4 for w23) */
            const __m512i g = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2,
                                               1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
            const __m512i s01 = _mm512_permutexvar_epi16(_mm512_add_epi16(g, _mm512_set1_epi16((short)(8 * n))), sc512);
            const __m512i s23 = _mm512_permutexvar_epi16(_mm512_add_epi16(g, _mm512_set1_epi16((short)(8 * n + 4))), sc512);
            for (int r = 0; r < R; r++) {
                const int8_t *x = xk + r * k + QK * b + 128 * n;
                sumi[r] = _mm512_dpwssd_epi32(sumi[r], s01, _mm512_maddubs_epi16(w01, _mm512_loadu_si512((const void *)x)));
                sumi[r] = _mm512_dpwssd_epi32(sumi[r], s23, _mm512_maddubs_epi16(w23, _mm512_loadu_si512((const void *)(x + 64))));
            }
        }
        for (int r = 0; r < R; r++) {
            const __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)(bk + r * (k / 16) + 16 * b)));
            const __m256i s256 = _mm256_add_epi32(_mm512_castsi512_si256(sumi[r]), _mm512_extracti64x4_epi64(sumi[r], 1));
            const __m256i total = _mm256_sub_epi32(s256, _mm256_slli_epi32(off, 5));
            acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(dk + r * nsb + b), _mm256_mul_ps(vd, _mm256_cvtepi32_ps(total)), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) out[r * out_stride] = hsum8(acc[r]);
}
#define ktile45 ktile45_512
#define ktile6 ktile6_512
#endif

/* a tile function's switch from its run-time row count R (1..8) to the kernel's compile-time one; CALL(R)
 * names the kernel and its arguments */
#define ROWS_SWITCH(CALL)                                                                                   \
    switch (R) {                                                                                            \
    case 8: CALL(8); break;                                                                                 \
    case 7: CALL(7); break;                                                                                 \
    case 6: CALL(6); break;                                                                                 \
    case 5: CALL(5); break;                                                                                 \
    case 4: CALL(4); break;                                                                                 \
    case 3: CALL(3); break;                                                                                 \
    case 2: CALL(2); break;                                                                                 \
    default: CALL(1); break;                                                                                \
    }

#include "qkernels_x8.h"
#include "qkernels_amx.h"
#include "qkernels_x16.h"
#include "qkernels_attention.h"

/* The first index of the largest of v's n values (kernels._first_max: a greedy head's scan of its logits): each
 * lane keeps its first maximum (strict >), lanes and the scalar tail tie to the lower index, so the answer is the
 * scalar loop's for finite values (torch.argmax's). Two sets of lanes hide the compare's latency; scalar, 8 rows of
 * 151,936 took 0.94 ms a pass. */
int64_t sd_first_max(const float *v, int64_t n) {
    int64_t i = 0, best = 0;
    float top = n > 0 ? v[0] : 0.0f;
#if defined(SD_AVX2)
    if (n >= 16) {
        __m256 t0 = _mm256_loadu_ps(v), t1 = _mm256_loadu_ps(v + 8);
        __m256i a0 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), a1 = _mm256_add_epi32(a0, _mm256_set1_epi32(8));
        __m256i i0 = a0, i1 = a1;
        const __m256i step = _mm256_set1_epi32(16);
        for (i = 16; i + 16 <= n; i += 16) {
            i0 = _mm256_add_epi32(i0, step);
            i1 = _mm256_add_epi32(i1, step);
            const __m256 x0 = _mm256_loadu_ps(v + i), x1 = _mm256_loadu_ps(v + i + 8);
            const __m256 g0 = _mm256_cmp_ps(x0, t0, _CMP_GT_OQ), g1 = _mm256_cmp_ps(x1, t1, _CMP_GT_OQ);
            t0 = _mm256_blendv_ps(t0, x0, g0);
            t1 = _mm256_blendv_ps(t1, x1, g1);
            a0 = _mm256_blendv_epi8(a0, i0, _mm256_castps_si256(g0));
            a1 = _mm256_blendv_epi8(a1, i1, _mm256_castps_si256(g1));
        }
        float tv[16];
        int32_t av[16];
        _mm256_storeu_ps(tv, t0);
        _mm256_storeu_ps(tv + 8, t1);
        _mm256_storeu_si256((__m256i *)av, a0);
        _mm256_storeu_si256((__m256i *)(av + 8), a1);
        top = tv[0];
        best = av[0];
        for (int l = 1; l < 16; l++)
            if (tv[l] > top || (tv[l] == top && av[l] < best)) {
                top = tv[l];
                best = av[l];
            }
    }
#endif
    for (; i < n; i++)
        if (v[i] > top) {
            top = v[i];
            best = i;
        }
    return best;
}

/* RMSNorm of one row (decoder_kernels._rms_norm): out = v / sqrt(mean(v^2) + eps) * w, out may be v. The squares
 * summed in 16 fixed lanes, combined in a fixed order, nothing contracted (-ffp-contract=off): the same bits in any
 * caller and on every ISA. Compiled by numba with fastmath, LLVM ordered the sum as each caller's compilation chose
 * (a fused pass moved the bits of Qwen2.5-Coder-0.5B's layer 0 against a separately compiled decode_layers). */
#define NORM_LANES 16
void sd_rms_norm(const float *v, const float *w, int64_t n, double eps, float *out) {
    float lane[NORM_LANES] = {0};
    int64_t i = 0;
    for (; i + NORM_LANES <= n; i += NORM_LANES)
        for (int j = 0; j < NORM_LANES; j++) lane[j] += v[i + j] * v[i + j];
    for (int j = 0; i + j < n; j++) lane[j] += v[i + j] * v[i + j];
    for (int h = NORM_LANES / 2; h > 0; h /= 2)
        for (int j = 0; j < h; j++) lane[j] += lane[j + h];
    const float inv = 1.0f / sqrtf(lane[0] / (float)n + (float)eps);
    for (i = 0; i < n; i++) out[i] = v[i] * inv * w[i];
}

/* An MLP's act(gate) * up (kernels.gated_columns): out[c0 .. c1] from one row of a w_gate_up product, whose gate and
 * up halves alternate in blocks of `block` values (weight_names.gate_up_block; c0 and c1 on block boundaries). Both
 * activations are gate x sigmoid(c z): silu z = g, c = 1; gelu (tanh approximation, as Gemma's gelu_pytorch_tanh,
 * since 0.5 (1 + tanh y) = sigmoid(2 y)) z = g + 0.044715 g^3, c = 2 sqrt(2 / pi). A value is the same steps in a
 * lane as alone (exp8 / exp1; no contraction), so its bits never depend on the columns computed with it. */
INLINE float gated1(float g, float u, int gelu) {
    const float z = gelu ? -1.5957691216057308f * (g + 0.044715f * g * g * g) : -g;
    return g / (1.0f + exp1(z)) * u;
}

void sd_gated(const float *gate_up, int64_t c0, int64_t c1, int64_t block, int64_t gelu, float *out) {
    for (int64_t c = c0; c < c1; c += block) {
        const float *g = gate_up + 2 * c, *u = g + block;
        float *o = out + c;
        int64_t i = 0;
#if defined(SD_AVX2)
        const __m256 cz = _mm256_set1_ps(-1.5957691216057308f), cg = _mm256_set1_ps(0.044715f);
        const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
        for (; i + 8 <= block; i += 8) {
            const __m256 x = _mm256_loadu_ps(g + i);
            const __m256 z = gelu ? _mm256_mul_ps(cz, _mm256_add_ps(x, _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(cg, x), x), x)))
                                  : _mm256_xor_ps(x, sign);
            const __m256 w = _mm256_div_ps(x, _mm256_add_ps(one, exp8(z)));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(w, _mm256_loadu_ps(u + i)));
        }
#endif
        for (; i < block; i++) o[i] = gated1(g[i], u[i], (int)gelu);
    }
}

/* A sampled row's softmax in blocks of 64 columns (row_dist.BlockDist: the target's distribution without its [V]
 * probabilities). A block's terms are exp((v - its max) x inv_t), 0 below e^-87 (-inf logits; torch's float32
 * softmax underflows there too); sd_softmax_blocks writes each
 * block's max and the sum of its terms, sd_block_terms one block's terms: the values that sum added. The sum runs in
 * 16 lanes combined in a fixed order, nothing contracted, and exp16 / exp8 / exp1 agree bit for bit: the same bits on
 * every ISA. */
#define SOFTMAX_BLOCK 64

/* the columns of block b of an n-column row (the last block may be short) */
INLINE int64_t block_len(int64_t n, int64_t b) {
    return n - b * SOFTMAX_BLOCK < SOFTMAX_BLOCK ? n - b * SOFTMAX_BLOCK : SOFTMAX_BLOCK;
}

INLINE float block_max(const float *v, int64_t len) {
    float m = -INFINITY;
    int64_t i = 0;
#if defined(SD_AVX2)
    if (len == SOFTMAX_BLOCK) {
        __m256 a = _mm256_loadu_ps(v);
        for (i = 8; i < SOFTMAX_BLOCK; i += 8) a = _mm256_max_ps(a, _mm256_loadu_ps(v + i));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        return _mm_cvtss_f32(m4);
    }
#endif
    for (; i < len; i++) m = v[i] > m ? v[i] : m;
    return m;
}

INLINE void block_terms(const float *v, int64_t len, float m, float inv_t, float *out) {
    int64_t i = 0;
#if defined(SD_AVX512)
    const __m512 wm = _mm512_set1_ps(m), wt = _mm512_set1_ps(inv_t), wlo = _mm512_set1_ps(-87.0f);
    for (; i + 16 <= len; i += 16) {
        const __m512 a = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(v + i), wm), wt);
        _mm512_storeu_ps(out + i, _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, wlo, _CMP_GE_OQ), exp16(a)));
    }
#endif
#if defined(SD_AVX2)
    const __m256 vm = _mm256_set1_ps(m), vt = _mm256_set1_ps(inv_t), lo = _mm256_set1_ps(-87.0f);
    for (; i + 8 <= len; i += 8) {
        const __m256 a = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(v + i), vm), vt);
        _mm256_storeu_ps(out + i, _mm256_and_ps(exp8(a), _mm256_cmp_ps(a, lo, _CMP_GE_OQ)));
    }
#endif
    for (; i < len; i++) {
        const float a = (v[i] - m) * inv_t;
        out[i] = a >= -87.0f ? exp1(a) : 0.0f;
    }
    for (; i < SOFTMAX_BLOCK; i++) out[i] = 0.0f;
}

void sd_softmax_blocks(const float *v, int64_t n, float inv_t, float *bmax, float *bsum) {
    float t[SOFTMAX_BLOCK];
    for (int64_t b = 0; b * SOFTMAX_BLOCK < n; b++) {
        const float *x = v + b * SOFTMAX_BLOCK;
        const int64_t len = block_len(n, b);
        const float m = block_max(x, len);
        bmax[b] = m;
        if (m == -INFINITY) {
            bsum[b] = 0.0f;
            continue;
        }
        block_terms(x, len, m, inv_t, t);
        float lane[16] = {0};
        for (int i = 0; i < SOFTMAX_BLOCK; i += 16)
            for (int j = 0; j < 16; j++) lane[j] += t[i + j];
        for (int h = 8; h > 0; h /= 2)
            for (int j = 0; j < h; j++) lane[j] += lane[j + h];
        bsum[b] = lane[0];
    }
}

void sd_block_terms(const float *v, int64_t n, int64_t b, float inv_t, float *out) {
    const float *x = v + b * SOFTMAX_BLOCK;
    const int64_t len = block_len(n, b);
    block_terms(x, len, block_max(x, len), inv_t, out);
}

/* A row's blocks weighed against its largest logit (row_dist.BlockDist): factor[b] = exp((top[b] - max) x inv_t)
 * (exp1's bits, 0 below e^-87), weight[b] = sums[b] x factor[b] in float64; returns the weights' sum, added in order. */
double sd_block_weights(const float *top, const float *sums, int64_t nb, float inv_t, double *factor, double *weight) {
    float m = -INFINITY;
    for (int64_t b = 0; b < nb; b++) m = top[b] > m ? top[b] : m;
    double total = 0.0;
    for (int64_t b = 0; b < nb; b++) {
        const float a = (top[b] - m) * inv_t;
        factor[b] = a >= -87.0f ? (double)exp1(a) : 0.0;
        weight[b] = (double)sums[b] * factor[b];
        total += weight[b];
    }
    return total;
}

/* Block b's tokens' float64 weights: its terms x factor, 0 where a filter drops them: below min_p (min-p, where
 * min_p > 0), below the weight floor or at it past id_floor (top-k and top-p: a prefix of the tokens in descending
 * weight, ties in id order), and at the removed[0 .. n_removed) ids (rejected drafts). */
void sd_block_token_weights(const float *row, int64_t n, int64_t b, float inv_t, double factor, double min_p,
                            double floor, int64_t id_floor, const int64_t *removed, int64_t n_removed, double *out) {
    float t[SOFTMAX_BLOCK];
    sd_block_terms(row, n, b, inv_t, t);
    for (int c = 0; c < SOFTMAX_BLOCK; c++) {
        const double w = (double)t[c] * factor;
        const int64_t id = b * SOFTMAX_BLOCK + c;
        out[c] = (min_p > 0.0 && w < min_p) || w < floor || (w == floor && id > id_floor) ? 0.0 : w;
    }
    for (int64_t i = 0; i < n_removed; i++)
        if (removed[i] / SOFTMAX_BLOCK == b) out[removed[i] % SOFTMAX_BLOCK] = 0.0;
}

/* whether a block whose largest token weighs factor (its factor) can hold a token past min_p and the floor */
INLINE int block_kept(double factor, double min_p, double floor) {
    return factor > 0.0 && factor >= min_p && factor >= floor;
}

/* Every block's weight again as the sum of its tokens' (sd_block_token_weights' filters); a block whose largest
 * token (weight factor[b]) is below min_p or the floor weighs 0 unsummed. Returns the weights' sum, added in order. */
double sd_block_reweigh(const float *row, int64_t n, int64_t nb, float inv_t, const double *factor, double min_p,
                        double floor, int64_t id_floor, const int64_t *removed, int64_t n_removed, double *weight) {
    double w[SOFTMAX_BLOCK], total = 0.0;
    for (int64_t b = 0; b < nb; b++) {
        weight[b] = 0.0;
        if (block_kept(factor[b], min_p, floor)) {
            sd_block_token_weights(row, n, b, inv_t, factor[b], min_p, floor, id_floor, removed, n_removed, w);
            for (int c = 0; c < SOFTMAX_BLOCK; c++) weight[b] += w[c];
        }
        total += weight[b];
    }
    return total;
}

/* The row's probabilities (float32 out[n]): every token's weight (sd_block_token_weights' filters) over total; blocks
 * whose largest token is below min_p or the floor are 0 unsummed. For a residual max(0, p - q) against a sampled
 * draft's q, which reads every token's p. */
void sd_block_probs(const float *row, int64_t n, int64_t nb, float inv_t, const double *factor, double min_p,
                    double floor, int64_t id_floor, const int64_t *removed, int64_t n_removed, double total,
                    float *out) {
    double w[SOFTMAX_BLOCK];
    const int unfiltered = min_p <= 0.0 && floor < 0.0 && n_removed == 0;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t len = block_len(n, b);
        float *o = out + b * SOFTMAX_BLOCK;
        if (unfiltered && factor[b] > 0.0) {  // (float) (term x factor / total), in float32 lanes
            float t[SOFTMAX_BLOCK];
            sd_block_terms(row, n, b, inv_t, t);
            const float scale = (float)(factor[b] / total);
            for (int64_t c = 0; c < len; c++) o[c] = t[c] * scale;
        } else if (block_kept(factor[b], min_p, floor)) {
            sd_block_token_weights(row, n, b, inv_t, factor[b], min_p, floor, id_floor, removed, n_removed, w);
            for (int64_t c = 0; c < len; c++) o[c] = (float)(w[c] / total);
        } else {
            memset(o, 0, (size_t)len * sizeof(float));
        }
    }
}

typedef struct {
    double w;
    int64_t id;
} sd_token;

/* descending weight, ties in id order (a stable sort's) */
static int token_order(const void *pa, const void *pb) {
    const sd_token *a = pa, *b = pb;
    if (a->w != b->w) return a->w > b->w ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

/* The tokens weighing at least theta past the floor (not min-p), sorted in token_order into out; how many. */
static int64_t gather_tokens(const float *row, int64_t n, int64_t nb, float inv_t, const double *factor, double theta,
                             double floor, int64_t id_floor, sd_token *out) {
    double w[SOFTMAX_BLOCK];
    int64_t count = 0;
    for (int64_t b = 0; b < nb; b++) {
        if (factor[b] < theta || factor[b] < floor) continue;
        sd_block_token_weights(row, n, b, inv_t, factor[b], 0.0, floor, id_floor, NULL, 0, w);
        for (int c = 0; c < SOFTMAX_BLOCK && b * SOFTMAX_BLOCK + c < n; c++)
            if (w[c] >= theta) out[count++] = (sd_token){w[c], b * SOFTMAX_BLOCK + c};
    }
    qsort(out, (size_t)count, sizeof(sd_token), token_order);
    return count;
}

/* Top-k and top-p as a weight floor and the last id kept at it (row_dist.BlockDist; top_k 0 and top_p 1: none).
 * Both keep a prefix of the tokens in token_order, found among those weighing at least a threshold that falls
 * 1000-fold from 1e-3 (the largest token weighs 1; a block's largest its factor, so blocks below the threshold hold
 * none) until the prefix ends inside them, then 0 (every token). Top-k: the k-th weight, ties at it kept; top-p,
 * after top-k and before min-p: the first token whose predecessors' running weight reaches top_p x the total after
 * top-k is dropped, and those after it. tokens: scratch for n; weight: scratch for nb. Returns the floor. */
double sd_block_floor(const float *row, int64_t n, int64_t nb, float inv_t, const double *factor, int64_t top_k,
                      double top_p, sd_token *tokens, double *weight, int64_t *id_floor) {
    double floor = -1.0;
    *id_floor = INT64_MAX;
    if (top_k > 0 && top_k < n) {
        for (double theta = 1e-3;; theta = theta > 1e-30 ? theta * 1e-3 : 0.0) {
            const int64_t count = gather_tokens(row, n, nb, inv_t, factor, theta, floor, *id_floor, tokens);
            if (count >= top_k || theta == 0.0) {
                floor = count >= top_k ? tokens[top_k - 1].w : 0.0;
                break;
            }
        }
    }
    if (top_p < 1.0) {
        const double total = sd_block_reweigh(row, n, nb, inv_t, factor, 0.0, floor, *id_floor, NULL, 0, weight);
        const double cut = top_p * total;
        for (double theta = 1e-3;; theta = theta > 1e-30 ? theta * 1e-3 : 0.0) {
            const int64_t count = gather_tokens(row, n, nb, inv_t, factor, theta, floor, *id_floor, tokens);
            double mass = 0.0;
            for (int64_t i = 0; i < count; i++) mass += tokens[i].w;
            if (mass < cut && theta > 0.0) continue;
            double before = 0.0;
            int64_t last = 0;
            for (int64_t i = 0; i < count && (i == 0 || before < cut); i++) {
                last = i;
                before += tokens[i].w;
            }
            floor = tokens[last].w;
            *id_floor = tokens[last].id;
            break;
        }
    }
    return floor;
}

/* sampling.sample's draw over the blocks: the first token whose running weight exceeds u x the total, the blocks'
 * float64 running sums first, then the tokens' of the block it falls in (a token of weight 0 is never picked; where
 * rounding leaves the running sums short, the last block and token that weigh anything). */
int64_t sd_block_pick(const double *weight, int64_t nb, const float *row, int64_t n, float inv_t, const double *factor,
                      double min_p, double floor, int64_t id_floor, const int64_t *removed, int64_t n_removed,
                      double u) {
    double total = 0.0;
    for (int64_t b = 0; b < nb; b++) total += weight[b];
    const double target = u * total;
    double running = 0.0;
    int64_t b = 0, last = 0;
    for (; b < nb; b++) {
        if (weight[b] > 0.0) last = b;
        if (running + weight[b] > target) break;
        running += weight[b];
    }
    if (b == nb) b = last;
    double w[SOFTMAX_BLOCK];
    sd_block_token_weights(row, n, b, inv_t, factor[b], min_p, floor, id_floor, removed, n_removed, w);
    int64_t pick = -1, heavy = 0;
    for (int c = 0; c < SOFTMAX_BLOCK; c++) {
        if (w[c] > 0.0) heavy = c;
        running += w[c];
        if (running > target && w[c] > 0.0) {
            pick = c;
            break;
        }
    }
    return b * SOFTMAX_BLOCK + (pick >= 0 ? pick : heavy);
}

/* the kernels' instruction set; "+amx" where the tiles are built and this process may use them */
const char *sd_isa(void) {
#if defined(SD_AMX)
    if (amx_enabled()) return "avx512-vnni+amx";
#endif
#if defined(SD_AVX512)
    return "avx512-vnni";
#elif defined(SD_VNNI)
    return "avx2-vnni";
#elif defined(SD_AVX2)
    return "avx2";
#else
    return "scalar";
#endif
}

#define KTILES(NAME, CALL)                                                                                  \
    static void NAME(int R, const uint8_t *q, int64_t k, const int8_t *xk, const float *dk, const int16_t *bk, \
                     float *out, int64_t os) {                                                              \
        ROWS_SWITCH(CALL)                                                                                   \
    }
#define CALL_Q4K(R) ktile45(R, 0, q, k, xk, dk, bk, out, os)
#define CALL_Q5K(R) ktile45(R, 1, q, k, xk, dk, bk, out, os)
#define CALL_Q6K(R) ktile6(R, q, k, xk, dk, bk, out, os)
KTILES(tiles_q4k, CALL_Q4K)
KTILES(tiles_q5k, CALL_Q5K)
KTILES(tiles_q6k, CALL_Q6K)

#define TILES(NAME, FMT)                                                                                    \
    static void NAME(int R, const uint8_t *q, const float *s, const float *m, int64_t k, const int8_t *xq,  \
                     const float *dx8, const float *bs32, const int32_t *nxl, float *out, int64_t os) {     \
        switch (R) {                                                                                        \
        case 4: tile(4, FMT, q, s, m, k, xq, dx8, bs32, nxl, out, os); break;                               \
        case 3: tile(3, FMT, q, s, m, k, xq, dx8, bs32, nxl, out, os); break;                               \
        case 2: tile(2, FMT, q, s, m, k, xq, dx8, bs32, nxl, out, os); break;                               \
        default: tile(1, FMT, q, s, m, k, xq, dx8, bs32, nxl, out, os); break;                              \
        }                                                                                                   \
    }
TILES(tiles_u4m, FMT_U4M)
TILES(tiles_u8m, FMT_U8M)
TILES(tiles_i8, FMT_I8)

/* A matrix's rows in q: segments [n_segments][3] = (first row, byte offset, bytes a row), by first row, each a run
   of rows of one layout (quant.segmented: a fused q/k/v matrix of Q4_K and Q6_K rows keeps each at its own width,
   no padding between them); padding entries start at the row count. The segment holding row n: */
static int64_t segment_of(const int64_t *segments, int64_t n_segments, int64_t n) {
    int64_t lo = 0, hi = n_segments - 1;
    while (lo < hi) {  /* the last segment starting at or before n */
        const int64_t mid = (lo + hi + 1) / 2;
        if (segments[3 * mid] <= n) lo = mid; else hi = mid - 1;
    }
    return lo;
}

/* out[r, n] = sum_k W[n, k] x[r, k] for weight rows n0 <= n < n1 and every activation row r.
 * q the rows' bytes as `segments` place them (segment_of), s and m [N, s_stride] floats, fmt [N] (a layout per row:
 * a fused q/k/v matrix may mix them; an interleaved group of 8 or 16 rows starts at a multiple of 8 or 16, and so
 * must n0); xq/dx8/bs32/nxl and xk/dk/bk/bw from sd_prepare; out [rows, out_stride]. */
void sd_qmatmul(const uint8_t *q, const int64_t *segments, int64_t n_segments, const float *s, const float *m,
                const int8_t *fmt, int64_t s_stride, int64_t k, const int8_t *xq, const float *dx8, const float *bs32,
                const int32_t *nxl, const int8_t *xk, const float *dk, const int16_t *bk, const int32_t *bw, int64_t rows,
                float *out, int64_t out_stride, int64_t n0, int64_t n1) {
    int64_t seg = segment_of(segments, n_segments, n0);
    for (int64_t n = n0; n < n1; n++) {
        while (seg + 1 < n_segments && segments[3 * (seg + 1)] <= n) seg++;
        const int64_t q_stride = segments[3 * seg + 2];
        const uint8_t *qn = q + segments[3 * seg + 1] + (n - segments[3 * seg]) * q_stride;
#if defined(SD_AMX)
        if ((fmt[n] == FMT_Q4KX8 || fmt[n] == FMT_Q6KX8) && n + 2 * X8 <= n1 && fmt[n + X8] == fmt[n] &&
            rows >= AMX_MIN_ROWS && amx_enabled()) {  /* (no AMX tile for Q5_K) */
            amx_x8_pair(fmt[n], qn, qn + X8 * q_stride, k, xk, dk, bk, rows, out + n, out_stride);  /* rows n .. n + 15 */
            n += 2 * X8 - 1;
            continue;
        }
#endif
#if defined(SD_AVX2) && !defined(SD_VNNI)
        /* a run of whole groups of one layout, read as STREAMS runs in turn (qkernels_x8.h) */
        if (x8_layout(fmt[n]) && rows <= (kx8_layout(fmt[n]) ? STREAM_ROWS : STREAM_B32_ROWS)) {
            int64_t end = n;
            while (end + X8 <= n1 && fmt[end] == fmt[n]) end += X8;
            if ((end - n) / X8 >= STREAMS) {
                x8_streams(fmt[n], qn, X8 * q_stride, (end - n) / X8, k, xq, dx8, bs32, xk, dk, bk, (int)rows,
                           out + n, out_stride);
                n = end - 1;
                continue;
            }
        }
#endif
        if (x16_layout(fmt[n])) {  /* rows n .. n + 15, interleaved (n % 16 == 0) */
            x16_group(fmt[n], qn, k, xq, dx8, bs32, xk, dk, bk, bw, rows, out + n, out_stride);
            n += X16 - 1;
            continue;
        }
        if (x8_layout(fmt[n])) {  /* rows n .. n + 7, interleaved (n % 8 == 0) */
            x8_group(fmt[n], qn, k, xq, dx8, bs32, xk, dk, bk, rows, out + n, out_stride);
            n += X8 - 1;
            continue;
        }
        const float *sn = s + n * s_stride, *mn = m + n * s_stride;
        /* activation rows per tile (Q6_K's unpacked weights leave no room for 8 rows' accumulators) */
        const int step = fmt[n] == FMT_Q4K || fmt[n] == FMT_Q5K ? KROWS : 4;
        for (int64_t r0 = 0; r0 < rows; r0 += step) {
            const int R = rows - r0 < step ? (int)(rows - r0) : step;
            const int8_t *x = xq + r0 * k;
            const float *d = dx8 + r0 * (k / 4), *b32 = bs32 + r0 * (k / 32);
            const int32_t *l = nxl + r0 * (k / 4);
            float *o = out + r0 * out_stride + n;
            const int8_t *xr = xk + r0 * k;
            const float *dr = dk + r0 * (k / QK);
            const int16_t *br = bk + r0 * (k / 16);
            switch (fmt[n]) {
            case FMT_Q4K: tiles_q4k(R, qn, k, xr, dr, br, o, out_stride); break;
            case FMT_Q5K: tiles_q5k(R, qn, k, xr, dr, br, o, out_stride); break;
            case FMT_Q6K: tiles_q6k(R, qn, k, xr, dr, br, o, out_stride); break;
            case FMT_U4M: tiles_u4m(R, qn, sn, mn, k, x, d, b32, l, o, out_stride); break;
            case FMT_U8M: tiles_u8m(R, qn, sn, mn, k, x, d, b32, l, o, out_stride); break;
            default: tiles_i8(R, qn, sn, mn, k, x, d, b32, l, o, out_stride); break;
            }
        }
    }
}

/* The next span of units for thread t of n, packed (first << 32 | end); -1 when none is left. Each thread owns a
   contiguous run of units (ranges[t] packs its next unit in the low 32 bits and its end in the high 32) and takes
   it front to back, so its weights stream as one sequence; a thread whose run is done takes the other runs' last
   units. A VM's two cores run at different speeds from moment to moment: an even split made the faster one wait at
   every join, and units dealt out in turn (a shared counter) broke the streams. A span is half of what is left of
   its run (rounded up), at most `most` units: a thread takes its own run `most` at a time until near its end, and
   two threads finishing a product wait at most a unit for each other, where whole chunks left one waiting for the other's last (1.45 ms of a 1-token pass summed over its joins, the LM head's 12 MB chunks
   0.35-0.4 ms of it; that head alone, Zen 4, 1 / 8 rows: 5.99 / 10.13 -> 5.85 / 9.57 ms). */
int64_t sd_span(int64_t *ranges, int64_t t, int64_t n, int64_t most) {
    for (int64_t i = 0; i < n; i++) {
        int64_t *r = ranges + (t + i) % n;
        int64_t v = __atomic_load_n(r, __ATOMIC_RELAXED);
        for (;;) {
            const int64_t front = v & 0xffffffff, back = v >> 32, left = back - front;
            if (left <= 0)
                break;
            const int64_t half = (left + 1) / 2, size = half < most ? half : most;
            const int64_t want = i == 0 ? (back << 32) | (front + size) : ((back - size) << 32) | front;
            if (__atomic_compare_exchange_n(r, &v, want, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                return i == 0 ? (front << 32) | (front + size) : ((back - size) << 32) | back;
        }
    }
    return -1;
}

/* numba's thread count as compiled callers take it (kernels.py sets it at import): numba.get_num_threads() inside
   a compiled function embeds an address, so numba compiled qmatmul, its callers and decode_layers afresh in every
   process instead of loading them from its cache (SmolLM2-135M's first generate in a fresh process 10 s -> 0.2 s).
   A count off from numba's (numba.set_num_threads after import) costs speed only: a region's iterations beyond its
   threads run one after another, and sd_span hands every unit out once, whichever thread asks. */
static int64_t sd_thread_count = 1;
void sd_set_threads(int64_t n) { sd_thread_count = n > 0 ? n : 1; }
int64_t sd_threads(void) { return sd_thread_count; }

/* The activation rows up to which this build's products read K-quant groups with x8_streams (0: it never does), whose
   runs need long spans (kernels._span_cap) */
int64_t sd_stream_rows(void) {
#if defined(SD_AVX2) && !defined(SD_VNNI)
    return STREAM_ROWS;
#else
    return 0;
#endif
}

/* Work shared inside a region without a barrier (kernels.qmatmul's activation rows): each thread claims units
   from a counter (sd_claim), counts each one it finishes (sd_finish), and waits until the count reaches the total
   (sd_await). A thread only waits for units some running thread has claimed, so a region whose iterations run
   one after another still ends: the first then does them all. */
#if defined(__x86_64__) || defined(__i386__)
#define SD_PAUSE() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define SD_PAUSE() __asm__ __volatile__("yield")
#else
#define SD_PAUSE() ((void)0)
#endif
int64_t sd_claim(int64_t *next) { return __atomic_fetch_add(next, 1, __ATOMIC_RELAXED); }
void sd_finish(int64_t *count) { __atomic_fetch_add(count, 1, __ATOMIC_RELEASE); }
void sd_await(const int64_t *count, int64_t total) {
    while (__atomic_load_n(count, __ATOMIC_ACQUIRE) < total) SD_PAUSE();
}

/* The read floor's work: n bytes at p read once (an OR of every 8-byte word, which the compiler
   vectorizes) as `streams` equal runs advanced READ_BLOCK bytes at a time in turn, the order
   x8_streams reads weights in (a run per core can keep fewer lines in flight than the memory allows).
   The tail past the runs is read on its own. */
#define READ_BLOCK 1024
uint64_t sd_read(const uint8_t *p, int64_t n, int64_t streams) {
    const int64_t run = n / streams / READ_BLOCK * READ_BLOCK;
    uint64_t acc = 0;
    for (int64_t o = 0; o < run; o += READ_BLOCK)
        for (int64_t s = 0; s < streams; s++)
            for (int i = 0; i < READ_BLOCK; i += 8) {
                uint64_t w;
                memcpy(&w, p + s * run + o + i, 8);
                acc |= w;
            }
    for (int64_t o = streams * run; o + 8 <= n; o += 8) {
        uint64_t w;
        memcpy(&w, p + o, 8);
        acc |= w;
    }
    return acc;
}

/* rows of the dequantized matrix (the token embedding lookup): out [len(ids), k] */
void sd_dequantize_rows(const uint8_t *q, const int64_t *segments, int64_t n_segments, const float *s,
                        const float *m, const int8_t *fmt, int64_t s_stride, int64_t k, const int64_t *ids,
                        int64_t n_ids, float *out) {
    for (int64_t i = 0; i < n_ids; i++) {
        const int64_t n = ids[i];
        const int64_t *seg = segments + 3 * segment_of(segments, n_segments, n);
        const int64_t q_stride = seg[2];
        const uint8_t *qn = q + seg[1] + (n - seg[0]) * q_stride;
        const float *sn = s + n * s_stride, *mn = m + n * s_stride;
        float *o = out + i * k;
        if (kx16_layout(fmt[n]) || kx8_layout(fmt[n])) {
            const int G = kx16_layout(fmt[n]) ? X16 : X8;
            kgroup_dequantize(G, fmt[n], qn - (n & (G - 1)) * q_stride,
                              (int)(n & (G - 1)), k, o);
            continue;
        }
        if (bx16_layout(fmt[n])) {
            bgroup_dequantize(X16, bx16_narrow(fmt[n]), qn - (n & (X16 - 1)) * q_stride, (int)(n & (X16 - 1)), k, o);
            continue;
        }
        if (x8_layout(fmt[n])) {
            bgroup_dequantize(X8, fmt[n], qn - (n & (X8 - 1)) * q_stride, (int)(n & (X8 - 1)), k, o);
            continue;
        }
        if (fmt[n] >= FMT_Q4K) {
            const int f = fmt[n];
            const int64_t size = f == FMT_Q4K ? 144 : (f == FMT_Q5K ? 176 : 210);
            for (int64_t b = 0; b < k / QK; b++) {
                const uint8_t *blk = qn + size * b;
                uint8_t sm[16];
                k4_scales(blk + 4, sm);  /* Q6_K: unused */
                const float d = f16_to_f32(f == FMT_Q6K ? blk + 208 : blk), dmin = f16_to_f32(blk + 2);
                for (int e = 0; e < QK; e++) {
                    int g;
                    const int32_t w = k_weight(f, blk, e, &g);
                    if (f == FMT_Q6K)
                        o[QK * b + e] = (d * (float)(int8_t)blk[192 + g]) * (float)(w - 32);
                    else
                        o[QK * b + e] = (d * (float)sm[g]) * (float)w - dmin * (float)sm[8 + g];
                }
            }
            continue;
        }
        for (int64_t e = 0; e < k; e++) {
            const int64_t b = e / 32, j = e % 32;
            switch (fmt[n]) {
            case FMT_U4M:
                o[e] = sn[b] * (float)((b & 1) ? (qn[32 * (b / 2) + j] >> 4) : (qn[32 * (b / 2) + j] & 15)) + mn[b];
                break;
            case FMT_U8M: o[e] = sn[b] * (float)qn[e] + mn[b]; break;
            default: o[e] = sn[b] * (float)((int32_t)qn[e] - 128); break;
            }
        }
    }
}

/* Q6_K rows packed into their interleaved groups (qkernels_x8.h's Q6KX8, qkernels_x16.h's Q6KX16; quant.py's
   interleaved() calls it): groups[i]'s n = 8 or 16 rows of GGUF super-blocks (row r at q + (g n + r) stride, nsb
   super-blocks of 210 bytes) -> nsb units of 210 n bytes at out + g n out_stride: the rows' d (2 n bytes), their 16
   scales a sub-block group at a time (16 n), then per half (a), step (t) and part the rows' 4 bytes. A step's parts:
   8 rows, B0..B2 = chunk cc's 6-bit value with bits 2cc..2cc+1 of chunk 3's in bits 6..7; 16 rows, L0 = chunks 0-1's
   low nibbles, L1 = chunks 2-3's, H = the four chunks' high 2 bits. One pass over the bytes, where NumPy's
   transposes took 3.1 s of Qwen2.5-Coder-1.5B's load (its LM head and half its ffn_down). */
void sd_pack_q6k(const uint8_t *q, int64_t stride, const int64_t *groups, int64_t n_groups, int64_t n,
                 int64_t nsb, uint8_t *out, int64_t out_stride) {
    for (int64_t gi = 0; gi < n_groups; gi++) {
        const int64_t g = groups[gi];
        for (int64_t s = 0; s < nsb; s++) {
            uint8_t *o = out + g * n * out_stride + s * 210 * n;
            for (int64_t r = 0; r < n; r++) {
                const uint8_t *b = q + (g * n + r) * stride + s * 210;
                o[2 * r] = b[208];
                o[2 * r + 1] = b[209];
                for (int k = 0; k < 16; k++) o[2 * n + k * n + r] = b[192 + k];
                uint8_t v[256];  /* the values 0..63 (before the -32): value (a, c, i) at 128 a + 32 c + i */
                for (int a = 0; a < 2; a++)
                    for (int c = 0; c < 4; c++)
                        for (int i = 0; i < 32; i++) {
                            const uint8_t low = b[64 * a + 32 * (c & 1) + i], hi = b[128 + 32 * a + i];
                            v[128 * a + 32 * c + i] = (uint8_t)(((c < 2) ? (low & 15) : (low >> 4)) | (((hi >> (2 * c)) & 3) << 4));
                        }
                for (int a = 0; a < 2; a++)
                    for (int t = 0; t < 8; t++)
                        for (int u = 0; u < 4; u++) {
                            const uint8_t *x = v + 128 * a + 4 * t + u;  /* chunk c's value at x[32 c] */
                            const uint8_t v0 = x[0], v1 = x[32], v2 = x[64], v3 = x[96];
                            uint8_t part[3];
                            if (n == 8) {
                                part[0] = (uint8_t)(v0 | ((v3 & 3) << 6));
                                part[1] = (uint8_t)(v1 | (((v3 >> 2) & 3) << 6));
                                part[2] = (uint8_t)(v2 | (((v3 >> 4) & 3) << 6));
                            } else {
                                part[0] = (uint8_t)((v0 & 15) | ((v1 & 15) << 4));
                                part[1] = (uint8_t)((v2 & 15) | ((v3 & 15) << 4));
                                part[2] = (uint8_t)((v0 >> 4) | ((v1 >> 4) << 2) | ((v2 >> 4) << 4) | ((v3 >> 4) << 6));
                            }
                            for (int p = 0; p < 3; p++) o[18 * n + ((a * 8 + t) * 3 + p) * 4 * n + 4 * r + u] = part[p];
                        }
            }
        }
    }
}

/* Q4_K (five = 0) or Q5_K (five = 1) rows packed into their interleaved groups (Q4KX8 / Q4KX16, Q5KX8 / Q5KX16),
   as sd_pack_q6k: per super-block of n rows the rows' d (2 n bytes) and dmin (2 n), their 8 six-bit scales and 8
   mins a sub-block at a time (8 n each, unpacked from GGUF's 12 bytes as llama.cpp's get_scale_min_k4), Q5_K's high
   bits a step at a time (32 n: step t, row r's qh[4 t .. 4 t + 3]), then the nibbles per pair of sub-blocks and step
   (128 n: row r's 4 bytes). */
void sd_pack_q45k(const uint8_t *q, int64_t stride, const int64_t *groups, int64_t n_groups, int64_t n,
                  int64_t nsb, int64_t five, uint8_t *out, int64_t out_stride) {
    const int64_t in = five ? 176 : 144, unit = five ? 180 : 148, qs = five ? 48 : 16, nibbles = (five ? 52 : 20) * n;
    for (int64_t gi = 0; gi < n_groups; gi++) {
        const int64_t g = groups[gi];
        for (int64_t s = 0; s < nsb; s++) {
            uint8_t *o = out + g * n * out_stride + s * unit * n;
            for (int64_t r = 0; r < n; r++) {
                const uint8_t *b = q + (g * n + r) * stride + s * in, *p = b + 4;
                memcpy(o + 2 * r, b, 2);
                memcpy(o + 2 * n + 2 * r, b + 2, 2);
                for (int j = 0; j < 8; j++) {
                    o[4 * n + j * n + r] = (uint8_t)(j < 4 ? p[j] & 63 : (p[j + 4] & 15) | ((p[j - 4] >> 6) << 4));
                    o[12 * n + j * n + r] = (uint8_t)(j < 4 ? p[j + 4] & 63 : (p[j + 4] >> 4) | ((p[j] >> 6) << 4));
                }
                if (five)
                    for (int t = 0; t < 8; t++) memcpy(o + 20 * n + t * 4 * n + 4 * r, b + 16 + 4 * t, 4);
                for (int pair = 0; pair < 4; pair++)
                    for (int t = 0; t < 8; t++)
                        memcpy(o + nibbles + (pair * 8 + t) * 4 * n + 4 * r, b + qs + 32 * pair + 4 * t, 4);
            }
        }
    }
}

/* Rows of a 32-value layout packed into their interleaved groups (qkernels_x8.h's Q80X8, Q50X8, Q40X8, Q41X8, Q51X8;
   qkernels_x16.h's 16-row forms), from the layouts quant.py's from_blocks made: src = 0 U4M (byte j of 64 values:
   the even block's value j low, the odd block's high), 1 U8M (a value 0..31 a byte), 2 I8 (value + 128); d and m the
   rows' float16 scales and mins [rows, nb] (m NULL: none stored). Per block of n rows at out + g n out_stride +
   b n size: the rows' d (2 n bytes), m (2 n), then Q8_0's values a step of 4 at a time (32 n: step t, row r's values
   4 t .. 4 t + 3), or a 5-bit type's fifth bits (4 n: row r's byte u has value 4 t + u's in bit t) and the nibbles
   (16 n: step t < 4, row r's value 4 t + u low and 16 + 4 t + u high), GGUF's own qs. One pass over the bytes,
   where NumPy's transposes took 3.3 s of Qwen2.5-Coder-0.5B's load (its Q5_0 layers). */
void sd_pack_blocks(const uint8_t *q, int64_t stride, int64_t src, int64_t five, const uint16_t *d, const uint16_t *m,
                    int64_t nb, const int64_t *groups, int64_t n_groups, int64_t n, uint8_t *out, int64_t out_stride) {
    const int64_t size = src == 2 ? 34 : 18 + (m ? 2 : 0) + (five ? 4 : 0);
    for (int64_t gi = 0; gi < n_groups; gi++) {
        const int64_t g = groups[gi];
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = out + g * n * out_stride + b * size * n;
            for (int64_t r = 0; r < n; r++) {
                const int64_t row = g * n + r;
                const uint8_t *x = q + row * stride;
                uint8_t v[32];
                for (int j = 0; j < 32; j++)
                    v[j] = src == 0 ? (uint8_t)((b & 1) ? x[32 * (b >> 1) + j] >> 4 : x[32 * (b >> 1) + j] & 15)
                                    : (uint8_t)(src == 2 ? x[32 * b + j] ^ 0x80 : x[32 * b + j]);
                memcpy(o + 2 * r, d + row * nb + b, 2);
                uint8_t *p = o + 2 * n;
                if (m) {
                    memcpy(p + 2 * r, m + row * nb + b, 2);
                    p += 2 * n;
                }
                if (src == 2) {
                    for (int t = 0; t < 8; t++) memcpy(p + t * 4 * n + 4 * r, v + 4 * t, 4);
                    continue;
                }
                if (five) {
                    for (int u = 0; u < 4; u++) {
                        uint8_t high = 0;
                        for (int t = 0; t < 8; t++) high |= (uint8_t)(((v[4 * t + u] >> 4) & 1) << t);
                        p[4 * r + u] = high;
                    }
                    p += 4 * n;
                }
                for (int t = 0; t < 4; t++)
                    for (int u = 0; u < 4; u++)
                        p[t * 4 * n + 4 * r + u] = (uint8_t)((v[4 * t + u] & 15) | ((v[16 + 4 * t + u] & 15) << 4));
            }
        }
    }
}

/* Q5_0 / Q5_1 blocks of `size` bytes (the 32 fifth bits as a little-endian word at qh_at, 16 bytes of nibbles at
   qs_at: value j low, j + 16 high) -> their values 0..31, a byte each (quant.py's U8M), one pass where NumPy's
   unpackbits and concatenations took ~1 s of Qwen2.5-Coder-0.5B's load (its Q5_0 layers). */
void sd_unpack_q5(const uint8_t *blocks, int64_t n_blocks, int64_t size, int64_t qh_at, int64_t qs_at, uint8_t *out) {
    for (int64_t b = 0; b < n_blocks; b++) {
        const uint8_t *x = blocks + b * size, *qs = x + qs_at;
        uint32_t qh;
        memcpy(&qh, x + qh_at, 4);
        uint8_t *o = out + 32 * b;
        for (int j = 0; j < 16; j++) {
            o[j] = (uint8_t)((qs[j] & 15) | (((qh >> j) & 1) << 4));
            o[j + 16] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
        }
    }
}
