// seq2seq.hpp against cpp/reference/seq2seq.hpp: the fused teacher-forced decoders (Bahdanau with
// the additive score on GRU, gated on LSTM; Luong with general, dot and concat scores, global,
// local-m and local-p) forward and backward, with source and target padding and a gradient into
// the attention weights, on odd sizes, in float on every SIMD level and in double, on one thread
// and split across two. Under mixed_bfloat16 (float only): the step products (step_rows, the query and
// feed products and their transposes) against cpp/reference/bf16.hpp's product at every level, AVX-512
// also on float lanes, and the bf16 decoder's query projections from its own states within float
// tolerance, its results within bf16's of the double reference.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attnx/seq2seq.hpp"
#include "reference/bf16.hpp"
#include "reference/seq2seq.hpp"
#include "bf16_check.hpp"
#include "reference_check.hpp"

using namespace attnx;
using namespace attnx::test;

namespace {

// The parameters in DecoderParams' order
enum { embeddings, kernel, recurrent_kernel, bias_in, bias_rec, query_kernel, query_bias, key_kernel, score_vector,
       attentional_kernel, position_kernel, position_vector, gate_kernel, gate_bias, output_kernel, output_bias, n_params };
const char* const param_names[n_params] = {"embeddings", "kernel", "recurrent_kernel", "bias_in", "bias_rec",
                                           "query_kernel", "query_bias", "key_kernel", "score_vector",
                                           "attentional_kernel", "position_kernel", "position_vector", "gate_kernel",
                                           "gate_bias", "output_kernel", "output_bias"};

template <class P, class Vec> DecoderParams<P> params_of(Vec* v) {
    DecoderParams<P> p;
    P* fields[n_params] = {&p.embeddings, &p.kernel, &p.recurrent_kernel, &p.bias_in, &p.bias_rec, &p.query_kernel,
                           &p.query_bias, &p.key_kernel, &p.score_vector, &p.attentional_kernel, &p.position_kernel,
                           &p.position_vector, &p.gate_kernel, &p.gate_bias, &p.output_kernel, &p.output_bias};
    for (int i = 0; i < n_params; ++i) *fields[i] = v[i].empty() ? nullptr : v[i].data();
    return p;
}

void test_decoder(DecoderConfig cfg, const char* what, unsigned seed) {
    std::mt19937 rng(seed);
    const int B = cfg.B, Tn = cfg.T, S = cfg.S, E = cfg.E, F = cfg.F(), H = cfg.H, K = cfg.K, G = cfg.G(), U = cfg.U;
    const int vocab = 7;
    const bool additive = cfg.score == ScoreKind::additive, luong = cfg.kind == DecoderKind::luong;
    std::vector<double> w[n_params];
    // a matrix of `rows` input rows scaled 1 / sqrt(rows), as initializers do: larger weights make the
    // decoder chaotic over its steps (sharp attention, saturated gates), and float rounding then grows
    // past any tolerance while double still agrees to 1e-10
    auto fill = [&](int i, size_t rows, size_t cols, bool used = true) {
        if (used) w[i] = random_values(rng, rows * cols, 1 / std::sqrt((double)rows));
    };
    fill(embeddings, vocab, E, true), fill(kernel, E + F, G), fill(recurrent_kernel, H, G);
    fill(bias_in, 1, G), fill(bias_rec, 1, G, cfg.cell == RNNCell::gru);
    fill(query_kernel, H, U, additive), fill(query_bias, 1, U, additive), fill(score_vector, U, 1, additive);
    fill(key_kernel, K, cfg.Dk(), cfg.score != ScoreKind::dot);
    fill(attentional_kernel, K + H, H, luong);
    fill(position_kernel, H, cfg.P, cfg.predictive()), fill(position_vector, cfg.P, 1, cfg.predictive());
    fill(gate_kernel, H, 1, cfg.gated), fill(gate_bias, 1, 1, cfg.gated);
    fill(output_kernel, H, cfg.V), fill(output_bias, 1, cfg.V);
    const auto enc = random_values(rng, (size_t)B * S * K), h0 = random_values(rng, (size_t)B * H, 0.5);
    const auto c0 = random_values(rng, (size_t)B * H, 0.5), dlogits = random_values(rng, (size_t)B * Tn * cfg.V);
    const auto dweights = random_values(rng, (size_t)B * Tn * S), dh_last = random_values(rng, (size_t)B * H);
    const auto dc_last = random_values(rng, (size_t)B * H);
    std::vector<int64_t> ids((size_t)B * Tn);
    for (auto& id : ids) id = (int64_t)(rng() % vocab);
    std::vector<uint8_t> source_mask((size_t)B * S, 1), target_mask((size_t)B * Tn, 1);
    for (int b = 1; b < B; ++b) source_mask[(size_t)b * S + S - 1 - b % 2] = 0, target_mask[(size_t)b * Tn + Tn - 1] = 0;

    // the reference
    std::vector<double> logits((size_t)B * Tn * cfg.V), h = h0, c = c0, feed((size_t)B * H, 0.0);
    reference::DecoderTrace trace;
    reference::decoder_forward(cfg, logits.data(), h.data(), c.data(), feed.data(), trace, params_of<const double*>(w),
                               ids.data(), enc.data(), source_mask.data(), target_mask.data());
    std::vector<double> weights;  // (T, B, S) as the cache holds them
    for (const auto& st : trace.steps) weights.insert(weights.end(), st.weights.begin(), st.weights.end());
    std::vector<double> dgrads[n_params], denc(enc.size()), dh = dh_last, dc = dc_last;
    for (int i = 0; i < n_params; ++i) dgrads[i].assign(w[i].size(), 0.0);
    reference::decoder_backward(cfg, denc.data(), dh.data(), dc.data(), params_of<double*>(dgrads), dlogits.data(),
                                dweights.data(), trace, params_of<const double*>(w), ids.data(), enc.data());
    Named want{{"logits", logits}, {"h", h}, {"weights", weights}, {"denc", denc}, {"dh0", dh}};
    if (cfg.cell == RNNCell::lstm) want.insert(want.end(), {{"c", c}, {"dc0", dc}});
    if (luong) want.push_back({"feed", feed});
    for (int i = 0; i < n_params; ++i)
        if (!w[i].empty()) want.push_back({std::string("d") + param_names[i], dgrads[i]});

    char where[160];
    std::snprintf(where, sizeof where, "%s B=%d T=%d S=%d E=%d K=%d H=%d U=%d V=%d", what, B, Tn, S, E, K, H, U, cfg.V);
    check_every_level(where, want, [&](auto tag) {
        using T = decltype(tag);
        std::vector<T> w_[n_params], dw_[n_params];
        for (int i = 0; i < n_params; ++i) w_[i] = cast<T>(w[i]), dw_[i].assign(w[i].size(), T(0));
        const auto enc_ = cast<T>(enc), dlogits_ = cast<T>(dlogits), dweights_ = cast<T>(dweights);
        std::vector<T> logits_(logits.size()), h_ = cast<T>(h0), c_ = cast<T>(c0), feed_((size_t)B * H, T(0)),
            hu((size_t)B * G), denc_(enc.size()), dh_ = cast<T>(dh_last), dc_ = cast<T>(dc_last);
        OwnedDecoderCache<T> cache(cfg, true);
        decoder_forward<T>(cfg, logits_.data(), h_.data(), c_.data(), feed_.data(), cache.cache,
                           params_of<const T*>(w_), ids.data(), enc_.data(), source_mask.data(), target_mask.data(),
                           false, hu.data());
        const std::vector<T> weights_(cache.cache.weights, cache.cache.weights + weights.size());
        decoder_backward<T>(cfg, denc_.data(), dh_.data(), dc_.data(), params_of<T*>(dw_), dlogits_.data(),
                            dweights_.data(), cache.cache, params_of<const T*>(w_), enc_.data());
        Named got{{"logits", to_double(logits_)}, {"h", to_double(h_)}, {"weights", to_double(weights_)},
                  {"denc", to_double(denc_)}, {"dh0", to_double(dh_)}};
        if (cfg.cell == RNNCell::lstm) got.insert(got.end(), {{"c", to_double(c_)}, {"dc0", to_double(dc_)}});
        if (luong) got.push_back({"feed", to_double(feed_)});
        for (int i = 0; i < n_params; ++i)
            if (!w[i].empty()) got.push_back({std::string("d") + param_names[i], to_double(dw_[i])});
        return got;
    });
}

// step_rows on bf16 pairs: out = bias + bf16(left) . bf16(op(W)) (+ out), rows from one to past a tile,
// K odd and even, N past whole panels and vectors, W plain and transposed
void test_step_rows_bf16(unsigned seed) {
    std::mt19937 rng(seed);
    for (int rows : {1, 5, 13})
        for (int K : {9, 34})
            for (int N : {11, 53, 130})
                for (bool transposed : {false, true})
                    for (bool accumulate : {false, true}) {
                        const auto left = random_values(rng, (size_t)rows * K), W = random_values(rng, (size_t)K * N);
                        const auto bias = random_values(rng, N), start = random_values(rng, (size_t)rows * N);
                        std::vector<double> want = start;
                        reference::bf16_gemm(want.data(), left.data(), false, W.data(), false, rows, N, K, accumulate);
                        for (int r = 0; !accumulate && r < rows; ++r)
                            for (int n = 0; n < N; ++n) want[(size_t)r * N + n] += bias[n];
                        char where[120];
                        std::snprintf(where, sizeof where, "step_rows bf16 rows=%d K=%d N=%d%s%s", rows, K, N,
                                      transposed ? " transposed" : "", accumulate ? " accumulate" : " bias");
                        on_every_bf16_path([&](const std::string& level) {
                            const auto left_ = cast<float>(left), W_ = cast<float>(W), bias_ = cast<float>(bias);
                            std::vector<float> out = cast<float>(start);
                            // W^T's layout: (N, K) rows
                            std::vector<float> Wt(W_.size());
                            for (int k = 0; k < K; ++k)
                                for (int n = 0; n < N; ++n) Wt[(size_t)n * K + k] = W_[(size_t)k * N + n];
                            const StepRight<float> right(transposed ? Wt.data() : W_.data(), K, N, transposed, true);
                            step_rows<float>(out.data(), left_.data(), (size_t)K, rows, right,
                                             accumulate ? nullptr : bias_.data(), accumulate);
                            expect_near(out, want, tolerance<float>(), std::string(where) + " " + level);
                        });
                    }
}

void expect_true(bool ok, const std::string& what) {
    if (!ok) std::printf("FAIL %s\n", what.c_str()), ++failures();
}

// Greedy decoding's output layer at one row (screened_output_row, the int8 screen) at every SIMD level (the
// int8 tiles' three) and 1 and 2 threads: on random, tied and near-tied columns (words within far less than
// the bound of each other), every column alike, a non-finite row, a zero row and a column of tiny weights,
// the argmax is dense_row_streamed's float32 one and the reference's (where the double logits do not tie
// within float rounding), the word's logit is float32's bit for bit, every logit within the stated bound e_v
// of float32's (recomputed here in double from the row's quantization); every 16-column chunk recomputed
// equals dense_row_streamed's; the cached screen is kept while W quantizes to it (also after a write that
// keeps every byte of q), made again when it does not.
void test_screened_output_row(unsigned seed) {
    std::mt19937 rng(seed);
    for (int H : {9, 34, 256})
        for (int V : {37, 530, 1203})
            for (int variant = 0; variant < 6; ++variant) {
                auto W = random_values(rng, (size_t)H * V, 1 / std::sqrt((double)H));
                auto x = random_values(rng, H, 0.5), b = random_values(rng, V, 0.1);
                if (variant == 1)  // an exact tie of the best at 3 and 7, a near tie at 11
                    for (int k = 0; k < H; ++k) {
                        W[(size_t)k * V + 7] = W[(size_t)k * V + 3];
                        W[(size_t)k * V + 11] = (double)(float)(W[(size_t)k * V + 3] * (1 + 0x1p-12));
                        b[3] = b[7] = b[11] = 8.0;
                    }
                if (variant == 2)  // every column alike: every chunk is recomputed
                    for (int k = 0; k < H; ++k)
                        for (int v = 0; v < V; ++v) W[(size_t)k * V + v] = W[(size_t)k * V], b[v] = b[0];
                if (variant == 3) x[H / 2] = std::nan("");
                if (variant == 4) std::fill(x.begin(), x.end(), 0.0);  // sx = 0: l~ = b exactly
                if (variant == 5)  // a column of tiny weights with the best bias, two columns a bound apart
                    for (int k = 0; k < H; ++k) {
                        W[(size_t)k * V + 5] = 0x1p-70 * (k + 1);
                        W[(size_t)k * V + 9] = W[(size_t)k * V + 4] + (k % 2 ? 1e-4 : -1e-4);
                        b[5] = 0.2, b[4] = b[9] = 0.5;
                    }
                const int64_t want = reference::output_word(x.data(), W.data(), b.data(), H, V);
                char where[120];
                std::snprintf(where, sizeof where, "screened_output_row H=%d V=%d variant %d", H, V, variant);
                on_every_level_and_split([&](const std::string& level) {
                    const std::string at = std::string(where) + " " + level;
                    const auto W_ = cast<float>(W), x_ = cast<float>(x), b_ = cast<float>(b);
                    std::vector<float> exact((size_t)V), got((size_t)V), chunk((size_t)V);
                    dense_row_streamed<float>(exact.data(), x_.data(), W_.data(), b_.data(), H, V);
                    for (int v0 = 0; v0 < V; v0 += 16)
                        output_columns_as_streamed(chunk.data(), x_.data(), W_.data(), b_.data(), H, V, v0,
                                                   std::min(V, v0 + 16));
                    expect_true(std::memcmp(chunk.data(), exact.data(), exact.size() * sizeof(float)) == 0,
                                at + ": the recomputed chunks are dense_row_streamed's bit for bit");
                    const auto screen = output_screen(W_.data(), H, V);
                    screened_output_row(got.data(), x_.data(), W_.data(), b_.data(), *screen);
                    const size_t best = row_argmax(exact.data(), (size_t)V);
                    expect_true(row_argmax(got.data(), (size_t)V) == best, at + ": float32's argmax");
                    expect_true(std::memcmp(&got[best], &exact[best], sizeof(float)) == 0, at + ": the word's logit");
                    if (variant == 3) {
                        expect_true(std::memcmp(got.data(), exact.data(), exact.size() * sizeof(float)) == 0,
                                    at + ": a NaN row is float32 throughout");
                        return;
                    }
                    if (variant == 1) expect_true(best == 3 || best == 11, at + ": the tie to the lowest id");
                    if (variant == 2) expect_true(best == 0, at + ": all tied: the first word");
                    std::vector<double> second(exact.begin(), exact.end());
                    std::sort(second.begin(), second.end(), std::greater<double>());
                    if (V > 1 && second[0] - second[1] > 1e-5 * (1 + std::abs(second[0])))
                        expect_true((int64_t)best == want, at + ": the reference's word");
                    // e_v from the row's quantization, as OutputScreen states it
                    std::vector<int8_t> qx((size_t)round_up(H, 4));
                    float sx;
                    quantize_rows(qx.data(), qx.size(), &sx, x_.data(), (size_t)H, 1, H, (int)qx.size());
                    double q1 = 0, q2 = 0, r2 = 0, x2 = 0;
                    for (int k = 0; k < H; ++k) {
                        const double r = (double)x_[k] - (double)sx * qx[k];
                        q1 += std::abs(qx[k]), q2 += (double)qx[k] * qx[k], r2 += r * r, x2 += (double)x_[k] * x_[k];
                    }
                    const double u = 0x1p-24, gamma = (H + 2) * u;
                    for (int v = 0; v < V; ++v) {
                        double squares = 0;
                        for (int k = 0; k < H; ++k) squares += std::pow((double)screen->q[(size_t)k * V + v], 2);
                        const double s_v = screen->scale[v];
                        const double N_v = s_v * (std::sqrt(squares) + 0.50004 * std::sqrt((double)H));
                        const double e = 1.01 * (0.50004 * sx * q1 * s_v +
                                                 (std::sqrt(r2) + gamma * std::sqrt(x2) + 4 * u * sx * std::sqrt(q2)) * N_v +
                                                 (gamma + u) * std::abs((double)b_[v]) + 0x1p-22 * std::abs((double)got[v])) +
                                         0x1p-100;
                        if (!(std::abs((double)got[v] - exact[v]) <= e)) {
                            expect_true(false, at + ": logit " + std::to_string(v) + " within the bound");
                            break;
                        }
                    }
                    if (variant == 5 && H == 256) {  // the tiny column is recomputed (its bound makes it a candidate)
                        expect_true(std::memcmp(&got[5], &exact[5], sizeof(float)) == 0, at + ": the tiny column");
                        expect_true(screen->scale[5] == 1.0f, at + ": a tiny column's scale");
                    }
                    // the cache: kept while W quantizes to the screen, made again once it does not
                    expect_true(output_screen(W_.data(), H, V) == screen, at + ": the screen kept");
                    auto changed = W_;
                    changed[(size_t)(H - 1) * V + V - 1] += 1.0f;
                    expect_true(output_screen(changed.data(), H, V) != screen, at + ": another array's screen");
                    auto in_place = W_;
                    const auto first = output_screen(in_place.data(), H, V);
                    // a write that keeps every q (the smallest step towards zero of a value far from a rounding
                    // boundary): the screen stays right, and is kept
                    size_t quiet = 0;
                    for (size_t i = 0; i < in_place.size(); ++i) {
                        const double y = (double)in_place[i] * first->inverse[i % V];
                        if (std::abs(y - std::nearbyint(y)) < 0.25 && std::abs(y) > 1) {
                            quiet = i;
                            break;
                        }
                    }
                    in_place[quiet] = std::nextafter(in_place[quiet], 0.0f);
                    expect_true(output_screen(in_place.data(), H, V) == first, at + ": a write keeping q keeps it");
                    in_place[(size_t)(H / 2) * V + V / 2] *= 3.0f;
                    const auto again = output_screen(in_place.data(), H, V);
                    expect_true(again != first && again->current(in_place.data()) && !first->current(in_place.data()),
                                at + ": a write into the array makes the screen again");
                    in_place[(size_t)(H / 3) * V + V / 3] = std::nanf("");
                    const auto with_nan = output_screen(in_place.data(), H, V);
                    expect_true(with_nan != again && !with_nan->finite, at + ": a NaN weight makes it again");
                });
            }
}

// The decoder under mixed_bfloat16 (cfg.bf16): every step's additive query projection is
// bf16(s_{t-1}) . bf16(W_q) + b_q of the kernel's own states (float tolerance: the rounding points are
// the reference's); logits, states and gradients within bf16's tolerance of the double reference
// (where float32 and double states straddle a rounding boundary their trajectories round apart, as
// test_reference_rnn_bf16 explains)
void test_decoder_bf16(DecoderConfig cfg, const char* what, unsigned seed) {
    constexpr double kBf16Tolerance = 3e-2;
    std::mt19937 rng(seed);
    const int B = cfg.B, Tn = cfg.T, S = cfg.S, E = cfg.E, F = cfg.F(), H = cfg.H, K = cfg.K, G = cfg.G(), U = cfg.U;
    const int vocab = 7;
    std::vector<double> w[n_params];
    auto fill = [&](int i, size_t rows, size_t cols) { w[i] = random_values(rng, rows * cols, 1 / std::sqrt((double)rows)); };
    fill(embeddings, vocab, E), fill(kernel, E + F, G), fill(recurrent_kernel, H, G), fill(bias_in, 1, G);
    fill(bias_rec, 1, G), fill(query_kernel, H, U), fill(query_bias, 1, U), fill(score_vector, U, 1);
    fill(key_kernel, K, U), fill(output_kernel, H, cfg.V), fill(output_bias, 1, cfg.V);
    const auto enc = random_values(rng, (size_t)B * S * K), h0 = random_values(rng, (size_t)B * H, 0.5);
    const auto dlogits = random_values(rng, (size_t)B * Tn * cfg.V);
    std::vector<int64_t> ids((size_t)B * Tn);
    for (auto& id : ids) id = (int64_t)(rng() % vocab);
    std::vector<uint8_t> source_mask((size_t)B * S, 1);
    for (int b = 1; b < B; ++b) source_mask[(size_t)b * S + S - 1 - b % 2] = 0;

    std::vector<double> logits((size_t)B * Tn * cfg.V), h = h0, c((size_t)B * H), feed((size_t)B * H);
    reference::DecoderTrace trace;
    reference::decoder_forward(cfg, logits.data(), h.data(), c.data(), feed.data(), trace, params_of<const double*>(w),
                               ids.data(), enc.data(), source_mask.data(), nullptr);
    std::vector<double> dgrads[n_params], denc(enc.size()), dh((size_t)B * H, 0.0), dc((size_t)B * H, 0.0);
    for (int i = 0; i < n_params; ++i) dgrads[i].assign(w[i].size(), 0.0);
    reference::decoder_backward(cfg, denc.data(), dh.data(), dc.data(), params_of<double*>(dgrads), dlogits.data(),
                                nullptr, trace, params_of<const double*>(w), ids.data(), enc.data());
    Named want{{"logits", logits}, {"h", h}, {"denc", denc}, {"dh0", dh}};
    for (int i = 0; i < n_params; ++i)
        if (!w[i].empty()) want.push_back({std::string("d") + param_names[i], dgrads[i]});

    cfg.bf16 = true;
    char where[160];
    std::snprintf(where, sizeof where, "%s bf16 B=%d T=%d S=%d E=%d K=%d H=%d U=%d V=%d", what, B, Tn, S, E, K, H, U,
                  cfg.V);
    on_every_bf16_path([&](const std::string& level) {
        std::vector<float> w_[n_params], dw_[n_params];
        for (int i = 0; i < n_params; ++i) w_[i] = cast<float>(w[i]), dw_[i].assign(w[i].size(), 0.0f);
        const auto enc_ = cast<float>(enc), dlogits_ = cast<float>(dlogits);
        std::vector<float> logits_(logits.size()), h_ = cast<float>(h0), hu((size_t)B * G), denc_(enc.size());
        std::vector<float> dh_((size_t)B * H, 0.0f), dc_((size_t)B * H, 0.0f);
        OwnedDecoderCache<float> cache(cfg, true);
        decoder_forward<float>(cfg, logits_.data(), h_.data(), nullptr, nullptr, cache.cache, params_of<const float*>(w_),
                               ids.data(), enc_.data(), source_mask.data(), nullptr, false, hu.data());
        // pq_t = bf16(s_{t-1}) . bf16(W_q) + b_q from the kernel's own s_{t-1}
        const std::vector<double> h_prev(cache.cache.h_prev, cache.cache.h_prev + (size_t)Tn * B * H);
        std::vector<double> pq((size_t)Tn * B * U);
        reference::bf16_gemm(pq.data(), h_prev.data(), false, w[query_kernel].data(), false, Tn * B, U, H, false);
        for (size_t i = 0; i < pq.size(); ++i) pq[i] += w[query_bias][i % U];
        expect_near(std::vector<float>(cache.cache.query_proj, cache.cache.query_proj + pq.size()), pq,
                    tolerance<float>(), std::string(where) + " query_proj " + level);
        decoder_backward<float>(cfg, denc_.data(), dh_.data(), dc_.data(), params_of<float*>(dw_), dlogits_.data(),
                                nullptr, cache.cache, params_of<const float*>(w_), enc_.data());
        Named got{{"logits", to_double(logits_)}, {"h", to_double(h_)}, {"denc", to_double(denc_)},
                  {"dh0", to_double(dh_)}};
        for (int i = 0; i < n_params; ++i)
            if (!w[i].empty()) got.push_back({std::string("d") + param_names[i], to_double(dw_[i])});
        compare_all(got, want, kBf16Tolerance, std::string(where) + " " + level);
    });
}

}  // namespace

