/* The clock of the C microbenchmarks in scripts/: seconds on the monotonic clock. */
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
