// attention.hpp against cpp/reference/attention.hpp: the fused scaled dot-product core (key padding
// and full masks, causal, dropout keep, the weights' own gradient, a learned scale; with and without
// the weights written), the softmax + context and dot-score kernels apart, the masked softmax, the
// additive score and the local window; odd sizes that leave vector tails, one shape large enough to
// split across two threads and one with several blocks of query rows.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attnx/attention.hpp"
#include "reference/attention.hpp"
#include "attend_check.hpp"
#include "reference_check.hpp"

using namespace attnx;
using namespace attnx::test;

namespace {

std::string describe(const AttendShape& sh, const char* what) {
    char s[128];
    std::snprintf(s, sizeof s, "%s B=%d H=%d Tq=%d S=%d Dk=%d Dv=%d", what, sh.B, sh.H, sh.Tq, sh.S, sh.Dk, sh.Dv);
    return s;
}

// A key padding mask (B, S) leaving at least one position per row, or a full mask (B, Tq, S)
std::vector<uint8_t> random_mask(std::mt19937& rng, size_t rows, int S) {
    std::vector<uint8_t> m(rows * S);
    for (size_t r = 0; r < rows; ++r)
        for (int s = 0; s < S; ++s) m[r * S + s] = s == 0 || rng() % 4 != 0;
    return m;
}

// keep = 1 / (1 - rate) or 0, rate 0.25
std::vector<double> random_keep(std::mt19937& rng, size_t n) {
    std::vector<double> k(n);
    for (auto& e : k) e = rng() % 4 ? 1 / 0.75 : 0.0;
    return k;
}

void test_sdpa(AttendShape sh, bool full_mask, bool causal, bool dropout, bool with_weights, unsigned seed) {
    std::mt19937 rng(seed);
    const AttendSizes sizes(sh);
    const size_t nq = sizes.query, nk = sizes.key, nv = sizes.value, nc = sizes.context, nw = sizes.weights;
    const auto q = random_values(rng, nq), k = random_values(rng, nk), v = random_values(rng, nv);
    const auto dcontext = random_values(rng, nc), dweights = random_values(rng, nw);
    const auto keep = random_keep(rng, nw);
    const auto mask_data = random_mask(rng, full_mask ? (size_t)sh.B * sh.Tq : (size_t)sh.B, sh.S);
    AttendMask mask;
    mask.data = mask_data.data(), mask.causal = causal;
    mask.stride_b = full_mask ? (size_t)sh.Tq * sh.S : (size_t)sh.S, mask.stride_t = full_mask ? sh.S : 0;
    const double scale = 1 / std::sqrt((double)sh.Dk);
    const double* keep_p = dropout ? keep.data() : nullptr;
    std::vector<double> context(nc), weights(nw), dq(nq), dk(nk), dv(nv);
    double dscale = 0;
    reference::sdpa_forward(sh, context.data(), weights.data(), q.data(), k.data(), v.data(), mask, keep_p, scale);
    reference::sdpa_backward(sh, dq.data(), dk.data(), dv.data(), &dscale, dcontext.data(),
                             with_weights ? dweights.data() : nullptr, weights.data(), q.data(), k.data(), v.data(),
                             keep_p, scale);
    Named want{{"context", context}};
    if (with_weights) want.push_back({"weights", weights});
    want.insert(want.end(), {{"dq", dq}, {"dk", dk}, {"dv", dv}, {"dscale", {dscale}}});
    std::string where = describe(sh, "sdpa");
    where += std::string(full_mask ? " full mask" : " key mask") + (causal ? " causal" : "") + (dropout ? " dropout" : "") +
             (with_weights ? " weights" : " no weights");
    check_every_level(where, want, [&](auto tag) {
        using T = decltype(tag);
        const auto q_ = cast<T>(q), k_ = cast<T>(k), v_ = cast<T>(v), keep_ = cast<T>(keep), dc = cast<T>(dcontext);
        const auto dw = cast<T>(dweights);
        std::vector<T> context_(nc), weights_(nw), dq_(nq), dk_(nk), dv_(nv);
        T dscale_ = 0;
        sdpa_forward<T>(sh, context_.data(), with_weights ? weights_.data() : nullptr, q_.data(), k_.data(), v_.data(),
                        mask, dropout ? keep_.data() : nullptr, (T)scale);
        Named got{{"context", to_double(context_)}};
        if (!with_weights)  // the backward reads the weights: take them from a call that writes them
            sdpa_forward<T>(sh, context_.data(), weights_.data(), q_.data(), k_.data(), v_.data(), mask,
                            dropout ? keep_.data() : nullptr, (T)scale);
        else
            got.push_back({"weights", to_double(weights_)});
        sdpa_backward<T>(sh, dq_.data(), dk_.data(), dv_.data(), &dscale_, dc.data(), with_weights ? dw.data() : nullptr,
                         weights_.data(), q_.data(), k_.data(), v_.data(), dropout ? keep_.data() : nullptr, (T)scale);
        got.insert(got.end(), {{"dq", to_double(dq_)}, {"dk", to_double(dk_)}, {"dv", to_double(dv_)}, {"dscale", {(double)dscale_}}});
        return got;
    });
}

// The score and softmax-context kernels apart (as the additive and local attention layers use them)
void test_scores_and_context(AttendShape sh, unsigned seed) {
    std::mt19937 rng(seed);
    const AttendSizes sizes(sh);
    const size_t nq = sizes.query, nk = sizes.key, nv = sizes.value, nc = sizes.context, nw = sizes.weights;
    const auto q = random_values(rng, nq), k = random_values(rng, nk), v = random_values(rng, nv);
    const auto dcontext = random_values(rng, nc), dweights = random_values(rng, nw), keep = random_keep(rng, nw);
    const auto dscores_in = random_values(rng, nw);
    const auto mask_data = random_mask(rng, (size_t)sh.B * sh.Tq, sh.S);
    AttendMask mask{mask_data.data(), (size_t)sh.Tq * sh.S, (size_t)sh.S, false};
    const double scale = 0.7;
    std::vector<double> scores(nw), weights(nw), softmax(nw), context(nc), dscores(nw), dv(nv), dkeep(nw), dq(nq), dk(nk);
    double dscale = 0;
    reference::dot_scores_forward(sh, scores.data(), q.data(), k.data(), scale);
    reference::dot_scores_backward(sh, dq.data(), dk.data(), &dscale, dscores_in.data(), q.data(), k.data(), scale);
    reference::masked_softmax_scores(sh, softmax.data(), scores.data(), mask);
    reference::softmax_context_forward(sh, context.data(), weights.data(), scores.data(), v.data(), mask, keep.data());
    reference::softmax_context_backward(sh, dscores.data(), dv.data(), dkeep.data(), dcontext.data(), dweights.data(),
                                        weights.data(), v.data(), keep.data());
    const Named want{{"scores", scores}, {"dq", dq}, {"dk", dk}, {"dscale", {dscale}}, {"softmax", softmax},
                     {"context", context}, {"weights", weights}, {"dscores", dscores}, {"dv", dv}, {"dkeep", dkeep}};
    check_every_level(describe(sh, "scores + softmax_context"), want, [&](auto tag) {
        using T = decltype(tag);
        const auto q_ = cast<T>(q), k_ = cast<T>(k), v_ = cast<T>(v), keep_ = cast<T>(keep), dc = cast<T>(dcontext);
        const auto dw = cast<T>(dweights), ds_in = cast<T>(dscores_in);
        std::vector<T> scores_(nw), weights_(nw), softmax_(nw), context_(nc), dscores_(nw), dv_(nv), dkeep_(nw), dq_(nq), dk_(nk);
        T dscale_ = 0;
        dot_scores_forward<T>(sh, scores_.data(), q_.data(), k_.data(), (T)scale);
        dot_scores_backward<T>(sh, dq_.data(), dk_.data(), &dscale_, ds_in.data(), q_.data(), k_.data(), (T)scale);
        masked_softmax_scores<T>(sh, softmax_.data(), scores_.data(), mask);
        weights_ = scores_;
        softmax_context_forward<T>(sh, context_.data(), weights_.data(), v_.data(), mask, keep_.data());
        softmax_context_backward<T>(sh, dscores_.data(), dv_.data(), dkeep_.data(), dc.data(), dw.data(), weights_.data(),
                                    v_.data(), keep_.data());
        return Named{{"scores", to_double(scores_)}, {"dq", to_double(dq_)}, {"dk", to_double(dk_)},
                     {"dscale", {(double)dscale_}}, {"softmax", to_double(softmax_)}, {"context", to_double(context_)},
                     {"weights", to_double(weights_)}, {"dscores", to_double(dscores_)}, {"dv", to_double(dv_)},
                     {"dkeep", to_double(dkeep_)}};
    });
}

void test_additive(int B, int Tq, int S, int U, unsigned seed) {
    std::mt19937 rng(seed);
    const auto pq = random_values(rng, (size_t)B * Tq * U), pk = random_values(rng, (size_t)B * S * U);
    const auto v = random_values(rng, U), dscores = random_values(rng, (size_t)B * Tq * S), dv0 = random_values(rng, U);
    std::vector<double> scores((size_t)B * Tq * S), hidden((size_t)B * Tq * S * U), dpq(pq.size()), dpk(pk.size()), dv = dv0;
    reference::additive_scores_forward(scores.data(), hidden.data(), pq.data(), pk.data(), v.data(), B, Tq, S, U);
    reference::additive_scores_backward(dpq.data(), dpk.data(), dv.data(), dscores.data(), hidden.data(), v.data(), B, Tq, S, U);
    char where[96];
    std::snprintf(where, sizeof where, "additive B=%d Tq=%d S=%d U=%d", B, Tq, S, U);
    check_every_level(where, {{"scores", scores}, {"hidden", hidden}, {"dpq", dpq}, {"dpk", dpk}, {"dv", dv}}, [&](auto tag) {
        using T = decltype(tag);
        const auto pq_ = cast<T>(pq), pk_ = cast<T>(pk), v_ = cast<T>(v), ds = cast<T>(dscores);
        std::vector<T> scores_(scores.size()), hidden_(hidden.size()), dpq_(pq.size()), dpk_(pk.size()), dv_ = cast<T>(dv0);
        additive_scores_forward<T>(scores_.data(), hidden_.data(), pq_.data(), pk_.data(), v_.data(), B, Tq, S, U);
        additive_scores_backward<T>(dpq_.data(), dpk_.data(), dv_.data(), ds.data(), hidden_.data(), v_.data(), B, Tq, S, U);
        return Named{{"scores", to_double(scores_)}, {"hidden", to_double(hidden_)}, {"dpq", to_double(dpq_)},
                     {"dpk", to_double(dpk_)}, {"dv", to_double(dv_)}};
    });
}

void test_local_window(int B, int Tq, int S, int D, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> pos(0, S - 1);
    std::vector<double> p((size_t)B * Tq);
    for (auto& e : p) e = (double)(float)pos(rng);
    const auto dgauss = random_values(rng, (size_t)B * Tq * S);
    const auto source_mask = random_mask(rng, B, S);
    std::vector<uint8_t> allowed((size_t)B * Tq * S);
    std::vector<double> gauss(allowed.size()), dp(p.size());
    reference::local_window_forward(allowed.data(), gauss.data(), p.data(), source_mask.data(), B, Tq, S, D);
    reference::local_window_backward(dp.data(), dgauss.data(), gauss.data(), p.data(), B, Tq, S, D);
    char where[96];
    std::snprintf(where, sizeof where, "local window B=%d Tq=%d S=%d D=%d", B, Tq, S, D);
    check_every_level(where, {{"allowed", std::vector<double>(allowed.begin(), allowed.end())}, {"gauss", gauss}, {"dp", dp}},
                      [&](auto tag) {
                          using T = decltype(tag);
                          const auto p_ = cast<T>(p), dg = cast<T>(dgauss);
                          std::vector<uint8_t> allowed_(allowed.size());
                          std::vector<T> gauss_(gauss.size()), dp_(p.size());
                          local_window_forward<T>(allowed_.data(), gauss_.data(), p_.data(), source_mask.data(), B, Tq, S, D);
                          local_window_backward<T>(dp_.data(), dg.data(), gauss_.data(), p_.data(), B, Tq, S, D);
                          return Named{{"allowed", std::vector<double>(allowed_.begin(), allowed_.end())},
                                       {"gauss", to_double(gauss_)}, {"dp", to_double(dp_)}};
                      });
}

}  // namespace


