// rnn_bf16.hpp against the references: every cell (SimpleRNN, LSTM, GRU reset_after and classic),
// both time orders, a step mask, with and without recurrent dropout, on every SIMD level (AVX-512
// also on float lanes where vdpbf16ps exists: bit-equal to it), one thread and two.
//   - the forward, step by step: cpp/reference/rnn.hpp (one step, every product's operands rounded to
//     bf16) from the kernel's own state entering each step, within float tolerance. A whole sequence
//     cannot be held to float tolerance: where the float32 and double states straddle a bf16 rounding
//     boundary they round apart (2^-9 relative), and the trajectories then differ by bf16's error;
//   - the backward on the kernel's forward cache: dh0, dc0 and the bias gradients against the rounded
//     reference within a few such roundings (kStepsTolerance), and the float reference within bf16's;
//   - dx, dW, dU: cpp/reference/bf16.hpp's product of the kernel's own dgates / dhu and cache within
//     float tolerance, and the float reference's gradients within bf16's.
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

// kStepsTolerance: the double reference's gate gradients round to other bf16 values than the kernel's
// float32 ones now and then (2^-9 relative each)
constexpr double kFloatTolerance = 2e-4, kStepsTolerance = 3e-3, kBf16Tolerance = 2e-2;

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
    // U of norm about 2, as trained recurrent kernels are (orthogonal at the start): a larger one makes
    // 6 steps amplify bf16's rounding as they amplify the gradients
    const auto U = random_values(rng, (size_t)H * G, 1.0 / std::sqrt((double)H)), b_in = random_values(rng, G, 0.3);
    const auto b_rec = random_values(rng, G, 0.3), h0 = random_values(rng, (size_t)B * H, 0.5);
    const auto c0 = random_values(rng, (size_t)B * H, 0.5), dy = random_values(rng, BT * H);
    const auto dh_last = random_values(rng, (size_t)B * H), dc_last = random_values(rng, (size_t)B * H);
    std::vector<double> rec_mask((size_t)B * H);
    // (a power of two: h_rec = 2 h is exact in float32 as in double, and rounds alike)
    for (size_t i = 0; i < rec_mask.size(); ++i) rec_mask[i] = i % 3 ? 2.0 : 0.0;
    const double* rm = dropout ? rec_mask.data() : nullptr;
    std::vector<uint8_t> mask(BT, 1);
    for (int b = 1; b < B; ++b) mask[(size_t)b * T + (b % 2 ? T - 1 : 0)] = 0;

    // the float32 reference's gradients (on the bf16-rounded input projection)
    const auto xr = reference::rounded_to_bf16(x.data(), x.size()), Wr = reference::rounded_to_bf16(W.data(), W.size());
    std::vector<double> dx(x.size()), dW(W.size(), 0), dU(U.size(), 0);
    {
        std::vector<double> y(BT * H, 0), h = h0, c = c0, db_in(G, 0), db_rec(G, 0), dh = dh_last, dc = dc_last;
        reference::RNNCache cache;
        reference::rnn_forward(cfg, y.data(), h.data(), lstm ? c.data() : nullptr, cache, xr.data(), Wr.data(),
                               U.data(), b_in.data(), gru_after ? b_rec.data() : nullptr, mask.data(), rm);
        reference::rnn_backward(cfg, dx.data(), dW.data(), dU.data(), db_in.data(),
                                gru_after ? db_rec.data() : nullptr, dh.data(), lstm ? dc.data() : nullptr, dy.data(),
                                cache, xr.data(), Wr.data(), U.data(), mask.data(), rm);
    }
    char where[112];
    std::snprintf(where, sizeof where, "%s reverse=%d dropout=%d B=%d T=%d C=%d H=%d", cell_name(cfg), (int)cfg.reverse,
                  (int)dropout, B, T, C, H);

    // returns y, dh0 and the steps' gate gradients
    auto check = [&](const std::string& level) -> std::vector<float> {
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
        // the forward, one step at a time from the kernel's state entering it
        RNNConfig step = cfg;
        step.T = 1, step.reverse = false;
        std::vector<double> y_t((size_t)B * H), g_t, aux_t;
        for (int t = 0; t < T; ++t) {
            std::vector<double> x_t((size_t)B * C), h_t((size_t)B * H), c_t((size_t)B * H, 0);
            std::vector<uint8_t> mask_t(B);
            for (int b = 0; b < B; ++b) {
                const size_t bt = (size_t)b * T + t;
                std::copy_n(xr.begin() + bt * C, C, x_t.begin() + (size_t)b * C);
                std::copy_n(h_prev.begin() + bt * H, H, h_t.begin() + (size_t)b * H);
                if (lstm) std::copy_n(c_prev.begin() + bt * H, H, c_t.begin() + (size_t)b * H);
                mask_t[b] = mask[bt];
            }
            reference::RNNCache one;
            reference::rnn_forward(step, y_t.data(), h_t.data(), lstm ? c_t.data() : nullptr, one, x_t.data(),
                                   Wr.data(), U.data(), b_in.data(), gru_after ? b_rec.data() : nullptr, mask_t.data(),
                                   rm, reference::round_to_bf16);
            // the kernel's step t (its padded rows' gates and aux are not kept: compared as the reference's)
            std::vector<double> got_y((size_t)B * H), got_g((size_t)B * G), got_aux((size_t)B * H);
            for (int b = 0; b < B; ++b) {
                const size_t bt = (size_t)b * T + t;
                for (int j = 0; j < H; ++j) {
                    got_y[(size_t)b * H + j] = y_[bt * H + j];
                    got_aux[(size_t)b * H + j] = mask[bt] ? aux[bt * H + j] : one.aux[(size_t)b * H + j];
                }
                for (int g = 0; g < G; ++g) got_g[(size_t)b * G + g] = mask[bt] ? gates[bt * G + g] : one.gates[(size_t)b * G + g];
            }
            Named want{{"y", y_t}, {"gates", one.gates}};
            Named got{{"y", got_y}, {"gates", got_g}};
            if (cfg.cell != RNNCell::simple) want.push_back({"aux", one.aux}), got.push_back({"aux", got_aux});
            compare_all(got, want, kFloatTolerance, at + " step " + std::to_string(t));
        }
        // the backward on the kernel's forward cache
        reference::RNNCache cache;
        cache.gates = to_double(gates), cache.h_prev = to_double(h_prev), cache.c_prev = to_double(c_prev);
        cache.h_rec = to_double(dropout ? h_rec : h_prev), cache.aux = to_double(aux);
        std::vector<double> ref_dx(x.size()), ref_dW(W.size(), 0), ref_dU(U.size(), 0), db_in(G, 0), db_rec(G, 0),
            dh = dh_last, dc = dc_last;
        reference::rnn_backward(cfg, ref_dx.data(), ref_dW.data(), ref_dU.data(), db_in.data(),
                                gru_after ? db_rec.data() : nullptr, dh.data(), lstm ? dc.data() : nullptr, dy.data(),
                                cache, xr.data(), Wr.data(), U.data(), mask.data(), rm, reference::round_to_bf16);
        if (!lstm) dc = dc_last;
        compare_all({{"dh0", to_double(dh_)}, {"dc0", to_double(lstm ? dc_ : cast<float>(dc_last))},
                     {"db_in", to_double(db_in_)}, {"db_rec", to_double(db_rec_)}},
                    {{"dh0", dh}, {"dc0", dc}, {"db_in", db_in}, {"db_rec", db_rec}}, kStepsTolerance, at);
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
        std::vector<float> outputs = y_;
        outputs.insert(outputs.end(), dh_.begin(), dh_.end());
        outputs.insert(outputs.end(), dhu_, dhu_ + BT * G);
        return outputs;
    };
    on_every_level_and_split([&](const std::string& level) {
        if (simd_level() == SimdLevel::avx512 && cpu_amx_support().bf16) {
            check(level + " amx");  // AMX tiles sum in their own order: against the reference alone
            amx_allowed() = false;
        }
        const auto native = check(level);
        amx_allowed() = true;
        if (simd_level() == SimdLevel::avx512 && cpu_has_avx512_bf16()) {
            amx_allowed() = false;
            bf16_dot_instruction_allowed() = false;
            const auto lanes = check(level + " float lanes");
            bf16_dot_instruction_allowed() = true;
            amx_allowed() = true;
            // the same arithmetic: bit for bit (no subnormal operands here)
            if (lanes != native) {
                std::printf("FAIL %s %s: vdpbf16ps and its emulation on float lanes differ\n", where, level.c_str());
                ++failures();
            }
        }
    });
}

}  // namespace

int main() {
    // (B, T, C, H); the last: odd T (the weight gradients' last pair of steps has one row) and odd H
    // (LSTM's tail units)
    const int shapes[][4] = {{3, 4, 5, 10}, {8, 6, 9, 64}, {5, 5, 7, 33}};
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
