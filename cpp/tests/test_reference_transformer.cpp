// transformer.hpp against cpp/reference/transformer.hpp: layer normalization forward and backward
// (with and without gamma, beta, dx), positions, keep and residual adds and
// the inference feed-forward, on odd sizes and on sizes that split across two threads.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attnx/transformer.hpp"
#include "reference/transformer.hpp"
#include "reference_check.hpp"

using namespace attnx;
using namespace attnx::test;

namespace {

void test_layernorm(size_t N, size_t C, bool affine, bool with_dx, unsigned seed) {
    std::mt19937 rng(seed);
    auto x = random_values(rng, N * C);
    for (size_t i = 0; i < x.size(); ++i) x[i] = (double)(float)(x[i] + 3.0);  // a mean away from 0
    const auto gamma = random_values(rng, C), beta = random_values(rng, C), dy = random_values(rng, N * C);
    const auto dgamma0 = random_values(rng, C), dbeta0 = random_values(rng, C);
    const double eps = 1e-5;
    std::vector<double> y(N * C), mean(N), rstd(N), dx(N * C), dgamma = dgamma0, dbeta = dbeta0;
    const double* g = affine ? gamma.data() : nullptr;
    reference::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), g, affine ? beta.data() : nullptr, N, C, eps);
    reference::layernorm_backward(with_dx ? dx.data() : nullptr, dgamma.data(), dbeta.data(), dy.data(), x.data(),
                                  mean.data(), rstd.data(), g, N, C);
    Named want{{"y", y}, {"mean", mean}, {"rstd", rstd}, {"dgamma", dgamma}, {"dbeta", dbeta}};
    if (with_dx) want.push_back({"dx", dx});
    char where[96];
    std::snprintf(where, sizeof where, "layernorm N=%zu C=%zu%s%s", N, C, affine ? " affine" : "", with_dx ? "" : " no dx");
    check_every_level(where, want, [&](auto tag) {
        using T = decltype(tag);
        const auto x_ = cast<T>(x), gamma_ = cast<T>(gamma), beta_ = cast<T>(beta), dy_ = cast<T>(dy);
        std::vector<T> y_(N * C), mean_(N), rstd_(N), dx_(N * C), dgamma_ = cast<T>(dgamma0), dbeta_ = cast<T>(dbeta0);
        const T* g_ = affine ? gamma_.data() : nullptr;
        layernorm_forward<T>(y_.data(), mean_.data(), rstd_.data(), x_.data(), g_, affine ? beta_.data() : nullptr, N, C, (T)eps);
        layernorm_backward<T>(with_dx ? dx_.data() : nullptr, dgamma_.data(), dbeta_.data(), dy_.data(), x_.data(),
                              mean_.data(), rstd_.data(), g_, N, C);
        Named got{{"y", to_double(y_)}, {"mean", to_double(mean_)}, {"rstd", to_double(rstd_)},
                  {"dgamma", to_double(dgamma_)}, {"dbeta", to_double(dbeta_)}};
        if (with_dx) got.push_back({"dx", to_double(dx_)});
        return got;
    });
}

void test_positions(size_t B, size_t T, size_t D, unsigned seed) {
    std::mt19937 rng(seed);
    const auto x = random_values(rng, B * T * D), dy = random_values(rng, B * T * D), dtable0 = random_values(rng, T * D);
    std::vector<double> table(T * D), y(B * T * D), dtable = dtable0;
    reference::sinusoidal_table(table.data(), T, D);
    reference::add_positions_forward(y.data(), x.data(), table.data(), B, T, D);
    reference::add_positions_backward(dtable.data(), dy.data(), B, T, D);
    char where[64];
    std::snprintf(where, sizeof where, "positions B=%zu T=%zu D=%zu", B, T, D);
    check_every_level(where, {{"table", table}, {"y", y}, {"dtable", dtable}}, [&](auto tag) {
        using T_ = decltype(tag);
        const auto x_ = cast<T_>(x), dy_ = cast<T_>(dy);
        std::vector<T_> table_(T * D), y_(B * T * D), dtable_ = cast<T_>(dtable0);
        sinusoidal_table<T_>(table_.data(), T, D);
        add_positions_forward<T_>(y_.data(), x_.data(), table_.data(), B, T, D);
        add_positions_backward<T_>(dtable_.data(), dy_.data(), B, T, D);
        return Named{{"table", to_double(table_)}, {"y", to_double(y_)}, {"dtable", to_double(dtable_)}};
    });
}

