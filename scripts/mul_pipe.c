/* Cycles per vpmaddubsw, vpmaddwd and the two interleaved, eight independent chains (the bound under the
 * wide passes' integer products, docs/performance.md):
 *
 *     gcc -O2 -march=native scripts/mul_pipe.c -o /tmp/mul_pipe && /tmp/mul_pipe 3.35   # the clock in GHz
 *
 * On Zen 2 each alone runs one a cycle, and interleaved still one a cycle between them (two would be
 * 0.5): they share one pipe. Then whether float FMAs could run beside them (inline assembly, so nothing
 * spills or folds): 4 vpmaddubsw and 10 vfmadd231ps on independent registers a round, alone and together:
 * 5 cycles together if the FMAs had pipes of their own, 7 if the multiplier's pipe is one of the two FMA
 * pipes. Zen 2: 4.0 / 5.0 / 7.1. Built for AVX-512 VNNI it goes on to the zmm rounds below. */
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

/* The AVX2 8-row tiles' step a row (qkernels_x8.h's q4x8_sub_sums): a vpmaddubsw against the row's 4 activation bytes
 * and a vpaddw into its sums, 8 rows on independent sums, the activations in a register or each a vpbroadcastd load.
 * Zen 4 (forty-sixth session, four runs, the clock argument 4.1): 5.6-5.8 cycles a round of 8 in registers (0.17 ns a
 * row step), 5.7-6.6 with the loads (0.17-0.20 ns): the broadcasts cost 2-15% */
#define STEP(r, t, X) "vpmaddubsw " X ", %%ymm0, %%ymm" #t "\n vpaddw %%ymm" #t ", %%ymm" #r ", %%ymm" #r "\n"
#define STEP_MEM(r, t, b, at) "vpbroadcastd " #at "(%1), %%ymm" #b "\n" STEP(r, t, "%%ymm" #b)
#define ROWS_REG STEP(1, 9, "%%ymm8") STEP(2, 10, "%%ymm8") STEP(3, 12, "%%ymm8") STEP(4, 13, "%%ymm8") \
                 STEP(5, 9, "%%ymm8") STEP(6, 10, "%%ymm8") STEP(7, 12, "%%ymm8") STEP(11, 13, "%%ymm8")
#define ROWS_MEM STEP_MEM(1, 9, 14, 0) STEP_MEM(2, 10, 15, 4) STEP_MEM(3, 12, 14, 8) STEP_MEM(4, 13, 15, 12) \
                 STEP_MEM(5, 9, 14, 16) STEP_MEM(6, 10, 15, 20) STEP_MEM(7, 12, 14, 24) STEP_MEM(11, 13, 15, 28)
/* a function timing `reps` loops of BODY after INIT, with %1 pointing at mem; the rest: the registers it writes */
#define MEM_ROUNDS(NAME, INIT, BODY, ...)                                                                     \
    static double NAME(long reps, const int32_t *mem) {                                                       \
        const double t0 = now();                                                                              \
        __asm__ volatile(INIT "1:\n" BODY "dec %0\n jnz 1b\n" : "+r"(reps) : "r"(mem) : "memory", __VA_ARGS__); \
        return now() - t0;                                                                                    \
    }
#define ROW_ROUNDS(NAME, BODY)                                                                                \
    MEM_ROUNDS(NAME, "vpxor %%ymm0, %%ymm0, %%ymm0\n vpxor %%ymm8, %%ymm8, %%ymm8\n", BODY, "xmm0", "xmm1",     \
               "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13",   \
               "xmm14", "xmm15")
ROW_ROUNDS(rows_reg, ROWS_REG)
ROW_ROUNDS(rows_mem, ROWS_MEM)

#if defined(__AVX512VNNI__)
/* AVX-512 (the 16-row tiles, qkernels_x16.h): a round of 8 vpdpbusd zmm on independent sums, alone and with 2 of
 * another instruction on registers of their own, and the 8 with a {1to16} memory operand (the tiles' activation
 * broadcasts). Zen 4 (family 25 model 17, forty-first session, at 3.7 GHz): 8.1-8.4 cycles alone; + 2 vpmulld,
 * vpmaddwd or vpdpwssd 10.1-10.6 (each takes a vpdpbusd's slot); + 2 vpsllvd or vpaddd 8.1-8.5; the memory operand
 * 8.1-8.3 */
