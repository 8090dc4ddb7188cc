// The int8 tiles (quantized.hpp) at every SIMD level this CPU runs against the plain loop: equal
// int32 accumulators on shapes that leave partial vectors, tiles and k blocks; the row
// quantization's round trip; the second pass of coarse rows (an outlier feature); and the int8
// Dense and recurrent forward passes (packed kernels, the input projection of every step in one
// product) against the double reference (cpp/reference/quantized.hpp) at every level and split.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "attnx/quantized.hpp"
#include "check.hpp"
#include "reference/quantized.hpp"
#include "reference_check.hpp"

using namespace attnx;

// fn(where) at every SIMD level this CPU runs and, where it has AMX-INT8, at AVX-512 with the tiles
// allowed and not (_core._amx_allow): every int8 instruction set the products can take
template <class F> static void on_every_int8_level(F&& fn) {
    for (SimdLevel level : {SimdLevel::baseline, SimdLevel::avx2, SimdLevel::avx512}) {
        if ((int)level > (int)cpu_simd_level()) continue;
        simd_level_cap() = (int)level;
        for (bool amx : {true, false}) {
            if (!amx && !amx_int8_active()) continue;  // no tiles to turn off
            amx_allowed() = amx;
            fn(std::string("level ") + simd_level_name(level) + " (" + int8_level_name() + ")");
        }
        amx_allowed() = true;
    }
    simd_level_cap() = (int)SimdLevel::avx512;
}

// on_every_level_and_split's runs, and at AVX-512 the same with the AMX tiles off
template <class F> static void on_every_level_split_and_amx(F&& fn) {
    attnx::test::on_every_level_and_split(fn);
    if (!amx_int8_active()) return;
    amx_allowed() = false;
    attnx::test::on_every_level_and_split([&](const std::string& where) {
        if (simd_level() == SimdLevel::avx512) fn(where + " amx off");
    });
    amx_allowed() = true;
}

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
    on_every_int8_level([&](const std::string& where) {
        std::vector<int32_t> got((size_t)R * B.Np, -1);
        int8_product(got.data(), (size_t)B.Np, qx.data(), (size_t)B.Kp, R, B, 0, N);
        int bad = 0;
        for (int r = 0; r < R; ++r)
            for (int n = 0; n < N; ++n) bad += got[(size_t)r * B.Np + n] != want[(size_t)r * N + n];
        // the columns from 16 on alone (a decoder step's column blocks): those, and nothing else, written
        if (N > 16) {
            std::vector<int32_t> part((size_t)R * B.Np, -1);
            int8_product(part.data(), (size_t)B.Np, qx.data(), (size_t)B.Kp, R, B, 16, N);
            for (int r = 0; r < R; ++r)
                for (int n = 0; n < N; ++n)
                    bad += part[(size_t)r * B.Np + n] != (n < 16 ? -1 : want[(size_t)r * N + n]);
        }
        if (bad) std::printf("R=%d K=%d N=%d %s: %d of %d differ\n", R, K, N, where.c_str(), bad, R * N);
        CHECK(bad == 0);
    });
}

// int8 weights (K, N) quantized per column from normal floats, as attnx.quantization does
static void random_int8_kernel(std::vector<int8_t>& q, std::vector<float>& scale, int K, int N, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.f, 0.3f);
    std::vector<float> w((size_t)K * N);
    for (auto& v : w) v = normal(rng);
    q.resize((size_t)K * N), scale.resize(N);
    for (int n = 0; n < N; ++n) {
        float m = 0.f;
        for (int k = 0; k < K; ++k) m = std::max(m, std::abs(w[(size_t)k * N + n]));
        scale[n] = m / 127.f;
        for (int k = 0; k < K; ++k) q[(size_t)k * N + n] = (int8_t)std::lrint(w[(size_t)k * N + n] / scale[n]);
    }
}

