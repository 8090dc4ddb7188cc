// Recurrent kernels: central-difference gradients in double for every cell kind with a mask,
// reversed time and recurrent dropout; the two-thread batch split against one thread; the float
// activations against libm; the one-row steps on U in place (the plan's and the decoders' batch of
// one) against the reference on every SIMD level.
#include <cmath>
#include <random>
#include <vector>

#include "attnx/rnn.hpp"
#include "check.hpp"
#include "reference/rnn.hpp"
#include "reference_check.hpp"

using namespace attnx;

namespace {

struct Problem {
    RNNConfig cfg;
    std::vector<double> x, W, U, b_in, b_rec, h0, c0, rec_mask, dy, dh_last;
    std::vector<uint8_t> mask;
};

Problem make_problem(RNNCell cell, bool reset_after, bool reverse, int B = 3, int T = 4, int C = 3, int H = 2) {
    Problem p;
    p.cfg.cell = cell;
    p.cfg.reset_after = reset_after;
    p.cfg.reverse = reverse;
    p.cfg.B = B, p.cfg.T = T, p.cfg.C = C, p.cfg.H = H;
    const int G = p.cfg.G();
    std::mt19937 rng(42);
    std::normal_distribution<double> normal(0.0, 0.7);
    auto fill = [&](std::vector<double>& v, size_t n) { v.resize(n); for (auto& e : v) e = normal(rng); };
    fill(p.x, (size_t)B * T * C), fill(p.W, (size_t)C * G), fill(p.U, (size_t)H * G), fill(p.b_in, G);
    fill(p.b_rec, G), fill(p.h0, (size_t)B * H), fill(p.c0, (size_t)B * H), fill(p.dy, (size_t)B * T * H);
    fill(p.dh_last, (size_t)B * H);
    p.rec_mask.resize((size_t)B * H);
    for (size_t i = 0; i < p.rec_mask.size(); ++i) p.rec_mask[i] = i % 3 ? 1.25 : 0.0;
    // row 0 full, row 1 post-padded, row 2 pre-padded
    p.mask = std::vector<uint8_t>((size_t)B * T, 1);
    p.mask[1 * T + T - 1] = 0;
    p.mask[2 * T + 0] = 0;
    return p;
}

struct Buffers {
    std::vector<double> y, h, c, gates, h_prev, h_rec, c_prev, aux, hu;
    RNNCache<double> cache;
};

// L = sum(y * dy) + sum(h_last * dh_last)
double run_forward(Problem& p, Buffers& s) {
    const auto& cfg = p.cfg;
    const size_t BT = (size_t)cfg.B * cfg.T, BH = (size_t)cfg.B * cfg.H;
    const bool gru_after = cfg.cell == RNNCell::gru && cfg.reset_after;
    s.y.assign(BT * cfg.H, 0), s.h = p.h0, s.c = p.c0, s.gates.assign(BT * cfg.G(), 0);
    s.h_prev.assign(BT * cfg.H, 0), s.h_rec.assign(BT * cfg.H, 0), s.c_prev.assign(BT * cfg.H, 0);
    s.aux.assign(BT * cfg.H, 0), s.hu.assign((size_t)cfg.B * cfg.G(), 0);
    s.cache.gates = s.gates.data(), s.cache.h_prev = s.h_prev.data(), s.cache.h_rec = s.h_rec.data();
    s.cache.c_prev = cfg.cell == RNNCell::lstm ? s.c_prev.data() : nullptr;
    s.cache.aux = cfg.cell == RNNCell::simple ? nullptr : s.aux.data();
    rnn_forward<double>(cfg, s.y.data(), s.h.data(), s.c.data(), s.cache, p.x.data(), p.W.data(), p.U.data(),
                        p.b_in.data(), gru_after ? p.b_rec.data() : nullptr, p.mask.data(), p.rec_mask.data(),
                        s.hu.data());
    double L = 0;
    for (size_t i = 0; i < s.y.size(); ++i) L += s.y[i] * p.dy[i];
    for (size_t i = 0; i < BH; ++i) L += s.h[i] * p.dh_last[i];
    return L;
}

void check_gradients(RNNCell cell, bool reset_after, bool reverse) {
    Problem p = make_problem(cell, reset_after, reverse);
    const auto& cfg = p.cfg;
    const int G = cfg.G();
    const bool gru_after = cell == RNNCell::gru && reset_after, lstm = cell == RNNCell::lstm;
    Buffers s;
    run_forward(p, s);
    std::vector<double> dx(p.x.size()), dW(p.W.size(), 0), dU(p.U.size(), 0), db(G, 0), dbr(G, 0);
    std::vector<double> dh = p.dh_last, dc((size_t)cfg.B * cfg.H, 0);
    std::vector<double> dgates(s.gates.size()), dhu(s.gates.size()), dhrec((size_t)cfg.B * cfg.H);
    rnn_backward<double>(cfg, dx.data(), dW.data(), dU.data(), db.data(), gru_after ? dbr.data() : nullptr, dh.data(),
                         lstm ? dc.data() : nullptr, p.dy.data(), s.cache, p.x.data(), p.W.data(), p.U.data(),
                         p.mask.data(), p.rec_mask.data(), dgates.data(), gru_after ? dhu.data() : dgates.data(),
                         dhrec.data());
    auto numeric = [&](std::vector<double>& v, size_t i) {
        const double eps = 1e-6, old = v[i];
        Buffers tmp;
        v[i] = old + eps;
        const double plus = run_forward(p, tmp);
        v[i] = old - eps;
        const double minus = run_forward(p, tmp);
        v[i] = old;
        return (plus - minus) / (2 * eps);
    };
    auto check_all = [&](std::vector<double>& v, const std::vector<double>& grad, const char* what) {
        for (size_t i = 0; i < v.size(); ++i) {
            const double want = numeric(v, i);
            if (std::abs(grad[i] - want) > 1e-6 * (1 + std::abs(want))) {
                std::printf("FAIL cell %d reset_after %d reverse %d: d%s[%zu] = %.9g, numeric %.9g\n", (int)cell,
                            (int)reset_after, (int)reverse, what, i, grad[i], want);
                ++attnx::test::failures();
                return;
            }
        }
    };
    check_all(p.x, dx, "x");
    check_all(p.W, dW, "W");
    check_all(p.U, dU, "U");
    check_all(p.b_in, db, "b_in");
    if (gru_after) check_all(p.b_rec, dbr, "b_rec");
    check_all(p.h0, dh, "h0");
    if (lstm) check_all(p.c0, dc, "c0");
}

void test_gradients() {
    for (bool reverse : {false, true}) {
        check_gradients(RNNCell::simple, true, reverse);
        check_gradients(RNNCell::lstm, true, reverse);
        check_gradients(RNNCell::gru, true, reverse);
        check_gradients(RNNCell::gru, false, reverse);
    }
}

void test_padded_steps_carry_state() {
    Problem p = make_problem(RNNCell::lstm, true, false);
    Buffers s;
    run_forward(p, s);
    const int T = p.cfg.T, H = p.cfg.H;
    // row 2 is pre-padded: its output at t = 0 is zero and the state entering t = 1 is the initial one
    for (int j = 0; j < H; ++j) {
        CHECK(s.y[(size_t)2 * T * H + j] == 0.0);
        CHECK(s.h_prev[((size_t)2 * T + 1) * H + j] == p.h0[(size_t)2 * H + j]);
    }
}

void test_batch_split_matches_one_thread() {
    const int threads = get_blas_threads();
    set_blas_threads(2);
    Problem p = make_problem(RNNCell::gru, true, true, /*B=*/10, /*T=*/5, /*C=*/3, /*H=*/4);
    Buffers split, single;
    p.cfg.split_batch = true;
    run_forward(p, split);
    p.cfg.split_batch = false;
    run_forward(p, single);
    set_blas_threads(threads);
    for (size_t i = 0; i < split.y.size(); ++i) CHECK_CLOSE(split.y[i], single.y[i], 1e-12);
    for (size_t i = 0; i < split.h.size(); ++i) CHECK_CLOSE(split.h[i], single.h[i], 1e-12);
}

void test_float_activations() {
    std::vector<float> v;
    for (double x = -20; x <= 20; x += 0.001) v.push_back((float)x);
    std::vector<float> t = v, s = v;
    activate_block<float>(Activation::tanh, t.data(), (int)t.size());
    activate_block<float>(Activation::sigmoid, s.data(), (int)s.size());
    double worst_t = 0, worst_s = 0;
    for (size_t i = 0; i < v.size(); ++i) {
        worst_t = std::max(worst_t, std::abs((double)t[i] - std::tanh((double)v[i])));
        worst_s = std::max(worst_s, std::abs((double)s[i] - 1.0 / (1.0 + std::exp(-(double)v[i]))));
    }
    CHECK(worst_t < 1e-6);
    CHECK(worst_s < 1e-6);
    float tail[3] = {-1.f, 0.f, 30.f};  // a length that is not a multiple of 4
    activate_block<float>(Activation::tanh, tail, 3);
    CHECK_CLOSE(tail[0], std::tanh(-1.0), 1e-6);
    CHECK(tail[1] == 0.f && tail[2] == 1.f);
}

// rnn_forward_rows on one row with U in place (RecurrentKernel::rows, no packed copy), the input
// projection computed first as the plan does, against reference::rnn_forward: every cell, both time
// orders, units that leave vector tails (H = 10: LSTM's tail units on 8 lanes), a padded step.
void test_one_row_steps_against_reference() {
    unsigned seed = 7;
    for (RNNCell cell : {RNNCell::simple, RNNCell::lstm, RNNCell::gru})
        for (bool reset_after : {true, false}) {
            if (cell != RNNCell::gru && !reset_after) continue;
            for (bool reverse : {false, true})
                for (int H : {10, 13, 37}) {
                    RNNConfig cfg;
                    cfg.cell = cell, cfg.reset_after = reset_after, cfg.reverse = reverse;
                    cfg.B = 1, cfg.T = 5, cfg.C = 6, cfg.H = H;
                    const int G = cfg.G(), T = cfg.T, C = cfg.C;
                    const bool gru_after = cell == RNNCell::gru && reset_after, lstm = cell == RNNCell::lstm;
                    std::mt19937 rng(seed++);
                    const auto x = test::random_values(rng, (size_t)T * C), W = test::random_values(rng, (size_t)C * G, 0.4);
                    const auto U = test::random_values(rng, (size_t)H * G, 0.4), b_in = test::random_values(rng, G, 0.3);
                    const auto b_rec = test::random_values(rng, G, 0.3), h0 = test::random_values(rng, H, 0.5);
                    const auto c0 = test::random_values(rng, H, 0.5);
                    std::vector<uint8_t> mask((size_t)T, 1);
                    mask[2] = 0;
                    std::vector<double> want_y((size_t)T * H, 0), want_h = h0, want_c = c0;
                    reference::RNNCache ref_cache;
                    reference::rnn_forward(cfg, want_y.data(), want_h.data(), lstm ? want_c.data() : nullptr, ref_cache,
                                           x.data(), W.data(), U.data(), b_in.data(), gru_after ? b_rec.data() : nullptr,
                                           mask.data(), nullptr);
                    const std::vector<double> want = [&] {
                        std::vector<double> all = want_y;
                        all.insert(all.end(), want_h.begin(), want_h.end());
                        if (lstm) all.insert(all.end(), want_c.begin(), want_c.end());
                        return all;
                    }();
                    auto run = [&](auto zero) {
                        using F = decltype(zero);
                        const auto xf = test::cast<F>(x), Wf = test::cast<F>(W), Uf = test::cast<F>(U);
                        const auto b_inf = test::cast<F>(b_in), b_recf = test::cast<F>(b_rec);
                        std::vector<F> y((size_t)T * H), h = test::cast<F>(h0), c = test::cast<F>(c0);
                        std::vector<F> gates((size_t)T * G), aux((size_t)T * H), hu((size_t)G);
                        dense_forward<F>(gates.data(), xf.data(), Wf.data(), b_inf.data(), T, C, G);
                        RNNCache<F> cache;  // inference: workspace only
                        cache.gates = gates.data(), cache.aux = cell == RNNCell::simple ? nullptr : aux.data();
                        rnn_forward_rows<F>(cfg, 0, 1, y.data(), h.data(), lstm ? c.data() : nullptr, cache,
                                            RecurrentKernel<F>{nullptr, nullptr, false, Uf.data()},
                                            gru_after ? b_recf.data() : nullptr, mask.data(), nullptr, hu.data());
                        std::vector<double> all(y.begin(), y.end());
                        all.insert(all.end(), h.begin(), h.end());
                        if (lstm) all.insert(all.end(), c.begin(), c.end());
                        return all;
                    };
                    char where[96];
                    std::snprintf(where, sizeof where, "one-row cell=%d reset_after=%d reverse=%d H=%d", (int)cell,
                                  (int)reset_after, (int)reverse, H);
                    test::on_every_level_and_split([&](const std::string& level) {
                        test::expect_near(run(float{}), want, test::tolerance<float>(), std::string(where) + " float " + level);
                        test::expect_near(run(double{}), want, test::tolerance<double>(),
                                          std::string(where) + " double " + level);
                    });
                }
        }
}

}  // namespace

int main() {
    test_gradients();
    test_padded_steps_carry_state();
    test_batch_split_matches_one_thread();
    test_float_activations();
    test_one_row_steps_against_reference();
    return attnx::test::report("test_rnn");
}
