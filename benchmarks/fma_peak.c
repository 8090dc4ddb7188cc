// The multiply-add throughput of one core: float32 FMA at 256 and 512 bits (GFLOP/s), bfloat16
// vdpbf16ps (GFLOP/s) and int8 vpdpbusd (GOP/s, 2 per multiply-add) at 512 bits, and AVX2's int8
// multiply-add without VNNI (vpmaddubsw + vpmaddwd + vpaddd, what attnx's int8 tiles run there):
// what the floors in the README are measured against. 12 independent accumulator chains hide the
// latency. Instructions this CPU lacks are reported as such, not run.
//   gcc -O3 -o /tmp/fma_peak benchmarks/fma_peak.c && /tmp/fma_peak      (run one per core to see both)
#include <immintrin.h>
#include <cpuid.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

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

// The same loop for integer or bf16 multiply-adds: `ops` operations (2 per multiply-add) per instruction
#define DOT_PEAK(name, isa, vec, init, step, ops)                                            \
    __attribute__((target(isa))) static double name(void) {                                  \
        vec acc[CHAINS], a = init(1), b = init(2);                                           \
        for (int i = 0; i < CHAINS; ++i) acc[i] = init(i);                                   \
        const long steps = STEPS / 4;                                                        \
        double t0 = now();                                                                   \
        for (long s = 0; s < steps; ++s)                                                     \
            _Pragma("GCC unroll 12")                                                         \
            for (int i = 0; i < CHAINS; ++i) acc[i] = step(acc[i], a, b);                    \
        double t = now() - t0;                                                               \
        volatile vec sink = acc[0];                                                          \
        for (int i = 1; i < CHAINS; ++i) sink = acc[i];                                      \
        (void)sink;                                                                          \
        return (double)ops * CHAINS * steps / t * 1e-9;                                      \
    }

#define I512(v) _mm512_set1_epi32(v)
#define BF16_INIT(v) ((__m512)_mm512_set1_epi32(0x3f803f80 + (v)))
#define BF16_STEP(acc, a, b) _mm512_dpbf16_ps(acc, (__m512bh)(a), (__m512bh)(b))
#define VNNI_STEP(acc, a, b) _mm512_dpbusd_epi32(acc, a, b)
#define I256(v) _mm256_set1_epi32(v)
#define AVX2_INT8_STEP(acc, a, b) _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)))
// vdpbf16ps: 16 lanes x 2 bf16 products; vpdpbusd: 16 lanes x 4 u8.s8 products; AVX2: 32 u8.s8 products
DOT_PEAK(peak_bf16, "avx512f,avx512bf16", __m512, BF16_INIT, BF16_STEP, 2 * 32)
DOT_PEAK(peak_vnni, "avx512f,avx512vnni", __m512i, I512, VNNI_STEP, 2 * 64)
DOT_PEAK(peak_avx2_int8, "avx2", __m256i, I256, AVX2_INT8_STEP, 2 * 32)

// AMX: Linux hands the tiles' state to a process that asks (arch_prctl ARCH_REQ_XCOMP_PERM), then each
// thread configures them (palette 1: 16 rows x 64 bytes each)
static int amx_usable(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) return 0;
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}
struct tile_config { uint8_t palette, start_row, reserved[14]; uint16_t bytes_per_row[16]; uint8_t rows[16]; };
// Operands of ones (bf16 1.0 pairs; int8 bytes 0x3f and 0x80): the tiles run zeros faster (~3.7 against
// ~3.0 TFLOP/s for the block with its loads below), and no product multiplies zeros only
static void fill_tile_operands(void* operands, size_t bytes) {
    for (size_t i = 0; i < bytes / 4; ++i) ((uint32_t*)operands)[i] = 0x3f803f80u;
}
#define AMX_PEAK(name, product, ops)                                                          \
    __attribute__((target("amx-tile,amx-bf16,amx-int8"))) static double name(void) {         \
        static struct tile_config config __attribute__((aligned(64)));                       \
        static char operand[16 * 64] __attribute__((aligned(64)));                           \
        fill_tile_operands(operand, sizeof operand);                                         \
        memset(&config, 0, sizeof config);                                                   \
        config.palette = 1;                                                                  \
        for (int t = 0; t < 8; ++t) config.bytes_per_row[t] = 64, config.rows[t] = 16;      \
        __asm__ __volatile__("" ::: "memory");                                               \
        _tile_loadconfig(&config);                                                           \
        _tile_loadd(4, operand, 64);                                                         \
        _tile_loadd(5, operand, 64);                                                         \
        _tile_loadd(6, operand, 64);                                                         \
        _tile_loadd(7, operand, 64);                                                         \
        const long steps = STEPS / 200;                                                      \
        double t0 = now();                                                                   \
        for (long s = 0; s < steps; ++s) {                                                   \
            product(0, 4, 5);                                                                \
            product(1, 4, 7);                                                                \
            product(2, 6, 5);                                                                \
            product(3, 6, 7);                                                                \
        }                                                                                    \
        double t = now() - t0;                                                               \
        _tile_release();                                                                     \
        return (double)ops * 4 * steps / t * 1e-9;                                           \
    }
