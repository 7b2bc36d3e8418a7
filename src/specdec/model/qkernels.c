/* Products of GGUF-quantized weight rows with a few activation rows, as integer dot products.
 *
 * Compiled on first use for the CPU at hand (cc -O3 -march=native, see clib.py) and called
 * from the numba layer stack (kernels.qmatmul). Weights keep their blocks' integers and scales,
 * repacked at load (quant.py) into one of four layouts; a row has K values, K a multiple of 64:
 *
 *   U4M  4-bit q; 32 bytes per two 32-blocks (byte j: block 2p's value j in the low nibble,
 *        block 2p+1's value j in the high one); value = s[b] * q + m[b]  (Q4_0, Q4_1, Q4_K)
 *   U8M  one byte per q (0..31); value = s[b] * q + m[b]               (Q5_0, Q5_1, Q5_K)
 *   I8   one byte per q + 128; value = s[b] * q per 32-block           (Q8_0)
 *   I8H  one byte per q + 128; value = s[h] * q per 16 values          (Q6_K)
 *
 * Activation rows are quantized per 32-block to int8 (llama.cpp's q8_0 route: d = max|x| / 127),
 * so each block's product is one exact integer dot (vpdpbusd with VNNI, else vpmaddubsw +
 * vpmaddwd) scaled once in float. The +128 of I8/I8H is taken back inside the integer
 * accumulator (it starts at -128 x the activations' 4-byte sums), the min term of U4M/U8M uses
 * each block's sum of quantized x. AVX-512 (VNNI) takes two blocks per instruction, AVX2 one.
 *
 * Bit-identity: every output element (weight row n, activation row r) is computed by the
 * same instruction sequence whatever the number of rows in the pass and wherever r sits in
 * its 4-row tile (the tile only shares the weight unpacking), so a verify row's logits equal
 * decoding it alone. Built with -ffp-contract=off so that the compiler never fuses float
 * ops differently between the tile sizes.
 */
#include <math.h>
#include <stdint.h>
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

enum { FMT_U4M = 0, FMT_U8M = 1, FMT_I8 = 2, FMT_I8H = 3 };

#define INLINE static inline __attribute__((always_inline))

const char *sd_isa(void) {
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

/* -- activations: x [rows, k] -> xq int8 [rows, k]; dx8 [rows, k/4] (each block's scale d =
 * max|x| / 127, 8 times: one per lane of its products); bs32 [rows, k/32] (d x the block's sum of
 * xq: the min term then sees the same x as the integer term, so an offset such as Q4_0's -8 s
 * cancels exactly); nxl [rows, k/4] (-128 x each 4 values' sum of xq, the I8 bias). -- */
void sd_prepare(const float *x, int64_t rows, int64_t k, int8_t *xq, float *dx8, float *bs32, int32_t *nxl) {
    const int64_t nb = k / 32;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *v = x + r * k + 32 * b;
            int8_t *q = xq + r * k + 32 * b;
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) {
                float a = fabsf(v[i]);
                amax = a > amax ? a : amax;
            }
            const float d = amax / 127.0f;
            const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
            for (int i = 0; i < 32; i++) {
                float t = nearbyintf(v[i] * id);
                t = t > 127.0f ? 127.0f : (t < -127.0f ? -127.0f : t);
                q[i] = (int8_t)t;
            }
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
    const __m512i quad_idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
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
        if (FMT == FMT_I8H)
            sv = _mm512_permutexvar_ps(quad_idx, _mm512_castps128_ps512(_mm_loadu_ps(s + 4 * p)));
        else
            sv = _mm512_permutexvar_ps(pair_idx, _mm512_castps128_ps512(
                     _mm_castpd_ps(_mm_load_sd((const double *)(s + 2 * p)))));
        for (int j = 0; j < R; j++) {
            const __m512i xv = _mm512_loadu_si512((const void *)(xq + j * k + 64 * p));
            const __m512i init = (FMT == FMT_I8 || FMT == FMT_I8H)
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

/* the exact integer dot of one 32-block: weights w (u8, or q + 128 for I8/I8H), activations xv */
INLINE __m256i block_dot(const int FMT, __m256i w, __m256i xv, const int32_t *nxl) {
    const int is_signed = FMT == FMT_I8 || FMT == FMT_I8H;
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
        if (FMT == FMT_I8H)
            sv = _mm256_set_m128(_mm_set1_ps(s[2 * b + 1]), _mm_set1_ps(s[2 * b]));
        else
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
            int32_t isum[2] = {0, 0};
            for (int i = 0; i < 32; i++) isum[i / 16] += weight_at(FMT, q, 32 * b + i) * x[i];
            const float d = dx8[j * (k / 4) + 8 * b];
            if (FMT == FMT_I8H) {
                acc = acc + (float)isum[0] * (s[2 * b] * d);
                acc = acc + (float)isum[1] * (s[2 * b + 1] * d);
            } else {
                acc = acc + (float)(isum[0] + isum[1]) * (s[b] * d);
            }
        }
        if (FMT == FMT_U4M || FMT == FMT_U8M)
            for (int64_t b = 0; b < nb; b++) acc = acc + m[b] * bs32[j * nb + b];
        out[j * out_stride] = acc;
    }
}
#endif

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
TILES(tiles_i8h, FMT_I8H)