// sdpa with its keep mask drawn by the kernel (KeepStream) gives, bit for bit, what it gives on the mask
// random_keep writes for the weights' shape (B, H, Tq, S): forward (the fused float path and bf16's
// whole products, with and without the weights written) and backward, on every level and split
template <class T> void test_drawn_keep(AttendShape sh, bool bf16, unsigned seed) {
    std::mt19937 rng(seed);
    const AttendSizes sizes(sh);
    const size_t nq = sizes.query, nk = sizes.key, nv = sizes.value, nc = sizes.context, nw = sizes.weights;
    const auto q = cast<T>(random_values(rng, nq)), k = cast<T>(random_values(rng, nk)), v = cast<T>(random_values(rng, nv));
    const auto dcontext = cast<T>(random_values(rng, nc));
    const KeepStream drawn{0x5eed0000ull + seed, 7, 0.3};  // first_row 7: a shard's rows
    std::vector<T> keep(nw);
    attnx::random_keep<T>(keep.data(), sh.B, nw / sh.B, drawn.key, drawn.first_row, drawn.rate);
    const AttendMask mask;
    const T scale = T(0.4);
    const std::string where = describe(sh, bf16 ? "sdpa drawn keep bf16" : "sdpa drawn keep");
    on_every_level_and_split([&](const std::string& level) {
        std::vector<T> c1(nc), w1(nw), c2(nc), w2(nw), c3(nc), c0(nc), w0(nw);
        sdpa_forward<T>(sh, c1.data(), w1.data(), q.data(), k.data(), v.data(), mask, keep.data(), scale, bf16);
        sdpa_forward<T>(sh, c2.data(), w2.data(), q.data(), k.data(), v.data(), mask, nullptr, scale, bf16, drawn);
        sdpa_forward<T>(sh, c3.data(), nullptr, q.data(), k.data(), v.data(), mask, nullptr, scale, bf16, drawn);
        sdpa_forward<T>(sh, c0.data(), w0.data(), q.data(), k.data(), v.data(), mask, nullptr, scale, bf16);
        CHECK(c1 == c2 && w1 == w2);
        std::vector<T> c1_no_weights(nc);  // the same contexts where the weights are not written
        sdpa_forward<T>(sh, c1_no_weights.data(), nullptr, q.data(), k.data(), v.data(), mask, keep.data(), scale, bf16);
        CHECK(c1_no_weights == c3);
        CHECK(c0 != c1);  // the mask drops something
        std::vector<T> dq1(nq), dk1(nk), dv1(nv), dq2(nq), dk2(nk), dv2(nv);
        sdpa_backward<T>(sh, dq1.data(), dk1.data(), dv1.data(), nullptr, dcontext.data(), nullptr, w1.data(), q.data(),
                         k.data(), v.data(), keep.data(), scale, bf16);
        sdpa_backward<T>(sh, dq2.data(), dk2.data(), dv2.data(), nullptr, dcontext.data(), nullptr, w1.data(), q.data(),
                         k.data(), v.data(), nullptr, scale, bf16, drawn);
        if (!(dq1 == dq2 && dk1 == dk2 && dv1 == dv2)) {
            std::printf("FAIL %s %s: the backward on the drawn mask differs\n", where.c_str(), level.c_str());
            ++failures();
        }
    });
}