void test_dropout_and_residual(size_t n, double rate, uint64_t seed) {
    std::mt19937 rng((unsigned)seed);
    const auto x = random_values(rng, n), sub = random_values(rng, n);
    std::vector<double> keep(n), dropped(n), y(n), y_plain(n);
    for (auto& k : keep) k = std::bernoulli_distribution(rate)(rng) ? 0.0 : 1.0 / (1.0 - rate);  // (random.hpp draws them)
    reference::apply_keep(dropped.data(), x.data(), keep.data(), n);
    reference::residual_add(y.data(), x.data(), sub.data(), keep.data(), n);
    reference::residual_add(y_plain.data(), x.data(), sub.data(), nullptr, n);
    char where[64];
    std::snprintf(where, sizeof where, "dropout n=%zu rate=%g", n, rate);
    check_every_level(where, {{"keep", keep}, {"dropped", dropped}, {"residual", y}, {"residual no keep", y_plain}},
                      [&](auto tag) {
                          using T = decltype(tag);
                          const auto x_ = cast<T>(x), sub_ = cast<T>(sub);
                          const auto keep_ = cast<T>(keep);
                          std::vector<T> dropped_(n), y_(n), y_plain_(n);
                          apply_keep<T>(dropped_.data(), x_.data(), keep_.data(), n);
                          residual_add<T>(y_.data(), x_.data(), sub_.data(), keep_.data(), n);
                          residual_add<T>(y_plain_.data(), x_.data(), sub_.data(), nullptr, n);
                          return Named{{"keep", to_double(keep_)}, {"dropped", to_double(dropped_)},
                                       {"residual", to_double(y_)}, {"residual no keep", to_double(y_plain_)}};
                      });
}

void test_feed_forward(int N, int C, int F, int OC, Activation act, unsigned seed) {
    std::mt19937 rng(seed);
    const auto x = random_values(rng, (size_t)N * C), W1 = random_values(rng, (size_t)C * F, 0.3);
    const auto b1 = random_values(rng, F), W2 = random_values(rng, (size_t)F * OC, 0.3), b2 = random_values(rng, OC);
    std::vector<double> y((size_t)N * OC);
    reference::feed_forward_forward(y.data(), x.data(), W1.data(), b1.data(), W2.data(), b2.data(), N, C, F, OC, act);
    char where[64];
    std::snprintf(where, sizeof where, "feed_forward N=%d C=%d F=%d OC=%d", N, C, F, OC);
    check_every_level(where, {{"y", y}}, [&](auto tag) {
        using T = decltype(tag);
        const auto x_ = cast<T>(x), W1_ = cast<T>(W1), b1_ = cast<T>(b1), W2_ = cast<T>(W2), b2_ = cast<T>(b2);
        std::vector<T> y_(y.size());
        feed_forward_forward<T>(y_.data(), x_.data(), W1_.data(), b1_.data(), W2_.data(), b2_.data(), N, C, F, OC, act);
        return Named{{"y", to_double(y_)}};
    });
}

}  // namespace

int main() {
    unsigned seed = 1;
    for (bool affine : {false, true})
        for (bool with_dx : {false, true}) {
            test_layernorm(7, 13, affine, with_dx, seed++);
            test_layernorm(1031, 37, affine, with_dx, seed++);  // splits across two threads
        }
    test_positions(3, 5, 7, seed++);
    test_positions(2, 9, 16, seed++);
    test_dropout_and_residual(1, 0.5, 11);
    test_dropout_and_residual(1003, 0.1, 12);
    test_dropout_and_residual(200003, 0.3, 13);  // splits across two threads
    test_feed_forward(5, 7, 11, 3, Activation::relu, seed++);
    test_feed_forward(611, 33, 129, 17, Activation::gelu, seed++);  // several row blocks, two threads
    return attnx::test::report("test_reference_transformer");
}
