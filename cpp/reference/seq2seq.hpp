// Reference attention decoders (Bahdanau; Luong global, local-m and local-p; Show, Attend and
// Tell's gated context): what seq2seq.hpp's fused, time-major, thread-split decoder computes, as
// the other references composed one target step at a time for the whole batch, in double:
// embedding.hpp, rnn.hpp (the T = 1 recurrence), attention.hpp (scores, masked softmax + context,
// local window), dense.hpp (projections). Per step t, with emb_t = embeddings[y_{t-1}]:
//   Bahdanau:  a_t = softmax(score(s_{t-1}, enc)), c_t = a_t . enc, feed = c_t (gated: beta_t c_t,
//              beta_t = sigmoid(s_{t-1} . w_beta + b_beta)), s_t = RNN([emb_t; feed], s_{t-1}), out_t = s_t
//   Luong:     h_t = RNN([emb_t; h~_{t-1}], h_{t-1}), a_t = softmax(score(h_t, enc)) (local: times
//              the window's Gaussian), c_t = a_t . enc, h~_t = tanh([c_t; h_t] W_c), out_t = h~_t
//   logits = out W_out + b_out
// Scores: additive v . tanh(q W_q + b_q + enc W_k), general q . (enc W_k), dot q . enc. (Hard
// attention, seq2seq.hpp's cfg.hard, has no reference here.)
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attnx/seq2seq.hpp"  // DecoderConfig, DecoderParams
#include "reference/attention.hpp"
#include "reference/dense.hpp"
#include "reference/embedding.hpp"
#include "reference/rnn.hpp"

