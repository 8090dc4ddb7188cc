// The int8 tiles (quantized.hpp) at every SIMD level this CPU runs against the plain loop: equal
// int32 accumulators on shapes that leave partial vectors, tiles and k blocks; and the row
// quantization's round trip.
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "attnx/quantized.hpp"
#include "check.hpp"

using namespace attnx;

static void product_matches_reference(int R, int K, int N, std::mt19937& rng) {
    std::uniform_int_distribution<int> byte(-127, 127);
    std::vector<int8_t> qw((size_t)K * N);
    for (auto& w : qw) w = (int8_t)byte(rng);
    Int8Packed B;
    pack_int8(B, qw.data(), (size_t)N, K, N);
    std::vector<int8_t> qx((size_t)R * B.Kp, 0);
    for (int r = 0; r < R; ++r)
        for (int k = 0; k < K; ++k) qx[(size_t)r * B.Kp + k] = (int8_t)(k % 7 == 0 ? 127 * (r % 2 ? 1 : -1) : byte(rng));
    std::vector<int32_t> want((size_t)R * N);
    int8_product_reference(want.data(), (size_t)N, qx.data(), (size_t)B.Kp, R, qw.data(), K, N);
    for (SimdLevel level : {SimdLevel::baseline, SimdLevel::avx2, SimdLevel::avx512}) {
        if ((int)level > (int)cpu_simd_level()) continue;
        simd_level_cap() = (int)level;
        std::vector<int32_t> got((size_t)R * B.Np, -1);
        int8_product(got.data(), (size_t)B.Np, qx.data(), (size_t)B.Kp, R, B, 0, N);
        int bad = 0;
        for (int r = 0; r < R; ++r)
            for (int n = 0; n < N; ++n) bad += got[(size_t)r * B.Np + n] != want[(size_t)r * N + n];
        if (bad) std::printf("R=%d K=%d N=%d level %s (%s): %d of %d differ\n", R, K, N, simd_level_name(level),
                             int8_level_name(), bad, R * N);
        CHECK(bad == 0);
    }
    simd_level_cap() = (int)SimdLevel::avx512;
}

int main() {
    std::mt19937 rng(7);
    for (int R : {1, 2, 3, 5, 9})
        for (int K : {1, 4, 7, 100, 257})
            for (int N : {1, 15, 16, 33, 100, 400}) product_matches_reference(R, K, N, rng);
    // extreme values: every product +-127^2, K large
    {
        const int R = 3, K = 1024, N = 20;
        std::vector<int8_t> qw((size_t)K * N, 127);
        Int8Packed B;
        pack_int8(B, qw.data(), (size_t)N, K, N);
        std::vector<int8_t> qx((size_t)R * B.Kp, -127);
        std::vector<int32_t> got((size_t)R * B.Np);
        int8_product(got.data(), (size_t)B.Np, qx.data(), (size_t)B.Kp, R, B, 0, N);
        CHECK(got[0] == -127 * 127 * K && got[(size_t)2 * B.Np + 19] == -127 * 127 * K);
    }
    // quantize_rows: |x - q s| <= s / 2, the largest magnitude maps to +-127, a zero row to 0
    {
        std::normal_distribution<float> normal(0.f, 1.f);
        const int R = 4, K = 37;
        std::vector<float> x((size_t)R * K);
        for (auto& v : x) v = normal(rng);
        for (int k = 0; k < K; ++k) x[(size_t)3 * K + k] = 0.f;
        std::vector<int8_t> q((size_t)R * 40);
        std::vector<float> s(R);
        for (SimdLevel level : {SimdLevel::baseline, SimdLevel::avx2, SimdLevel::avx512}) {
            if ((int)level > (int)cpu_simd_level()) continue;
            simd_level_cap() = (int)level;
            quantize_rows(q.data(), 40, s.data(), x.data(), (size_t)K, R, K, 40);
            for (int r = 0; r < R; ++r) {
                int top = 0;
                for (int k = 0; k < K; ++k) {
                    CHECK(std::abs(x[(size_t)r * K + k] - q[(size_t)r * 40 + k] * s[r]) <= s[r] * 0.5f * 1.0001f);
                    top = std::max(top, std::abs((int)q[(size_t)r * 40 + k]));
                }
                CHECK(r == 3 ? (top == 0 && s[r] == 0.f) : top == 127);
                for (int k = K; k < 40; ++k) CHECK(q[(size_t)r * 40 + k] == 0);
            }
        }
        simd_level_cap() = (int)SimdLevel::avx512;
    }
    return attnx::test::report("test_quantized");
}
