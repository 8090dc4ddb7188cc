// attnx's int8 LSTM forward (cpp/include/attnx/quantized.hpp: packed int8 kernels, the input
// projection of every step in one int8 product, h quantized per step) against its float32 LSTM
// forward (rnn.hpp) on one thread, in process CPU time (other processes on a shared host do not
// count), at the CPU's level and at the AVX2 level. Arguments: B T C H iterations.
//   g++ -std=gnu++17 -O3 -ffp-contract=off -fno-math-errno -fno-trapping-math -Wno-psabi -Icpp/include \
//     -o /tmp/int8_lstm benchmarks/int8_lstm_cpu_time.cpp -lopenblas && /tmp/int8_lstm 32 32 32 100 100
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include "attnx/quantized.hpp"
using namespace attnx;
static double cpu() { timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char** argv) {
    int B = atoi(argv[1]), T = atoi(argv[2]), C = atoi(argv[3]), H = atoi(argv[4]), it = atoi(argv[5]);
    RNNConfig cfg; cfg.cell = RNNCell::lstm; cfg.B = B; cfg.T = T; cfg.C = C; cfg.H = H;
    const int G = 4 * H;
    std::mt19937 rng(1); std::uniform_int_distribution<int> byte(-127, 127); std::normal_distribution<float> nd;
    std::vector<int8_t> qw((size_t)C * G), qu((size_t)H * G); for (auto& w : qw) w = byte(rng); for (auto& w : qu) w = byte(rng);
    std::vector<float> sw(G, 0.001f), x((size_t)B * T * C), y((size_t)B * T * H), h((size_t)B * H), c((size_t)B * H), b(G, 0.f);
    std::vector<float> Wf((size_t)C * G), Uf((size_t)H * G), gates((size_t)B * T * G), aux((size_t)B * T * H), hu((size_t)B * G);
    for (auto& v : x) v = nd(rng);
    for (auto& v : Wf) v = nd(rng) * 0.1f;
    for (auto& v : Uf) v = nd(rng) * 0.1f;
    Int8Kernel W, U; pack_int8_kernel(W, qw.data(), sw.data(), C, G, G); pack_int8_kernel(U, qu.data(), sw.data(), H, G, G);
    set_blas_threads(1);
    RNNCache<float> cache; cache.gates = gates.data(); cache.aux = aux.data();
    for (int lvl : {2, 1}) {
        simd_level_cap() = lvl;
        double ti = 0, tf = 0;
        for (int round = 0; round < 3; ++round) {
            double t0 = cpu();
            for (int i = 0; i < it; ++i) rnn_forward_int8(cfg, y.data(), h.data(), c.data(), x.data(), W, U, b.data(), nullptr, nullptr);
            double t1 = cpu();
            for (int i = 0; i < it; ++i) rnn_forward<float>(cfg, y.data(), h.data(), c.data(), cache, x.data(), Wf.data(), Uf.data(), b.data(), nullptr, nullptr, nullptr, hu.data());
            double t2 = cpu();
            ti += t1 - t0, tf += t2 - t1;
        }
        printf("%-8s B=%d T=%d C=%d H=%d, 1 thread, CPU time: int8 %.1f us, float32 %.1f us: %.2fx\n", int8_level_name(), B, T, C, H, ti / (3 * it) * 1e6, tf / (3 * it) * 1e6, tf / ti);
    }
}