namespace attnx::reference {

// One step's values, kept for the backward pass
struct DecoderStep {
    std::vector<double> emb, query, x, states, pq, hidden, scores, weights, context, feed, gate, concat, htilde;
    std::vector<double> p, pos_hidden, gauss;
    std::vector<uint8_t> window, step_mask;
    RNNCache rnn;
};

struct DecoderTrace {
    std::vector<double> keys, out;  // keys (B, S, Dk); out (B, T, H)
    std::vector<DecoderStep> steps;
};

inline RNNConfig decoder_rnn(const DecoderConfig& cfg) {
    RNNConfig r = cfg.rnn_step();
    r.split_batch = false;
    return r;
}

// a_t and c_t for query q (B, H) at step t (fills st.pq, hidden, scores, weights, context, p, window, gauss)
inline void decoder_attend(const DecoderConfig& cfg, const DecoderParams<const double*>& w, DecoderTrace& tr,
                           DecoderStep& st, int t, const double* q, const double* enc, const uint8_t* source_mask) {
    const int B = cfg.B, S = cfg.S, U = cfg.U, H = cfg.H, K = cfg.K, Dk = cfg.Dk();
    st.scores.assign((size_t)B * S, 0), st.weights.assign((size_t)B * S, 0), st.context.assign((size_t)B * K, 0);
    if (cfg.score == ScoreKind::additive) {
        // pq = q W_q + b_q;  scores = v . tanh(pq + keys)
        st.pq.assign((size_t)B * U, 0), st.hidden.assign((size_t)B * S * U, 0);
        std::vector<double> z(st.pq.size());
        dense_forward(st.pq.data(), z.data(), q, w.query_kernel, w.query_bias, B, H, U, Activation::linear);
        additive_scores_forward(st.scores.data(), st.hidden.data(), st.pq.data(), tr.keys.data(), w.score_vector, B, 1, S, U);
    } else {
        // scores = q . keys  (keys = enc W_k, or enc for dot)
        dot_scores_forward(AttendShape{B, 1, 1, S, Dk, 0}, st.scores.data(), q,
                           cfg.score == ScoreKind::dot ? enc : tr.keys.data(), 1.0);
    }
    AttendMask mask{source_mask, (size_t)S, 0, false};
    const double* keep = nullptr;
    if (cfg.local()) {
        st.p.assign(B, 0), st.window.assign((size_t)B * S, 0), st.gauss.assign((size_t)B * S, 0);
        if (cfg.predictive()) {
            // p_t = L_b sigmoid(v_p . tanh(q W_p)),  L_b the row's real source length
            const int P = cfg.P;
            st.pos_hidden.assign((size_t)B * P, 0);
            std::vector<double> z(st.pos_hidden.size());
            dense_forward(st.pos_hidden.data(), z.data(), q, w.position_kernel, nullptr, B, H, P, Activation::tanh);
            for (int b = 0; b < B; ++b) {
                double a = 0;
                for (int u = 0; u < P; ++u) a += w.position_vector[u] * st.pos_hidden[(size_t)b * P + u];
                const double L = source_mask ? std::count(source_mask + (size_t)b * S, source_mask + (size_t)(b + 1) * S, 1) : S;
                st.p[b] = L * act(Activation::sigmoid, a);
            }
        } else {
            // local-m: p_t = t, clipped to the source
            std::fill(st.p.begin(), st.p.end(), (double)std::min(cfg.first_step + t, S - 1));
        }
        local_window_forward(st.window.data(), st.gauss.data(), st.p.data(), source_mask, B, 1, S, cfg.local_window);
        mask.data = st.window.data();
        keep = st.gauss.data();
    }
    softmax_context_forward(AttendShape{B, 1, 1, S, 0, K}, st.context.data(), st.weights.data(), st.scores.data(), enc,
                            mask, keep);
}

// logits (B, T, V); h, c (B, H) initial state in, final out (c: LSTM); feed (B, H) Luong's h~ in and out.
// ids (B, T); enc (B, S, K); source_mask (B, S), target_mask (B, T) or null.
inline void decoder_forward(const DecoderConfig& cfg, double* logits, double* h, double* c, double* feed,
                            DecoderTrace& tr, const DecoderParams<const double*>& w, const int64_t* ids,
                            const double* enc, const uint8_t* source_mask, const uint8_t* target_mask) {
    const int B = cfg.B, Tn = cfg.T, S = cfg.S, E = cfg.E, F = cfg.F(), H = cfg.H, K = cfg.K;
    const bool luong = cfg.kind == DecoderKind::luong;
    const RNNConfig rc = decoder_rnn(cfg);
    // keys = enc W_k
    if (cfg.score != ScoreKind::dot) {
        tr.keys.assign((size_t)B * S * cfg.Dk(), 0);
        std::vector<double> z(tr.keys.size());
        dense_forward(tr.keys.data(), z.data(), enc, w.key_kernel, nullptr, B * S, K, cfg.Dk(), Activation::linear);
    }
    tr.out.assign((size_t)B * Tn * H, 0);
    tr.steps.assign(Tn, DecoderStep{});
    std::vector<double> ignored_c((size_t)B * H, 0);
    for (int t = 0; t < Tn; ++t) {
        DecoderStep& st = tr.steps[t];
        st.emb.assign((size_t)B * E, 0), st.step_mask.assign(B, 1), st.states.assign((size_t)B * H, 0);
        std::vector<int64_t> ids_t(B);
        for (int b = 0; b < B; ++b) {
            ids_t[b] = ids[(size_t)b * Tn + t];
            if (target_mask) st.step_mask[b] = target_mask[(size_t)b * Tn + t];
        }
        embedding_forward(st.emb.data(), ids_t.data(), w.embeddings, B, E);
        st.query.assign(h, h + (size_t)B * H);  // s_{t-1} (Bahdanau's query)
        if (!luong) {
            decoder_attend(cfg, w, tr, st, t, st.query.data(), enc, source_mask);
            st.feed = st.context;
            if (cfg.gated) {
                // beta_t = sigmoid(s_{t-1} . w_beta + b_beta);  feed = beta_t c_t
                st.gate.assign(B, 0);
                for (int b = 0; b < B; ++b) {
                    double z = w.gate_bias[0];
                    for (int j = 0; j < H; ++j) z += h[(size_t)b * H + j] * w.gate_kernel[j];
                    st.gate[b] = act(Activation::sigmoid, z);
                    for (int k = 0; k < K; ++k) st.feed[(size_t)b * K + k] = st.gate[b] * st.context[(size_t)b * K + k];
                }
            }
        } else {
            st.feed.assign(feed, feed + (size_t)B * H);  // h~_{t-1}
        }
        // s_t = RNN([emb_t; feed], s_{t-1})
        st.x.assign((size_t)B * (E + F), 0);
        for (int b = 0; b < B; ++b) {
            std::copy_n(&st.emb[(size_t)b * E], E, &st.x[(size_t)b * (E + F)]);
            std::copy_n(&st.feed[(size_t)b * F], F, &st.x[(size_t)b * (E + F) + E]);
        }
        rnn_forward(rc, st.states.data(), h, cfg.cell == RNNCell::lstm ? c : ignored_c.data(), st.rnn, st.x.data(),
                    w.kernel, w.recurrent_kernel, w.bias_in, cfg.cell == RNNCell::gru ? w.bias_rec : nullptr,
                    st.step_mask.data(), nullptr);
        const double* out_t = st.states.data();
        if (luong) {
            decoder_attend(cfg, w, tr, st, t, st.states.data(), enc, source_mask);
            // h~_t = tanh([c_t; h_t] W_c)
            st.concat.assign((size_t)B * (K + H), 0), st.htilde.assign((size_t)B * H, 0);
            for (int b = 0; b < B; ++b) {
                std::copy_n(&st.context[(size_t)b * K], K, &st.concat[(size_t)b * (K + H)]);
                std::copy_n(&st.states[(size_t)b * H], H, &st.concat[(size_t)b * (K + H) + K]);
            }
            std::vector<double> z(st.htilde.size());
            dense_forward(st.htilde.data(), z.data(), st.concat.data(), w.attentional_kernel, nullptr, B, K + H, H,
                          Activation::tanh);
            std::copy(st.htilde.begin(), st.htilde.end(), feed);
            out_t = st.htilde.data();
        }
        for (int b = 0; b < B; ++b) std::copy_n(out_t + (size_t)b * H, H, &tr.out[((size_t)b * Tn + t) * H]);
    }
    std::vector<double> z((size_t)B * Tn * cfg.V);
    dense_forward(logits, z.data(), tr.out.data(), w.output_kernel, w.output_bias, B * Tn, H, cfg.V, Activation::linear);
}

// Backward of decoder_attend: dq (B, H) and denc, dkeys accumulate, with parameter gradients
// dcontext (B, K); dweights_t (B, S) or null
inline void decoder_attend_backward(const DecoderConfig& cfg, const DecoderParams<double*>& dw,
                                    const DecoderParams<const double*>& w, const DecoderTrace& tr, const DecoderStep& st,
                                    const double* q, const double* enc, const double* dcontext, const double* dweights_t,
                                    double* dq, double* denc, double* dkeys) {
    const int B = cfg.B, S = cfg.S, U = cfg.U, H = cfg.H, K = cfg.K, Dk = cfg.Dk();
    std::vector<double> dscores((size_t)B * S), dvalue((size_t)B * S * K), dkeep((size_t)B * S), dq_part((size_t)B * H);
    // c = sum_s a keep enc;  a = masked_softmax(scores)
    softmax_context_backward(AttendShape{B, 1, 1, S, 0, K}, dscores.data(), dvalue.data(),
                             cfg.predictive() ? dkeep.data() : nullptr, dcontext, dweights_t, st.weights.data(), enc,
                             cfg.local() ? st.gauss.data() : nullptr);
    for (size_t i = 0; i < dvalue.size(); ++i) denc[i] += dvalue[i];
    if (cfg.predictive()) {
        // keep = gauss(p);  p = L sigmoid(v_p . hid);  hid = tanh(q W_p)
        const int P = cfg.P;
        std::vector<double> dp(B), dhid((size_t)B * P);
        local_window_backward(dp.data(), dkeep.data(), st.gauss.data(), st.p.data(), B, 1, S, cfg.local_window);
        for (int b = 0; b < B; ++b) {
            double a = 0;
            for (int u = 0; u < P; ++u) a += w.position_vector[u] * st.pos_hidden[(size_t)b * P + u];
            const double sig = act(Activation::sigmoid, a), L = st.p[b] / sig;
            const double da = dp[b] * L * sig * (1 - sig);
            for (int u = 0; u < P; ++u) {
                const double hid = st.pos_hidden[(size_t)b * P + u];
                dw.position_vector[u] += da * hid;
                dhid[(size_t)b * P + u] = da * w.position_vector[u] * (1 - hid * hid);
            }
        }
        dense_backward(dq_part.data(), dw.position_kernel, nullptr, dhid.data(), q, w.position_kernel, B, H, P);
        for (size_t i = 0; i < dq_part.size(); ++i) dq[i] += dq_part[i];
    }
    if (cfg.score == ScoreKind::additive) {
        // scores = v . tanh(pq + keys);  pq = q W_q + b_q
        std::vector<double> dpq((size_t)B * U), dpk((size_t)B * S * U);
        additive_scores_backward(dpq.data(), dpk.data(), dw.score_vector, dscores.data(), st.hidden.data(),
                                 w.score_vector, B, 1, S, U);
        for (size_t i = 0; i < dpk.size(); ++i) dkeys[i] += dpk[i];
        dense_backward(dq_part.data(), dw.query_kernel, dw.query_bias, dpq.data(), q, w.query_kernel, B, H, U);
    } else {
        // scores = q . keys
        std::vector<double> dk((size_t)B * S * Dk);
        dot_scores_backward(AttendShape{B, 1, 1, S, Dk, 0}, dq_part.data(), dk.data(), nullptr, dscores.data(), q,
                            cfg.score == ScoreKind::dot ? enc : tr.keys.data(), 1.0);
        double* to = cfg.score == ScoreKind::dot ? denc : dkeys;
        for (size_t i = 0; i < dk.size(); ++i) to[i] += dk[i];
    }
    for (size_t i = 0; i < dq_part.size(); ++i) dq[i] += dq_part[i];
}

// Backward of decoder_forward: dlogits (B, T, V); dweights (B, T, S) or null; dh, dc (B, H) in the
// gradient of the final state, out that of the initial one; denc overwritten; dw accumulates.
inline void decoder_backward(const DecoderConfig& cfg, double* denc, double* dh, double* dc,
                             const DecoderParams<double*>& dw, const double* dlogits, const double* dweights,
                             const DecoderTrace& tr, const DecoderParams<const double*>& w, const int64_t* ids,
                             const double* enc) {
    const int B = cfg.B, Tn = cfg.T, S = cfg.S, E = cfg.E, F = cfg.F(), H = cfg.H, K = cfg.K;
    const bool luong = cfg.kind == DecoderKind::luong;
    const RNNConfig rc = decoder_rnn(cfg);
    // logits = out W_out + b_out
    std::vector<double> dout((size_t)B * Tn * H);
    dense_backward(dout.data(), dw.output_kernel, dw.output_bias, dlogits, tr.out.data(), w.output_kernel, B * Tn, H, cfg.V);
    std::fill(denc, denc + (size_t)B * S * K, 0.0);
    std::vector<double> dkeys(tr.keys.size(), 0), dfeed_next((size_t)B * H, 0), dx((size_t)B * (E + F));
    std::vector<double> ignored_dc((size_t)B * H, 0), dweights_t((size_t)B * S);
    for (int t = Tn - 1; t >= 0; --t) {
        const DecoderStep& st = tr.steps[t];
        std::vector<double> dout_t((size_t)B * H), dctx((size_t)B * K, 0), dstates((size_t)B * H, 0);
        for (int b = 0; b < B; ++b) {
            std::copy_n(&dout[((size_t)b * Tn + t) * H], H, &dout_t[(size_t)b * H]);
            if (dweights) std::copy_n(dweights + ((size_t)b * Tn + t) * S, S, &dweights_t[(size_t)b * S]);
        }
        if (luong) {
            // h~_t = tanh([c_t; h_t] W_c), read by out_t and by the next step's input
            std::vector<double> dpre((size_t)B * H), dconcat((size_t)B * (K + H));
            for (size_t i = 0; i < dpre.size(); ++i)
                dpre[i] = (dout_t[i] + dfeed_next[i]) * (1 - st.htilde[i] * st.htilde[i]);
            dense_backward(dconcat.data(), dw.attentional_kernel, nullptr, dpre.data(), st.concat.data(),
                           w.attentional_kernel, B, K + H, H);
            for (int b = 0; b < B; ++b) {
                std::copy_n(&dconcat[(size_t)b * (K + H)], K, &dctx[(size_t)b * K]);
                std::copy_n(&dconcat[(size_t)b * (K + H) + K], H, &dstates[(size_t)b * H]);
            }
            decoder_attend_backward(cfg, dw, w, tr, st, st.states.data(), enc, dctx.data(),
                                    dweights ? dweights_t.data() : nullptr, dstates.data(), denc, dkeys.data());
        } else {
            dstates = dout_t;
        }
        // s_t = RNN(x_t, s_{t-1}),  x_t = [emb_t; feed]
        rnn_backward(rc, dx.data(), dw.kernel, dw.recurrent_kernel, dw.bias_in,
                     cfg.cell == RNNCell::gru ? dw.bias_rec : nullptr, dh, cfg.cell == RNNCell::lstm ? dc : ignored_dc.data(),
                     dstates.data(), st.rnn, st.x.data(), w.kernel, w.recurrent_kernel, st.step_mask.data(), nullptr);
        // emb_t = embeddings[y]
        std::vector<int64_t> ids_t(B);
        std::vector<double> demb((size_t)B * E), dfeed((size_t)B * F);
        for (int b = 0; b < B; ++b) {
            ids_t[b] = ids[(size_t)b * Tn + t];
            std::copy_n(&dx[(size_t)b * (E + F)], E, &demb[(size_t)b * E]);
            std::copy_n(&dx[(size_t)b * (E + F) + E], F, &dfeed[(size_t)b * F]);
        }
        embedding_backward(dw.embeddings, demb.data(), ids_t.data(), B, E);
        if (luong) {
            dfeed_next = dfeed;  // into h~_{t-1}
            continue;
        }
        // Bahdanau: feed = c_t (gated: beta c_t, beta = sigmoid(s_{t-1} . w_beta + b_beta)); the query is s_{t-1}
        dctx = dfeed;
        if (cfg.gated)
            for (int b = 0; b < B; ++b) {
                double dbeta = 0;
                for (int k = 0; k < K; ++k) {
                    dbeta += dfeed[(size_t)b * K + k] * st.context[(size_t)b * K + k];
                    dctx[(size_t)b * K + k] = st.gate[b] * dfeed[(size_t)b * K + k];
                }
                const double dz = dbeta * st.gate[b] * (1 - st.gate[b]);
                dw.gate_bias[0] += dz;
                for (int j = 0; j < H; ++j) {
                    dw.gate_kernel[j] += dz * st.query[(size_t)b * H + j];
                    dh[(size_t)b * H + j] += dz * w.gate_kernel[j];
                }
            }
        decoder_attend_backward(cfg, dw, w, tr, st, st.query.data(), enc, dctx.data(),
                                dweights ? dweights_t.data() : nullptr, dh, denc, dkeys.data());
    }
    // keys = enc W_k
    if (cfg.score != ScoreKind::dot) {
        std::vector<double> denc_part((size_t)B * S * K);
        dense_backward(denc_part.data(), dw.key_kernel, nullptr, dkeys.data(), enc, w.key_kernel, B * S, K, cfg.Dk());
        for (size_t i = 0; i < denc_part.size(); ++i) denc[i] += denc_part[i];
    }
}

// The word greedy decoding picks from one row x (H,): argmax_v (b_v + sum_k x_k W[k, v]) for W (H, V),
// b (V,), ties to the lowest id (seq2seq.hpp's screened_output_row keeps its float32 argmax)
inline int64_t output_word(const double* x, const double* W, const double* b, int H, int V) {
    int64_t best = 0;
    double top = 0.0;
    for (int v = 0; v < V; ++v) {
        double l = b[v];
        for (int k = 0; k < H; ++k) l += x[k] * W[(size_t)k * V + v];
        if (v == 0 || l > top) top = l, best = v;
    }
    return best;
}

}  // namespace attnx::reference
