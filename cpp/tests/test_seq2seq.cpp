// Fused attention decoders: T single steps equal one fused call, and backward matches central
// differences (double, tiny sizes) for Bahdanau (GRU), Luong (general score, LSTM, local-m),
// Luong (concat score, GRU, local-p) and Show, Attend and Tell (Bahdanau, LSTM, gated context).
#include <functional>
#include <random>
#include <vector>

#include "attnx/seq2seq.hpp"
#include "check.hpp"

using namespace attnx;

// Every cache buffer, with a step mask
struct CacheBuffers : OwnedDecoderCache<double> {
    explicit CacheBuffers(const DecoderConfig& c) : OwnedDecoderCache<double>(c, true) {}
};

struct Problem {
    DecoderConfig cfg;
    // the parameters, in DecoderParams' order
    enum { embeddings, kernel, recurrent_kernel, bias, query_kernel, query_bias, key_kernel, score_vector,
           attentional_kernel, output_kernel, output_bias, position_kernel, position_vector, gate_kernel, gate_bias,
           n_params };
    std::vector<double> w[n_params];
    std::vector<double> enc, h0, c0;
    std::vector<int64_t> ids;
    std::vector<uint8_t> source_mask, target_mask;
    const int vocab = 6;

    explicit Problem(DecoderConfig c) : cfg(c) {
        std::mt19937 gen(7);
        std::uniform_real_distribution<double> u(-0.7, 0.7);
        auto fill = [&](std::vector<double>& v, size_t n) { v.resize(n); for (auto& x : v) x = u(gen); };
        const int G = c.G(), H = c.H, K = c.K;
        fill(w[embeddings], (size_t)vocab * c.E), fill(w[kernel], (size_t)(c.E + c.F()) * G);
        fill(w[recurrent_kernel], (size_t)H * G), fill(w[bias], 2 * (size_t)G), fill(w[query_kernel], (size_t)H * c.U);
        fill(w[query_bias], c.U), fill(w[key_kernel], (size_t)K * c.Dk()), fill(w[score_vector], c.U);
        fill(w[attentional_kernel], (size_t)(K + H) * H), fill(w[output_kernel], (size_t)H * c.V);
        fill(w[output_bias], c.V), fill(w[position_kernel], (size_t)H * c.P), fill(w[position_vector], c.P);
        fill(w[gate_kernel], H), fill(w[gate_bias], 1);
        fill(enc, (size_t)c.B * c.S * K), fill(h0, (size_t)c.B * H), fill(c0, (size_t)c.B * H);
        ids.resize((size_t)c.B * c.T);
        for (size_t i = 0; i < ids.size(); ++i) ids[i] = (int64_t)(i * 5 % vocab);
        source_mask.assign((size_t)c.B * c.S, 1);
        source_mask[(size_t)c.S - 1] = 0;  // row 0 has one padded source position
        target_mask.assign((size_t)c.B * c.T, 1);
        target_mask[(size_t)c.T - 1] = 0;  // row 0's last target step is padding
    }

    template <class P> DecoderParams<P> params(std::vector<double>* b) {
        DecoderParams<P> p;
        auto at = [&](int i) { return b[i].data(); };
        p.embeddings = at(0), p.kernel = at(1), p.recurrent_kernel = at(2), p.bias_in = at(3);
        p.bias_rec = cfg.cell == RNNCell::gru ? at(3) + cfg.G() : nullptr;
        p.query_kernel = at(4), p.query_bias = at(5), p.key_kernel = at(6), p.score_vector = at(7);
        p.attentional_kernel = at(8), p.output_kernel = at(9), p.output_bias = at(10);
        p.position_kernel = at(11), p.position_vector = at(12), p.gate_kernel = at(13), p.gate_bias = at(14);
        return p;
    }
    std::vector<double>* buffers() { return w; }

    // logits of the fused T-step forward
    std::vector<double> forward(CacheBuffers& cb) {
        std::vector<double> logits((size_t)cfg.B * cfg.T * cfg.V), h = h0, c = c0, feed((size_t)cfg.B * cfg.H, 0.0),
            hu((size_t)cfg.B * cfg.G());
        decoder_forward<double>(cfg, logits.data(), h.data(), c.data(), feed.data(), cb.cache,
                                params<const double*>(buffers()), ids.data(), enc.data(), source_mask.data(),
                                target_mask.data(), false, hu.data());
        return logits;
    }
};

