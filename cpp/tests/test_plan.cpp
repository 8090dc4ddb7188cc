// The inference plan (plan.hpp) against plain double-precision loops: a plan of embedding, padding mask,
// dense, merge and the masked mean over time, and the embedding's refusal of ids outside its table; an
// LSTM op against cpp/reference/rnn.hpp on every SIMD level, its packed recurrent kernel remade after
// each change of the kernel's bytes and each change of level; an RNN over an embedding's table after each
// change of the embedding, W and b_in.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "attnx/plan.hpp"
#include "check.hpp"
#include "reference/rnn.hpp"
#include "reference_check.hpp"

using namespace attnx;

static std::vector<float> normal(size_t n, std::mt19937& gen) {
    std::normal_distribution<float> dist;
    std::vector<float> v(n);
    for (auto& x : v) x = dist(gen);
    return v;
}

// ids (B, T) -> embedding (B, T, D) -> dense tanh (B, T, U) -> merge with itself (concat, sum)
// -> masked mean over time under ids != 0
static void test_token_plan() {
    std::mt19937 gen(3);
    const int B = 3, Tn = 5, V = 11, D = 4, U = 6;
    const std::vector<int64_t> ids = {1, 2, 3, 0, 0, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0};  // the last row fully padded
    const auto table = normal((size_t)V * D, gen), W = normal((size_t)D * U, gen), bias = normal(U, gen);

    InferencePlan plan;
    const int embedded = plan.add_slot((size_t)B * Tn * D), dense = plan.add_slot((size_t)B * Tn * U);
    const int both = plan.add_slot((size_t)B * Tn * 2 * U), pooled = plan.add_slot((size_t)B * 2 * U);
    const int mask = plan.add_mask_slot((size_t)B * Tn);
    PlanOp op;
    op.kind = PlanOpKind::embedding, op.out = embedded, op.rows = B * Tn, op.cols = D, op.vocab = V;
    op.w[0] = table.data();
    plan.add_op(std::move(op));
    op = PlanOp{};
    op.kind = PlanOpKind::padding_mask, op.mask = mask, op.rows = B * Tn;
    plan.add_op(std::move(op));
    op = PlanOp{};
    op.kind = PlanOpKind::dense, op.in = embedded, op.out = dense, op.rows = B * Tn, op.cols = D, op.units = U;
    op.w[0] = W.data(), op.w[1] = bias.data(), op.act = Activation::tanh;
    plan.add_op(std::move(op));
    op = PlanOp{};
    op.kind = PlanOpKind::merge, op.in = dense, op.in2 = dense, op.out = both, op.rows = B * Tn, op.cols = U;
    plan.add_op(std::move(op));
    op = PlanOp{};
    op.kind = PlanOpKind::mean_pool, op.in = both, op.out = pooled, op.mask = mask, op.cols = 2 * U;
    op.attend.B = B, op.attend.Tq = Tn;
    plan.add_op(std::move(op));

    std::vector<float> out((size_t)B * 2 * U, -1.f);
    CHECK(plan.run(ids.data(), pooled, out.data()));
    for (int b = 0; b < B; ++b) {
        std::vector<double> sum(U, 0.0);
        int count = 0;
        for (int t = 0; t < Tn; ++t) {
            const int64_t id = ids[(size_t)b * Tn + t];
            if (id == 0) continue;
            ++count;
            for (int u = 0; u < U; ++u) {
                double z = bias[u];
                for (int d = 0; d < D; ++d) z += (double)table[(size_t)id * D + d] * W[(size_t)d * U + u];
                sum[u] += std::tanh(z);
            }
        }
        for (int u = 0; u < U; ++u) {
            const double want = count ? sum[u] / count : 0.0;  // a fully padded row pools to zeros
            CHECK_CLOSE(out[(size_t)b * 2 * U + u], want, 1e-5);
            CHECK_CLOSE(out[(size_t)b * 2 * U + U + u], want, 1e-5);
        }
    }

    std::vector<int64_t> bad = ids;
    bad[7] = V;  // outside the table: the run stops, the output untouched
    std::vector<float> untouched(out.size(), 7.f);
    CHECK(!plan.run(bad.data(), pooled, untouched.data()));
    CHECK(untouched[0] == 7.f);
    bad[7] = -1;
    CHECK(!plan.run(bad.data(), pooled, untouched.data()));
}