// dense_forward_int8 at every level and split = the reference, on rows with an unused outlier (two passes)
static void dense_matches_reference(std::mt19937& rng) {
    const int R = 150, K = 37, N = 70;  // partial tiles, chunks of 64 rows, a split across threads
    std::vector<int8_t> qw;
    std::vector<float> sw;
    random_int8_kernel(qw, sw, K, N, rng);
    for (int n = 0; n < N; ++n) qw[(size_t)5 * N + n] = 0;  // feature 5 unused
    auto x = attnx::test::cast<float>(attnx::test::random_values(rng, (size_t)R * K));
    auto bias = attnx::test::cast<float>(attnx::test::random_values(rng, N));
    for (int r = 0; r < R; r += 7) x[(size_t)r * K + 5] = 1000.f;
    Int8Kernel packed;
    pack_int8_kernel(packed, qw.data(), sw.data(), K, N, N);
    for (Activation a : {Activation::linear, Activation::relu, Activation::tanh}) {
        std::vector<double> want((size_t)R * N);
        reference::dense_forward_int8(want.data(), x.data(), qw.data(), sw.data(), bias.data(), R, K, N, a);
        on_every_level_split_and_amx([&](const std::string& where) {
            std::vector<float> got((size_t)R * N);
            dense_forward_int8(got.data(), x.data(), R, packed, bias.data(), a);
            attnx::test::expect_near(got, want, 1e-5, "dense_forward_int8 " + where);
            // in column blocks of 20, 33 and 17: the same floats, each block contiguous
            std::vector<float> b0((size_t)R * 20), b1((size_t)R * 33), b2((size_t)R * 17);
            Int8ColumnBlocks blocks;
            blocks.out[0] = b0.data(), blocks.out[1] = b1.data(), blocks.out[2] = b2.data();
            blocks.ends[0] = 20, blocks.ends[1] = 53, blocks.ends[2] = 70, blocks.count = 3;
            dense_forward_int8(blocks, x.data(), R, packed, bias.data(), a);
            int differ = 0;
            for (int r = 0; r < R; ++r)
                for (int n = 0; n < N; ++n) {
                    const float block = n < 20 ? b0[(size_t)r * 20 + n] : n < 53 ? b1[(size_t)r * 33 + n - 20]
                                                                              : b2[(size_t)r * 17 + n - 53];
                    differ += block != got[(size_t)r * N + n];
                }
            CHECK(differ == 0);
        });
    }
}

// feed_forward_forward_int8 (both products chunk by chunk, the hidden rows in the thread's scratch) at
// every level and split = the reference's two int8 Dense layers, with an outlier row (two passes)
static void feed_forward_matches_reference(std::mt19937& rng) {
    const int R = 150, K = 37, F = 70, N = 23;  // partial tiles, chunks of 64 rows, a split across threads
    std::vector<int8_t> qw1, qw2;
    std::vector<float> sw1, sw2;
    random_int8_kernel(qw1, sw1, K, F, rng);
    random_int8_kernel(qw2, sw2, F, N, rng);
    for (int n = 0; n < F; ++n) qw1[(size_t)5 * F + n] = 0;  // feature 5 unused
    auto x = attnx::test::cast<float>(attnx::test::random_values(rng, (size_t)R * K));
    auto b1 = attnx::test::cast<float>(attnx::test::random_values(rng, F));
    auto b2 = attnx::test::cast<float>(attnx::test::random_values(rng, N));
    for (int r = 0; r < R; r += 7) x[(size_t)r * K + 5] = 1000.f;
    Int8Kernel packed1, packed2;
    pack_int8_kernel(packed1, qw1.data(), sw1.data(), K, F, F);
    pack_int8_kernel(packed2, qw2.data(), sw2.data(), F, N, N);
    for (Activation a : {Activation::relu, Activation::gelu}) {
        std::vector<double> want((size_t)R * N);
        reference::feed_forward_forward_int8(want.data(), x.data(), qw1.data(), sw1.data(), b1.data(), a, qw2.data(),
                                             sw2.data(), b2.data(), R, K, F, N);
        on_every_level_split_and_amx([&](const std::string& where) {
            std::vector<float> got((size_t)R * N), twice((size_t)R * N), hidden((size_t)R * F);
            feed_forward_forward_int8(got.data(), x.data(), R, packed1, b1.data(), a, packed2, b2.data());
            attnx::test::expect_near(got, want, 1e-5, "feed_forward_forward_int8 " + where);
            // the same floats as two dense_forward_int8 calls
            dense_forward_int8(hidden.data(), x.data(), R, packed1, b1.data(), a);
            dense_forward_int8(twice.data(), hidden.data(), R, packed2, b2.data(), Activation::linear);
            CHECK(got == twice);
        });
    }
}

