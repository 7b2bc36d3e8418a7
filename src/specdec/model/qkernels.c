/* Products of GGUF-quantized weight rows with a few activation rows, as integer dot products.
 *
 * Compiled on first use for the CPU at hand (cc -O3 -march=native, see clib.py) and called
 * from the numba layer stack (kernels.qproduct). Weights keep their blocks' bits, repacked
 * at load (quant.py) into one of four layouts, each row of K values:
 *
 *   U4M  4-bit q, 16 bytes per 32 values (byte j: value j low nibble, value j+16 high),
 *        value = s[b] * q + m[b] per 32-block        (Q4_0 with m = -8 s, Q4_1, Q4_K)
 *   U8M  one byte per q (0..31), value = s[b] * q + m[b]   (Q5_0, Q5_1, Q5_K)
 *   I8   signed byte q, value = s[b] * q per 32      (Q8_0)
 *   I8H  signed byte q, value = s[h] * q per 16      (Q6_K)
 *
 * Activation rows are quantized per 32-block to int8 (llama.cpp's q8_0 route: d = max|x| / 127),
 * so each block's product is one exact integer dot (vpdpbusd with VNNI, else vpmaddubsw +
 * vpmaddwd) scaled once in float; the min term of U4M/U8M uses each block's sum of quantized x.
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

enum { FMT_U4M = 0, FMT_U8M = 1, FMT_I8 = 2, FMT_I8H = 3 };

#define INLINE static inline __attribute__((always_inline))

const char *sd_isa(void) {
#if defined(SD_AVX2) && (defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__)))
    return "avx2+vnni";
#elif defined(SD_AVX2)
    return "avx2";
#else
    return "scalar";
#endif
}

/* -- activations: x [rows, k] -> xq int8 [rows, k], dx [rows, k/32] (the scales) and bs32 [rows, k/32]
 * (each block's sum as quantized, dx * sum(xq): the min term then sees the same x as the integer
 * term, so an offset such as Q4_0's -8 s cancels exactly) -- */
void sd_prepare(const float *x, int64_t rows, int64_t k, int8_t *xq, float *dx, float *bs32) {
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
            for (int i = 0; i < 32; i++) sum += q[i];
            dx[r * nb + b] = d;
            bs32[r * nb + b] = d * (float)sum;
        }
    }
}

#ifdef SD_AVX2
INLINE __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

