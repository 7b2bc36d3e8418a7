/* Cycles per vpmaddubsw, vpmaddwd and the two interleaved, eight independent chains (the bound under the
 * wide passes' integer products, docs/performance.md):
 *
 *     gcc -O2 -march=native scripts/mul_pipe.c -o /tmp/mul_pipe && /tmp/mul_pipe 3.35   # the clock in GHz
 *
 * On Zen 2 each alone runs one a cycle, and interleaved still one a cycle between them (two would be
 * 0.5): they share one pipe. Then whether float FMAs could run beside them (inline assembly, so nothing
 * spills or folds): 4 vpmaddubsw and 10 vfmadd231ps on independent registers a round, alone and together:
 * 5 cycles together if the FMAs had pipes of their own, 7 if the multiplier's pipe is one of the two FMA
 * pipes. Zen 2: 4.0 / 5.0 / 7.1. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include "clock.h"

#define EACH(OP) OP(a0) OP(a1) OP(a2) OP(a3) OP(a4) OP(a5) OP(a6) OP(a7)
#define MADDUBS(a) a = _mm256_maddubs_epi16(a, x);
#define MADD(a) a = _mm256_madd_epi16(a, x);
#define BOTH(a) a = _mm256_madd_epi16(_mm256_maddubs_epi16(a, x), x);
#define TIME(NAME, OP, OPS)                                                                                  \
    t0 = now();                                                                                               \
    for (long n = 0; n < reps; n++) {                                                                         \
        EACH(OP)                                                                                              \
        __asm__("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7));       \
    }                                                                                                         \
    printf("%-20s %.2f cycles an instruction\n", NAME, (now() - t0) * ghz * 1e9 / reps / (8 * OPS));

#define INT4 "vpmaddubsw %%ymm0, %%ymm1, %%ymm2\n vpmaddubsw %%ymm0, %%ymm1, %%ymm3\n" \
             "vpmaddubsw %%ymm0, %%ymm1, %%ymm2\n vpmaddubsw %%ymm0, %%ymm1, %%ymm3\n"
#define FMA2(a, b) "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #a "\n vfmadd231ps %%ymm14, %%ymm15, %%ymm" #b "\n"
#define FMA10 FMA2(4, 5) FMA2(6, 7) FMA2(8, 9) FMA2(10, 11) FMA2(12, 13)
#define ASM_ROUNDS(NAME, BODY)                                                                                \
    static double NAME(long reps) {                                                                           \
        const double t0 = now();                                                                              \
        __asm__ volatile("vxorps %%ymm14, %%ymm14, %%ymm14\n vxorps %%ymm15, %%ymm15, %%ymm15\n"             \
                         "1:\n" BODY "dec %0\n jnz 1b\n"                                                     \
                         : "+r"(reps)                                                                         \
                         :                                                                                    \
                         : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",    \
                           "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");                            \
        return now() - t0;                                                                                    \
    }
ASM_ROUNDS(ints, INT4)
ASM_ROUNDS(fmas, FMA10)
ASM_ROUNDS(both, INT4 FMA10)

int main(int argc, char **argv) {
    const double ghz = argc > 1 ? atof(argv[1]) : 3.0;
    const long reps = 100000000;
    const __m256i x = _mm256_set1_epi8(5);
    __m256i a0 = x, a1 = x, a2 = x, a3 = x, a4 = x, a5 = x, a6 = x, a7 = x;
    double t0;
    TIME("vpmaddubsw", MADDUBS, 1)
    TIME("vpmaddwd", MADD, 1)
    TIME("both, interleaved", BOTH, 2)
    printf("4 vpmaddubsw         %.2f cycles a round\n", ints(reps) * ghz * 1e9 / reps);
    printf("10 vfmadd231ps       %.2f cycles a round\n", fmas(reps) * ghz * 1e9 / reps);
    printf("both                 %.2f cycles a round\n", both(reps) * ghz * 1e9 / reps);
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)),
                                       _mm256_add_epi32(_mm256_add_epi32(a4, a5), _mm256_add_epi32(a6, a7)));
    return _mm256_extract_epi32(s, 0) == 12345;
}