// Rows of K = 1, 15, 17, 40, 100 features (partial vectors and 16-lane groups: the tails of row_abs_max
// and of the coarse sums) at every level: quantize_rows and Int8Activations give the reference's bytes,
// scales and coarse rows, the largest magnitude in the last (partial) vector; dense_forward_int8 at
// every level and split = the reference
static void rows_at_odd_widths(std::mt19937& rng) {
    std::normal_distribution<float> normal(0.f, 1.f);
    for (int K : {1, 15, 17, 40, 100}) {
        const int R = 5, N = 33, Kp = round_up(K, 4);
        std::vector<int8_t> qw;
        std::vector<float> sw;
        random_int8_kernel(qw, sw, K, N, rng);
        if (K > 1)
            for (int n = 0; n < N; ++n) qw[(size_t)(K - 1) * N + n] = 0;  // the last feature unused
        Int8Kernel packed;
        pack_int8_kernel(packed, qw.data(), sw.data(), K, N, N);
        const float* kw = packed.head.feature_weight.data();
        std::vector<float> x((size_t)R * K);
        for (auto& v : x) v = normal(rng);
        x[(size_t)1 * K + K - 1] = -7.f;    // row 1: its largest magnitude last, negative
        std::fill(x.begin() + 2 * K, x.begin() + 3 * K, 0.f);  // row 2: zero
        x[(size_t)3 * K + K - 1] = 1000.f;  // row 3: an unused outlier last (coarse when K > 1)
        x[(size_t)4 * K + K / 2] = 50.f;    // row 4: a used one in the middle
        std::vector<int8_t> want_q((size_t)R * K), want_qe((size_t)R * K);
        std::vector<float> want_s(R), want_se(R);
        std::vector<int> want_which;
        for (int r = 0; r < R; ++r)
            if (reference::quantize_row_two_pass_int8(want_q.data() + (size_t)r * K, want_s[r],
                                                      want_qe.data() + (size_t)r * K, want_se[r], x.data() + (size_t)r * K,
                                                      kw, K))
                want_which.push_back(r);
        CHECK(K == 1 || std::count(want_which.begin(), want_which.end(), 3) == 1);  // the test holds a coarse row
        for (SimdLevel level : {SimdLevel::baseline, SimdLevel::avx2, SimdLevel::avx512}) {
            if ((int)level > (int)cpu_simd_level()) continue;
            simd_level_cap() = (int)level;
            std::vector<int8_t> q((size_t)R * Kp, 1);
            std::vector<float> s(R);
            quantize_rows(q.data(), (size_t)Kp, s.data(), x.data(), (size_t)K, R, K, Kp);
            Int8Activations a;
            a.resize(R, K, Kp, packed.head.Np);
            on_widest_lanes<float>([&](auto lanes) __attribute__((always_inline)) {
                a.quantize_on<decltype(lanes)>(x.data(), (size_t)K, R, kw);
            });
            int bad = 0;
            for (int r = 0; r < R; ++r) {
                bad += s[r] != want_s[r] || a.s[r] != want_s[r];
                for (int k = 0; k < Kp; ++k) {
                    const int8_t want = k < K ? want_q[(size_t)r * K + k] : 0;
                    bad += q[(size_t)r * Kp + k] != want || a.q[(size_t)r * Kp + k] != want;
                }
            }
            bad += a.coarse != (int)want_which.size();
            for (int i = 0; i < std::min(a.coarse, (int)want_which.size()); ++i) {
                const int r = want_which[i];
                bad += a.which[i] != r || a.se[i] != want_se[r];
                for (int k = 0; k < K; ++k) bad += a.qe[(size_t)i * Kp + k] != want_qe[(size_t)r * K + k];
            }
            if (bad) std::printf("K=%d level %s: %d quantized values differ from the reference\n", K,
                                 simd_level_name(level), bad);
            CHECK(bad == 0);
        }
        simd_level_cap() = (int)SimdLevel::avx512;
        auto bias = attnx::test::cast<float>(attnx::test::random_values(rng, N));
        std::vector<double> want((size_t)R * N);
        reference::dense_forward_int8(want.data(), x.data(), qw.data(), sw.data(), bias.data(), R, K, N,
                                      Activation::relu);
        on_every_level_split_and_amx([&](const std::string& where) {
            std::vector<float> got((size_t)R * N);
            dense_forward_int8(got.data(), x.data(), R, packed, bias.data(), Activation::relu);
            attnx::test::expect_near(got, want, 1e-5, "dense_forward_int8 K=" + std::to_string(K) + " " + where);
        });
    }
}