INLINE float hsum(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* sum_i m[i] * bs[i] for i < n, 8 lanes, the tail masked (a masked lane adds an exact 0) */
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

/* R activation rows (R <= 4, a compile-time constant after inlining) against one weight row */
INLINE void tile(const int R, const int FMT, const uint8_t *q, const float *s, const float *m, int64_t k,
                 const int8_t *xq, const float *dx, const float *bs32,
                 float *out, int64_t out_stride) {
    const int64_t nb = k / 32;
    __m256 acc[4];
    for (int j = 0; j < R; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i w, wa = _mm256_setzero_si256();
        __m256 sv;
        if (FMT == FMT_U4M) {
            const __m128i v = _mm_loadu_si128((const __m128i *)(q + 16 * b));
            w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0F));
        } else {
            w = _mm256_loadu_si256((const __m256i *)(q + 32 * b));
        }
        if (FMT == FMT_I8 || FMT == FMT_I8H) wa = _mm256_abs_epi8(w);
        if (FMT == FMT_I8H)
            sv = _mm256_set_m128(_mm_set1_ps(s[2 * b + 1]), _mm_set1_ps(s[2 * b]));
        else
            sv = _mm256_set1_ps(s[b]);
        for (int j = 0; j < R; j++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + j * k + 32 * b));
            __m256i p;
            if (FMT == FMT_I8 || FMT == FMT_I8H)
                p = dot_u8s8(wa, _mm256_sign_epi8(xv, w));
            else
                p = dot_u8s8(w, xv);
            const __m256 scale = _mm256_mul_ps(sv, _mm256_broadcast_ss(dx + j * nb + b));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[j]);
        }
    }
    for (int j = 0; j < R; j++) {
        float t = hsum(acc[j]);
        if (FMT == FMT_U4M || FMT == FMT_U8M) t = t + min_dot(m, bs32 + j * nb, nb);
        out[j * out_stride] = t;
    }
}
#else  /* portable C: the same arithmetic per element, one value at a time */
INLINE void tile(const int R, const int FMT, const uint8_t *q, const float *s, const float *m, int64_t k,
                 const int8_t *xq, const float *dx, const float *bs32,
                 float *out, int64_t out_stride) {
    const int64_t nb = k / 32;
    for (int j = 0; j < R; j++) {
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; b++) {
            const int8_t *x = xq + j * k + 32 * b;
            int32_t isum[2] = {0, 0};
            for (int i = 0; i < 32; i++) {
                int32_t w;
                if (FMT == FMT_U4M) w = i < 16 ? (q[16 * b + i] & 15) : (q[16 * b + i - 16] >> 4);
                else if (FMT == FMT_U8M) w = q[32 * b + i];
                else w = (int8_t)q[32 * b + i];
                isum[i / 16] += w * x[i];
            }
            const float d = dx[j * nb + b];
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
                     const float *dx, const float *bs32, float *out, int64_t os) {       \
        switch (R) {                                                                                        \
        case 4: tile(4, FMT, q, s, m, k, xq, dx, bs32, out, os); break;                               \
        case 3: tile(3, FMT, q, s, m, k, xq, dx, bs32, out, os); break;                               \
        case 2: tile(2, FMT, q, s, m, k, xq, dx, bs32, out, os); break;                               \
        default: tile(1, FMT, q, s, m, k, xq, dx, bs32, out, os); break;                              \
        }                                                                                                   \
    }
TILES(tiles_u4m, FMT_U4M)
TILES(tiles_u8m, FMT_U8M)
TILES(tiles_i8, FMT_I8)
TILES(tiles_i8h, FMT_I8H)

/* out[r, n] = sum_k W[n, k] x[r, k] for weight rows n0 <= n < n1 and every activation row r.
 * q [N, q_stride] bytes, s and m [N, s_stride] floats, fmt [N] (a layout per row: a fused
 * q/k/v matrix may mix them); xq/dx/bs32 from sd_prepare; out [rows, out_stride]. */
void sd_qmatmul(const uint8_t *q, const float *s, const float *m, const int8_t *fmt, int64_t q_stride,
                int64_t s_stride, int64_t k, const int8_t *xq, const float *dx,
                const float *bs32, int64_t rows, float *out, int64_t out_stride, int64_t n0, int64_t n1) {
    const int64_t nb = k / 32;
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *qn = q + n * q_stride;
        const float *sn = s + n * s_stride, *mn = m + n * s_stride;
        for (int64_t r0 = 0; r0 < rows; r0 += 4) {
            const int R = rows - r0 < 4 ? (int)(rows - r0) : 4;
            const int8_t *x = xq + r0 * k;
            const float *d = dx + r0 * nb, *b32 = bs32 + r0 * nb;
            float *o = out + r0 * out_stride + n;
            switch (fmt[n]) {
            case FMT_U4M: tiles_u4m(R, qn, sn, mn, k, x, d, b32, o, out_stride); break;
            case FMT_U8M: tiles_u8m(R, qn, sn, mn, k, x, d, b32, o, out_stride); break;
            case FMT_I8: tiles_i8(R, qn, sn, mn, k, x, d, b32, o, out_stride); break;
            default: tiles_i8h(R, qn, sn, mn, k, x, d, b32, o, out_stride); break;
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
            case FMT_U4M: o[e] = sn[b] * (float)(j < 16 ? (qn[16 * b + j] & 15) : (qn[16 * b + j - 16] >> 4)) + mn[b]; break;
            case FMT_U8M: o[e] = sn[b] * (float)qn[e] + mn[b]; break;
            case FMT_I8: o[e] = sn[b] * (float)(int8_t)qn[e]; break;
            default: o[e] = sn[e / 16] * (float)(int8_t)qn[e]; break;
            }
        }
    }
}
