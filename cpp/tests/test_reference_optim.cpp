// optim.hpp against cpp/reference/optim.hpp: three steps of SGD (plain, momentum, Nesterov, weight
// decay), Adam and AdamW, RMSprop (plain, centered, momentum), and the regularization helpers, on
// odd lengths that leave vector tails and one that splits across two threads.
#include <random>
#include <string>
#include <vector>

#include "attnx/optim.hpp"
#include "reference/optim.hpp"
#include "reference_check.hpp"

using namespace attnx;
using namespace attnx::test;

namespace {

void test_updates(size_t n, unsigned seed) {
    std::mt19937 rng(seed);
    const auto p0 = random_values(rng, n), s0 = random_values(rng, n, 0.1);
    auto v0 = random_values(rng, n, 0.1);
    for (auto& e : v0) e = e * e;  // second moments are >= 0
    std::vector<std::vector<double>> grads;
    for (int step = 0; step < 3; ++step) grads.push_back(random_values(rng, n));
    Named want;
    {
        std::vector<double> p = p0, buf = s0, q = p0, qbuf = s0, r = p0;
        for (const auto& g : grads) {
            reference::sgd_update(p.data(), g.data(), buf.data(), n, 0.1, 0.9, false, 0.01);
            reference::sgd_update(q.data(), g.data(), qbuf.data(), n, 0.1, 0.8, true, 0.0);
            reference::sgd_update(r.data(), g.data(), nullptr, n, 0.1, 0.0, false, 0.02);
        }
        want.insert(want.end(), {{"sgd momentum p", p}, {"sgd momentum buf", buf}, {"sgd nesterov p", q},
                                 {"sgd nesterov buf", qbuf}, {"sgd plain p", r}});
    }
    for (bool decoupled : {false, true}) {
        std::vector<double> p = p0, m = s0, v = v0;
        long step = 4;
        for (const auto& g : grads)
            reference::adam_update(p.data(), g.data(), m.data(), v.data(), n, 0.01, 0.9, 0.999, 1e-7, step++, 0.05, decoupled);
        const std::string name = decoupled ? "adamw" : "adam";
        want.insert(want.end(), {{name + " p", p}, {name + " m", m}, {name + " v", v}});
    }
    for (int kind = 0; kind < 3; ++kind) {  // plain, centered, centered with momentum
        std::vector<double> p = p0, v = v0, mg(n, 0.0), buf = s0;
        for (const auto& g : grads)
            reference::rmsprop_update(p.data(), g.data(), v.data(), kind ? mg.data() : nullptr, kind == 2 ? buf.data() : nullptr,
                                      n, 0.01, 0.9, 1e-7, 0.5, 0.01);
        const std::string name = "rmsprop " + std::to_string(kind);
        want.insert(want.end(), {{name + " p", p}, {name + " v", v}, {name + " mg", mg}, {name + " buf", buf}});
    }
    std::vector<double> g1 = grads[0], g2 = grads[1], scaled = p0, clipped = p0;
    reference::add_l1l2_gradient(g1.data(), p0.data(), n, 0.01, 0.02);
    reference::add_l1l2_gradient(g2.data(), p0.data(), n, 0.0, 0.03);
    reference::scale_inplace(scaled.data(), n, 0.7);
    reference::clip_inplace(clipped.data(), n, -0.5, 0.8);
    want.insert(want.end(), {{"sum_squares", {reference::sum_squares(p0.data(), n)}},
                             {"l1l2 penalty", {reference::l1l2_penalty(p0.data(), n, 0.01, 0.02)}},
                             {"l2 penalty", {reference::l1l2_penalty(p0.data(), n, 0.0, 0.03)}},
                             {"l1l2 gradient", g1}, {"l2 gradient", g2}, {"scaled", scaled}, {"clipped", clipped}});
    char where[32];
    std::snprintf(where, sizeof where, "optimizers n=%zu", n);
    check_every_level(where, want, [&](auto tag) {
        using T = decltype(tag);
        const auto p0_ = cast<T>(p0), s0_ = cast<T>(s0), v0_ = cast<T>(v0);
        std::vector<std::vector<T>> g_;
        for (const auto& g : grads) g_.push_back(cast<T>(g));
        Named got;
        {
            std::vector<T> p = p0_, buf = s0_, q = p0_, qbuf = s0_, r = p0_;
            for (const auto& g : g_) {
                sgd_update<T>(p.data(), g.data(), buf.data(), n, T(0.1), T(0.9), false, T(0.01));
                sgd_update<T>(q.data(), g.data(), qbuf.data(), n, T(0.1), T(0.8), true, T(0));
                sgd_update<T>(r.data(), g.data(), nullptr, n, T(0.1), T(0), false, T(0.02));
            }
            got.insert(got.end(), {{"sgd momentum p", to_double(p)}, {"sgd momentum buf", to_double(buf)},
                                   {"sgd nesterov p", to_double(q)}, {"sgd nesterov buf", to_double(qbuf)},
                                   {"sgd plain p", to_double(r)}});
        }
        for (bool decoupled : {false, true}) {
            std::vector<T> p = p0_, m = s0_, v = v0_;
            long step = 4;
            for (const auto& g : g_)
                adam_update<T>(p.data(), g.data(), m.data(), v.data(), n, T(0.01), T(0.9), T(0.999), T(1e-7), step++,
                               T(0.05), decoupled);
            const std::string name = decoupled ? "adamw" : "adam";
            got.insert(got.end(), {{name + " p", to_double(p)}, {name + " m", to_double(m)}, {name + " v", to_double(v)}});
        }
        {  // several arrays in one region (cut anywhere) give each array's own update bit for bit
            const size_t cuts[] = {0, n / 3, n / 3 + (n > 2), n};  // three arrays, one of them of 0 or 1 element
            std::vector<T> p = p0_, m = s0_, v = v0_, q = p0_, qm = s0_, qv = v0_;
            std::vector<T*> ps, ms, vs;
            std::vector<const T*> gs;
            std::vector<size_t> sizes;
            for (int a = 0; a < 3; ++a) {
                ps.push_back(p.data() + cuts[a]), ms.push_back(m.data() + cuts[a]), vs.push_back(v.data() + cuts[a]);
                gs.push_back(g_[0].data() + cuts[a]), sizes.push_back(cuts[a + 1] - cuts[a]);
                adam_update<T>(q.data() + cuts[a], g_[0].data() + cuts[a], qm.data() + cuts[a], qv.data() + cuts[a],
                               sizes.back(), T(0.01), T(0.9), T(0.999), T(1e-7), 3, T(0.05), false);
            }
            adam_update_arrays<T>(ps.data(), gs.data(), ms.data(), vs.data(), sizes.data(), 3, T(0.01), T(0.9),
                                  T(0.999), T(1e-7), 3, T(0.05), false);
            CHECK(p == q && m == qm && v == qv);
        }
        for (int kind = 0; kind < 3; ++kind) {
            std::vector<T> p = p0_, v = v0_, mg(n, T(0)), buf = s0_;
            for (const auto& g : g_)
                rmsprop_update<T>(p.data(), g.data(), v.data(), kind ? mg.data() : nullptr, kind == 2 ? buf.data() : nullptr,
                                  n, T(0.01), T(0.9), T(1e-7), T(0.5), T(0.01));
            const std::string name = "rmsprop " + std::to_string(kind);
            got.insert(got.end(), {{name + " p", to_double(p)}, {name + " v", to_double(v)}, {name + " mg", to_double(mg)},
                                   {name + " buf", to_double(buf)}});
        }
        std::vector<T> g1 = g_[0], g2 = g_[1], scaled = p0_, clipped = p0_;
        add_l1l2_gradient<T>(g1.data(), p0_.data(), n, 0.01, 0.02);
        add_l1l2_gradient<T>(g2.data(), p0_.data(), n, 0.0, 0.03);
        for (double l1 : {0.01, 0.0}) {  // the fused pass gives the two kernels' numbers bit for bit
            std::vector<T> apart = g_[2], fused = g_[2];
            add_l1l2_gradient<T>(apart.data(), p0_.data(), n, l1, 0.02);
            const double penalty = l1l2_penalty_add_gradient<T>(fused.data(), p0_.data(), n, l1, 0.02);
            CHECK(penalty == l1l2_penalty<T>(p0_.data(), n, l1, 0.02));
            CHECK(fused == apart);
        }
        scale_inplace<T>(scaled.data(), n, T(0.7));
        clip_inplace<T>(clipped.data(), n, T(-0.5), T(0.8));
        got.insert(got.end(), {{"sum_squares", {sum_squares<T>(p0_.data(), n)}},
                               {"l1l2 penalty", {l1l2_penalty<T>(p0_.data(), n, 0.01, 0.02)}},
                               {"l2 penalty", {l1l2_penalty<T>(p0_.data(), n, 0.0, 0.03)}},
                               {"l1l2 gradient", to_double(g1)}, {"l2 gradient", to_double(g2)},
                               {"scaled", to_double(scaled)}, {"clipped", to_double(clipped)}});
        return got;
    });
}

}  // namespace

int main() {
    test_updates(1, 1);
    test_updates(37, 2);
    test_updates(40003, 3);  // adam splits across two threads
    return attnx::test::report("test_reference_optim");
}
