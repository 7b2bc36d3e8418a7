/* How fast cores read memory as one stream or as several in turn, with N vpmaddubsw a 32-byte vector
 * between reads (what a product does with its weights). The numbers behind qkernels_x8.h's x8_streams:
 *
 *     gcc -O2 -march=native -fopenmp scripts/read_streams.c -o /tmp/read_streams && /tmp/read_streams
 *     gcc ... -DBLK=2304 ...      # bytes a stream advances a turn (default 1152)
 *
 * Prints GB/s for 1 and 2 threads, N = 0 and 4, 1-8 streams a thread over 1 GiB (madvised huge pages). */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "clock.h"
#ifndef BLK
#define BLK 1152
#endif

/* n bytes from p, 128 a step, N vpmaddubsw a vector (N = 0: an OR, so every load is used) */
__attribute__((noinline)) static __m256i stream(const uint8_t *p, size_t n, int N) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    const __m256i x = _mm256_set1_epi8(3);
    for (size_t i = 0; i < n; i += 128) {
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(p + i)), v1 = _mm256_loadu_si256((const __m256i *)(p + i + 32));
        const __m256i v2 = _mm256_loadu_si256((const __m256i *)(p + i + 64)), v3 = _mm256_loadu_si256((const __m256i *)(p + i + 96));
        for (int j = 0; j < N; j++) {
            a0 = _mm256_add_epi16(a0, _mm256_maddubs_epi16(v0, x));
            a1 = _mm256_add_epi16(a1, _mm256_maddubs_epi16(v1, x));
            a2 = _mm256_add_epi16(a2, _mm256_maddubs_epi16(v2, x));
            a3 = _mm256_add_epi16(a3, _mm256_maddubs_epi16(v3, x));
            __asm__("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3));
        }
        if (N == 0) {
            a0 = _mm256_or_si256(a0, v0), a1 = _mm256_or_si256(a1, v1);
            a2 = _mm256_or_si256(a2, v2), a3 = _mm256_or_si256(a3, v3);
        }
    }
    return _mm256_add_epi16(_mm256_add_epi16(a0, a1), _mm256_add_epi16(a2, a3));
}

/* n bytes as S equal streams, BLK bytes of each in turn */
static int streams(const uint8_t *p, size_t n, int N, int S) {
    __m256i s = _mm256_setzero_si256();
    const size_t part = n / S / BLK * BLK;
    for (size_t o = 0; o < part; o += BLK)
        for (int t = 0; t < S; t++) s = _mm256_add_epi16(s, stream(p + t * part + o, BLK, N));
    return _mm256_extract_epi16(s, 0);
}

int main(void) {
    const size_t big = (size_t)1 << 30;
    uint8_t *b = aligned_alloc(2 << 20, big);
    madvise(b, big, MADV_HUGEPAGE);
    memset(b, 1, big);
    int sink = 0;
    for (int threads = 1; threads <= 2; threads++)
        for (int N = 0; N <= 4; N += 4)
            for (int S = 1; S <= 8; S *= 2) {
                double best = 1e9;
                for (int r = 0; r < 3; r++) {
                    const double t0 = now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
                    sink += streams(b + omp_get_thread_num() * (big / threads), big / threads, N, S);
                    if (now() - t0 < best) best = now() - t0;
                }
                printf("%d thread(s), N = %d, %d stream(s): %.1f GB/s\n", threads, N, S, big / best / 1e9);
            }
    return sink == 12345;  /* keeps the reads */
}
