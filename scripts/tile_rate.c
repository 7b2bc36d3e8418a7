/* GMAC/s of the interleaved tiles on one core: AVX-512 VNNI builds run the 16-row groups (qkernels_x16.h), every
 * other build the 8-row groups (qkernels_x8.h), as a product picks them on that CPU. It includes the kernels' source,
 * so a -D flag or an edited copy of a header is measured as built:
 *
 *     gcc -O3 -march=native -ffp-contract=off -std=gnu11 scripts/tile_rate.c -o /tmp/tile_rate -lm
 *     for r in 1 2 4 8; do /tmp/tile_rate $r 6; /tmp/tile_rate $r 4; done      # Q6_K, Q4_K, one group in L1
 *     /tmp/tile_rate 8 6 400                                                 # 400 groups: 8 MB, out of L2
 *     /tmp/tile_rate 8 6 4000 & /tmp/tile_rate 8 6 4000; wait                 # both cores streaming (16-row: 81 MB)
 *     /tmp/tile_rate peak                                                    # independent vpdpbusd zmm alone
 *     gcc ... -mno-avx512f ... -o /tmp/tile_rate2                            # the 8-row (AVX2) tiles on this CPU
 *     /tmp/tile_rate2 1 4 16000 4                                            # AVX2 without VNNI: x8_streams, 4 groups a call
 *
 * Arguments: activation rows R (1-8), 4, 5 or 6 (Q4_K, Q5_K or Q6_K) or 40, 41, 50, 80 (the 32-value types Q4_0, Q4_1,
 * Q5_0, Q8_0), groups of 16 (or 8) x 1536 weights (default 1: 14-20 KB of a 16-row K-quant group), and on AVX2
 * builds without VNNI the groups a call of the 1-2 row streaming reader x8_streams takes (default 0: each group on
 * its own, x8_group; a product hands x8_streams its spans, 4-20 groups for the 1.5B's q/k/v and output matrices).
 * Random valid blocks (d = 1), best of 15 repetitions of ~2 GMAC. On a build without AVX2 the file runs the
 * portable reference, which says nothing about speed. */
#include "../src/specdec/model/qkernels.c"
#include <stdio.h>
#include <stdlib.h>
#include "clock.h"
#include <sys/mman.h>

#if defined(SD_AVX512)
static void peak(void) {  /* 12 independent chains: the pipe's throughput, not one chain's latency */
    __m512i a[12];
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_epi32(i);
    const __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
    const long n = 200000000;
    const double t0 = now();
    for (long i = 0; i < n; i++) {
#pragma GCC unroll 12
        for (int c = 0; c < 12; c++) a[c] = _mm512_dpbusd_epi32(a[c], w, x);
        __asm__ volatile("" : : "v"(w), "v"(x));
    }
    const double t = now() - t0;
    __m512i s = a[0];
    for (int c = 1; c < 12; c++) s = _mm512_add_epi32(s, a[c]);
    printf("vpdpbusd zmm: %.2f G/s = %.1f GMAC/s one core (%d)\n", n * 12 / t / 1e9, n * 12 * 64 / t / 1e9,
           _mm512_reduce_add_epi32(s));
}
#endif

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s ROWS 4|5|6|40|41|50|80 [GROUPS [SPAN]] | peak\n", argv[0]);
        return 2;
    }
    if (argv[1][0] == 'p') {
#if defined(SD_AVX512)
        peak();
        return 0;
#else
        fprintf(stderr, "no AVX-512 VNNI in this build\n");
        return 1;
#endif
    }
    /* the types by their argument: name, 16- and 8-row layout, and whether a block's per-row f16 fields (d, set
     * to 1.0) come with a second run of them (Q4_K's dmin, Q4_1's m, also 1.0) */
    static const struct { int arg; const char *name; int fmt16, fmt8, two; } types[] = {
        {4, "Q4_K", FMT_Q4KX16, FMT_Q4KX8, 1}, {5, "Q5_K", FMT_Q5KX16, FMT_Q5KX8, 1}, {6, "Q6_K", FMT_Q6KX16, FMT_Q6KX8, 0},
        {40, "Q4_0", FMT_Q40X16, FMT_Q40X8, 0}, {41, "Q4_1", FMT_Q41X16, FMT_Q41X8, 1},
        {50, "Q5_0", FMT_Q50X16, FMT_Q50X8, 0}, {80, "Q8_0", FMT_Q80X16, FMT_Q80X8, 0},
    };
    const int R = atoi(argv[1]), arg = argc > 2 ? atoi(argv[2]) : 4, groups = argc > 3 ? atoi(argv[3]) : 1;
    const int span = argc > 4 ? atoi(argv[4]) : 0;
    int ti = 0;
    while (ti < 7 && types[ti].arg != arg) ti++;
    if (R < 1 || R > 8 || groups < 1 || ti == 7 || span < 0) {
        fprintf(stderr, "rows 1-8, a type 4, 5, 6, 40, 41, 50 or 80, groups >= 1, span >= 0\n");
        return 2;
    }
#if defined(SD_AVX512)
    const int G = X16, fmt = types[ti].fmt16, f8 = kx16_layout(fmt) ? fmt : bx16_narrow(fmt);
#else
    const int G = X8, fmt = types[ti].fmt8, f8 = fmt;
