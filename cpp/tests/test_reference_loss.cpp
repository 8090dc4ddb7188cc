// loss.hpp against cpp/reference/loss.hpp: every loss from logits and from probabilities, with and
// without weights, ignored labels and zero-weight rows, probabilities on and beyond the clip edges;
// the loss and its gradient, on odd sizes and one that splits across two threads.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attnx/loss.hpp"
#include "reference/loss.hpp"
#include "reference_check.hpp"

using namespace attnx;
using namespace attnx::test;

namespace {

// Probabilities in (0.02, 0.98), with exact 0 and 1 (beyond the clip) at every 17th and 19th entry
std::vector<double> probabilities(std::mt19937& rng, size_t n, bool edges) {
    std::uniform_real_distribution<double> u(0.02, 0.98);
    std::vector<double> p(n);
    for (size_t i = 0; i < n; ++i) p[i] = edges && i % 17 == 5 ? 0.0 : edges && i % 19 == 7 ? 1.0 : (double)(float)u(rng);
    return p;
}

std::vector<double> uniforms(std::mt19937& rng, size_t n) {
    std::uniform_real_distribution<double> u(0, 1);
    std::vector<double> v(n);
    for (auto& e : v) e = (double)(float)u(rng);
    return v;
}

void test_elementwise(size_t n, bool weighted, unsigned seed) {
    std::mt19937 rng(seed);
    const auto z = random_values(rng, n, 2.0), p = probabilities(rng, n, true);
    // y = 1 where p = 1: there (1 - y) log(1 - clip(p) + eps) would read 1 - eps as float rounds it
    // (log(2.19e-7) against log(2e-7)), a difference of the precision, not of the kernel
    auto y = uniforms(rng, n);
    for (size_t i = 0; i < n; ++i)
        if (p[i] == 1.0) y[i] = 1.0;
    const auto w = uniforms(rng, n), target = random_values(rng, n);
    const double* w_ = weighted ? w.data() : nullptr;
    const double denom = (double)n + 3;
    std::vector<double> d1(n), d2(n), d3(n);
    const double l1 = reference::bce_logits(d1.data(), z.data(), y.data(), w_, n, denom);
    const double l2 = reference::bce_probs(d2.data(), p.data(), y.data(), w_, n, denom);
    const double l3 = reference::mse(d3.data(), z.data(), target.data(), w_, n, denom);
    char where[64];
    std::snprintf(where, sizeof where, "bce, mse n=%zu%s", n, weighted ? " weighted" : "");
    check_every_level(where, {{"bce_logits", {l1}}, {"dz", d1}, {"bce_probs", {l2}}, {"dp", d2}, {"mse", {l3}}, {"dmse", d3}},
                      [&](auto tag) {
                          using T = decltype(tag);
                          const auto z_ = cast<T>(z), p_ = cast<T>(p), y_ = cast<T>(y), wt = cast<T>(w), t_ = cast<T>(target);
                          const T* w2 = weighted ? wt.data() : nullptr;
                          std::vector<T> e1(n), e2(n), e3(n);
                          const double m1 = bce_logits<T>(e1.data(), z_.data(), y_.data(), w2, n, (T)denom);
                          const double m2 = bce_probs<T>(e2.data(), p_.data(), y_.data(), w2, n, (T)denom);
                          const double m3 = mse<T>(e3.data(), z_.data(), t_.data(), w2, n, (T)denom);
                          return Named{{"bce_logits", {m1}}, {"dz", to_double(e1)}, {"bce_probs", {m2}}, {"dp", to_double(e2)},
                                       {"mse", {m3}}, {"dmse", to_double(e3)}};
                      });
}

void test_cross_entropy(size_t rows, size_t K, bool weighted, unsigned seed) {
    std::mt19937 rng(seed);
    const auto z = random_values(rng, rows * K, 2.0), p = probabilities(rng, rows * K, false);
    auto w = uniforms(rng, rows);
    w[rows / 2] = 0;  // a zero-weight row
    std::vector<int64_t> labels(rows);
    for (auto& l : labels) l = (int64_t)(rng() % K);
    labels[rows - 1] = -100;  // ignored
    std::vector<double> soft(rows * K);
    for (size_t r = 0; r < rows; ++r) {  // soft targets summing to 1.5
        const auto u = uniforms(rng, K);
        double s = 0;
        for (double e : u) s += e;
        for (size_t k = 0; k < K; ++k) soft[r * K + k] = (double)(float)(1.5 * u[k] / s);
    }
    const double* w_ = weighted ? w.data() : nullptr;
    const double denom = (double)rows;
    Named want;
    for (bool logits : {true, false}) {
        const double* in = logits ? z.data() : p.data();
        std::vector<double> ds(rows * K), dc(rows * K);
        const double ls = reference::sparse_cce(ds.data(), in, labels.data(), w_, rows, K, logits, -100, denom);
        const double lc = reference::categorical_cce(dc.data(), in, soft.data(), w_, rows, K, logits, denom);
        const std::string from = logits ? " logits" : " probs";
        want.insert(want.end(), {{"sparse" + from, {ls}}, {"dsparse" + from, ds}, {"categorical" + from, {lc}},
                                 {"dcategorical" + from, dc}});
    }
    std::vector<double> dsmooth(rows * K);  // label smoothing (logits only)
    const double lsmooth = reference::sparse_cce(dsmooth.data(), z.data(), labels.data(), w_, rows, K, true, -100,
                                                 denom, 0.1);
    want.insert(want.end(), {{"sparse smoothed", {lsmooth}}, {"dsparse smoothed", dsmooth}});
    char where[64];
    std::snprintf(where, sizeof where, "cross-entropy rows=%zu K=%zu%s", rows, K, weighted ? " weighted" : "");
    check_every_level(where, want, [&](auto tag) {
        using T = decltype(tag);
        const auto z_ = cast<T>(z), p_ = cast<T>(p), wt = cast<T>(w), soft_ = cast<T>(soft);
        const T* w2 = weighted ? wt.data() : nullptr;
        Named got;
        for (bool logits : {true, false}) {
            const T* in = logits ? z_.data() : p_.data();
            std::vector<T> ds(rows * K), dc(rows * K);
            const double ls = sparse_cce<T>(ds.data(), in, labels.data(), w2, rows, K, logits, -100, (T)denom);
            const double lc = categorical_cce<T>(dc.data(), in, soft_.data(), w2, rows, K, logits, (T)denom);
            const std::string from = logits ? " logits" : " probs";
            got.insert(got.end(), {{"sparse" + from, {ls}}, {"dsparse" + from, to_double(ds)},
                                   {"categorical" + from, {lc}}, {"dcategorical" + from, to_double(dc)}});
        }
        std::vector<T> dsmooth(rows * K);
        const double lsmooth = sparse_cce<T>(dsmooth.data(), z_.data(), labels.data(), w2, rows, K, true, -100,
                                             (T)denom, 0.1);
        got.insert(got.end(), {{"sparse smoothed", {lsmooth}}, {"dsparse smoothed", to_double(dsmooth)}});
        return got;
    });
}

}  // namespace

int main() {
    unsigned seed = 1;
    for (bool weighted : {false, true}) {
        test_elementwise(1, weighted, seed++);
        test_elementwise(203, weighted, seed++);
        test_cross_entropy(5, 7, weighted, seed++);
        test_cross_entropy(301, 127, weighted, seed++);  // sparse_cce splits across two threads
    }
    return attnx::test::report("test_reference_loss");
}
