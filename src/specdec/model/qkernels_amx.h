/* AMX tiles for interleaved Q4_K and Q6_K (included by qkernels.c after qkernels_x8.h).
 *
 * A pass of several activation rows against interleaved weights is bound by the products on AVX-512
 * (one vpdpbusd is 64 multiply-adds); one AMX tile instruction does up to 16 x 16 x 32 = 8192. Two
 * interleaved groups (16 weight rows) are unpacked, one scale group at a time (Q4_K: a sub-block of 32
 * values; Q6_K: 16 values), into a B tile whose row t holds step t (4 values) of the 16 weight rows as
 * u8, the layout TDPBSUD reads (src2, VNNI-packed); the A tiles are 16 activation rows each of the same
 * values (q8_K int8, src1, read in place with the row stride k). C[m][n] = the exact int32 dot of
 * activation row m and weight row n over the scale group, then scaled by that group's scale of row n
 * (vpmulld) and summed over the super-block: the same integers as every other path, followed by the
 * same fused float steps, so a row's bits do not depend on whether AMX, AVX-512, AVX2 or C made them.
 *
 * Linux hands out the tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM); each call loads
 * its tile configuration (another library on the thread may have set its own) and releases the tiles.
 */
#if defined(SD_AVX512) && defined(__AVX512VL__) && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define SD_AMX 1
#include <sys/syscall.h>
long syscall(long number, ...);  /* unistd.h declares it only for _GNU_SOURCE, not -std=c11 */

/* activation rows per A tile, A tiles per sweep (each with its own C tile: four products in flight
 * share one B tile), and the fewest rows worth the tiles (fewer stay on AVX-512) */
enum { AMX_ROWS = 16, AMX_BLOCKS = 4, AMX_MIN_ROWS = 16 };

static int amx_state = -1;  /* -1: not asked yet, 0: refused, 1: granted */

/* whether this process may use the tiles (asked once; a benign race: every asker gets the same answer) */
static int amx_enabled(void) {
    if (amx_state < 0) amx_state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return amx_state;
}

struct amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed));

/* tiles 0..3: C of A-tile i [rows x 16 int32]; 4: A [16 x K int8]; 5: the last A [last x K];
 * 6: B [K / 4 x 64 u8]; K = the values of a scale group */
static void amx_configure(int blocks, int last, int group) {
    struct amx_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < blocks; i++) cfg.rows[i] = (uint8_t)(i == blocks - 1 ? last : AMX_ROWS), cfg.colsb[i] = 64;
    cfg.rows[4] = AMX_ROWS, cfg.colsb[4] = (uint16_t)group;
    cfg.rows[5] = (uint8_t)last, cfg.colsb[5] = (uint16_t)group;
    cfg.rows[6] = (uint8_t)(group / 4), cfg.colsb[6] = 64;
    _tile_loadconfig(&cfg);
}

INLINE void store_pair(uint8_t *row, __m256i w0, __m256i w1) {  /* a B tile row: weight rows 0..7, 8..15 */
    _mm256_storeu_si256((__m256i *)row, w0);
    _mm256_storeu_si256((__m256i *)(row + 32), w1);
}

/* scale group g (a sub-block of 32 values) of super-blocks blk0, blk1 as a B tile of 8 rows */
INLINE void q4x8_pair_b_tile(const uint8_t *blk0, const uint8_t *blk1, int g, uint8_t *tile) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const uint8_t *q0 = blk0 + 160 + 256 * (g / 2), *q1 = blk1 + 160 + 256 * (g / 2);
    for (int t = 0; t < 8; t++) {
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(q0 + 32 * t));
        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(q1 + 32 * t));
        store_pair(tile + 64 * t, _mm256_and_si256((g & 1) ? _mm256_srli_epi16(v0, 4) : v0, m4),
                   _mm256_and_si256((g & 1) ? _mm256_srli_epi16(v1, 4) : v1, m4));
    }
}

/* scale group g (16 values: chunk g / 2, steps 4 (g % 2) ..) of super-blocks blk0, blk1 as a B tile of 4 rows */
INLINE void q6x8_pair_b_tile(const uint8_t *blk0, const uint8_t *blk1, int g, uint8_t *tile) {
    const int c = g / 2, cc = c % 4;
    const int64_t at = 144 + 768 * (c / 4);
    for (int tt = 0; tt < 4; tt++) {
        const int64_t step = at + 96 * (4 * (g % 2) + tt);
        const uint8_t *b0 = blk0 + step, *b1 = blk1 + step;
        store_pair(tile + 64 * tt, q6x8_chunk(b0, cc), q6x8_chunk(b1, cc));
    }
}

