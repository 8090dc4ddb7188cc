// One-row products (dense.hpp's dense_row_columns, a decoding step at batch 1) on one thread: their
// read rate of W against a plain read of the same bytes, and how the width of the column blocks that
// stream W's rows changes it; then the products split across 2 threads (dense_row_streamed's
// parallel_for) against one. Each size cycles through enough distinct weight matrices (>= 12 MiB, as
// a step's 11.4 MB) that W comes from L3 as in decoding, not from L2. Wall time per product, best of
// 20 passes, sizes interleaved five times.
//   g++ -std=c++17 -O3 -ffp-contract=off -Wno-psabi -Icpp/include -o /tmp/row_split benchmarks/row_split.cpp -lopenblas -lpthread
//   /tmp/row_split            (run under `env -u OPENBLAS_CORETYPE`, one interleaved run)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "attnx/dense.hpp"

using namespace attnx;

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// best of `repeats` passes of run(W) over all matrices, per matrix, in microseconds
template <class Run> static double per_matrix(std::vector<std::vector<float>>& Ws, int repeats, Run&& run) {
    double best = 1e30;
    for (int r = 0; r < repeats; ++r) {
        const double t0 = now();
        for (auto& W : Ws) run(W.data());
        best = std::min(best, (now() - t0) / Ws.size());
    }
    return best * 1e6;
}

// the sum of n floats, in 8 chains of the widest vectors: a plain read of W
static float read_all(const float* W, size_t n) {
    return on_widest_lanes<float>([&](auto lane) __attribute__((always_inline)) {
        using V = decltype(lane);
        constexpr int L = Lanes<V>::W;
        V acc[8] = {};
        size_t i = 0;
        for (; i + 8 * L <= n; i += 8 * L)
            for (int j = 0; j < 8; ++j) acc[j] += vload<V>(W + i + j * L, L);
        float total = 0;
        for (int j = 0; j < 8; ++j) total += sum_lanes<float>(L, [&](size_t d) { return acc[j][d]; });
        for (; i < n; ++i) total += W[i];
        return total;
    });
}

template <int block> static void row_blocks(float* z, const float* x, const float* W, const float* b, int C, int OC) {
    on_widest_lanes<float>([&](auto) __attribute__((always_inline)) {
        dense_row_columns<float, block>(z, x, W, (size_t)OC, b, C, 0, OC);
    });
}

int main() {
    std::mt19937 rng(0);
    std::uniform_real_distribution<float> u(-1, 1);
    // enough distinct (C, OC) matrices (>= 12 MiB) that each product reads W from L3
    auto weights = [&](int C, int OC) {
        const size_t count = std::max<size_t>(2, (size_t(12) << 20) / (sizeof(float) * C * OC));
        std::vector<std::vector<float>> Ws(count, std::vector<float>((size_t)C * OC));
        for (auto& W : Ws)
            for (auto& w : W) w = u(rng);
        return Ws;
    };
    const int sizes[][2] = {{256, 256}, {256, 512}, {512, 256}, {256, 768}, {256, 6000}, {256, 8000}};
    std::printf("one thread, GB/s of W (wall time per product in us)\n");
    std::printf("%6s %6s %14s %14s %14s %14s %14s %14s\n", "C", "OC", "plain read", "block 256", "block 512",
                "block 1024", "block 2048", "block 8192");
    float sink = 0;
    for (auto& s : sizes) {
        const int C = s[0], OC = s[1];
        auto Ws = weights(C, OC);
        std::vector<float> x(C), z(OC), b(OC);
        for (auto& v : x) v = u(rng);
        double t[6];
        std::fill(t, t + 6, 1e30);
        set_blas_threads(1);
        for (int round = 0; round < 5; ++round) {
            t[0] = std::min(t[0], per_matrix(Ws, 20, [&](const float* W) { sink += read_all(W, (size_t)C * OC); }));
            t[1] = std::min(t[1], per_matrix(Ws, 20, [&](const float* W) { row_blocks<256>(z.data(), x.data(), W, b.data(), C, OC); }));
            t[2] = std::min(t[2], per_matrix(Ws, 20, [&](const float* W) { row_blocks<512>(z.data(), x.data(), W, b.data(), C, OC); }));
            t[3] = std::min(t[3], per_matrix(Ws, 20, [&](const float* W) { row_blocks<1024>(z.data(), x.data(), W, b.data(), C, OC); }));
            t[4] = std::min(t[4], per_matrix(Ws, 20, [&](const float* W) { row_blocks<2048>(z.data(), x.data(), W, b.data(), C, OC); }));
            t[5] = std::min(t[5], per_matrix(Ws, 20, [&](const float* W) { row_blocks<8192>(z.data(), x.data(), W, b.data(), C, OC); }));
        }
        const double bytes = 4.0 * C * OC;
        std::printf("%6d %6d", C, OC);
        for (double v : t) std::printf(" %6.1f (%5.2f)", bytes / v / 1e3, v);
        std::printf("\n");
    }
    std::printf("\nsplit across threads (dense_row_streamed), us per product\n");
    std::printf("%6s %6s %10s %10s %7s\n", "C", "OC", "1 thr us", "2 thr us", "ratio");
    for (auto& s : sizes) {
        const int C = s[0], OC = s[1];
        auto Ws = weights(C, OC);
        std::vector<float> x(C), z(OC), b(OC);
        for (auto& v : x) v = u(rng);
        double t[2] = {1e30, 1e30};
        for (int round = 0; round < 5; ++round)  // interleaved: 1 thread, then 2, five times
            for (int threads : {1, 2}) {
                set_blas_threads(threads);
                t[threads - 1] = std::min(t[threads - 1], per_matrix(Ws, 20, [&](const float* W) {
                    dense_row_streamed<float>(z.data(), x.data(), W, b.data(), C, OC);
                }));
            }
        std::printf("%6d %6d %10.2f %10.2f %7.2f\n", C, OC, t[0], t[1], t[0] / t[1]);
    }
    return sink == 12345.0f;
}