// rnn_forward_int8 (one cell, direction, GRU form) at every level and split = the reference, with a
// padded step. h's quantization could round the other way where the float and double states differ
// in their last bits (an error of an int8 step of one product then); these operands do not meet one.
// `outliers`: a feature of x and of h_0 that the kernels do not use, large in some rows: those rows
// take the second pass (coarse rows), in the input projection and in the first step's h_{t-1} U
// B: 5 (every step's product below int8_amx_pays's rows), or 37 (the steps on AMX tiles too, on one
// thread and on two)
static void recurrent_matches_reference(RNNCell cell, bool reset_after, bool reverse, bool outliers,
                                        std::mt19937& rng, int batch = 5) {
    RNNConfig cfg;
    cfg.cell = cell, cfg.reset_after = reset_after, cfg.reverse = reverse;
    cfg.B = batch, cfg.T = 6, cfg.C = 13, cfg.H = 21;
    const int G = cfg.G(), B = cfg.B, T = cfg.T, H = cfg.H;
    const bool classic = cell == RNNCell::gru && !reset_after;
    std::vector<int8_t> qw, qu;
    std::vector<float> sw, su;
    random_int8_kernel(qw, sw, cfg.C, G, rng);
    random_int8_kernel(qu, su, H, G, rng);
    auto x = attnx::test::cast<float>(attnx::test::random_values(rng, (size_t)B * T * cfg.C));
    if (outliers) {
        std::fill(qw.begin(), qw.begin() + G, int8_t(0));  // feature 0 of x and of h unused
        std::fill(qu.begin(), qu.begin() + G, int8_t(0));
        for (int bt = 0; bt < B * T; bt += 3) x[(size_t)bt * cfg.C] = bt % 2 ? 500.f : -700.f;
    }
    auto b_in = attnx::test::cast<float>(attnx::test::random_values(rng, G, 0.1));
    auto b_rec = attnx::test::cast<float>(attnx::test::random_values(rng, G, 0.1));
    const float* pb_rec = cell == RNNCell::gru && reset_after ? b_rec.data() : nullptr;
    std::vector<uint8_t> mask((size_t)B * T, 1);
    mask[(size_t)1 * T + 2] = 0;
    auto h0 = attnx::test::random_values(rng, (size_t)B * H, 0.5), c0 = attnx::test::random_values(rng, (size_t)B * H);
    if (outliers) h0[(size_t)2 * H] = 300.0, h0[(size_t)4 * H] = -250.0;
    std::vector<double> want_y((size_t)B * T * H), want_h = h0, want_c = c0;
    reference::rnn_forward_int8(cfg, want_y.data(), want_h.data(), want_c.data(), x.data(), qw.data(), sw.data(),
                                qu.data(), su.data(), b_in.data(), pb_rec, mask.data());
    Int8Kernel W, U;
    pack_int8_kernel(W, qw.data(), sw.data(), cfg.C, G, G);
    pack_int8_kernel(U, qu.data(), su.data(), H, G, classic ? 2 * H : G);
    const std::string what = std::string("rnn_forward_int8 ") +
                             (cell == RNNCell::lstm ? "lstm" : cell == RNNCell::gru ? "gru" : "simple") +
                             (classic ? " classic" : "") + (reverse ? " reverse " : " ") +
                             (outliers ? "outliers " : "");
    on_every_level_split_and_amx([&](const std::string& where) {
        std::vector<float> y((size_t)B * T * H), h = attnx::test::cast<float>(h0), c = attnx::test::cast<float>(c0);
        rnn_forward_int8(cfg, y.data(), h.data(), cell == RNNCell::lstm ? c.data() : nullptr, x.data(), W, U,
                         b_in.data(), pb_rec, mask.data());
        attnx::test::expect_near(y, want_y, 1e-5, what + "y " + where);
        attnx::test::expect_near(h, want_h, 1e-5, what + "h " + where);
        if (cell == RNNCell::lstm) attnx::test::expect_near(c, want_c, 1e-5, what + "c " + where);
    });
}