int main() {
    unsigned seed = 1;
    // (B, H, Tq, S, Dk, Dv): odd sizes; one large enough to split (B H Tq S (Dk + Dv) > 2^17); one
    // whose source length makes several blocks of query rows (sdpa_block_rows)
    const AttendShape small{2, 3, 5, 7, 9, 11}, split{2, 2, 40, 37, 19, 21}, blocks{1, 1, 33, 1100, 5, 3};
    for (bool full_mask : {false, true})
        for (bool causal : {false, true})
            for (bool dropout : {false, true}) test_sdpa(small, full_mask, causal, dropout, true, seed++);
    test_sdpa(small, false, true, true, false, seed++);
    test_sdpa(split, false, true, true, true, seed++);
    test_sdpa(split, true, false, false, false, seed++);
    test_sdpa(blocks, false, false, true, true, seed++);
    test_sdpa(blocks, false, true, false, false, seed++);
    test_scores_and_context(small, seed++);
    test_scores_and_context(split, seed++);
    test_additive(3, 4, 5, 13, seed++);
    test_additive(4, 9, 23, 37, seed++);  // splits across two threads
    test_local_window(3, 5, 17, 4, seed++);
    test_local_window(2, 3, 9, 0, seed++);
    // rows of S % 4 != 0 entries start mid-word of the stream; several blocks of query rows
    for (const AttendShape& sh : {small, split, AttendShape{2, 3, 130, 601, 8, 8}}) {
        test_drawn_keep<float>(sh, false, seed++);
        test_drawn_keep<float>(sh, true, seed++);
        test_drawn_keep<double>(sh, false, seed++);
    }
    return attnx::test::report("test_reference_attention");
}
