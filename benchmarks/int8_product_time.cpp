// One int8 product (quantized.hpp's int8_product) on the AMX tiles against the AVX-512 VNNI tiles, one
// thread, at row counts from 1 to 64: the figures behind int8_amx_pays (which rows take the tiles).
// Interleaved, best of 15 rounds, nanoseconds per call; GOP/s counts multiplies and adds apart.
// Arguments: K N.
//   g++ -std=gnu++17 -O3 -ffp-contract=off -fno-math-errno -fno-trapping-math -Wno-psabi -Icpp/include \
//     -o /tmp/int8_product benchmarks/int8_product_time.cpp -lopenblas && /tmp/int8_product 100 400
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <vector>

#include "attnx/quantized.hpp"
using namespace attnx;

static double now() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

int main(int argc, char** argv) {
    if (argc != 3) return std::printf("usage: %s K N\n", argv[0]), 2;
    const int K = atoi(argv[1]), N = atoi(argv[2]);
    if (!amx_int8_active()) return std::printf("no AMX-INT8 on this CPU (or the OS refuses it)\n"), 1;
    std::mt19937 rng(1);
    std::uniform_int_distribution<int> byte(-127, 127);
    std::vector<int8_t> qw((size_t)K * N);
    for (auto& w : qw) w = (int8_t)byte(rng);
    Int8Packed B;
    pack_int8(B, qw.data(), (size_t)N, K, N);
    for (int R : {1, 4, 8, 12, 16, 32, 64}) {
        std::vector<int8_t> qx((size_t)R * B.Kp);
        for (auto& v : qx) v = (int8_t)byte(rng);
        std::vector<int32_t> acc((size_t)R * B.Np);
        double best[2] = {1e9, 1e9};
        const int iters = std::max(20, (int)(2e7 / ((double)R * K * N + 1e4)));
        for (int round = 0; round < 15; ++round)
            for (int amx = 0; amx < 2; ++amx) {
                const double t0 = now();
                for (int i = 0; i < iters; ++i) {
                    if (amx) int8_product_amx(acc.data(), B.Np, qx.data(), B.Kp, R, B, 0, N);
                    else {
                        amx_allowed() = false;  // int8_product at AVX-512 without the tiles: VNNI
                        int8_product(acc.data(), B.Np, qx.data(), B.Kp, R, B, 0, N);
                        amx_allowed() = true;
                    }
                }
                best[amx] = std::min(best[amx], (now() - t0) / iters);
            }
        std::printf("K=%4d N=%4d R=%3d  vnni %8.0f ns  amx %8.0f ns  vnni/amx %5.2fx  amx %6.0f GOP/s%s\n", K, N, R,
                    best[0] * 1e9, best[1] * 1e9, best[0] / best[1], 2.0 * R * K * N / best[1] * 1e-9,
                    int8_amx_pays(R, B) ? "  (int8_product: amx)" : "");
    }
}
