// Core kernels against xtensor / xtensor-blas reference computations.
#include <cmath>
#include <vector>

#include <xtensor/xrandom.hpp>
#include <xtensor/xtensor.hpp>
#include <xtensor/xview.hpp>
#include <xtensor-blas/xlinalg.hpp>

#include "attnx/activations.hpp"
#include "attnx/dense.hpp"
#include "attnx/embedding.hpp"
#include "attnx/loss.hpp"
#include "attnx/optim.hpp"
#include "attnx/parallel.hpp"
#include "check.hpp"

using namespace attnx;

static void test_dense() {
    xt::random::seed(1);
    const int N = 5, C = 7, OC = 3;
    xt::xtensor<double, 2> x = xt::random::randn<double>({N, C});
    xt::xtensor<double, 2> W = xt::random::randn<double>({C, OC});
    xt::xtensor<double, 1> b = xt::random::randn<double>({OC});
    xt::xtensor<double, 2> z = xt::zeros<double>({N, OC});
    dense_forward(z.data(), x.data(), W.data(), b.data(), N, C, OC);
    xt::xtensor<double, 2> want = xt::linalg::dot(x, W) + b;
    CHECK(xt::allclose(z, want));

    xt::xtensor<double, 2> dz = xt::random::randn<double>({N, OC});
    xt::xtensor<double, 2> dx = xt::zeros<double>({N, C});
    xt::xtensor<double, 2> dW = xt::ones<double>({C, OC});  // backward accumulates
    xt::xtensor<double, 1> db = xt::zeros<double>({OC});
    dense_backward(dx.data(), dW.data(), db.data(), dz.data(), x.data(), W.data(), N, C, OC);
    CHECK(xt::allclose(dx, xt::linalg::dot(dz, xt::transpose(W))));
    CHECK(xt::allclose(dW, xt::linalg::dot(xt::transpose(x), dz) + 1.0));
    CHECK(xt::allclose(db, xt::sum(dz, {0})));
}

static void test_empty_gemm() {
    // K = 0: C = beta * C, no BLAS call with a zero leading dimension
    double C[4] = {1, 2, 3, 4};
    matmul<double>(C, nullptr, nullptr, 2, 2, 0, false, false, 0.5);
    CHECK_CLOSE(C[3], 2.0, 1e-12);
}

static void test_softmax() {
    double x[6] = {1, 2, 3, -1000, 0, 1000};
    double y[6];
    softmax_rows(y, x, 2, 3);
    double e = std::exp(1.0), s = 1 + e + e * e;
    CHECK_CLOSE(y[0], 1 / s, 1e-12);
    CHECK_CLOSE(y[5], 1.0, 1e-12);
    CHECK(std::isfinite(y[3]));
}

// Every SIMD level this CPU has: exp_array over lengths 1..40 (whole vectors and every tail) gives
// libm's values and writes nothing past the end (the AVX-512 tails store under a lane mask).
static void test_every_simd_level() {
    for (int level = 0; level <= (int)cpu_simd_level(); ++level) {
        simd_level_cap() = level;
        CHECK((int)simd_level() == level);
        for (size_t n = 1; n <= 40; ++n) {
            std::vector<float> x(n), y(n + 16, -7.f);
            for (size_t i = 0; i < n; ++i) x[i] = -3.f + 0.37f * (float)i;
            exp_array(y.data(), x.data(), n);
            for (size_t i = 0; i < n; ++i) CHECK_CLOSE(y[i], std::exp((double)x[i]), 2e-7);
            for (size_t i = n; i < y.size(); ++i) CHECK(y[i] == -7.f);
        }
    }
    simd_level_cap() = (int)SimdLevel::avx512;
}

// The float exp kernel: relative error about 1 ulp over the range, 0 below it, inf above, NaN kept.
static void test_exp_array() {
    std::vector<float> x, y;
    for (double v = -87.3; v < 88.7; v += 0.0137) x.push_back((float)v);
    y.resize(x.size());
    exp_array(y.data(), x.data(), x.size());
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const double want = std::exp((double)x[i]);
        worst = std::max(worst, std::abs(y[i] - want) / want);
    }
    CHECK(worst < 2e-7);
    // eleven values: a vector's worth and a scalar tail, both meeting every special case
    float special[11] = {-INFINITY, -100.f, 0.f, 89.f, NAN, -1e30f, 1e30f, -1e7f, INFINITY, NAN, -1e30f};
    exp_array(special, special, 11);
    CHECK(special[0] == 0 && special[1] == 0 && special[2] == 1 && std::isinf(special[3]) && std::isnan(special[4]));
    CHECK(special[5] == 0 && std::isinf(special[6]) && special[7] == 0 && std::isinf(special[8]) &&
          std::isnan(special[9]) && special[10] == 0);
    // a softmax row whose scores span the float range: the huge negative ones weigh 0, never NaN
    float row[11] = {-1e30f, 0.f, -1e30f, 1.f, -3e38f, 0.f, -1e30f, 2.f, -1e7f, 1.f, -3e38f}, weights[11];
    masked_softmax_row(weights, row, nullptr, 11);
    const double norm = 2 + 2 * std::exp(1.0) + std::exp(2.0);
    for (int c = 0; c < 11; ++c) {
        const double want = row[c] < -100 ? 0.0 : std::exp((double)row[c]) / norm;
        CHECK(std::abs(weights[c] - want) < 1e-6);
    }
}

