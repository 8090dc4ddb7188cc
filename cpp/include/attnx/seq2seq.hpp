// Attention decoders for sequence-to-sequence translation, fused over all target steps for
// teacher-forced training (forward and backward), with the same code serving one inference step.
//
// Both decoders read target ids y (B, T) (y_{t-1}, the previous word, at step t), encoder outputs
// enc (B, S, K) with a source mask, and an initial state from the encoder. Per step t:
//
//   Bahdanau (TensorFlow NMT tutorial):           Luong (global, or local-m with a window D):
//     a_t = softmax(score(s_{t-1}, enc))            h_t = RNN([emb(y_{t-1}); h~_{t-1}], h_{t-1})
//     c_t = a_t . enc                               a_t = softmax(score(h_t, enc)), c_t = a_t . enc
//     s_t = RNN([emb(y_{t-1}); c_t], s_{t-1})       h~_t = tanh([c_t; h_t] . W_c)     (input feeding)
//     out_t = s_t                                   out_t = h~_t
//   logits = out . W_out + b_out: one (B*T, H) x (H, V) GEMM after the loop.
//
// Scores: additive v . tanh(q W_q + b_q + enc W_k) (Bahdanau; Luong's "concat"), general
// q . (enc W_k), dot q . enc. The decoder's input x_t = [emb_t; feed_t] is split in two: the
// embedding half of x . W + b is one GEMM over all steps before the loop, the feed half (c_t or
// h~_{t-1}) one small GEMM per step. The recurrence is rnn.hpp's (the T = 1 case of
// rnn_forward_rows / rnn_backward_rows), scores and softmax + context are attention.hpp's.
//
// Per-step caches are time-major (T, B, ...) so that each step's slice is the contiguous (B, 1, ...)
// block the T = 1 kernels expect; dU, dW and dW_out are single GEMMs over all steps after the loop.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnx/attention.hpp"
#include "attnx/dense.hpp"
#include "attnx/embedding.hpp"
#include "attnx/gemm.hpp"
#include "attnx/rnn.hpp"

namespace attnx {

enum class DecoderKind { bahdanau, luong };
enum class ScoreKind { additive, general, dot };  // Luong's "concat" is the additive score

struct DecoderConfig {
    DecoderKind kind = DecoderKind::bahdanau;
    ScoreKind score = ScoreKind::additive;
    RNNCell cell = RNNCell::gru;  // gru (reset_after) or lstm
    int B = 0, T = 0, S = 0;      // batch, target steps, source steps
    int E = 0, K = 0, H = 0;      // target embedding, encoder output, decoder state sizes
    int U = 0, V = 0;             // additive score units, target vocabulary
    int local_window = -1;        // Luong local-m: attend to |s - t| <= D with a Gaussian (-1: global)
    int first_step = 0;           // target position of step 0 (local-m's p_t when decoding step by step)