int main() {
    std::mt19937 rng(7);
    for (int R : {1, 2, 3, 5, 9})
        for (int K : {1, 4, 7, 100, 257})
            for (int N : {1, 15, 16, 33, 100, 400}) product_matches_reference(R, K, N, rng);
    // the AMX tiles' shapes (int8_amx_pays: from 16 rows, from 8 where K > 64): whole and partial 16-row
    // tiles and 32-row panels, k blocks of 64 whole (qx read in place) and partial (copied and padded),
    // 1 to 2 column tiles
    for (int R : {8, 12, 16, 17, 31, 32, 33, 48, 64, 70})
        for (int K : {1, 37, 64, 128, 200})
            for (int N : {1, 16, 17, 32, 48, 100}) product_matches_reference(R, K, N, rng);
    // extreme values: every product +-127^2, K large
    for (int R : {3, 20}) {  // the VNNI tiles, the AMX tiles
        const int K = 1024, N = 20;
        std::vector<int8_t> qw((size_t)K * N, 127);
        Int8Packed B;
        pack_int8(B, qw.data(), (size_t)N, K, N);
        std::vector<int8_t> qx((size_t)R * B.Kp, -127);
        std::vector<int32_t> got((size_t)R * B.Np);
        int8_product(got.data(), (size_t)B.Np, qx.data(), (size_t)B.Kp, R, B, 0, N);
        CHECK(got[0] == -127 * 127 * K && got[(size_t)(R - 1) * B.Np + 19] == -127 * 127 * K);
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
    // coarse rows: one large value the weights do not use leaves the others at |q| <= 1, so the
    // residual takes a second pass (the same bytes at every level, x within se / 2 of s q + se qe);
    // ordinary rows take one, and so does a row whose large value the weights use
    {
        std::normal_distribution<float> normal(0.f, 1.f);
        const int R = 5, K = 37, Kp = 40;
        std::vector<float> x((size_t)R * K);
        for (auto& v : x) v = normal(rng);
        x[(size_t)1 * K + 3] = 1000.f;   // an outlier feature
        x[(size_t)3 * K + 0] = -5000.f;  // and one more, negative, in another row
        x[(size_t)4 * K + 5] = 1000.f;   // an outlier the weights use: one pass
        std::vector<float> kw(K, 127.f);
        kw[3] = kw[0] = 0.f;  // features 0 and 3 unused
        Panels<int8_t> want_q, want_qe;  // (the buffers' own type: Int8Activations keeps them on cache lines)
        for (SimdLevel level : {SimdLevel::baseline, SimdLevel::avx2, SimdLevel::avx512}) {
            if ((int)level > (int)cpu_simd_level()) continue;
            simd_level_cap() = (int)level;
            Int8Activations a;
            a.resize(R, K, Kp, 16);
            on_widest_lanes<float>([&](auto lanes) __attribute__((always_inline)) {
                a.quantize_on<decltype(lanes)>(x.data(), (size_t)K, R, kw.data());
            });
            CHECK(a.coarse == 2 && a.which[0] == 1 && a.which[1] == 3);
            for (int i = 0; i < a.coarse; ++i) {
                const int r = a.which[i];
                for (int k = 0; k < K; ++k) {
                    const float approx = a.s[r] * a.q[(size_t)r * Kp + k] + a.se[i] * a.qe[(size_t)i * Kp + k];
                    CHECK(std::abs(x[(size_t)r * K + k] - approx) <= a.se[i] * 0.5f * 1.001f + 1e-6f);
                }
                CHECK(a.se[i] <= a.s[r] * 0.5f / 127.f * 1.001f);  // max|e| <= s / 2
            }
            if (want_q.empty()) want_q = a.q, want_qe = a.qe;
            CHECK(a.q == want_q && a.qe == want_qe);
        }
        simd_level_cap() = (int)SimdLevel::avx512;
    }
    // dense_forward_int8 on a row whose outlier feature the kernel ignores: within the second pass's bound
    {
        std::normal_distribution<float> normal(0.f, 1.f);
        const int R = 3, K = 24, N = 9;
        std::vector<float> x((size_t)R * K), w((size_t)K * N), sw(N);
        for (auto& v : x) v = normal(rng);
        for (auto& v : w) v = normal(rng);
        for (int n = 0; n < N; ++n) w[n] = 0.f;  // feature 0 unused
        x[(size_t)1 * K] = 1000.f;
        std::vector<int8_t> qw((size_t)K * N);
        for (int n = 0; n < N; ++n) {  // per column, as attnx.quantization does
            float m = 0.f;
            for (int k = 0; k < K; ++k) m = std::max(m, std::abs(w[(size_t)k * N + n]));
            sw[n] = m / 127.f;
            for (int k = 0; k < K; ++k) qw[(size_t)k * N + n] = (int8_t)std::lrint(w[(size_t)k * N + n] / sw[n]);
        }
        std::vector<float> out((size_t)R * N);
        Int8Kernel packed;
        pack_int8_kernel(packed, qw.data(), sw.data(), K, N, N);
        dense_forward_int8(out.data(), x.data(), R, packed, nullptr, Activation::linear);
        for (int n = 0; n < N; ++n) {
            double y = 0, wsum = 0, xsum = 0;
            for (int k = 0; k < K; ++k) y += (double)x[(size_t)K + k] * w[(size_t)k * N + n];
            for (int k = 1; k < K; ++k) wsum += std::abs(w[(size_t)k * N + n]), xsum += std::abs(x[(size_t)K + k]);
            // the others' max is about 3: a step of 3 / 127 for them, where one pass would give 1000 / 127
            const double dw = sw[n] / 2, dx = 4.0 / 254;
            CHECK(std::abs(out[N + n] - y) <= dx * (wsum + K * dw) + xsum * dw + 1e-3);
        }
    }
    rows_at_odd_widths(rng);
    dense_matches_reference(rng);
    feed_forward_matches_reference(rng);
    for (RNNCell cell : {RNNCell::simple, RNNCell::gru, RNNCell::lstm})
        for (bool reset_after : {true, false})
            for (bool reverse : {false, true}) {
                if (cell != RNNCell::gru && !reset_after) continue;
                for (bool outliers : {false, true}) recurrent_matches_reference(cell, reset_after, reverse, outliers, rng);
            }
    for (RNNCell cell : {RNNCell::gru, RNNCell::lstm})
        for (bool reset_after : {true, false}) {
            if (cell != RNNCell::gru && !reset_after) continue;
            recurrent_matches_reference(cell, reset_after, false, true, rng, 37);
        }
    return attnx::test::report("test_quantized");
}
