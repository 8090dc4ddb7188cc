// rnn_bf16.hpp against the references: every cell (SimpleRNN, LSTM, GRU reset_after and classic),
// both time orders, a step mask, with and without recurrent dropout, on every SIMD level (AVX-512
// also on float lanes where vdpbf16ps exists), one thread and two.
//   - the forward, dh0, dc0 and the bias gradients: cpp/reference/rnn.hpp on x and W rounded to bf16
//     (the input projection's only rounding), within float tolerance;
//   - dx, dW, dU: cpp/reference/bf16.hpp's product of the kernel's own dgates / dhu and cache (the
//     float32 steps' results) within float tolerance, and the float reference's gradients within
//     bf16's (what rounding dgates moves them by).
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attnx/rnn_bf16.hpp"
#include "reference/bf16.hpp"
#include "reference/rnn.hpp"
#include "reference_check.hpp"

using namespace attnx;
using namespace attnx::test;

namespace {

constexpr double kFloatTolerance = 2e-4, kBf16Tolerance = 2e-2;

const char* cell_name(const RNNConfig& cfg) {
    return cfg.cell == RNNCell::simple ? "SimpleRNN"
           : cfg.cell == RNNCell::lstm ? "LSTM"
           : cfg.reset_after           ? "GRU(reset_after)"
                                       : "GRU(classic)";
}

void test_cell(const RNNConfig& cfg, bool dropout, unsigned seed) {
    const int B = cfg.B, T = cfg.T, C = cfg.C, H = cfg.H, G = cfg.G();
    const size_t BT = (size_t)B * T;
    const bool gru_after = cfg.cell == RNNCell::gru && cfg.reset_after, lstm = cfg.cell == RNNCell::lstm;
    std::mt19937 rng(seed);
    const auto x = random_values(rng, BT * C), W = random_values(rng, (size_t)C * G, 0.4);
    const auto U = random_values(rng, (size_t)H * G, 0.4), b_in = random_values(rng, G, 0.3);
    const auto b_rec = random_values(rng, G, 0.3), h0 = random_values(rng, (size_t)B * H, 0.5);
    const auto c0 = random_values(rng, (size_t)B * H, 0.5), dy = random_values(rng, BT * H);
    const auto dh_last = random_values(rng, (size_t)B * H), dc_last = random_values(rng, (size_t)B * H);
    std::vector<double> rec_mask((size_t)B * H);
    for (size_t i = 0; i < rec_mask.size(); ++i) rec_mask[i] = i % 3 ? 1.25 : 0.0;
    const double* rm = dropout ? rec_mask.data() : nullptr;
    std::vector<uint8_t> mask(BT, 1);
    for (int b = 1; b < B; ++b) mask[(size_t)b * T + (b % 2 ? T - 1 : 0)] = 0;

    // the reference on the bf16-rounded input projection
    const auto xr = reference::rounded_to_bf16(x.data(), x.size()), Wr = reference::rounded_to_bf16(W.data(), W.size());
    std::vector<double> y(BT * H, 0), h = h0, c = c0;
    reference::RNNCache cache;
    reference::rnn_forward(cfg, y.data(), h.data(), lstm ? c.data() : nullptr, cache, xr.data(), Wr.data(), U.data(),
                           b_in.data(), gru_after ? b_rec.data() : nullptr, mask.data(), rm);
    std::vector<double> dx(x.size()), dW(W.size(), 0), dU(U.size(), 0), db_in(G, 0), db_rec(G, 0), dh = dh_last,
                                                                                          dc = dc_last;
    reference::rnn_backward(cfg, dx.data(), dW.data(), dU.data(), db_in.data(), gru_after ? db_rec.data() : nullptr,
                            dh.data(), lstm ? dc.data() : nullptr, dy.data(), cache, xr.data(), Wr.data(), U.data(),
                            mask.data(), rm);
    if (!lstm) c = c0, dc = dc_last;
    char where[112];
    std::snprintf(where, sizeof where, "%s reverse=%d dropout=%d B=%d T=%d C=%d H=%d", cell_name(cfg), (int)cfg.reverse,
                  (int)dropout, B, T, C, H);

    auto check = [&](const std::string& level) {
        const auto x_ = cast<float>(x), W_ = cast<float>(W), U_ = cast<float>(U), b_in_ = cast<float>(b_in);
        const auto b_rec_ = cast<float>(b_rec), rec_mask_ = cast<float>(rec_mask), dy_ = cast<float>(dy);
        std::vector<float> y_(BT * H), h_ = cast<float>(h0), c_ = cast<float>(c0), gates(BT * G), h_prev(BT * H),
            h_rec(BT * H), c_prev(BT * H), aux(BT * H), hu((size_t)B * G);
        RNNCache<float> kc;
        kc.gates = gates.data(), kc.h_prev = h_prev.data(), kc.h_rec = dropout ? h_rec.data() : nullptr;
        kc.c_prev = lstm ? c_prev.data() : nullptr, kc.aux = cfg.cell == RNNCell::simple ? nullptr : aux.data();
        const float* rm_ = dropout ? rec_mask_.data() : nullptr;
        rnn_forward_bf16(cfg, y_.data(), h_.data(), c_.data(), kc, x_.data(), W_.data(), U_.data(), b_in_.data(),
                         gru_after ? b_rec_.data() : nullptr, mask.data(), rm_, hu.data());
        std::vector<float> dx_(x.size()), dW_(W.size(), 0), dU_(U.size(), 0), db_in_(G, 0), db_rec_(G, 0);
        std::vector<float> dh_ = cast<float>(dh_last), dc_ = cast<float>(dc_last), dgates(BT * G), dhu(BT * G),
                           dhrec((size_t)B * H);
        float* dhu_ = gru_after ? dhu.data() : dgates.data();
        rnn_backward_bf16(cfg, dx_.data(), dW_.data(), dU_.data(), db_in_.data(), gru_after ? db_rec_.data() : nullptr,
                          dh_.data(), lstm ? dc_.data() : nullptr, dy_.data(), kc, x_.data(), W_.data(), U_.data(),
                          mask.data(), rm_, dgates.data(), dhu_, dhrec.data());
        const std::string at = std::string(where) + " " + level;
        compare_all({{"y", to_double(y_)}, {"h", to_double(h_)}, {"c", to_double(lstm ? c_ : cast<float>(c0))},
                     {"dh0", to_double(dh_)}, {"dc0", to_double(lstm ? dc_ : cast<float>(dc_last))},
                     {"db_in", to_double(db_in_)}, {"db_rec", to_double(db_rec_)}},
                    {{"y", y}, {"h", h}, {"c", c}, {"dh0", dh}, {"dc0", dc}, {"db_in", db_in}, {"db_rec", db_rec}},
                    kFloatTolerance, at);
        // the products, from the kernel's own step gradients
        const auto dg = to_double(dgates), dg_u = to_double(gru_after ? dhu : dgates);
        const auto hr = to_double(dropout ? h_rec : h_prev), rh = to_double(aux);
        std::vector<double> want_dx(x.size()), want_dW(W.size(), 0), want_dU(U.size(), 0);
        reference::bf16_gemm(want_dx.data(), dg.data(), false, W.data(), true, (int)BT, C, G, false);
        reference::bf16_gemm(want_dW.data(), x.data(), true, dg.data(), false, C, G, (int)BT, true);
        if (cfg.cell == RNNCell::gru && !cfg.reset_after) {
            // dU_rz from h_rec, dU_n from r * h_rec: columns [0, 2H) and [2H, 3H) of dU
            std::vector<double> d_rz(BT * 2 * H), d_n(BT * H), rz((size_t)H * 2 * H, 0), n((size_t)H * H, 0);
            for (size_t r = 0; r < BT; ++r)
                for (int g = 0; g < G; ++g) (g < 2 * H ? d_rz[r * 2 * H + g] : d_n[r * H + g - 2 * H]) = dg_u[r * G + g];
            reference::bf16_gemm(rz.data(), hr.data(), true, d_rz.data(), false, H, 2 * H, (int)BT, false);
            reference::bf16_gemm(n.data(), rh.data(), true, d_n.data(), false, H, H, (int)BT, false);
            for (int k = 0; k < H; ++k)
                for (int g = 0; g < G; ++g) want_dU[(size_t)k * G + g] = g < 2 * H ? rz[(size_t)k * 2 * H + g] : n[(size_t)k * H + g - 2 * H];
        } else {
            reference::bf16_gemm(want_dU.data(), hr.data(), true, dg_u.data(), false, H, G, (int)BT, false);
        }
        const Named got{{"dx", to_double(dx_)}, {"dW", to_double(dW_)}, {"dU", to_double(dU_)}};
        compare_all(got, {{"dx", want_dx}, {"dW", want_dW}, {"dU", want_dU}}, kFloatTolerance, at + " bf16 products");
        // bf16's tolerance on the whole array (one element may sum large terms that cancel)
        const Named float32{{"dx", dx}, {"dW", dW}, {"dU", dU}};
        for (size_t i = 0; i < got.size(); ++i) {
            double diff = 0, norm = 0;
            for (size_t j = 0; j < got[i].second.size(); ++j) {
                const double d = got[i].second[j] - float32[i].second[j];
                diff += d * d, norm += float32[i].second[j] * float32[i].second[j];
            }
            if (!(std::sqrt(diff) <= kBf16Tolerance * std::sqrt(norm))) {
                std::printf("FAIL %s %s: |bf16 - float32| / |float32| = %.3g\n", at.c_str(), got[i].first.c_str(),
                            std::sqrt(diff / norm));
                ++failures();
            }
        }
    };
    on_every_level_and_split([&](const std::string& level) {
        check(level);
        if (simd_level() == SimdLevel::avx512 && cpu_has_avx512_bf16()) {
            bf16_dot_instruction_allowed() = false;
            check(level + " float lanes");
            bf16_dot_instruction_allowed() = true;
        }
    });
}

}  // namespace

int main() {
    const int shapes[][4] = {{3, 4, 5, 10}, {8, 6, 9, 64}};
    unsigned seed = 1;
    for (RNNCell cell : {RNNCell::simple, RNNCell::lstm, RNNCell::gru})
        for (bool reset_after : {true, false}) {
            if (cell != RNNCell::gru && !reset_after) continue;
            for (bool reverse : {false, true})
                for (bool dropout : {false, true})
                    for (const auto& s : shapes) {
                        RNNConfig cfg;
                        cfg.cell = cell, cfg.reset_after = reset_after, cfg.reverse = reverse;
                        cfg.B = s[0], cfg.T = s[1], cfg.C = s[2], cfg.H = s[3];
                        if (s[3] == 10 && dropout) cfg.activation = Activation::relu;  // the general activation path
                        test_cell(cfg, dropout, seed++);
                    }
        }
    return attnx::test::report("test_reference_rnn_bf16");
}