/* out[r, n] = sum_k W[n, k] x[r, k] for weight rows n0 <= n < n1 and every activation row r.
 * q [N, q_stride] bytes, s and m [N, s_stride] floats, fmt [N] (a layout per row: a fused
 * q/k/v matrix may mix them); xq/dx8/bs32/nxl from sd_prepare; out [rows, out_stride]. */
void sd_qmatmul(const uint8_t *q, const float *s, const float *m, const int8_t *fmt, int64_t q_stride,
                int64_t s_stride, int64_t k, const int8_t *xq, const float *dx8, const float *bs32,
                const int32_t *nxl, int64_t rows, float *out, int64_t out_stride, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *qn = q + n * q_stride;
        const float *sn = s + n * s_stride, *mn = m + n * s_stride;
        for (int64_t r0 = 0; r0 < rows; r0 += 4) {
            const int R = rows - r0 < 4 ? (int)(rows - r0) : 4;
            const int8_t *x = xq + r0 * k;
            const float *d = dx8 + r0 * (k / 4), *b32 = bs32 + r0 * (k / 32);
            const int32_t *l = nxl + r0 * (k / 4);
            float *o = out + r0 * out_stride + n;
            switch (fmt[n]) {
            case FMT_U4M: tiles_u4m(R, qn, sn, mn, k, x, d, b32, l, o, out_stride); break;
            case FMT_U8M: tiles_u8m(R, qn, sn, mn, k, x, d, b32, l, o, out_stride); break;
            case FMT_I8: tiles_i8(R, qn, sn, mn, k, x, d, b32, l, o, out_stride); break;
            default: tiles_i8h(R, qn, sn, mn, k, x, d, b32, l, o, out_stride); break;
            }
        }
    }
}

/* rows of the dequantized matrix (the token embedding lookup): out [len(ids), k] */
void sd_dequantize_rows(const uint8_t *q, const float *s, const float *m, const int8_t *fmt, int64_t q_stride,
                        int64_t s_stride, int64_t k, const int64_t *ids, int64_t n_ids, float *out) {
    for (int64_t i = 0; i < n_ids; i++) {
        const int64_t n = ids[i];
        const uint8_t *qn = q + n * q_stride;
        const float *sn = s + n * s_stride, *mn = m + n * s_stride;
        float *o = out + i * k;
        for (int64_t e = 0; e < k; e++) {
            const int64_t b = e / 32, j = e % 32;
            switch (fmt[n]) {
            case FMT_U4M:
                o[e] = sn[b] * (float)((b & 1) ? (qn[32 * (b / 2) + j] >> 4) : (qn[32 * (b / 2) + j] & 15)) + mn[b];
                break;
            case FMT_U8M: o[e] = sn[b] * (float)qn[e] + mn[b]; break;
            case FMT_I8: o[e] = sn[b] * (float)((int32_t)qn[e] - 128); break;
            default: o[e] = sn[e / 16] * (float)((int32_t)qn[e] - 128); break;
            }
        }
    }
}
