// One-row products (dense.hpp's dense_row_streamed, a decoding step at batch 1) on 1 and 2 threads, in
// microseconds per product of wall time: where splitting a row's columns across the spinning workers
// would pay. Each size cycles through enough distinct weight matrices
// (>= 12 MiB, as a step's 11.4 MB) that W comes from L3 as in decoding, not from L2.
//   g++ -std=c++17 -O2 -Wno-psabi -Icpp/include -o /tmp/row_split benchmarks/row_split.cpp -lopenblas -lpthread
//   /tmp/row_split            (run under `env -u OPENBLAS_CORETYPE`, one interleaved run)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "attnx/dense.hpp"

using namespace attnx;

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// best of `repeats` passes over all matrices, per product, in microseconds
static double per_product(std::vector<std::vector<float>>& Ws, const std::vector<float>& x, std::vector<float>& z,
                          const std::vector<float>& b, int C, int OC, int repeats) {
    double best = 1e30;
    for (int r = 0; r < repeats; ++r) {
        const double t0 = now();
        for (auto& W : Ws) dense_row_streamed<float>(z.data(), x.data(), W.data(), b.data(), C, OC);
        best = std::min(best, (now() - t0) / Ws.size());
    }
    return best * 1e6;
}

int main() {
    std::mt19937 rng(0);
    std::uniform_real_distribution<float> u(-1, 1);
    const int sizes[][2] = {{64, 64},   {128, 128}, {128, 256}, {256, 128}, {256, 256}, {256, 512},
                            {512, 256}, {512, 512}, {256, 1024}, {1024, 256}, {256, 6000}};
    std::printf("%6s %6s %10s %10s %10s %7s\n", "C", "OC", "MACs", "1 thr us", "2 thr us", "ratio");
    for (auto& s : sizes) {
        const int C = s[0], OC = s[1];
        const size_t count = std::max<size_t>(2, (size_t(12) << 20) / (sizeof(float) * C * OC));
        std::vector<std::vector<float>> Ws(count, std::vector<float>((size_t)C * OC));
        for (auto& W : Ws)
            for (auto& w : W) w = u(rng);
        std::vector<float> x(C), z(OC), b(OC);
        for (auto& v : x) v = u(rng);
        double t[2] = {1e30, 1e30};
        for (int round = 0; round < 5; ++round)  // interleaved: 1 thread, then 2, five times
            for (int threads : {1, 2}) {
                set_blas_threads(threads);
                t[threads - 1] = std::min(t[threads - 1], per_product(Ws, x, z, b, C, OC, 20));
            }
        std::printf("%6d %6d %10.0f %10.2f %10.2f %7.2f\n", C, OC, double(C) * OC, t[0], t[1], t[0] / t[1]);
    }
    return 0;
}