INLINE __m512i u8x16_epi32(const uint8_t *lo, const uint8_t *hi) {  /* 8 + 8 bytes (rows 0..7, 8..15) */
    int64_t a, b;
    memcpy(&a, lo, 8), memcpy(&b, hi, 8);
    return _mm512_cvtepu8_epi32(_mm_set_epi64x(b, a));
}

INLINE __m512i i8x16_epi32(const uint8_t *lo, const uint8_t *hi) {
    int64_t a, b;
    memcpy(&a, lo, 8), memcpy(&b, hi, 8);
    return _mm512_cvtepi8_epi32(_mm_set_epi64x(b, a));
}

INLINE __m512 f16x16_ps(const uint8_t *lo, const uint8_t *hi) {  /* 8 + 8 float16 */
    const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)lo)),
                                              _mm_loadu_si128((const __m128i *)hi), 1);
    return _mm512_cvtph_ps(h);
}

/* the super-block's float steps for activation rows r < m: q4x8_epilogue's per lane (fmsub(d, sumi,
 * dmin x msum), then fmadd), the min term as vpmaddwd makes it on the other paths */
static void q4x8_pair_epilogue(const uint8_t *blk0, const uint8_t *blk1, const int32_t *sumi, const int16_t *bk,
                               int64_t k, int64_t b, const float *dk, int m, float *acc) {
    const int64_t nsb = k / QK;
    const __m512 vd = f16x16_ps(blk0, blk1), vm = f16x16_ps(blk0 + 16, blk1 + 16);
    __m512i mn[8];  /* sub-block j's mins of the 16 rows, in both 16-bit halves of each lane */
    for (int j = 0; j < 8; j++) {
        const __m512i v = u8x16_epi32(blk0 + 96 + 8 * j, blk1 + 96 + 8 * j);
        mn[j] = _mm512_or_si512(v, _mm512_slli_epi32(v, 16));
    }
    for (int r = 0; r < m; r++) {
        const int16_t *sums = bk + r * (k / 16) + 16 * b;
        __m512i msum = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            int32_t pair;
            memcpy(&pair, sums + 2 * j, 4);
            msum = _mm512_add_epi32(msum, _mm512_madd_epi16(mn[j], _mm512_set1_epi32(pair)));
        }
        const __m512 t = _mm512_fmsub_ps(vd, _mm512_cvtepi32_ps(_mm512_load_si512(sumi + 16 * r)),
                                         _mm512_mul_ps(vm, _mm512_cvtepi32_ps(msum)));
        _mm512_store_ps(acc + 16 * r, _mm512_fmadd_ps(_mm512_set1_ps(dk[r * nsb + b]), t, _mm512_load_ps(acc + 16 * r)));
    }
}

/* q6x8_epilogue's steps per lane: values are q - 32, so 32 x sum_g scale_g x bk_g is taken back first */
static void q6x8_pair_epilogue(const uint8_t *blk0, const uint8_t *blk1, const int32_t *sumi, const int16_t *bk,
                               int64_t k, int64_t b, const float *dk, int m, float *acc) {
    const int64_t nsb = k / QK;
    const __m512 vd = f16x16_ps(blk0, blk1);
    __m512i sc2[8];  /* row i's (scale 2gp, scale 2gp + 1) as int16 */
    for (int gp = 0; gp < 8; gp++) {
        const __m128i p0 = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(blk0 + 16 + 16 * gp)),
                                             _mm_loadl_epi64((const __m128i *)(blk0 + 24 + 16 * gp)));
        const __m128i p1 = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(blk1 + 16 + 16 * gp)),
                                             _mm_loadl_epi64((const __m128i *)(blk1 + 24 + 16 * gp)));
        sc2[gp] = _mm512_cvtepi8_epi16(_mm256_inserti128_si256(_mm256_castsi128_si256(p0), p1, 1));
    }
    for (int r = 0; r < m; r++) {
        const int16_t *sums = bk + r * (k / 16) + 16 * b;
        __m512i s = _mm512_load_si512(sumi + 16 * r);
        for (int gp = 0; gp < 8; gp++) {
            int32_t pair;
            memcpy(&pair, sums + 2 * gp, 4);
            s = _mm512_sub_epi32(s, _mm512_slli_epi32(_mm512_madd_epi16(sc2[gp], _mm512_set1_epi32(pair)), 5));
        }
        const __m512 t = _mm512_mul_ps(vd, _mm512_cvtepi32_ps(s));
        _mm512_store_ps(acc + 16 * r, _mm512_fmadd_ps(_mm512_set1_ps(dk[r * nsb + b]), t, _mm512_load_ps(acc + 16 * r)));
    }
}