#endif
    const int kq = arg < 10;  /* a K-quant: Q4_K, Q5_K, Q6_K */
#if defined(SD_AVX2) && !defined(SD_VNNI)
    if (span && R > (kq ? STREAM_ROWS : STREAM_B32_ROWS)) {
        fprintf(stderr, "x8_streams takes %d row(s) of this type\n", kq ? STREAM_ROWS : STREAM_B32_ROWS);
        return 2;
    }
#else
    if (span) {
        fprintf(stderr, "a span is x8_streams', which only AVX2 builds without VNNI run\n");
        return 2;
    }
#endif
    const int64_t k = 1536, nsb = k / (kq ? QK : 32);
    const int64_t sb = arg == 6 ? (G == X16 ? Q6KX16_BYTES : Q6KX8_BYTES) : kq ? q45_bytes(G, arg == 5) : bx_bytes(G, f8);
    const size_t gbytes = (size_t)sb * nsb;
    /* on 2 MB pages, as a loaded model's weights are (numpy asks for transparent huge pages: a loaded 1.5B holds
     * 1.1 GB of AnonHugePages); on 4 KB pages, streamed 8-row Q6_K read 100-105 GMAC/s against 123-128 */
    const size_t wbytes = (gbytes * groups + (1 << 21) - 1) & ~(size_t)((1 << 21) - 1);
    uint8_t *w = aligned_alloc(1 << 21, wbytes);
    madvise(w, wbytes, MADV_HUGEPAGE);
    for (size_t i = 0; i < gbytes * groups; i++) w[i] = (uint8_t)rand();
    for (int g = 0; g < groups; g++)
        for (int64_t b = 0; b < nsb; b++)
            for (int i = 0; i < G * (1 + types[ti].two); i++) {
                w[g * gbytes + sb * b + 2 * i] = 0;
                w[g * gbytes + sb * b + 2 * i + 1] = 0x3C;
            }
    int8_t *xq = aligned_alloc(64, 64 * ((R * k + 63) / 64));
    float *dx8 = aligned_alloc(64, 64 * ((4 * R * (k / 4) + 63) / 64));
    float *bs32 = aligned_alloc(64, 64 * ((4 * R * (k / 32) + 63) / 64));
    for (int i = 0; i < R * k; i++) xq[i] = (int8_t)rand();
    for (int i = 0; i < R * k / 4; i++) dx8[i] = 1.0f;
    for (int i = 0; i < R * k / 32; i++) bs32[i] = (float)(rand() % 2000 - 1000);
    int8_t *xk = aligned_alloc(64, R * k);
    float *dk = aligned_alloc(64, 64 * ((4 * R * nsb + 63) / 64));
    int16_t *bk = aligned_alloc(64, 64 * ((2 * R * k / 16 + 63) / 64));
    float *out = aligned_alloc(64, 64 * ((4 * R * G * groups + 63) / 64));
    for (int i = 0; i < R * k; i++) xk[i] = (int8_t)rand();
    for (int i = 0; i < R * nsb; i++) dk[i] = 1.0f;
    for (int i = 0; i < R * k / 16; i++) bk[i] = (int16_t)(rand() % 2000 - 1000);
    const size_t bw_bytes = 4 * (size_t)R * (size_t)BW_WORDS(k);
    int32_t *bw = aligned_alloc(64, (bw_bytes + 63) / 64 * 64);
    for (int r = 0; r < R; r++) k_sum_words(k, bk + r * (k / 16), bw + r * BW_WORDS(k));
    const long iters = (long)(2e9 / ((double)G * k * R * groups)) + 1;
    const int64_t os = (int64_t)G * groups;
    double best = 1e9;
    for (int rep = 0; rep < 15; rep++) {
        const double t0 = now();
        for (long it = 0; it < iters; it++) {
#if defined(SD_AVX2) && !defined(SD_VNNI)
            for (int g0 = 0; span && g0 < groups; g0 += span) {  /* as sd_qmatmul hands a span to x8_streams */
                const int n = groups - g0 < span ? groups - g0 : span;
                if (n >= STREAMS)
                    x8_streams(fmt, w + g0 * gbytes, gbytes, n, k, xq, dx8, bs32, xk, dk, bk, R, out + G * g0, os);
                else
                    for (int g = g0; g < g0 + n; g++) x8_group(fmt, w + g * gbytes, k, xq, dx8, bs32, xk, dk, bk, R, out + G * g, os);
            }
            if (span) continue;
#endif
            for (int g = 0; g < groups; g++)
#if defined(SD_AVX512)
                x16_group(fmt, w + g * gbytes, k, xq, dx8, bs32, xk, dk, bk, bw, R, out + G * g, os);
#else
                x8_group(fmt, w + g * gbytes, k, xq, dx8, bs32, xk, dk, bk, R, out + G * g, os);
#endif
        }
        const double t = now() - t0;
        if (t < best) best = t;
    }
    printf("%s, %d row(s), %d group(s) of %d x %lld%s: %.1f GMAC/s, %.1f GB/s one core (out[0] %g)\n", types[ti].name, R,
           groups, G, (long long)k, span ? ", x8_streams" : "", iters * (double)G * k * R * groups / best / 1e9,
           iters * (double)gbytes * groups / best / 1e9, out[0]);
    return 0;
}