int main() {
    unsigned seed = 1;
    DecoderConfig bahdanau;
    bahdanau.kind = DecoderKind::bahdanau, bahdanau.score = ScoreKind::additive, bahdanau.cell = RNNCell::gru;
    bahdanau.B = 3, bahdanau.T = 4, bahdanau.S = 5, bahdanau.E = 3, bahdanau.K = 7, bahdanau.H = 9;
    bahdanau.U = 5, bahdanau.V = 11;
    test_decoder(bahdanau, "Bahdanau GRU", seed++);
    DecoderConfig gated = bahdanau;
    gated.cell = RNNCell::lstm, gated.gated = true;
    test_decoder(gated, "Bahdanau LSTM gated", seed++);
    DecoderConfig general = bahdanau;
    general.kind = DecoderKind::luong, general.score = ScoreKind::general, general.cell = RNNCell::lstm;
    test_decoder(general, "Luong general LSTM", seed++);
    DecoderConfig dot = general;
    dot.score = ScoreKind::dot, dot.cell = RNNCell::gru, dot.K = dot.H;
    test_decoder(dot, "Luong dot GRU", seed++);
    DecoderConfig local_m = general;
    local_m.local_window = 1;
    test_decoder(local_m, "Luong local-m", seed++);
    DecoderConfig local_p = general;
    local_p.score = ScoreKind::additive, local_p.cell = RNNCell::gru, local_p.local_window = 2;
    local_p.local_mode = LocalMode::predictive, local_p.P = 3;
    test_decoder(local_p, "Luong local-p concat", seed++);
    // large enough that the time loop's rows split across two threads
    DecoderConfig big = bahdanau;
    big.B = 16, big.T = 6, big.S = 13, big.E = 17, big.K = 33, big.H = 40, big.U = 21, big.V = 29;
    test_decoder(big, "Bahdanau GRU (split)", seed++);
    DecoderConfig big_luong = general;
    big_luong.B = 16, big_luong.T = 6, big_luong.S = 13, big_luong.E = 17, big_luong.K = 33, big_luong.H = 40, big_luong.V = 29;
    test_decoder(big_luong, "Luong general LSTM (split)", seed++);
    test_step_rows_bf16(seed++);
    test_decoder_bf16(bahdanau, "Bahdanau GRU", seed++);
    test_decoder_bf16(big, "Bahdanau GRU (split)", seed++);
    test_screened_output_row(seed++);
    return attnx::test::report("test_reference_seq2seq");
}
