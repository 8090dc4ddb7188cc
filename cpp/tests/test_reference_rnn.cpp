// rnn.hpp against cpp/reference/rnn.hpp: every cell (SimpleRNN, LSTM, GRU reset_after and classic),
// both time orders, with a step mask and recurrent dropout, on shapes whose units leave vector
// tails (and LSTM's packed tail units), in float on every SIMD level and in double, on one thread
// and split across two; forward outputs and final states, then every gradient.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attnx/rnn.hpp"
#include "reference/rnn.hpp"
#include "reference_check.hpp"

using namespace attnx;
using namespace attnx::test;

namespace {

struct Problem {
    RNNConfig cfg;
    std::vector<double> x, W, U, b_in, b_rec, h0, c0, rec_mask, dy, dh_last, dc_last;
    std::vector<uint8_t> mask;
};

Problem make_problem(RNNConfig cfg, unsigned seed) {
    Problem p;
    p.cfg = cfg;
    const int B = cfg.B, T = cfg.T, C = cfg.C, H = cfg.H, G = cfg.G();
    std::mt19937 rng(seed);
    p.x = random_values(rng, (size_t)B * T * C), p.W = random_values(rng, (size_t)C * G, 0.4);
    p.U = random_values(rng, (size_t)H * G, 0.4), p.b_in = random_values(rng, G, 0.3), p.b_rec = random_values(rng, G, 0.3);
    p.h0 = random_values(rng, (size_t)B * H, 0.5), p.c0 = random_values(rng, (size_t)B * H, 0.5);
    p.dy = random_values(rng, (size_t)B * T * H), p.dh_last = random_values(rng, (size_t)B * H);
    p.dc_last = random_values(rng, (size_t)B * H);
    p.rec_mask.resize((size_t)B * H);
    for (size_t i = 0; i < p.rec_mask.size(); ++i) p.rec_mask[i] = i % 3 ? 1.25 : 0.0;
    // a random padding pattern: some rows post-padded, some pre-padded, some with holes
    p.mask.assign((size_t)B * T, 1);
    for (int b = 1; b < B; ++b) p.mask[(size_t)b * T + (b % 2 ? T - 1 : 0)] = 0;
    if (T > 2) p.mask[(size_t)(B - 1) * T + T / 2] = 0;
    return p;
}

struct Result {
    std::vector<double> y, h, c, dx, dW, dU, db_in, db_rec, dh0, dc0;
};

Result run_reference(const Problem& p) {
    const RNNConfig& cfg = p.cfg;
    const bool gru_after = cfg.cell == RNNCell::gru && cfg.reset_after, lstm = cfg.cell == RNNCell::lstm;
    Result r;
    r.y.assign((size_t)cfg.B * cfg.T * cfg.H, 0), r.h = p.h0, r.c = p.c0;
    reference::RNNCache cache;
    reference::rnn_forward(cfg, r.y.data(), r.h.data(), lstm ? r.c.data() : nullptr, cache, p.x.data(), p.W.data(),
                           p.U.data(), p.b_in.data(), gru_after ? p.b_rec.data() : nullptr, p.mask.data(),
                           p.rec_mask.data());
    r.dx.assign(p.x.size(), 0), r.dW.assign(p.W.size(), 0), r.dU.assign(p.U.size(), 0);
    r.db_in.assign(cfg.G(), 0), r.db_rec.assign(cfg.G(), 0), r.dh0 = p.dh_last, r.dc0 = p.dc_last;
    reference::rnn_backward(cfg, r.dx.data(), r.dW.data(), r.dU.data(), r.db_in.data(),
                            gru_after ? r.db_rec.data() : nullptr, r.dh0.data(), lstm ? r.dc0.data() : nullptr,
                            p.dy.data(), cache, p.x.data(), p.W.data(), p.U.data(), p.mask.data(), p.rec_mask.data());
    if (!lstm) r.c = p.c0, r.dc0 = p.dc_last;
    return r;
}

template <class T> Result run_fast(const Problem& p) {
    const RNNConfig& cfg = p.cfg;
    const size_t BT = (size_t)cfg.B * cfg.T, G = cfg.G();
    const bool gru_after = cfg.cell == RNNCell::gru && cfg.reset_after, lstm = cfg.cell == RNNCell::lstm;
    const auto x = cast<T>(p.x), W = cast<T>(p.W), U = cast<T>(p.U), b_in = cast<T>(p.b_in), b_rec = cast<T>(p.b_rec);
    const auto rec_mask = cast<T>(p.rec_mask), dy = cast<T>(p.dy);
    std::vector<T> y(BT * cfg.H), h = cast<T>(p.h0), c = cast<T>(p.c0), gates(BT * G), h_prev(BT * cfg.H),
        h_rec(BT * cfg.H), c_prev(BT * cfg.H), aux(BT * cfg.H), hu((size_t)cfg.B * G);
    RNNCache<T> cache;
    cache.gates = gates.data(), cache.h_prev = h_prev.data(), cache.h_rec = h_rec.data();
    cache.c_prev = lstm ? c_prev.data() : nullptr;
    cache.aux = cfg.cell == RNNCell::simple ? nullptr : aux.data();
    rnn_forward<T>(cfg, y.data(), h.data(), c.data(), cache, x.data(), W.data(), U.data(), b_in.data(),
                   gru_after ? b_rec.data() : nullptr, p.mask.data(), rec_mask.data(), hu.data());
    std::vector<T> dx(p.x.size()), dW(p.W.size(), 0), dU(p.U.size(), 0), db_in(G, 0), db_rec(G, 0);
    std::vector<T> dh = cast<T>(p.dh_last), dc = cast<T>(p.dc_last), dgates(BT * G), dhu(BT * G), dhrec((size_t)cfg.B * cfg.H);
    rnn_backward<T>(cfg, dx.data(), dW.data(), dU.data(), db_in.data(), gru_after ? db_rec.data() : nullptr, dh.data(),
                    lstm ? dc.data() : nullptr, dy.data(), cache, x.data(), W.data(), U.data(), p.mask.data(),
                    rec_mask.data(), dgates.data(), gru_after ? dhu.data() : dgates.data(), dhrec.data());
    auto d = [](const std::vector<T>& v) { return std::vector<double>(v.begin(), v.end()); };
    return {d(y), d(h), d(c), d(dx), d(dW), d(dU), d(db_in), d(db_rec), d(dh), d(dc)};
}

template <class T> void compare(const Result& got, const Result& want, const std::string& where) {
    const double tol = tolerance<T>();
    expect_near(got.y, want.y, tol, where + " y") && expect_near(got.h, want.h, tol, where + " h_last") &&
        expect_near(got.c, want.c, tol, where + " c_last") && expect_near(got.dx, want.dx, tol, where + " dx") &&
        expect_near(got.dW, want.dW, tol, where + " dW") && expect_near(got.dU, want.dU, tol, where + " dU") &&
        expect_near(got.db_in, want.db_in, tol, where + " db_in") &&
        expect_near(got.db_rec, want.db_rec, tol, where + " db_rec") &&
        expect_near(got.dh0, want.dh0, tol, where + " dh0") && expect_near(got.dc0, want.dc0, tol, where + " dc0");
}

const char* cell_name(const RNNConfig& cfg) {
    return cfg.cell == RNNCell::simple ? "SimpleRNN"
           : cfg.cell == RNNCell::lstm ? "LSTM"
           : cfg.reset_after           ? "GRU(reset_after)"
                                       : "GRU(classic)";
}

void test_cells_against_reference() {
    // (B, T, C, H): units that leave tails on 4 and 8 lanes (H = 10 is LSTM's packed tail on 8 lanes),
    // and one large enough that the batch splits across two threads
    const int shapes[][4] = {{3, 4, 5, 10}, {5, 3, 7, 13}, {8, 6, 9, 64}};
    unsigned seed = 1;
    for (RNNCell cell : {RNNCell::simple, RNNCell::lstm, RNNCell::gru})
        for (bool reset_after : {true, false}) {
            if (cell != RNNCell::gru && !reset_after) continue;
            for (bool reverse : {false, true})
                for (const auto& s : shapes) {
                    RNNConfig cfg;
                    cfg.cell = cell, cfg.reset_after = reset_after, cfg.reverse = reverse;
                    cfg.B = s[0], cfg.T = s[1], cfg.C = s[2], cfg.H = s[3];
                    // the general activation path (AnyActivations, AnySlopes) on the middle shape
                    if (s[3] == 13) cfg.activation = Activation::relu, cfg.recurrent_activation = Activation::sigmoid;
                    const Problem p = make_problem(cfg, seed++);
                    const Result want = run_reference(p);
                    char where[96];
                    std::snprintf(where, sizeof where, "%s reverse=%d B=%d T=%d C=%d H=%d", cell_name(cfg), (int)reverse,
                                  cfg.B, cfg.T, cfg.C, cfg.H);
                    on_every_level_and_split([&](const std::string& level) {
                        compare<float>(run_fast<float>(p), want, std::string(where) + " float " + level);
                        compare<double>(run_fast<double>(p), want, std::string(where) + " double " + level);
                    });
                }
        }
}

}  // namespace

int main() {
    test_cells_against_reference();
    return attnx::test::report("test_reference_rnn");
}