static void check_steps_equal_fused(DecoderConfig cfg) {
    Problem p(cfg);
    p.target_mask.assign(p.target_mask.size(), 1);
    CacheBuffers fused(cfg);
    const std::vector<double> logits = p.forward(fused);
    DecoderConfig one = cfg;
    one.T = 1;
    CacheBuffers step(one);
    std::vector<double> h = p.h0, c = p.c0, feed((size_t)cfg.B * cfg.H, 0.0), hu((size_t)cfg.B * cfg.G()),
        step_logits((size_t)cfg.B * cfg.V);
    std::vector<int64_t> ids(cfg.B);
    for (int t = 0; t < cfg.T; ++t) {
        one.first_step = t;
        for (int b = 0; b < cfg.B; ++b) ids[b] = p.ids[(size_t)b * cfg.T + t];
        decoder_forward<double>(one, step_logits.data(), h.data(), c.data(), feed.data(), step.cache,
                                p.params<const double*>(p.buffers()), ids.data(), p.enc.data(), p.source_mask.data(),
                                nullptr, t > 0, hu.data());
        for (int b = 0; b < cfg.B; ++b)
            for (int v = 0; v < cfg.V; ++v)
                CHECK_CLOSE(step_logits[(size_t)b * cfg.V + v], logits[((size_t)b * cfg.T + t) * cfg.V + v], 1e-12);
    }
}

static void check_gradients(DecoderConfig cfg) {
    Problem p(cfg);
    std::mt19937 gen(3);
    std::normal_distribution<double> n01;
    std::vector<double> R((size_t)cfg.B * cfg.T * cfg.V);
    for (auto& r : R) r = n01(gen);
    auto loss = [&]() {
        CacheBuffers cb(cfg);
        const std::vector<double> logits = p.forward(cb);
        double sum = 0;
        for (size_t i = 0; i < R.size(); ++i) sum += logits[i] * R[i];
        return sum;
    };
    CacheBuffers cb(cfg);
    p.forward(cb);
    std::vector<double> grads[Problem::n_params];
    for (int i = 0; i < Problem::n_params; ++i) grads[i].assign(p.buffers()[i].size(), 0.0);
    std::vector<double> denc(p.enc.size()), dh((size_t)cfg.B * cfg.H, 0.0), dc(dh);
    decoder_backward<double>(cfg, denc.data(), dh.data(), dc.data(), p.params<double*>(grads), R.data(), nullptr,
                             cb.cache, p.params<const double*>(p.buffers()), p.enc.data());
    auto numeric = [&](std::vector<double>& v, size_t i) {
        const double old = v[i];
        v[i] = old + 1e-6;
        const double plus = loss();
        v[i] = old - 1e-6;
        const double minus = loss();
        v[i] = old;
        return (plus - minus) / 2e-6;
    };
    for (size_t i = 0; i < p.enc.size(); i += 5) CHECK_CLOSE(denc[i], numeric(p.enc, i), 1e-6);
    for (size_t i = 0; i < p.h0.size(); i += 3) CHECK_CLOSE(dh[i], numeric(p.h0, i), 1e-6);
    const bool used[Problem::n_params] = {true, true, true, true, cfg.score == ScoreKind::additive,
                                          cfg.score == ScoreKind::additive, cfg.score != ScoreKind::dot,
                                          cfg.score == ScoreKind::additive, cfg.kind == DecoderKind::luong, true, true,
                                          cfg.predictive(), cfg.predictive(), cfg.gated, cfg.gated};
    for (int k = 0; k < Problem::n_params; ++k) {
        if (!used[k]) continue;
        std::vector<double>& weight = p.w[k];
        // LSTM has one bias vector (the second half of the buffer is unused)
        const size_t limit = k == Problem::bias && cfg.cell == RNNCell::lstm ? (size_t)cfg.G() : weight.size();
        for (size_t i = 0; i < limit; i += 7) CHECK_CLOSE(grads[k][i], numeric(weight, i), 1e-6);
    }
}

int main() {
    DecoderConfig bahdanau;
    bahdanau.kind = DecoderKind::bahdanau, bahdanau.score = ScoreKind::additive, bahdanau.cell = RNNCell::gru;
    bahdanau.B = 2, bahdanau.T = 3, bahdanau.S = 4, bahdanau.E = 3, bahdanau.K = 5, bahdanau.H = 4;
    bahdanau.U = 3, bahdanau.V = 5;
    DecoderConfig luong = bahdanau;
    luong.kind = DecoderKind::luong, luong.score = ScoreKind::general, luong.cell = RNNCell::lstm;
    luong.local_window = 1;
    DecoderConfig local_p = luong;
    local_p.score = ScoreKind::additive, local_p.cell = RNNCell::gru, local_p.local_window = 2;
    local_p.local_mode = LocalMode::predictive, local_p.P = 3;
    DecoderConfig show_attend_tell = bahdanau;
    show_attend_tell.cell = RNNCell::lstm, show_attend_tell.gated = true;
    for (const DecoderConfig& cfg : {bahdanau, luong, local_p, show_attend_tell}) {
        check_steps_equal_fused(cfg);
        check_gradients(cfg);
    }
    return attnx::test::report("test_seq2seq");
}
