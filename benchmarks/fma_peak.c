// The FMA throughput of one core (GFLOP/s) at 256 and 512 bits: what the floors in the README are
// measured against. 12 independent accumulator chains per width hide the FMA latency.
//   gcc -O3 -o /tmp/fma_peak benchmarks/fma_peak.c && /tmp/fma_peak      (run one per core to see both)
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);  // time on the CPU: other processes on these cores do not count
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

#define CHAINS 12
#define STEPS 1000000000L

// One FMA-throughput loop per vector width: CHAINS independent accumulators hide the FMA latency.
#define FMA_PEAK(name, isa, vec, set1, fmadd, lanes)                                         \
    __attribute__((target(isa))) static double name(void) {                                  \
        vec acc[CHAINS], a = set1(0.999999f), b = set1(1e-7f);                               \
        for (int i = 0; i < CHAINS; ++i) acc[i] = set1((float)i);                            \
        const long steps = STEPS / 4;                                                        \
        double t0 = now();                                                                   \
        for (long s = 0; s < steps; ++s)                                                     \
            _Pragma("GCC unroll 12")                                                         \
            for (int i = 0; i < CHAINS; ++i) acc[i] = fmadd(acc[i], a, b);                   \
        double t = now() - t0;                                                               \
        float sink = 0;                                                                      \
        for (int i = 0; i < CHAINS; ++i) sink += acc[i][0];                                  \
        if (sink == 12345.f) puts("");                                                       \
        return 2.0 * lanes * CHAINS * steps / t * 1e-9;                                      \
    }

FMA_PEAK(peak256, "avx2,fma", __m256, _mm256_set1_ps, _mm256_fmadd_ps, 8)
FMA_PEAK(peak512, "avx512f", __m512, _mm512_set1_ps, _mm512_fmadd_ps, 16)

int main(void) {
    double best256 = 0, best512 = 0;
    for (int r = 0; r < 3; ++r) {
        double p = peak256(), q = peak512();
        if (p > best256) best256 = p;
        if (q > best512) best512 = q;
    }
    printf("FMA peak, one core: AVX2 (8 floats) %.1f GFLOP/s, AVX-512 (16 floats) %.1f GFLOP/s\n", best256, best512);
    return 0;
}