    int F() const { return kind == DecoderKind::bahdanau ? K : H; }  // feed: c_t or h~_{t-1}
    int G() const { return (cell == RNNCell::lstm ? 4 : 3) * H; }
    int Dk() const { return score == ScoreKind::additive ? U : score == ScoreKind::general ? H : K; }
    bool local() const { return kind == DecoderKind::luong && local_window >= 0; }
    // one step of the recurrence, as rnn.hpp runs it
    RNNConfig rnn_step() const {
        RNNConfig r;
        r.cell = cell, r.B = B, r.T = 1, r.C = E + F(), r.H = H;
        return r;
    }
};

// Parameters (P = const T*) or their gradients (P = T*). Null when the variant has none.
template <class P> struct DecoderParams {
    P embeddings = nullptr;          // (Vt, E)
    P kernel = nullptr;              // (E + F, G): rows [0, E) read emb(y_{t-1}), rows [E, E + F) the feed
    P recurrent_kernel = nullptr;    // (H, G)
    P bias_in = nullptr;             // (G,)
    P bias_rec = nullptr;            // (G,) GRU's recurrent bias (reset_after)
    P query_kernel = nullptr;        // additive: (H, U)
    P query_bias = nullptr;          // additive: (U,)
    P key_kernel = nullptr;          // additive: (K, U); general: (K, H)
    P score_vector = nullptr;        // additive: (U,)
    P attentional_kernel = nullptr;  // Luong: (K + H, H) = W_c
    P output_kernel = nullptr;       // (H, V)
    P output_bias = nullptr;         // (V,)
};

// Everything backward needs (and the attention weights users plot). Time-major unless noted.
template <class T> struct DecoderCache {
    int64_t* ids = nullptr;      // (T, B) target input ids
    uint8_t* step_mask = nullptr;  // (T, B) target mask, null = all real
    T* keys = nullptr;           // (B, S, Dk): enc W_k (additive, general); null for dot (keys = enc)
    T* emb = nullptr;            // (T, B, E) emb(y_{t-1})
    T* feed = nullptr;           // (T, B, F) c_t (Bahdanau) or h~_{t-1} (Luong)
    T* gates = nullptr;          // (T, B, G) RNNCache fields, one (B, 1, .) block per step
    T* h_prev = nullptr;         // (T, B, H)
    T* c_prev = nullptr;         // (T, B, H) LSTM
    T* aux = nullptr;            // (T, B, H)
    T* states = nullptr;         // (T, B, H) RNN outputs h_t (s_t)
    T* query_proj = nullptr;     // (T, B, U) additive: q W_q + b_q
    T* score_hidden = nullptr;   // (T, B, S, U) additive: tanh(q W_q + b_q + enc W_k)
    T* weights = nullptr;        // (T, B, S) attention weights a_t
    T* context = nullptr;        // (T, B, K) Luong's c_t (Bahdanau's is the feed)
    T* concat = nullptr;         // (T, B, K + H) Luong [c_t; h_t]
    uint8_t* window = nullptr;   // (T, B, S) local-m: positions inside the window
    T* gauss = nullptr;          // (T, B, S) local-m: Gaussian factor
    T* out = nullptr;            // (B, T, H) batch-major: what the output projection reads

    RNNCache<T> rnn_at(const DecoderConfig& cfg, int t) const {
        const size_t bh = (size_t)t * cfg.B * cfg.H;
        RNNCache<T> c;
        c.gates = gates + (size_t)t * cfg.B * cfg.G();
        c.h_prev = h_prev + bh;
        c.c_prev = c_prev ? c_prev + bh : nullptr;
        c.aux = aux + bh;
        return c;
    }
    const T* query_at(const DecoderConfig& cfg, int t) const {  // Bahdanau: s_{t-1}; Luong: h_t
        return (cfg.kind == DecoderKind::bahdanau ? h_prev : states) + (size_t)t * cfg.B * cfg.H;
    }
    const T* keys_or_enc(const T* enc) const { return keys ? keys : enc; }
};

// ------------------------------------------------------------------------------ attention step
// a_t = masked_softmax(score(q_t, enc)) and c_t = a_t . enc for all B rows of step t (Tq = 1).
template <class T>
void attend_step_forward(const DecoderConfig& cfg, const DecoderParams<const T*>& w, const DecoderCache<T>& cache,
                         int t, const T* query, const T* enc, const uint8_t* source_mask, T* context) {
    const int B = cfg.B, S = cfg.S, U = cfg.U;
    const size_t bs = (size_t)t * B * S;
    T* scores = cache.weights + bs;  // scores, turned into weights in place
    if (cfg.score == ScoreKind::additive) {
        T* pq = cache.query_proj + (size_t)t * B * U;
        // pq = q W_q + b_q;  scores[b, s] = v . tanh(pq[b] + keys[b, s])
        dense_forward<T>(pq, query, w.query_kernel, w.query_bias, B, cfg.H, U);
        additive_scores_forward<T>(scores, cache.score_hidden + bs * U, pq, cache.keys, w.score_vector, B, 1, S, U);
    } else {
        // scores[b, s] = q[b] . keys[b, s]  (keys = enc W_k for general, enc for dot)
        dot_scores_forward<T>(scores, query, cache.keys_or_enc(enc), B, 1, 1, S, cfg.Dk(), T(1));
    }
    AttendMask mask;
    mask.data = source_mask;
    mask.stride_b = (size_t)S;
    const T* keep = nullptr;
    if (cfg.local()) {
        // local-m: aligned position p_t = t (clipped to the source), Gaussian window of half-width D
        std::vector<T> p((size_t)B, T(std::min(cfg.first_step + t, S - 1)));
        local_window_forward<T>(cache.window + bs, cache.gauss + bs, p.data(), source_mask, B, 1, S, cfg.local_window);
        mask.data = cache.window + bs;
        keep = cache.gauss + bs;
    }
    softmax_context_forward<T>(context, scores, enc, mask, keep, B, 1, 1, S, cfg.K);
}

// Workspace of the backward pass, allocated once per call (never inside the time loop).
template <class T> struct AttendGradWork {
    std::vector<T> dscores, denc_step, dquery_step, dkeys_step;
    AttendGradWork(const DecoderConfig& cfg)
        : dscores((size_t)cfg.B * cfg.S), denc_step((size_t)cfg.B * cfg.S * cfg.K),
          dquery_step((size_t)cfg.B * std::max(cfg.Dk(), cfg.U)), dkeys_step((size_t)cfg.B * cfg.S * cfg.Dk()) {}
};

// Backward of attend_step_forward. Accumulates: dquery (B, H), denc (B, S, K), dkeys (B, S, Dk),
// dw.score_vector; dquery_proj (B, U) (additive) is overwritten, for dW_q after the loop.
template <class T>
void attend_step_backward(const DecoderConfig& cfg, const DecoderParams<const T*>& w, const DecoderParams<T*>& dw,
                          const DecoderCache<T>& cache, int t, const T* query, const T* enc, const T* dcontext,
                          T* dquery, T* denc, T* dkeys, T* dquery_proj, AttendGradWork<T>& work) {
    const int B = cfg.B, S = cfg.S, U = cfg.U, K = cfg.K, Dk = cfg.Dk();
    const size_t bs = (size_t)t * B * S;
    const T* keep = cfg.local() ? cache.gauss + bs : nullptr;
    softmax_context_backward<T>(work.dscores.data(), work.denc_step.data(), (T*)nullptr, dcontext, (const T*)nullptr,
                                cache.weights + bs, enc, keep, B, 1, 1, S, K);
    // denc += a_t^T . dc_t (per row b)
    for (size_t i = 0; i < work.denc_step.size(); ++i) denc[i] += work.denc_step[i];
    if (cfg.score == ScoreKind::additive) {
        additive_scores_backward<T>(dquery_proj, work.dkeys_step.data(), dw.score_vector, work.dscores.data(),
                                    cache.score_hidden + bs * U, w.score_vector, B, 1, S, U);
        // dq += d(pq) . W_q^T
        matmul<T>(dquery, dquery_proj, w.query_kernel, B, cfg.H, U, false, true, T(1));
    } else {
        dot_scores_backward<T>(work.dquery_step.data(), work.dkeys_step.data(), (T*)nullptr, work.dscores.data(), query,
                               cache.keys_or_enc(enc), B, 1, 1, S, Dk, T(1));
        for (size_t i = 0; i < (size_t)B * cfg.H; ++i) dquery[i] += work.dquery_step[i];
    }
    // the keys' gradient: into dkeys (projected keys) or straight into denc (dot: keys = enc)
    T* dk_total = cfg.score == ScoreKind::dot ? denc : dkeys;
    for (size_t i = 0; i < work.dkeys_step.size(); ++i) dk_total[i] += work.dkeys_step[i];
}

// (T, B, C) <-> (B, T, C) copies around the batch-major output projection
template <class T> void time_to_batch_major(T* dst, const T* src, int Tn, int B, int C) {
    for (int t = 0; t < Tn; ++t)
        for (int b = 0; b < B; ++b) {
            const T* row = src + ((size_t)t * B + b) * C;
            std::copy(row, row + C, dst + ((size_t)b * Tn + t) * C);
        }
}
template <class T> void batch_to_time_major(T* dst, const T* src, int Tn, int B, int C) {
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < Tn; ++t) {
            const T* row = src + ((size_t)b * Tn + t) * C;
            std::copy(row, row + C, dst + ((size_t)t * B + b) * C);
        }
}

