/* GMAC/s of the AVX-512 16-row K-quant tiles (qkernels_x16.h) on one core, against the vpdpbusd zmm pipe's own
 * rate: the measurements behind docs/performance.md's Zen 4 thirty-fifth session. It includes the kernels'
 * source, so a -D flag or an edited copy of qkernels_x16.h is measured as built:
 *
 *     gcc -O3 -march=native -ffp-contract=off -std=gnu11 scripts/x16_rate.c -o /tmp/x16_rate -lm
 *     for r in 1 2 4 8; do /tmp/x16_rate $r 6; /tmp/x16_rate $r 4; done      # Q6_K, Q4_K, one group in L1
 *     /tmp/x16_rate 8 6 400                                                 # 400 groups: 8 MB, out of L2
 *     /tmp/x16_rate 8 6 4000 & /tmp/x16_rate 8 6 4000; wait                 # both cores streaming 81 MB
 *     /tmp/x16_rate peak                                                    # independent vpdpbusd zmm alone
 *
 * Arguments: activation rows R (1-8), 4, 5 or 6 (Q4_K, Q5_K or Q6_K) or 40, 41, 50, 80 (the 32-value types Q4_0, Q4_1,
 * Q5_0, Q8_0), groups of 16 x 1536 weights (default 1: 14-20 KB for the K-quants). Random valid blocks (d = 1),
 * best of 15 repetitions of ~2 GMAC. Build on an AVX-512 VNNI CPU: elsewhere the file compiles the portable
 * reference, which says nothing about speed. */
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
        fprintf(stderr, "usage: %s ROWS 4|5|6|40|41|50|80 [GROUPS] | peak\n", argv[0]);
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
    /* the types by their argument: layout, name, and the f16 fields a block of 16 rows starts with (d; Q4_K's
     * dmin, Q4_1's m), set to 1.0 */
    static const struct { int arg, fmt; const char *name; int halves; } types[] = {
        {4, FMT_Q4KX16, "Q4_K", 32}, {5, FMT_Q5KX16, "Q5_K", 32}, {6, FMT_Q6KX16, "Q6_K", 16}, {40, FMT_Q40X16, "Q4_0", 16},
        {41, FMT_Q41X16, "Q4_1", 32}, {50, FMT_Q50X16, "Q5_0", 16}, {80, FMT_Q80X16, "Q8_0", 16},
    };
    const int R = atoi(argv[1]), arg = argc > 2 ? atoi(argv[2]) : 4, groups = argc > 3 ? atoi(argv[3]) : 1;
    int ti = 0;
    while (ti < 7 && types[ti].arg != arg) ti++;
    if (R < 1 || R > 8 || groups < 1 || ti == 7) {
        fprintf(stderr, "rows 1-8, a type 4, 5, 6, 40, 41, 50 or 80, groups >= 1\n");
        return 2;
    }
    const int fmt = types[ti].fmt, kq = kx16_layout(fmt);
    const int64_t k = 1536, nsb = k / (kq ? QK : 32);
    const int64_t sb = fmt == FMT_Q6KX16                        ? Q6KX16_BYTES
                     : fmt == FMT_Q4KX16 || fmt == FMT_Q5KX16 ? q45_bytes(X16, fmt == FMT_Q5KX16)
                                                              : bx_bytes(X16, bx16_narrow(fmt));
    const size_t gbytes = (size_t)sb * nsb;
    /* on 2 MB pages, as a loaded model's weights are (numpy asks for transparent huge pages: a loaded 1.5B holds
     * 1.1 GB of AnonHugePages); on 4 KB pages, streamed 8-row Q6_K read 100-105 GMAC/s against 123-128 */
    const size_t wbytes = (gbytes * groups + (1 << 21) - 1) & ~(size_t)((1 << 21) - 1);
    uint8_t *w = aligned_alloc(1 << 21, wbytes);
    madvise(w, wbytes, MADV_HUGEPAGE);
    for (size_t i = 0; i < gbytes * groups; i++) w[i] = (uint8_t)rand();
    for (int g = 0; g < groups; g++)
        for (int64_t b = 0; b < nsb; b++)
            for (int i = 0; i < types[ti].halves; i++) {
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
    float *out = aligned_alloc(64, 64 * ((4 * R * 16 * groups + 63) / 64));
    for (int i = 0; i < R * k; i++) xk[i] = (int8_t)rand();
    for (int i = 0; i < R * nsb; i++) dk[i] = 1.0f;
    for (int i = 0; i < R * k / 16; i++) bk[i] = (int16_t)(rand() % 2000 - 1000);
    const size_t bw_bytes = 4 * (size_t)R * (size_t)BW_WORDS(k);
    int32_t *bw = aligned_alloc(64, (bw_bytes + 63) / 64 * 64);
    for (int r = 0; r < R; r++) k_sum_words(k, bk + r * (k / 16), bw + r * BW_WORDS(k));
    const long iters = (long)(2e9 / (16.0 * k * R * groups)) + 1;
    double best = 1e9;
    for (int rep = 0; rep < 15; rep++) {
        const double t0 = now();
        for (long it = 0; it < iters; it++)
            for (int g = 0; g < groups; g++)
                x16_group(fmt, w + g * gbytes, k, xq, dx8, bs32, xk, dk, bk, bw, R, out + 16 * g, 16 * (int64_t)groups);
        const double t = now() - t0;
        if (t < best) best = t;
    }
    printf("%s, %d row(s), %d group(s) of 16 x %lld: %.1f GMAC/s one core (out[0] %g)\n", types[ti].name, R,
           groups, (long long)k, iters * 16.0 * k * R * groups / best / 1e9, out[0]);
    return 0;
}
