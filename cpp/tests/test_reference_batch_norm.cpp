// batch_norm.hpp against cpp/reference/batch_norm.hpp: batch and moving statistics, channels last and
// a feature axis with axes after it (runs shorter and longer than the lanes and the float blocks), with
// and without a mask (one flag per row, per run, per element), gamma / beta or neither, dx or the
// parameter gradients only, an empty batch; sizes past the threshold that splits each pass across two
// threads.
// The reference's own dx is checked against central differences of sum(y dy).
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attnx/batch_norm.hpp"
#include "reference/batch_norm.hpp"
#include "reference_check.hpp"

using namespace attnx;
using namespace attnx::test;

namespace {

struct Case {
    size_t outer, C, inner, mask_span;  // mask_span 0: no mask
    bool batch_statistics, affine, with_dx;
    // x's mean, and a rise along x's rows that moves each block's mean away from the channel's (the
    // one-pass statistics sum each block about its own mean, and the blocks about the first one's)
    double offset = 3, drift = 0;
};

std::vector<uint8_t> random_mask(std::mt19937& rng, size_t n) {
    std::vector<uint8_t> mask(n);
    for (size_t i = 0; i < n; ++i) mask[i] = i == 0 || rng() % 3 != 0;
    return mask;
}

void test_batch_norm(const Case& k, unsigned seed) {
    std::mt19937 rng(seed);
    BatchNormConfig cfg;
    cfg.outer = k.outer, cfg.C = k.C, cfg.inner = k.inner, cfg.mask_span = k.mask_span ? k.mask_span : 1;
    cfg.batch_statistics = k.batch_statistics, cfg.momentum = 0.9, cfg.epsilon = 1e-3;
    const size_t n = k.outer * k.C * k.inner, C = k.C;
    auto x = random_values(rng, n, 2.0);
    for (size_t e = 0; e < n; ++e) x[e] = (double)(float)(x[e] + k.offset + k.drift * double(e) / double(n));
    const auto gamma = random_values(rng, C), beta = random_values(rng, C), dy = random_values(rng, n);
    const auto moving_mean0 = random_values(rng, C), dgamma0 = random_values(rng, C), dbeta0 = random_values(rng, C);
    std::vector<double> moving_variance0(C);
    for (auto& v : moving_variance0) v = (double)(float)(0.5 + std::abs(random_values(rng, 1)[0]));
    const auto mask_flags = random_mask(rng, k.mask_span ? (n + k.mask_span - 1) / k.mask_span : 0);
    const uint8_t* mask = k.mask_span ? mask_flags.data() : nullptr;
    const double* g = k.affine ? gamma.data() : nullptr;
    const double* b = k.affine ? beta.data() : nullptr;

    std::vector<double> y(n), mean(C), rstd(C), count(C), mm = moving_mean0, mv = moving_variance0, dx(n),
        dgamma = dgamma0, dbeta = dbeta0;
    reference::batch_norm_forward(cfg, y.data(), mean.data(), rstd.data(), count.data(), mm.data(), mv.data(),
                                  x.data(), g, b, mask);
    reference::batch_norm_backward(cfg, k.with_dx ? dx.data() : nullptr, dgamma.data(), dbeta.data(), dy.data(),
                                   x.data(), mean.data(), rstd.data(), count.data(), g, mask);
    Named want{{"y", y}, {"mean", mean}, {"rstd", rstd}, {"moving_mean", mm}, {"moving_variance", mv},
               {"dgamma", dgamma}, {"dbeta", dbeta}};
    if (k.batch_statistics) want.push_back({"count", count});
    if (k.with_dx) want.push_back({"dx", dx});
    char where[160];
    std::snprintf(where, sizeof where, "batch norm outer=%zu C=%zu inner=%zu mask_span=%zu offset=%g drift=%g%s%s%s",
                  k.outer, C, k.inner, k.mask_span, k.offset, k.drift, k.batch_statistics ? " batch" : " moving", k.affine ? "" : " no gamma/beta",
                  k.with_dx ? "" : " no dx");
    check_every_level(where, want, [&](auto tag) {
        using Tp = decltype(tag);
        const auto x_ = cast<Tp>(x), gamma_ = cast<Tp>(gamma), beta_ = cast<Tp>(beta), dy_ = cast<Tp>(dy);
        std::vector<Tp> y_(n), mean_(C), rstd_(C), count_(C), mm_ = cast<Tp>(moving_mean0),
            mv_ = cast<Tp>(moving_variance0), dx_(n), dgamma_ = cast<Tp>(dgamma0), dbeta_ = cast<Tp>(dbeta0);
        const Tp* g_ = k.affine ? gamma_.data() : nullptr;
        batch_norm_forward<Tp>(cfg, y_.data(), mean_.data(), rstd_.data(), count_.data(), mm_.data(), mv_.data(),
                               x_.data(), g_, k.affine ? beta_.data() : nullptr, mask);
        batch_norm_backward<Tp>(cfg, k.with_dx ? dx_.data() : nullptr, dgamma_.data(), dbeta_.data(), dy_.data(),
                                x_.data(), mean_.data(), rstd_.data(), count_.data(), g_, mask);
        Named got{{"y", to_double(y_)},           {"mean", to_double(mean_)},   {"rstd", to_double(rstd_)},
                  {"moving_mean", to_double(mm_)}, {"moving_variance", to_double(mv_)},
                  {"dgamma", to_double(dgamma_)}, {"dbeta", to_double(dbeta_)}};
        if (k.batch_statistics) got.push_back({"count", to_double(count_)});
        if (k.with_dx) got.push_back({"dx", to_double(dx_)});
        return got;
    });
}

// The reference's dx against central differences of L = sum_e y_e dy_e (batch statistics, masked)
void test_reference_gradient(size_t outer, size_t C, size_t inner, size_t mask_span, unsigned seed) {
    std::mt19937 rng(seed);
    BatchNormConfig cfg;
    cfg.outer = outer, cfg.C = C, cfg.inner = inner, cfg.mask_span = mask_span ? mask_span : 1;
    cfg.batch_statistics = true;
    const size_t n = outer * C * inner;
    auto x = random_values(rng, n);
    const auto gamma = random_values(rng, C), beta = random_values(rng, C), dy = random_values(rng, n);
    const auto flags = random_mask(rng, mask_span ? n / mask_span : 0);
    const uint8_t* mask = mask_span ? flags.data() : nullptr;
    std::vector<double> y(n), mean(C), rstd(C), count(C), mm(C), mv(C, 1.0), dx(n), dgamma(C), dbeta(C);
    auto loss = [&] {
        reference::batch_norm_forward(cfg, y.data(), mean.data(), rstd.data(), count.data(), mm.data(), mv.data(),
                                      x.data(), gamma.data(), beta.data(), mask);
        double l = 0;
        for (size_t e = 0; e < n; ++e) l += y[e] * dy[e];
        return l;
    };
    loss();
    reference::batch_norm_backward(cfg, dx.data(), dgamma.data(), dbeta.data(), dy.data(), x.data(), mean.data(),
                                   rstd.data(), count.data(), gamma.data(), mask);
    const std::vector<double> want = dx;
    std::vector<double> numeric(n);
    for (size_t e = 0; e < n; ++e) {
        const double keep = x[e], h = 1e-6;
        x[e] = keep + h;
        const double up = loss();
        x[e] = keep - h;
        const double down = loss();
        x[e] = keep;
        numeric[e] = (up - down) / (2 * h);
    }
    expect_near(numeric, want, 1e-6, "reference batch norm dx vs central differences, mask_span " +
                                         std::to_string(mask_span));
}

}  // namespace