// ------------------------------------------------------------------------------------- forward
// Teacher-forced decoder over T steps (T = 1: one inference step).
//   ids (B, T) target inputs; enc (B, S, K); source_mask (B, S) and target_mask (B, T) nonzero =
//   real (null: all real). h, c (B, H): in the initial state, out the final one (c: LSTM only).
//   feed (B, F), Luong only: in h~ of the previous step (zeros at the start), out h~ of the last.
//   keys_ready: cache.keys already holds enc W_k (decoding steps reuse it).
//   logits (B, T, V) written. hu (B, G) is workspace.
template <class T>
void decoder_forward(const DecoderConfig& cfg, T* logits, T* h, T* c, T* feed, const DecoderCache<T>& cache,
                     const DecoderParams<const T*>& w, const int64_t* ids, const T* enc, const uint8_t* source_mask,
                     const uint8_t* target_mask, bool keys_ready, T* hu) {
    const int B = cfg.B, Tn = cfg.T, E = cfg.E, F = cfg.F(), H = cfg.H, K = cfg.K, G = cfg.G();
    const RNNConfig rc = cfg.rnn_step();
    // keys = enc W_k, once for all steps
    if (cache.keys && !keys_ready)
        dense_forward<T>(cache.keys, enc, w.key_kernel, (const T*)nullptr, B * cfg.S, K, cfg.Dk());
    // time-major ids and step mask, then emb[t, b] = embeddings[y[b, t]]
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < Tn; ++t) {
            cache.ids[(size_t)t * B + b] = ids[(size_t)b * Tn + t];
            if (cache.step_mask) cache.step_mask[(size_t)t * B + b] = target_mask ? target_mask[(size_t)b * Tn + t] : 1;
        }
    embedding_forward<T>(cache.emb, cache.ids, w.embeddings, (size_t)Tn * B, (size_t)E);
    // gates[t] = emb_t W_e + b_in for all steps in one GEMM; the feed half joins per step
    dense_forward<T>(cache.gates, cache.emb, w.kernel, w.bias_in, Tn * B, E, G);
    const T* W_feed = w.kernel + (size_t)E * G;
    const size_t BH = (size_t)B * H;
    for (int t = 0; t < Tn; ++t) {
        T* feed_t = cache.feed + (size_t)t * B * F;
        T* states_t = cache.states + (size_t)t * BH;
        const uint8_t* mask_t = cache.step_mask ? cache.step_mask + (size_t)t * B : nullptr;
        if (cfg.kind == DecoderKind::bahdanau) {
            // c_t from s_{t-1} (the state entering the step) is the feed
            attend_step_forward<T>(cfg, w, cache, t, h, enc, source_mask, feed_t);
        } else {
            std::copy(feed, feed + BH, feed_t);  // h~_{t-1}
        }
        // gates[t] += feed_t W_f; then the recurrence of one step (h, c updated in place)
        matmul<T>(cache.gates + (size_t)t * B * G, feed_t, W_feed, B, G, F, false, false, T(1));
        const RNNCache<T> rnn_t = cache.rnn_at(cfg, t);
        for_batch_rows(rc, [&](int b0, int b1) {
            rnn_forward_rows<T>(rc, b0, b1, states_t, h, c, rnn_t, w.recurrent_kernel, w.bias_rec, mask_t,
                                (const T*)nullptr, hu);
        });
        if (cfg.kind == DecoderKind::luong) {
            T* ctx_t = cache.context + (size_t)t * B * K;
            attend_step_forward<T>(cfg, w, cache, t, states_t, enc, source_mask, ctx_t);
            // h~_t = tanh([c_t; h_t] W_c), the next step's feed
            T* cat = cache.concat + (size_t)t * B * (K + H);
            for (int b = 0; b < B; ++b) {
                std::copy(ctx_t + (size_t)b * K, ctx_t + (size_t)(b + 1) * K, cat + (size_t)b * (K + H));
                std::copy(states_t + (size_t)b * H, states_t + (size_t)(b + 1) * H, cat + (size_t)b * (K + H) + K);
            }
            matmul<T>(feed, cat, w.attentional_kernel, B, H, K + H);
            for (size_t i = 0; i < BH; ++i) feed[i] = std::tanh(feed[i]);
            for (int b = 0; b < B; ++b)  // out_t = h~_t, batch-major
                std::copy(feed + (size_t)b * H, feed + (size_t)(b + 1) * H, cache.out + ((size_t)b * Tn + t) * H);
        }
    }
    if (cfg.kind == DecoderKind::bahdanau) time_to_batch_major(cache.out, cache.states, Tn, B, H);
    // logits = out W_out + b_out: one GEMM over all B * T rows
    dense_forward<T>(logits, cache.out, w.output_kernel, w.output_bias, B * Tn, H, cfg.V);
}

