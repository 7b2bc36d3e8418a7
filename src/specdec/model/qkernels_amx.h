/* AMX tiles for interleaved Q4_K (included by qkernels.c after qkernels_x8.h).
 *
 * A pass of several activation rows against Q4KX8 weights is bound by the products on AVX-512 (one
 * vpdpbusd is 64 multiply-adds); an AMX tile instruction does 16 x 16 x 32 = 8192. Two interleaved
 * groups (16 weight rows) are unpacked, one 32-value sub-block at a time, into a B tile of 8 rows x 64
 * bytes: row t holds step t (4 values) of the 16 weight rows, u8 nibbles, which is the layout TDPBSUD
 * reads (src2, VNNI-packed); the A tile is up to 16 activation rows of the sub-block (q8_K int8, src1,
 * read in place with the row stride k). C[m][n] = the exact int32 dot of activation row m and weight
 * row n over the sub-block, then scaled by the sub-block's scale of row n (vpmulld) and summed over
 * the super-block: the same integers as every other path, followed by the same fused float steps, so
 * a row's bits do not depend on whether AMX, AVX-512, AVX2 or C computed it.
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

/* tiles 0..3: C of A-tile i [rows x 16 int32]; 4: A [16 x 32 int8]; 5: the last A [last x 32]; 6: B [8 x 64 u8] */
static void amx_configure(int blocks, int last) {
    struct amx_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < blocks; i++) cfg.rows[i] = (uint8_t)(i == blocks - 1 ? last : AMX_ROWS), cfg.colsb[i] = 64;
    cfg.rows[4] = AMX_ROWS, cfg.colsb[4] = 32;
    cfg.rows[5] = (uint8_t)last, cfg.colsb[5] = 32;
    cfg.rows[6] = 8, cfg.colsb[6] = 64;
    _tile_loadconfig(&cfg);
}

/* sub-block j of super-block blk of groups g0, g1 as a B tile: row t = step t of weight rows 0..15 */
INLINE void q4x8_pair_b_tile(const uint8_t *blk0, const uint8_t *blk1, int j, uint8_t *tile) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const uint8_t *q0 = blk0 + 160 + 256 * (j / 2), *q1 = blk1 + 160 + 256 * (j / 2);
    for (int t = 0; t < 8; t++) {
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(q0 + 32 * t));
        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(q1 + 32 * t));
        _mm256_storeu_si256((__m256i *)(tile + 64 * t), _mm256_and_si256((j & 1) ? _mm256_srli_epi16(v0, 4) : v0, m4));
        _mm256_storeu_si256((__m256i *)(tile + 64 * t + 32), _mm256_and_si256((j & 1) ? _mm256_srli_epi16(v1, 4) : v1, m4));
    }
}

INLINE __m512i u8x16_epi32(const uint8_t *lo, const uint8_t *hi) {  /* 8 + 8 bytes (rows 0..7, 8..15) */
    int64_t a, b;
    memcpy(&a, lo, 8), memcpy(&b, hi, 8);
    return _mm512_cvtepu8_epi32(_mm_set_epi64x(b, a));
}

INLINE __m512 f16x16_ps(const uint8_t *lo, const uint8_t *hi) {  /* 8 + 8 float16 */
    const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)lo)),
                                              _mm_loadu_si128((const __m128i *)hi), 1);
    return _mm512_cvtph_ps(h);
}

/* A-tile i of a sweep (tile indices are immediates): its rows of the sub-block against B, into C i */
#define AMX_PRODUCT(i)                                                                                      \
    if (i < blocks) {                                                                                       \
        const int8_t *a = xk + (r0 + AMX_ROWS * (i)) * k + QK * b + 32 * j;                                 \
        _tile_zero(i);                                                                                      \
        if (i == blocks - 1) { _tile_loadd(5, a, k); _tile_dpbsud(i, 5, 6); }                               \
        else { _tile_loadd(4, a, k); _tile_dpbsud(i, 4, 6); }                                               \
    }
#define AMX_STORE(i) if (i < blocks) { _tile_stored(i, ctile + AMX_ROWS * 16 * (i), 64); }

