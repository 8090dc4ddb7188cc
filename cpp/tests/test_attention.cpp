// Attention kernels against direct loops and central differences, in double.
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "attnx/attention.hpp"
#include "attnx/pooling.hpp"
#include "check.hpp"

using namespace attnx;
using Vec = std::vector<double>;

static Vec randn(size_t n, unsigned seed) {
    std::mt19937 gen(seed);
    std::normal_distribution<double> dist;
    Vec v(n);
    for (auto& x : v) x = dist(gen);
    return v;
}

static double dot(const Vec& a, const Vec& b) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
    return s;
}

// Central-difference check of d loss / d x against `analytic`.
static void check_gradient(Vec& x, const Vec& analytic, const std::function<double()>& loss, const char* what) {
    const double eps = 1e-6;
    for (size_t i = 0; i < x.size(); ++i) {
        const double old = x[i];
        x[i] = old + eps;
        const double plus = loss();
        x[i] = old - eps;
        const double minus = loss();
        x[i] = old;
        attnx::test::check_close(analytic[i], (plus - minus) / (2 * eps), 1e-6, what, __LINE__);
    }
}

// Two heads, a key padding mask with one fully masked batch row, causal, dropout keep mask.
static void test_sdpa_against_loops_and_finite_differences() {
    const int B = 2, H = 2, Tq = 3, S = 4, Dk = 2, Dv = 3;
    Vec q = randn(B * Tq * H * Dk, 1), k = randn(B * S * H * Dk, 2), v = randn(B * S * H * Dv, 3);
    Vec keep = randn(B * H * Tq * S, 4);
    for (auto& x : keep) x = x > -0.5 ? 1.5 : 0.0;
    const uint8_t pad[B * S] = {1, 1, 0, 1, 0, 0, 0, 0};
    AttendMask mask;
    mask.data = pad;
    mask.stride_b = S;
    mask.causal = true;
    const double scale = 0.8;
    const AttendShape shape{B, H, Tq, S, Dk, Dv};
    Vec ctx(B * Tq * H * Dv), w(B * H * Tq * S);
    sdpa_forward(shape, ctx.data(), w.data(), q.data(), k.data(), v.data(), mask, keep.data(), scale);

    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
            for (int t = 0; t < Tq; ++t) {
                double e[S], sum = 0;
                for (int s = 0; s < S; ++s) {
                    const bool ok = pad[b * S + s] && s <= t;
                    double sc = 0;
                    for (int d = 0; d < Dk; ++d)
                        sc += q[((b * Tq + t) * H + h) * Dk + d] * k[((b * S + s) * H + h) * Dk + d];
                    e[s] = ok ? std::exp(scale * sc) : 0.0;
                    sum += e[s];
                }
                for (int s = 0; s < S; ++s) {
                    const double want = sum > 0 ? e[s] / sum : 0.0;
                    CHECK_CLOSE(w[((b * H + h) * Tq + t) * S + s], want, 1e-12);
                }
                for (int d = 0; d < Dv; ++d) {
                    double want = 0;
                    for (int s = 0; s < S; ++s)
                        want += (sum > 0 ? e[s] / sum : 0.0) * keep[((b * H + h) * Tq + t) * S + s] *
                                v[((b * S + s) * H + h) * Dv + d];
                    CHECK_CLOSE(ctx[((b * Tq + t) * H + h) * Dv + d], want, 1e-12);
                }
            }
    for (double x : w) CHECK(std::isfinite(x));

    const Vec rc = randn(ctx.size(), 5), rw = randn(w.size(), 6);
    auto loss = [&]() {
        Vec c2(ctx.size()), w2(w.size());
        sdpa_forward(shape, c2.data(), w2.data(), q.data(), k.data(), v.data(), mask, keep.data(), scale);
        return dot(c2, rc) + dot(w2, rw);
    };
    Vec dq(q.size()), dk(k.size()), dv(v.size());
    double dscale = 0;
    sdpa_backward(shape, dq.data(), dk.data(), dv.data(), &dscale, rc.data(), rw.data(), w.data(), q.data(), k.data(),
                  v.data(), keep.data(), scale);
    check_gradient(q, dq, loss, "dq");
    check_gradient(k, dk, loss, "dk");
    check_gradient(v, dv, loss, "dv");
    // d/dscale: scores are linear in scale, so the loss derivative is dscale
    const double eps = 1e-6;
    auto loss_at = [&](double sc) {
        Vec c2(ctx.size()), w2(w.size());
        sdpa_forward(shape, c2.data(), w2.data(), q.data(), k.data(), v.data(), mask, keep.data(), sc);
        return dot(c2, rc) + dot(w2, rw);
    };
    CHECK_CLOSE(dscale, (loss_at(scale + eps) - loss_at(scale - eps)) / (2 * eps), 1e-6);
}