#define DP8 "vpdpbusd %%zmm16, %%zmm17, %%zmm18\n vpdpbusd %%zmm16, %%zmm17, %%zmm19\n" \
            "vpdpbusd %%zmm16, %%zmm17, %%zmm20\n vpdpbusd %%zmm16, %%zmm17, %%zmm21\n" \
            "vpdpbusd %%zmm16, %%zmm17, %%zmm22\n vpdpbusd %%zmm16, %%zmm17, %%zmm23\n" \
            "vpdpbusd %%zmm16, %%zmm17, %%zmm24\n vpdpbusd %%zmm16, %%zmm17, %%zmm25\n"
#define DP8_MEM "vpdpbusd (%1)%{1to16%}, %%zmm17, %%zmm18\n vpdpbusd 4(%1)%{1to16%}, %%zmm17, %%zmm19\n" \
                "vpdpbusd 8(%1)%{1to16%}, %%zmm17, %%zmm20\n vpdpbusd 12(%1)%{1to16%}, %%zmm17, %%zmm21\n" \
                "vpdpbusd 16(%1)%{1to16%}, %%zmm17, %%zmm22\n vpdpbusd 20(%1)%{1to16%}, %%zmm17, %%zmm23\n" \
                "vpdpbusd 24(%1)%{1to16%}, %%zmm17, %%zmm24\n vpdpbusd 28(%1)%{1to16%}, %%zmm17, %%zmm25\n"
#define TWO(OP) OP " %%zmm16, %%zmm26, %%zmm26\n " OP " %%zmm16, %%zmm27, %%zmm27\n"
#define ZMM_ROUNDS(NAME, BODY)                                                                                \
    MEM_ROUNDS(NAME, "vpxord %%zmm16, %%zmm16, %%zmm16\n vpxord %%zmm17, %%zmm17, %%zmm17\n", BODY, "xmm16",     \
               "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm24", "xmm25", "xmm26", "xmm27")
ZMM_ROUNDS(dp_alone, DP8)
ZMM_ROUNDS(dp_mulld, DP8 TWO("vpmulld"))
ZMM_ROUNDS(dp_sllvd, DP8 TWO("vpsllvd"))
ZMM_ROUNDS(dp_addd, DP8 TWO("vpaddd"))
ZMM_ROUNDS(dp_maddwd, DP8 TWO("vpmaddwd"))
ZMM_ROUNDS(dp_dpwssd, DP8 TWO("vpdpwssd"))
ZMM_ROUNDS(dp_mem, DP8_MEM)

static void zmm_rounds(double ghz, long reps) {
    static const int32_t mem[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    static const struct { const char *name; double (*f)(long, const int32_t *); } rounds[] = {
        {"8 vpdpbusd zmm", dp_alone}, {"+ 2 vpmulld", dp_mulld}, {"+ 2 vpsllvd", dp_sllvd}, {"+ 2 vpaddd", dp_addd},
        {"+ 2 vpmaddwd", dp_maddwd}, {"+ 2 vpdpwssd", dp_dpwssd}, {"8 with {1to16} memory", dp_mem},
    };
    for (int i = 0; i < 7; i++)
        printf("%-24s %.2f cycles a round\n", rounds[i].name, rounds[i].f(reps / 4, mem) * ghz * 1e9 / (reps / 4));
}
#endif

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
    static const int32_t mem[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    printf("8 row steps          %.2f cycles a round\n", rows_reg(reps, mem) * ghz * 1e9 / reps);
    printf("+ a broadcast each   %.2f cycles a round\n", rows_mem(reps, mem) * ghz * 1e9 / reps);
#if defined(__AVX512VNNI__)
    zmm_rounds(ghz, reps);
#endif
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)),
                                       _mm256_add_epi32(_mm256_add_epi32(a4, a5), _mm256_add_epi32(a6, a7)));
    return _mm256_extract_epi32(s, 0) == 12345;
}
