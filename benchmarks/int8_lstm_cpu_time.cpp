// attnx's int8 LSTM forward (cpp/include/attnx/quantized.hpp: packed int8 kernels, x_t and h_{t-1}
// quantized and multiplied per step, the scales in the cell's loop) against its float32 LSTM
// forward (rnn.hpp) on one thread, in process CPU time (other processes on a shared host do not
// count), at the CPU's level, at AVX-512 with the AMX tiles off (where the CPU has them) and at the
// AVX2 level, then the int8 forward's parts (quantizing x_t and h, their products) timed alone.
// Arguments: B T C H iterations.
//   g++ -std=gnu++17 -O3 -ffp-contract=off -fno-math-errno -fno-trapping-math -Wno-psabi -Icpp/include \
//     -o /tmp/int8_lstm benchmarks/int8_lstm_cpu_time.cpp -lopenblas && /tmp/int8_lstm 32 32 32 100 100
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <vector>

#include "attnx/quantized.hpp"
using namespace attnx;

static double cpu_seconds() {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char** argv) {
    if (argc != 6) return std::printf("usage: %s B T C H iterations\n", argv[0]), 2;
    const int B = atoi(argv[1]), T = atoi(argv[2]), C = atoi(argv[3]), H = atoi(argv[4]), iterations = atoi(argv[5]);
    RNNConfig cfg;
    cfg.cell = RNNCell::lstm, cfg.B = B, cfg.T = T, cfg.C = C, cfg.H = H;
    const int G = 4 * H;
    std::mt19937 rng(1);
    std::uniform_int_distribution<int> byte(-127, 127);
    std::normal_distribution<float> normal;
    std::vector<int8_t> qw((size_t)C * G), qu((size_t)H * G);
    for (auto& w : qw) w = (int8_t)byte(rng);
    for (auto& w : qu) w = (int8_t)byte(rng);
    std::vector<float> scale(G, 0.001f), bias(G, 0.f), x((size_t)B * T * C), y((size_t)B * T * H);
    std::vector<float> h((size_t)B * H), c((size_t)B * H), W((size_t)C * G), U((size_t)H * G);
    std::vector<float> gates((size_t)B * T * G), aux((size_t)B * T * H), hu((size_t)B * G);
    for (auto& v : x) v = normal(rng);
    for (auto& v : W) v = normal(rng) * 0.1f;
    for (auto& v : U) v = normal(rng) * 0.1f;
    Int8Kernel qW, qU;
    pack_int8_kernel(qW, qw.data(), scale.data(), C, G, G);
    pack_int8_kernel(qU, qu.data(), scale.data(), H, G, G);
    set_blas_threads(1);
    RNNCache<float> cache;  // inference: gates and aux are workspace
    cache.gates = gates.data(), cache.aux = aux.data();
    auto int8 = [&] {
        rnn_forward_int8(cfg, y.data(), h.data(), c.data(), x.data(), qW, qU, bias.data(), nullptr, nullptr);
    };
    auto float32 = [&] {
        rnn_forward<float>(cfg, y.data(), h.data(), c.data(), cache, x.data(), W.data(), U.data(), bias.data(), nullptr,
                           nullptr, nullptr, hu.data());
    };
    // the CPU's level (AMX tiles where it has AMX-INT8: products of 16 rows or more), AVX-512 with the
    // tiles off (VNNI), and AVX2
    struct Run { SimdLevel level; bool amx; };
    for (Run run : {Run{SimdLevel::avx512, true}, Run{SimdLevel::avx512, false}, Run{SimdLevel::avx2, true}}) {
        if (!run.amx && !amx_int8_active()) continue;
        simd_level_cap() = (int)run.level;
        amx_allowed() = run.amx;
        double t_int8 = 0, t_float32 = 0;
        for (int round = 0; round < 3; ++round) {  // interleaved
            double t0 = cpu_seconds();
            for (int i = 0; i < iterations; ++i) int8();
            double t1 = cpu_seconds();
            for (int i = 0; i < iterations; ++i) float32();
            double t2 = cpu_seconds();
            t_int8 += t1 - t0, t_float32 += t2 - t1;
        }
        const double n = 3.0 * iterations;
        std::printf("%-8s LSTM B=%d T=%d C=%d H=%d, 1 thread, CPU time: int8 %.1f us, float32 %.1f us: %.2fx\n",
                    int8_level_name(), B, T, C, H, t_int8 / n * 1e6, t_float32 / n * 1e6, t_float32 / t_int8);
        // the int8 forward's parts, each timed alone over T steps of B rows on the same operands; the
        // cell's loop (scales, biases, gates, state) is what is left of the whole
        auto per_call = [&](auto&& part) {
            part();
            const double t0 = cpu_seconds();
            for (int i = 0; i < iterations; ++i) part();
            return (cpu_seconds() - t0) / iterations * 1e6;
        };
        const Int8Packed &PW = qW.head, &PU = qU.head;
        Int8Activations xq, hq;
        xq.resize(B, C, PW.Kp, PW.Np), hq.resize(B, H, PU.Kp, PU.Np);
        std::vector<int32_t> ax((size_t)B * PW.Np), ah((size_t)B * PU.Np);
        const double quantize_x = per_call([&] {
            for (int t = 0; t < T; ++t)
                on_widest_lanes<float>([&](auto lanes) __attribute__((always_inline)) {
                    xq.quantize_on<decltype(lanes)>(x.data() + (size_t)t * C, (size_t)T * C, B, PW.feature_weight.data());
                });
        });
        const double product_x = per_call([&] {
            for (int t = 0; t < T; ++t) xq.product(ax.data(), (size_t)PW.Np, B, PW, 0, G);
        });
        const double quantize_h = per_call([&] {
            for (int t = 0; t < T; ++t)
                on_widest_lanes<float>([&](auto lanes) __attribute__((always_inline)) {
                    hq.quantize_on<decltype(lanes)>(h.data(), (size_t)H, B, PU.feature_weight.data());
                });
        });
        const double product_h = per_call([&] {
            for (int t = 0; t < T; ++t) hq.product(ah.data(), (size_t)PU.Np, B, PU, 0, G);
        });
        std::printf("         int8 parts: quantize x_t %.1f us, x_t W %.1f us, quantize h %.1f us, h U %.1f us, "
                    "the cell's loop (the rest) %.1f us\n", quantize_x, product_x, quantize_h, product_h,
                    t_int8 / n * 1e6 - quantize_x - product_x - quantize_h - product_h);
    }
    amx_allowed() = true;
}