// per instruction: 16 x 16 sums of 32 bf16 products (tdpbf16ps) or 64 int8 products (tdpbssd), 2 ops each
AMX_PEAK(peak_amx_bf16, _tile_dpbf16ps, 2 * 16 * 16 * 32)
AMX_PEAK(peak_amx_int8, _tile_dpbssd, 2 * 16 * 16 * 64)

// What a product can reach: attnx's 32 x 32 block (bf16.hpp amx_bf16_block) loads two A and two B tiles
// per four tdpbf16ps, here cycling through `steps` steps' operands (4 KiB each): 4 (16 KiB, L1) or 256
// (1 MiB, L2). The tile loads, not the products, set its pace: the gap to the peak above is the
// ceiling of any 2 x 2 tiling, not of the packing around it.
__attribute__((target("amx-tile,amx-bf16"))) static double amx_bf16_block_with_loads(int cycled) {
    static struct tile_config config __attribute__((aligned(64)));
    static char operands[256][4][16 * 64] __attribute__((aligned(64)));  // per step: A0 A1 B0 B1
    fill_tile_operands(operands, sizeof operands);
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; ++t) config.bytes_per_row[t] = 64, config.rows[t] = 16;
    __asm__ __volatile__("" ::: "memory");
    _tile_loadconfig(&config);
    const long steps = STEPS / 200;
    double t0 = now();
    for (long s = 0; s < steps; ++s) {
        char(*step)[16 * 64] = operands[s % cycled];
        _tile_loadd(4, step[0], 64);
        _tile_loadd(6, step[2], 64);
        _tile_loadd(7, step[3], 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, step[1], 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    double t = now() - t0;
    _tile_release();
    return 2.0 * 16 * 16 * 32 * 4 * steps / t * 1e-9;
}
static double amx_block_l1(void) { return amx_bf16_block_with_loads(4); }
static double amx_block_l2(void) { return amx_bf16_block_with_loads(256); }

static void report(const char* what, const char* unit, int supported, double (*peak)(void)) {
    if (!supported) {
        printf("%-40s not on this CPU\n", what);
        return;
    }
    double best = 0;
    for (int r = 0; r < 3; ++r) {
        double p = peak();
        if (p > best) best = p;
    }
    printf("%-40s %7.1f %s\n", what, best, unit);
}

int main(void) {
    __builtin_cpu_init();
    const int avx512 = __builtin_cpu_supports("avx512f");
    printf("peak, one core (%d chains, thread CPU time):\n", CHAINS);
    report("float32 FMA AVX2 (8 floats)", "GFLOP/s", __builtin_cpu_supports("fma"), peak256);
    report("float32 FMA AVX-512 (16 floats)", "GFLOP/s", avx512, peak512);
    report("bf16 vdpbf16ps (512 bits)", "GFLOP/s", avx512 && __builtin_cpu_supports("avx512bf16"), peak_bf16);
    report("int8 vpdpbusd (512 bits)", "GOP/s", avx512 && __builtin_cpu_supports("avx512vnni"), peak_vnni);
    report("int8 AVX2 vpmaddubsw+vpmaddwd+vpaddd", "GOP/s", __builtin_cpu_supports("avx2"), peak_avx2_int8);
    const int amx = amx_usable();
    report("bf16 AMX tdpbf16ps (4 tiles of sums)", "GFLOP/s", amx, peak_amx_bf16);
    report("int8 AMX tdpbssd (4 tiles of sums)", "GOP/s", amx, peak_amx_int8);
    report("bf16 AMX 32x32 block, tile loads from L1", "GFLOP/s", amx, amx_block_l1);
    report("bf16 AMX 32x32 block, tile loads from L2", "GFLOP/s", amx, amx_block_l2);
    return 0;
}
