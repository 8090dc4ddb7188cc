// Transformer kernels against xtensor reference computations and finite differences.
#include <xtensor/xrandom.hpp>
#include <xtensor/xtensor.hpp>
#include <xtensor/xview.hpp>

#include <vector>

#include "attnx/transformer.hpp"
#include "check.hpp"

using namespace attnx;

static void test_layernorm_forward() {
    xt::random::seed(1);
    const size_t N = 4, C = 6;
    xt::xtensor<double, 2> x = xt::random::randn<double>({N, C}) * 2.0 + 5.0;
    xt::xtensor<double, 1> g = xt::random::randn<double>({C}), b = xt::random::randn<double>({C});
    xt::xtensor<double, 2> y = xt::zeros<double>({N, C});
    xt::xtensor<double, 1> mean = xt::zeros<double>({N}), rstd = xt::zeros<double>({N});
    layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), g.data(), b.data(), N, C, 1e-5);
    auto m = xt::eval(xt::mean(x, {1}));
    auto centered = xt::eval(x - xt::view(m, xt::all(), xt::newaxis()));
    auto var = xt::eval(xt::mean(centered * centered, {1}));
    auto want = xt::eval(centered / xt::view(xt::sqrt(var + 1e-5), xt::all(), xt::newaxis()) * g + b);
    CHECK(xt::allclose(y, want, 1e-12, 1e-12));
    CHECK(xt::allclose(mean, m));
}

// L = sum(y * r): dx, dgamma, dbeta against central differences.
static void test_layernorm_backward() {
    xt::random::seed(2);
    const size_t N = 3, C = 5;
    xt::xtensor<double, 2> x = xt::random::randn<double>({N, C}), r = xt::random::randn<double>({N, C});
    xt::xtensor<double, 1> g = xt::random::randn<double>({C}), b = xt::random::randn<double>({C});
    auto loss = [&](const xt::xtensor<double, 2>& xx, const xt::xtensor<double, 1>& gg) {
        xt::xtensor<double, 2> y = xt::zeros<double>({N, C});
        std::vector<double> mean(N), rstd(N);
        layernorm_forward(y.data(), mean.data(), rstd.data(), xx.data(), gg.data(), b.data(), N, C, 1e-3);
        return double(xt::sum(y * r)());
    };
    xt::xtensor<double, 2> y = xt::zeros<double>({N, C}), dx = xt::zeros<double>({N, C});
    std::vector<double> mean(N), rstd(N);
    layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), g.data(), b.data(), N, C, 1e-3);
    xt::xtensor<double, 1> dg = xt::zeros<double>({C}), db = xt::ones<double>({C});  // db accumulates onto 1
    layernorm_backward(dx.data(), dg.data(), db.data(), r.data(), x.data(), mean.data(), rstd.data(), g.data(), N, C);
    const double eps = 1e-6;
    for (size_t i = 0; i < N * C; ++i) {
        auto xp = x, xm = x;
        xp.data()[i] += eps;
        xm.data()[i] -= eps;
        CHECK_CLOSE(dx.data()[i], (loss(xp, g) - loss(xm, g)) / (2 * eps), 1e-6);
    }
    for (size_t c = 0; c < C; ++c) {
        auto gp = g, gm = g;
        gp(c) += eps;
        gm(c) -= eps;
        CHECK_CLOSE(dg(c), (loss(x, gp) - loss(x, gm)) / (2 * eps), 1e-6);
        CHECK_CLOSE(db(c), 1.0 + double(xt::sum(xt::view(r, xt::all(), c))()), 1e-12);
    }
}

static void test_positions_and_residual() {
    double table[6];
    sinusoidal_table(table, 3, 2);
    CHECK_CLOSE(table[0], 0.0, 1e-15);       // sin(0)
    CHECK_CLOSE(table[1], 1.0, 1e-15);       // cos(0)
    CHECK_CLOSE(table[4], std::sin(2.0), 1e-15);
    double x[12], y[12], dtable[6] = {0};
    for (int i = 0; i < 12; ++i) x[i] = i;
    add_positions_forward(y, x, table, 2, 3, 2);
    CHECK_CLOSE(y[6 + 5], 11 + table[5], 1e-15);
    add_positions_backward(dtable, x, 2, 3, 2);
    CHECK_CLOSE(dtable[1], 1.0 + 7.0, 1e-15);

    double keep[4] = {1, 0, 1, 1}, sub[4] = {1, 2, 3, 4}, base[4] = {10, 10, 10, 10}, out[4];
    residual_add(out, base, sub, keep, 4);
    CHECK_CLOSE(out[1], 10.0, 0);
    CHECK_CLOSE(out[2], 13.0, 0);
}

int main() {
    test_layernorm_forward();
    test_layernorm_backward();
    test_positions_and_residual();
    return attnx::test::report("test_transformer");
}