// ------------------------------------------------------------------------------------ backward
// Backward of decoder_forward with the caches of a training pass.
//   dlogits (B, T, V); dh, dc (B, H): in the gradient of the final state (zeros if unused), out that
//   of the initial state. denc (B, S, K) overwritten. Parameter gradients in dw accumulate.
template <class T>
void decoder_backward(const DecoderConfig& cfg, T* denc, T* dh, T* dc, const DecoderParams<T*>& dw,
                      const T* dlogits, const DecoderCache<T>& cache, const DecoderParams<const T*>& w, const T* enc) {
    const int B = cfg.B, Tn = cfg.T, E = cfg.E, F = cfg.F(), H = cfg.H, K = cfg.K, G = cfg.G(), U = cfg.U;
    const int S = cfg.S, Dk = cfg.Dk();
    const size_t BH = (size_t)B * H, TB = (size_t)Tn * B;
    const RNNConfig rc = cfg.rnn_step();
    const bool luong = cfg.kind == DecoderKind::luong, additive = cfg.score == ScoreKind::additive;
    const T* W_feed = w.kernel + (size_t)E * G;

    // d out = dlogits W_out^T; dW_out += out^T dlogits; db_out += sum dlogits (one GEMM each)
    std::vector<T> dout_bm(TB * H), dout(TB * H);
    dense_backward<T>(dout_bm.data(), dw.output_kernel, dw.output_bias, dlogits, cache.out, w.output_kernel, (int)TB, H,
                      cfg.V);
    batch_to_time_major(dout.data(), dout_bm.data(), Tn, B, H);

    std::fill(denc, denc + (size_t)B * S * K, T(0));
    std::vector<T> dgates(TB * G), dhu_gru(cfg.cell == RNNCell::gru ? TB * G : 0), dhrec(BH), dfeed((size_t)B * F),
        dkeys((size_t)B * S * Dk, T(0));
    std::vector<T> dquery_proj(additive ? TB * U : 0), dstate(BH), dpre(luong ? TB * H : 0), dcat((size_t)B * (K + H)),
        dcontext((size_t)B * K);
    std::vector<T> dfeed_next(luong ? BH : 0, T(0));  // Luong: d h~_t arriving from step t + 1's input
    // d(h U + b_rec): its own buffer for GRU (the candidate's r * (.) splits it from dgates), else dgates
    T* dhu = cfg.cell == RNNCell::gru ? dhu_gru.data() : dgates.data();
    AttendGradWork<T> work(cfg);

    for (int t = Tn - 1; t >= 0; --t) {
        T* dg_t = dgates.data() + (size_t)t * B * G;
        T* dhu_t = dhu + (size_t)t * B * G;
        const uint8_t* mask_t = cache.step_mask ? cache.step_mask + (size_t)t * B : nullptr;
        T* dqp_t = additive ? dquery_proj.data() + (size_t)t * B * U : nullptr;
        const T* dy_t = dout.data() + (size_t)t * BH;
        // one step of rnn.hpp's BPTT (the decoder's cells are tanh / sigmoid): dh, dc from h_t to h_{t-1}
        const RNNCache<T> rnn_t = cache.rnn_at(cfg, t);
        auto rnn_step_backward = [&](const T* d_out) {
            for_batch_rows(rc, [&](int b0, int b1) {
                rnn_backward_rows<T>(rc, TanhSigmoidSlopes<T>{}, b0, b1, dh, dc, dg_t, dhu_t, dhrec.data(), d_out,
                                     rnn_t, w.recurrent_kernel, mask_t, (const T*)nullptr);
            });
        };
        if (!luong) {
            // s_t's gradient enters the recurrence; then d c_t = dgates_t W_f^T reaches s_{t-1} via attention
            rnn_step_backward(dy_t);
            matmul<T>(dfeed.data(), dg_t, W_feed, B, F, G, false, true);
            attend_step_backward<T>(cfg, w, dw, cache, t, cache.query_at(cfg, t), enc, dfeed.data(), dh, denc,
                                    dkeys.data(), dqp_t, work);
        } else {
            // d h~_t = d out_t + (from step t + 1's input); d pre = d h~_t (1 - h~_t^2)
            T* dpre_t = dpre.data() + (size_t)t * BH;
            const T* ht = cache.out;  // batch-major h~
            for (int b = 0; b < B; ++b)
                for (int j = 0; j < H; ++j) {
                    const size_t i = (size_t)b * H + j;
                    const T a = ht[((size_t)b * Tn + t) * H + j];
                    dpre_t[i] = (dy_t[i] + dfeed_next[i]) * (T(1) - a * a);
                }
            // d[c_t; h_t] = d pre W_c^T
            matmul<T>(dcat.data(), dpre_t, w.attentional_kernel, B, K + H, H, false, true);
            for (int b = 0; b < B; ++b) {
                const T* row = dcat.data() + (size_t)b * (K + H);
                std::copy(row, row + K, dcontext.data() + (size_t)b * K);
                std::copy(row + K, row + K + H, dstate.data() + (size_t)b * H);
            }
            // h_t's gradient: from h~_t and from its score as the query
            attend_step_backward<T>(cfg, w, dw, cache, t, cache.query_at(cfg, t), enc, dcontext.data(), dstate.data(),
                                    denc, dkeys.data(), dqp_t, work);
            rnn_step_backward(dstate.data());
            // d h~_{t-1} = dgates_t W_f^T (h~_{-1} is the given initial feed)
            matmul<T>(dfeed_next.data(), dg_t, W_feed, B, F, G, false, true);
        }
    }
    // after the loop, one GEMM each over all T * B rows:
    // dW_e += emb^T dgates, db_in += sum dgates, d emb = dgates W_e^T -> dembeddings by id
    std::vector<T> demb(TB * E);
    dense_backward<T>(demb.data(), dw.kernel, dw.bias_in, dgates.data(), cache.emb, w.kernel, (int)TB, E, G);
    embedding_backward<T>(dw.embeddings, demb.data(), cache.ids, TB, (size_t)E);
    // dW_f += feed^T dgates
    matmul<T>(dw.kernel + (size_t)E * G, cache.feed, dgates.data(), F, G, (int)TB, true, false, T(1));
    // dU += h_prev^T dhu, db_rec += sum dhu
    dense_backward<T>((T*)nullptr, dw.recurrent_kernel, dw.bias_rec, dhu, cache.h_prev, w.recurrent_kernel,
                      (int)TB, H, G);
    if (luong) {
        // dW_c += [c; h]^T d pre
        matmul<T>(dw.attentional_kernel, cache.concat, dpre.data(), K + H, H, (int)TB, true, false, T(1));
    }
    if (additive) {
        // dW_q += q^T d pq, db_q += sum d pq (q: s_{t-1} or h_t of every step)
        const T* queries = luong ? cache.states : cache.h_prev;
        dense_backward<T>((T*)nullptr, dw.query_kernel, dw.query_bias, dquery_proj.data(), queries, w.query_kernel,
                          (int)TB, H, U);
    }
    if (cfg.score != ScoreKind::dot) {
        // keys = enc W_k: dW_k += enc^T dkeys, denc += dkeys W_k^T
        dense_backward<T>((T*)nullptr, dw.key_kernel, (T*)nullptr, dkeys.data(), enc, w.key_kernel, B * S, K, Dk);
        matmul<T>(denc, dkeys.data(), w.key_kernel, B * S, K, Dk, false, true, T(1));
    }
}

}  // namespace attnx