// float input -> layer norm -> residual add of the input
static void test_float_plan() {
    std::mt19937 gen(5);
    const int N = 4, C = 8;
    const auto x = normal((size_t)N * C, gen), gamma = normal(C, gen), beta = normal(C, gen);
    InferencePlan plan;
    const int normed = plan.add_slot((size_t)N * C), sum = plan.add_slot((size_t)N * C);
    PlanOp op;
    op.kind = PlanOpKind::layernorm, op.in = 0, op.out = normed, op.rows = N, op.cols = C, op.scalar = 1e-5f;
    op.w[0] = gamma.data(), op.w[1] = beta.data();
    plan.add_op(std::move(op));
    op = PlanOp{};
    op.kind = PlanOpKind::residual_add, op.in = 0, op.in2 = normed, op.out = sum;
    plan.add_op(std::move(op));
    std::vector<float> out((size_t)N * C);
    CHECK(plan.run(x.data(), sum, out.data()));
    for (int n = 0; n < N; ++n) {
        double mean = 0, var = 0;
        for (int c = 0; c < C; ++c) mean += x[(size_t)n * C + c] / (double)C;
        for (int c = 0; c < C; ++c) var += std::pow(x[(size_t)n * C + c] - mean, 2) / C;
        for (int c = 0; c < C; ++c) {
            const double xv = x[(size_t)n * C + c];
            CHECK_CLOSE(out[(size_t)n * C + c], xv + (xv - mean) / std::sqrt(var + 1e-5) * gamma[c] + beta[c], 1e-4);
        }
    }
}

// x (B, T, C) -> LSTM (final h); one plan built once, run on every SIMD level and thread budget (a level
// after another reads panels of other widths), U changed in place between runs
static void test_rnn_plan_sees_its_kernel_change() {
    std::mt19937 gen(7);
    RNNConfig cfg;
    cfg.cell = RNNCell::lstm, cfg.B = 1, cfg.T = 6, cfg.C = 5, cfg.H = 19;  // 19 units: LSTM's tail block too
    const int G = cfg.G();
    const auto x = test::random_values(gen, (size_t)cfg.B * cfg.T * cfg.C), W = test::random_values(gen, (size_t)cfg.C * G);
    const auto b = test::random_values(gen, G);
    auto U = test::random_values(gen, (size_t)cfg.H * G, 0.3);
    const auto xf = test::cast<float>(x), Wf = test::cast<float>(W), bf = test::cast<float>(b);
    auto Uf = test::cast<float>(U);  // the plan points into it, as into a layer's array

    InferencePlan plan;
    const int out = plan.add_slot((size_t)cfg.B * cfg.H);
    PlanOp op;
    op.kind = PlanOpKind::rnn, op.in = 0, op.out = out, op.rnn = cfg, op.units = 0;  // final h
    op.w[0] = Wf.data(), op.w[1] = Uf.data(), op.w[2] = bf.data();
    plan.add_op(std::move(op));
    auto check = [&](const std::string& what) {
        std::vector<double> h((size_t)cfg.B * cfg.H, 0.0), c(h);
        reference::RNNCache cache;
        reference::rnn_forward(cfg, nullptr, h.data(), c.data(), cache, x.data(), W.data(), U.data(), b.data(),
                               nullptr, nullptr, nullptr);
        std::vector<float> got((size_t)cfg.B * cfg.H);
        CHECK(plan.run(xf.data(), out, got.data()));
        test::expect_near(got, h, 1e-5, "plan LSTM " + what);
    };
    test::on_every_level_and_split([&](const std::string& level) {
        check(level);
        U[3 * G + 7] += 0.5, Uf[3 * G + 7] = (float)U[3 * G + 7];  // a user's write into the array
        check(level + ", one value changed");
    });
    // a zero's sign flipped: other bytes, the same value (a check comparing floats would not repack)
    U[0] = 0.0, Uf[0] = 0.f;
    check("U[0] = 0");
    Uf[0] = -0.f;
    check("U[0] = -0");
}