/* activation rows 0 .. rows - 1 against the 16 weight rows of Q4KX8 groups g0, g1 (out[r * os + n],
 * n < 16), up to AMX_BLOCKS x 16 rows a sweep. Per lane the float steps are q4x8_epilogue's:
 * fmsub(d, sumi, dmin x msum), then fmadd. */
static void amx_q4x8_pair(const uint8_t *g0, const uint8_t *g1, int64_t k, const int8_t *xk, const float *dk,
                          const int16_t *bk, int64_t rows, float *out, int64_t os) {
    enum { SWEEP = AMX_ROWS * AMX_BLOCKS };
    const int64_t nsb = k / QK;
    uint8_t btile[8 * 64] __attribute__((aligned(64)));
    int32_t ctile[SWEEP * 16] __attribute__((aligned(64)));
    int32_t sumi[SWEEP * 16] __attribute__((aligned(64)));
    float acc[SWEEP * 16] __attribute__((aligned(64)));
    int configured = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += SWEEP) {
        const int m = rows - r0 < SWEEP ? (int)(rows - r0) : SWEEP;
        const int blocks = (m + AMX_ROWS - 1) / AMX_ROWS, last = m - AMX_ROWS * (blocks - 1);
        if (configured != 64 * blocks + last) amx_configure(blocks, last), configured = 64 * blocks + last;
        memset(acc, 0, sizeof(float) * 16 * m);
        for (int64_t b = 0; b < nsb; b++) {
            const uint8_t *blk0 = g0 + Q4KX8_BYTES * b, *blk1 = g1 + Q4KX8_BYTES * b;
            for (int j = 0; j < 8; j++) {
                q4x8_pair_b_tile(blk0, blk1, j, btile);
                _tile_loadd(6, btile, 64);
                AMX_PRODUCT(0) AMX_PRODUCT(1) AMX_PRODUCT(2) AMX_PRODUCT(3)
                AMX_STORE(0) AMX_STORE(1) AMX_STORE(2) AMX_STORE(3)
                const __m512i sc = u8x16_epi32(blk0 + 32 + 8 * j, blk1 + 32 + 8 * j);
                for (int r = 0; r < m; r++) {
                    const __m512i p = _mm512_mullo_epi32(_mm512_load_si512(ctile + 16 * r), sc);
                    _mm512_store_si512(sumi + 16 * r, j ? _mm512_add_epi32(_mm512_load_si512(sumi + 16 * r), p) : p);
                }
            }
            const __m512 vd = f16x16_ps(blk0, blk1), vm = f16x16_ps(blk0 + 16, blk1 + 16);
            __m512i mn[8];  /* sub-block j's mins of the 16 rows, in both 16-bit halves of each lane */
            for (int j = 0; j < 8; j++) {
                const __m512i v = u8x16_epi32(blk0 + 96 + 8 * j, blk1 + 96 + 8 * j);
                mn[j] = _mm512_or_si512(v, _mm512_slli_epi32(v, 16));
            }
            for (int r = 0; r < m; r++) {
                const int16_t *sums = bk + (r0 + r) * (k / 16) + 16 * b;
                __m512i msum = _mm512_setzero_si512();
                for (int j = 0; j < 8; j++) {  /* min_j x (sums[2j] + sums[2j + 1]), as vpmaddwd on the other paths */
                    int32_t pair;
                    memcpy(&pair, sums + 2 * j, 4);
                    msum = _mm512_add_epi32(msum, _mm512_madd_epi16(mn[j], _mm512_set1_epi32(pair)));
                }
                const __m512 t = _mm512_fmsub_ps(vd, _mm512_cvtepi32_ps(_mm512_load_si512(sumi + 16 * r)),
                                                 _mm512_mul_ps(vm, _mm512_cvtepi32_ps(msum)));
                _mm512_store_ps(acc + 16 * r, _mm512_fmadd_ps(_mm512_set1_ps(dk[(r0 + r) * nsb + b]), t, _mm512_load_ps(acc + 16 * r)));
            }
        }
        for (int r = 0; r < m; r++) _mm512_storeu_ps(out + (r0 + r) * os, _mm512_load_ps(acc + 16 * r));
    }
    _tile_release();
}
#endif