static void test_embedding() {
    double table[6] = {0, 1, 10, 11, 20, 21};
    int64_t ids[3] = {2, 0, 2};
    double out[6];
    embedding_forward(out, ids, table, 3, 2);
    CHECK_CLOSE(out[0], 20, 0);
    CHECK_CLOSE(out[3], 1, 0);
    double dtable[6] = {0, 0, 0, 0, 0, 0};
    double dout[6] = {1, 1, 1, 1, 1, 1};
    embedding_backward(dtable, dout, ids, 3, 2);
    CHECK_CLOSE(dtable[4], 2, 0);  // id 2 used twice
    CHECK_CLOSE(dtable[2], 0, 0);
}

static void test_losses() {
    double z[2] = {0.0, 50.0}, y[2] = {1.0, 0.0}, dz[2];
    double loss = bce_logits(dz, z, y, (const double*)nullptr, 2, 2.0);
    CHECK_CLOSE(loss, (std::log(2.0) + 50.0) / 2, 1e-12);
    CHECK_CLOSE(dz[0], -0.25, 1e-12);
    double logits[3] = {1, 2, 3}, d[3];
    int64_t label[1] = {2};
    double l = sparse_cce(d, logits, label, (const double*)nullptr, 1, 3, true, -100, 1.0);
    CHECK_CLOSE(l, std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3, 1e-12);
}

static void test_adam_first_step() {
    // first Adam step moves each weight by lr * sign(g) (up to eps)
    double p[2] = {1, 1}, g[2] = {0.5, -2}, m[2] = {0, 0}, v[2] = {0, 0};
    adam_update(p, g, m, v, 2, 0.1, 0.9, 0.999, 1e-12, 1, 0.0, false);
    CHECK_CLOSE(p[0], 0.9, 1e-9);
    CHECK_CLOSE(p[1], 1.1, 1e-9);
}

// run_team: every member runs once with its own index, and a sync orders the members' writes before
// every member's reads after it (each round, each member reads what all wrote in it); one thread, or a
// call inside another parallel region, runs a team of one
static void test_run_team() {
    const int threads = attnx::get_blas_threads();
    for (int budget : {1, 2}) {
        attnx::set_blas_threads(budget);
        std::vector<int> slots(2, 0), sums(2 * 100, -1);
        unsigned seen_members = 0;
        attnx::run_team(2, [&](const attnx::TeamMember& team) {
            if (team.index == 0) seen_members = team.members;
            for (int round = 0; round < 100; ++round) {
                slots[team.index] = round * 10 + (int)team.index;
                team.sync();  // every member's slot of this round written
                int sum = 0;
                for (unsigned m = 0; m < team.members; ++m) sum += slots[m];
                sums[round * 2 + team.index] = sum;
                team.sync();  // read before the next round writes
            }
        });
        CHECK(seen_members == (unsigned)budget);
        for (int round = 0; round < 100; ++round)
            for (unsigned m = 0; m < seen_members; ++m)
                CHECK(sums[round * 2 + m] == (budget == 2 ? round * 20 + 1 : round * 10));
    }
    attnx::set_blas_threads(2);
    unsigned nested_members = 0;
    attnx::parallel_for(2, 1e9, [&](size_t lo, size_t) {
        if (lo == 0) attnx::run_team(2, [&](const attnx::TeamMember& team) { nested_members = team.members; });
    });
    CHECK(nested_members == 1);
    attnx::set_blas_threads(threads);
}

int main() {
    test_dense();
    test_empty_gemm();
    test_softmax();
    test_exp_array();
    test_every_simd_level();
    test_embedding();
    test_losses();
    test_adam_first_step();
    test_run_team();
    return attnx::test::report("test_core_kernels");
}
