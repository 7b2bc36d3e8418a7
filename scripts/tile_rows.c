/* Cycles per vpmaddubsw of the AVX2 Q4_K tile's hot loop alone (a broadcast activation load, a vpmaddubsw and
 * an int16 add a row a step; weights and activations held in L1), by activation rows R: the measurement behind
 * qkernels_x8.h's 8-row AVX2 tiles (docs/performance.md, Zen 2, twenty-ninth session):
 *
 *     for r in 2 4 6 8; do gcc -O3 -march=native -DR=$r scripts/tile_rows.c -o /tmp/tile$r && /tmp/tile$r 3.35; done
 *
 * (the argument: the clock in GHz). "products only" is the pipe's bound: the same vpmaddubsw and adds with
 * nothing loaded. On Zen 2 (two runs): 1.47-1.48 / 1.23 / 1.17-1.18 / 1.17 cycles at 2 / 4 / 6 / 8 rows,
 * 1.00 products only. */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "clock.h"
#ifndef R
#define R 4
#endif

static inline __m256i bcast(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* 8 sub-blocks of 8 steps a round over 1 KB of weights (as the tile: a pair's low and high nibbles) */
__attribute__((noinline)) static __m256i tile(const uint8_t *w, const int8_t *x, long reps) {
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256i total = _mm256_setzero_si256();
    for (long n = 0; n < reps; n++)
        for (int j = 0; j < 8; j++) {
            const uint8_t *qs = w + 256 * (j / 2);
            __m256i a[R];
            for (int r = 0; r < R; r++) a[r] = _mm256_setzero_si256();
#pragma GCC unroll 2
            for (int t = 0; t < 8; t++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * t));
                const __m256i wt = _mm256_and_si256((j & 1) ? _mm256_srli_epi16(v, 4) : v, m4);
                for (int r = 0; r < R; r++)
                    a[r] = _mm256_add_epi16(a[r], _mm256_maddubs_epi16(wt, bcast(x + 256 * r + 32 * j + 4 * t)));
            }
            for (int r = 0; r < R; r++) total = _mm256_add_epi32(total, _mm256_madd_epi16(a[r], m4));
        }
    return total;
}

/* four independent chains of vpmaddubsw and an add, operands in registers */
__attribute__((noinline)) static __m256i products(const uint8_t *w, const int8_t *x, long n) {
    __m256i v = _mm256_loadu_si256((const __m256i *)w);
    const __m256i x0 = bcast(x), x1 = bcast(x + 4), x2 = bcast(x + 8), x3 = bcast(x + 12);
    __m256i a0 = v, a1 = v, a2 = v, a3 = v;
    for (long i = 0; i < n; i++) {
        a0 = _mm256_add_epi16(a0, _mm256_maddubs_epi16(v, x0));
        a1 = _mm256_add_epi16(a1, _mm256_maddubs_epi16(v, x1));
        a2 = _mm256_add_epi16(a2, _mm256_maddubs_epi16(v, x2));
        a3 = _mm256_add_epi16(a3, _mm256_maddubs_epi16(v, x3));
        __asm__("" : "+x"(v));
    }
    return _mm256_add_epi16(_mm256_add_epi16(a0, a1), _mm256_add_epi16(a2, a3));
}

int main(int argc, char **argv) {
    const double ghz = argc > 1 ? atof(argv[1]) : 3.0;
    const long reps = 2000000;
    uint8_t *w = aligned_alloc(64, 4096);
    int8_t *x = aligned_alloc(64, 4096);
    for (int i = 0; i < 4096; i++) {
        w[i] = (uint8_t)rand();
        x[i] = (int8_t)(rand() % 100);
    }
    double t0 = now();
    __m256i s = tile(w, x, reps);
    printf("%d rows: %.2f cycles a vpmaddubsw\n", R, (now() - t0) * ghz * 1e9 / (reps * 64.0 * R));
    t0 = now();
    s = _mm256_add_epi32(s, products(w, x, reps * 64));
    printf("products only: %.2f cycles a vpmaddubsw\n", (now() - t0) * ghz * 1e9 / (reps * 64.0 * 4));
    int32_t o[8];
    _mm256_storeu_si256((__m256i *)o, s);
    return o[0] == 12345;
}