// ids (B, T) -> an RNN over an embedding's table (EmbeddedProjection) -> y (B, T, H), against the reference on
// the embedding's rows, for each cell, on every SIMD level and thread budget (the table made again at each
// level); then after writes into E's rows (read by this call or by a later one only), W and b_in
static void check_embedded_rnn(RNNCell cell, bool reset_after, bool reverse, int B, int Tn, int H) {
    std::mt19937 gen(11);
    RNNConfig cfg;
    cfg.cell = cell, cfg.reset_after = reset_after, cfg.reverse = reverse;
    cfg.B = B, cfg.T = Tn, cfg.C = 6, cfg.H = H;
    const int G = cfg.G(), V = 23;
    const size_t BT = (size_t)B * Tn;
    std::vector<int64_t> ids(BT);
    std::uniform_int_distribution<int64_t> token(0, V - 2);  // (id V - 1 unread until the end)
    for (auto& id : ids) id = token(gen);  // repeats: rows read several times per call
    for (int b = 0; b < B; b += 2) ids[(size_t)b * Tn + Tn - 1] = 0;  // a padded last step on every other row
    auto E = test::random_values(gen, (size_t)V * cfg.C), W = test::random_values(gen, (size_t)cfg.C * G, 0.5);
    auto U = test::random_values(gen, (size_t)H * G, 0.3), b_in = test::random_values(gen, G);
    const bool rec_bias = cell == RNNCell::gru && reset_after;
    const auto b_rec = test::random_values(gen, G);
    auto Ef = test::cast<float>(E), Wf = test::cast<float>(W), Uf = test::cast<float>(U), bf = test::cast<float>(b_in);
    const auto brf = test::cast<float>(b_rec);

    InferencePlan plan;
    const int out = plan.add_slot(BT * H), m = plan.add_mask_slot(BT);
    PlanOp op;
    op.kind = PlanOpKind::padding_mask, op.mask = m, op.rows = (int)BT;  // ids != 0: id 0 pads
    plan.add_op(std::move(op));
    op = PlanOp{};
    op.kind = PlanOpKind::rnn, op.in = 0, op.out = out, op.rnn = cfg, op.units = 1, op.mask = m, op.vocab = V;
    op.w[0] = Wf.data(), op.w[1] = Uf.data(), op.w[2] = bf.data(), op.w[3] = rec_bias ? brf.data() : nullptr;
    op.w[4] = Ef.data();
    op.embedded = std::make_unique<EmbeddedProjection>((size_t)V, (size_t)cfg.C, (size_t)G);
    plan.add_op(std::move(op));
    const std::string name = std::string(cell == RNNCell::lstm ? "LSTM" : cell == RNNCell::gru ? "GRU" : "SimpleRNN") +
                             (reset_after ? "" : " classic") + (reverse ? " reversed" : "") + " B=" + std::to_string(B);
    auto check = [&](const std::string& what) {
        std::vector<double> x(BT * cfg.C), y(BT * H), h((size_t)B * H, 0.0), c(h);
        std::vector<uint8_t> real(BT);
        for (size_t i = 0; i < BT; ++i) {
            std::copy(E.begin() + ids[i] * cfg.C, E.begin() + (ids[i] + 1) * cfg.C, x.begin() + i * cfg.C);
            real[i] = ids[i] != 0;
        }
        reference::RNNCache cache;
        reference::rnn_forward(cfg, y.data(), h.data(), c.data(), cache, x.data(), W.data(), U.data(), b_in.data(),
                               rec_bias ? b_rec.data() : nullptr, real.data(), nullptr);
        std::vector<float> got(BT * H);
        CHECK(plan.run(ids.data(), out, got.data()));
        test::expect_near(got, y, 1e-5, "plan " + name + " over an embedding, " + what);
    };
    auto set = [](std::vector<double>& v, std::vector<float>& f, size_t i, double value) {
        v[i] = value, f[i] = (float)value;  // the reference's operand and the plan's
    };
    test::on_every_level_and_split([&](const std::string& level) {
        check(level);
        set(E, Ef, (size_t)ids[1] * cfg.C + 2, E[(size_t)ids[1] * cfg.C + 2] + 1.0);  // a row this call reads
        check(level + ", a row of E changed");
        set(W, Wf, (size_t)3 * G + 5, W[(size_t)3 * G + 5] - 0.7);
        check(level + ", W changed");
        set(b_in, bf, 1, b_in[1] + 0.4);
        check(level + ", b_in changed");
    });
    // a row made, changed while a call does not read it, then read again
    const int64_t kept = ids[2];
    ids[2] = V - 1;
    check("row V - 1 read");
    ids[2] = kept;
    check("row V - 1 not read");
    set(E, Ef, (size_t)(V - 1) * cfg.C + 1, E[(size_t)(V - 1) * cfg.C + 1] - 2.0);
    ids[2] = V - 1;
    check("row V - 1 read after its change");
    // an id outside the table: the run stops with the output untouched
    ids[0] = V;
    std::vector<float> untouched(BT * H, 7.f);
    CHECK(!plan.run(ids.data(), out, untouched.data()));
    CHECK(untouched[0] == 7.f);
    ids[0] = -1;
    CHECK(!plan.run(ids.data(), out, untouched.data()));
}

static void test_embedded_rnn_plan() {
    check_embedded_rnn(RNNCell::lstm, true, false, 3, 5, 19);      // LSTM's tail block
    check_embedded_rnn(RNNCell::gru, true, true, 2, 4, 8);         // reset_after: the recurrent bias apart
    check_embedded_rnn(RNNCell::gru, false, false, 1, 6, 16);      // batch 1: the one-row tiles
    check_embedded_rnn(RNNCell::simple, true, false, 4, 3, 5);
    check_embedded_rnn(RNNCell::lstm, true, false, 25, 20, 64);    // past kProjectFirstBytes
}

int main() {
    test_token_plan();
    test_float_plan();
    test_rnn_plan_sees_its_kernel_change();
    test_embedded_rnn_plan();
    return attnx::test::report("test_plan");
}