// The batch split over threads gives the same result as one thread.
static void test_parallel_matches_serial() {
    const int B = 8, H = 2, T = 48, D = 16;
    Vec q = randn(B * T * H * D, 7), k = randn(B * T * H * D, 8), v = randn(B * T * H * D, 9);
    Vec ctx(q.size()), w(B * H * T * T), ctx1(q.size()), w1(w.size());
    AttendMask mask;
    sdpa_forward(AttendShape{B, H, T, T, D, D}, ctx.data(), w.data(), q.data(), k.data(), v.data(), mask,
                 (const double*)nullptr, 0.25);
    for (int b = 0; b < B; ++b)  // one batch row at a time: below the threading threshold
        sdpa_forward(AttendShape{1, H, T, T, D, D}, ctx1.data() + (size_t)b * T * H * D,
                     w1.data() + (size_t)b * H * T * T, q.data() + (size_t)b * T * H * D,
                     k.data() + (size_t)b * T * H * D, v.data() + (size_t)b * T * H * D, mask,
                     (const double*)nullptr, 0.25);
    double worst = 0;
    for (size_t i = 0; i < ctx.size(); ++i) worst = std::max(worst, std::abs(ctx[i] - ctx1[i]));
    CHECK(worst < 1e-12);
}

static void test_additive_scores() {
    const int B = 2, Tq = 2, S = 3, U = 4;
    Vec pq = randn(B * Tq * U, 10), pk = randn(B * S * U, 11), v = randn(U, 12);
    Vec scores(B * Tq * S), hidden(B * Tq * S * U);
    additive_scores_forward(scores.data(), hidden.data(), pq.data(), pk.data(), v.data(), B, Tq, S, U);
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < Tq; ++t)
            for (int s = 0; s < S; ++s) {
                double want = 0;
                for (int u = 0; u < U; ++u)
                    want += v[u] * std::tanh(pq[(b * Tq + t) * U + u] + pk[(b * S + s) * U + u]);
                CHECK_CLOSE(scores[(b * Tq + t) * S + s], want, 1e-12);
            }
    const Vec r = randn(scores.size(), 13);
    auto loss = [&]() {
        Vec s2(scores.size()), h2(hidden.size());
        additive_scores_forward(s2.data(), h2.data(), pq.data(), pk.data(), v.data(), B, Tq, S, U);
        return dot(s2, r);
    };
    Vec dpq(pq.size()), dpk(pk.size()), dv(U, 0.0);
    additive_scores_backward(dpq.data(), dpk.data(), dv.data(), r.data(), hidden.data(), v.data(), B, Tq, S, U);
    check_gradient(pq, dpq, loss, "dpq");
    check_gradient(pk, dpk, loss, "dpk");
    check_gradient(v, dv, loss, "dv");
}

static void test_local_window() {
    const int B = 1, Tq = 2, S = 7, D = 2;
    const double p[2] = {2.3, 6.0};
    std::vector<uint8_t> allowed(B * Tq * S);
    Vec gauss(B * Tq * S);
    local_window_forward(allowed.data(), gauss.data(), p, (const uint8_t*)nullptr, B, Tq, S, D);
    for (int t = 0; t < Tq; ++t)
        for (int s = 0; s < S; ++s) {
            const bool in = std::abs(s - p[t]) <= D;
            CHECK(allowed[t * S + s] == in);
            CHECK_CLOSE(gauss[t * S + s], in ? std::exp(-(s - p[t]) * (s - p[t]) / 2.0) : 0.0, 1e-12);  // sigma = 1
        }
    Vec dgauss = randn(gauss.size(), 14), dp(Tq);
    local_window_backward(dp.data(), dgauss.data(), gauss.data(), p, B, Tq, S, D);
    CHECK_CLOSE(dp[0], [&] {
        double acc = 0;
        for (int s = 1; s <= 4; ++s) acc += dgauss[s] * gauss[s] * (s - p[0]);  // / sigma^2 = 1
        return acc;
    }(), 1e-12);
}

static void test_pooling() {
    const int B = 2, T = 3, C = 2;
    Vec x = randn(B * T * C, 15), W = randn(C, 16), bias = randn(T, 17);
    const uint8_t mask[B * T] = {1, 1, 0, 0, 0, 0};
    Vec out(B * C), a(B * T), e(B * T);
    attention_pooling_forward(PoolingConfig{B, T, C, true, false}, out.data(), a.data(), e.data(), x.data(), W.data(),
                              bias.data(), mask);
    double z[T], sum = 0;
    for (int t = 0; t < 2; ++t) {
        z[t] = std::exp(std::tanh(x[t * C] * W[0] + x[t * C + 1] * W[1] + bias[t]));
        sum += z[t];
    }
    CHECK_CLOSE(a[0], z[0] / sum, 1e-12);
    CHECK(a[2] == 0.0 && a[3] == 0.0 && out[2] == 0.0 && out[3] == 0.0);  // padded step, fully masked row
    CHECK_CLOSE(out[1], a[0] * x[1] + a[1] * x[3], 1e-12);
}

int main() {
    test_sdpa_against_loops_and_finite_differences();
    test_parallel_matches_serial();
    test_additive_scores();
    test_local_window();
    test_pooling();
    return attnx::test::report("test_attention");
}