/* A-tile i of a sweep (tile indices are immediates): its rows of the scale group against B, into C i */
#define AMX_PRODUCT(i)                                                                                      \
    if (i < blocks) {                                                                                       \
        const int8_t *a = xk + (r0 + AMX_ROWS * (i)) * k + QK * b + group * g;                              \
        _tile_zero(i);                                                                                      \
        if (i == blocks - 1) { _tile_loadd(5, a, k); _tile_dpbsud(i, 5, 6); }                               \
        else { _tile_loadd(4, a, k); _tile_dpbsud(i, 4, 6); }                                               \
    }
#define AMX_STORE(i) if (i < blocks) { _tile_stored(i, ctile + AMX_ROWS * 16 * (i), 64); }

/* activation rows 0 .. rows - 1 against the 16 weight rows of interleaved groups g0, g1 of layout fmt
 * (FMT_Q4KX8 or FMT_Q6KX8): out[r * os + n], n < 16, up to AMX_BLOCKS x 16 activation rows a sweep */
static void amx_x8_pair(int fmt, const uint8_t *g0, const uint8_t *g1, int64_t k, const int8_t *xk, const float *dk,
                        const int16_t *bk, int64_t rows, float *out, int64_t os) {
    enum { SWEEP = AMX_ROWS * AMX_BLOCKS };
    const int q4 = fmt == FMT_Q4KX8, group = q4 ? 32 : 16, bytes = q4 ? q45_bytes(X8, 0) : Q6KX8_BYTES;
    const uint8_t *scales0 = q4 ? g0 + 32 : g0 + 16, *scales1 = q4 ? g1 + 32 : g1 + 16;  /* group g's at 8 g */
    const int64_t nsb = k / QK;
    uint8_t btile[8 * 64] __attribute__((aligned(64)));
    int32_t ctile[SWEEP * 16] __attribute__((aligned(64)));
    int32_t sumi[SWEEP * 16] __attribute__((aligned(64)));
    float acc[SWEEP * 16] __attribute__((aligned(64)));
    int configured = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += SWEEP) {
        const int m = rows - r0 < SWEEP ? (int)(rows - r0) : SWEEP;
        const int blocks = (m + AMX_ROWS - 1) / AMX_ROWS, last = m - AMX_ROWS * (blocks - 1);
        if (configured != 64 * blocks + last) amx_configure(blocks, last, group), configured = 64 * blocks + last;
        memset(acc, 0, sizeof(float) * 16 * m);
        for (int64_t b = 0; b < nsb; b++) {
            const uint8_t *blk0 = g0 + bytes * b, *blk1 = g1 + bytes * b;
            for (int g = 0; g < QK / group; g++) {
                if (q4) q4x8_pair_b_tile(blk0, blk1, g, btile);
                else q6x8_pair_b_tile(blk0, blk1, g, btile);
                _tile_loadd(6, btile, 64);
                AMX_PRODUCT(0) AMX_PRODUCT(1) AMX_PRODUCT(2) AMX_PRODUCT(3)
                AMX_STORE(0) AMX_STORE(1) AMX_STORE(2) AMX_STORE(3)
                const __m512i sc = q4 ? u8x16_epi32(scales0 + bytes * b + 8 * g, scales1 + bytes * b + 8 * g)
                                      : i8x16_epi32(scales0 + bytes * b + 8 * g, scales1 + bytes * b + 8 * g);
                for (int r = 0; r < m; r++) {
                    const __m512i p = _mm512_mullo_epi32(_mm512_load_si512(ctile + 16 * r), sc);
                    _mm512_store_si512(sumi + 16 * r, g ? _mm512_add_epi32(_mm512_load_si512(sumi + 16 * r), p) : p);
                }
            }
            if (q4) q4x8_pair_epilogue(blk0, blk1, sumi, bk + r0 * (k / 16), k, b, dk + r0 * nsb, m, acc);
            else q6x8_pair_epilogue(blk0, blk1, sumi, bk + r0 * (k / 16), k, b, dk + r0 * nsb, m, acc);
        }
        for (int r = 0; r < m; r++) _mm512_storeu_ps(out + (r0 + r) * os, _mm512_load_ps(acc + 16 * r));
    }
    _tile_release();
}
#endif