int main() {
    unsigned seed = 1;
    for (bool batch : {true, false})
        for (bool affine : {true, false}) {
            test_batch_norm({13, 7, 1, 0, batch, affine, true}, seed++);   // channels last
            test_batch_norm({3, 5, 11, 0, batch, affine, true}, seed++);   // axes after the features
            test_batch_norm({6, 7, 1, 14, batch, affine, true}, seed++);   // (B, T, H, C): a flag per 2 rows
            test_batch_norm({4, 5, 6, 6, batch, affine, true}, seed++);    // mask (B, T) on axis 1: a flag per run
            test_batch_norm({4, 5, 1, 1, batch, affine, true}, seed++);    // (B, T, 1) on axis 1: a flag per element
        }
    test_batch_norm({9, 4, 3, 12, true, true, false}, seed++);             // parameter gradients only
    test_batch_norm({9, 4, 3, 12, false, true, true}, seed++);             // masked, moving statistics
    test_batch_norm({70, 5, 1, 5, true, true, true}, seed++);              // rows past one float block
    test_batch_norm({3, 4, 37, 0, true, true, true}, seed++);              // runs of full lanes and a tail
    test_batch_norm({2, 3, 9000, 0, true, false, true}, seed++);           // runs longer than one block
    // x large enough that each pass splits across two threads: rows and runs, with and without a mask
    const size_t split = size_t(batch_norm_detail::kParallelMinElements) + 1;
    test_batch_norm({split / 67 + 1, 67, 1, 0, true, true, true}, seed++);
    test_batch_norm({split / 67 + 1, 67, 1, 67, true, true, true}, seed++);
    test_batch_norm({2 * (split / 134 + 1), 67, 1, 134, false, true, true}, seed++);  // a flag per 2 rows: even rows
    test_batch_norm({split / 150 + 1, 3, 50, 150, true, true, true}, seed++);
    test_batch_norm({split / 27000 + 1, 3, 9000, 0, true, true, true}, seed++);
    test_batch_norm({3000, 5, 1, 0, true, true, true, 300, 0}, seed++);     // a mean far from zero against its spread
    test_batch_norm({3000, 5, 1, 0, true, true, true, -50, 200}, seed++);   // the first blocks' means far from the mean
    test_batch_norm({40, 3, 100, 0, true, true, true, 20, -80}, seed++);
    test_batch_norm({0, 3, 5, 0, true, true, true}, seed++);               // an empty batch: nothing moves
    test_reference_gradient(5, 3, 1, 0, seed++);
    test_reference_gradient(4, 3, 2, 6, seed++);
    test_reference_gradient(6, 4, 1, 8, seed++);
    return attnx::test::report("test_reference_batch_norm");
}
