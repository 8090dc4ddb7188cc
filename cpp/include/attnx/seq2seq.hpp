// Attention decoders for sequence-to-sequence translation, fused over all target steps for
// teacher-forced training (forward and backward), with the same code serving one inference step.
//
// Both decoders read target ids y (B, T) (y_{t-1}, the previous word, at step t), encoder outputs
// enc (B, S, K) with a source mask, and an initial state from the encoder. Per step t:
//
//   Bahdanau (TensorFlow NMT tutorial):           Luong (global, or local with a window D):
//     a_t = softmax(score(s_{t-1}, enc))            h_t = RNN([emb(y_{t-1}); h~_{t-1}], h_{t-1})
//     c_t = a_t . enc                               a_t = softmax(score(h_t, enc)), c_t = a_t . enc
//     s_t = RNN([emb(y_{t-1}); c_t], s_{t-1})       h~_t = tanh([c_t; h_t] . W_c)     (input feeding)
//     out_t = s_t                                   out_t = h~_t
//   logits = out . W_out + b_out: one (B*T, H) x (H, V) GEMM after the loop (a decoding loop's
//   one-step calls: rows split across threads on the output layer packed once, DecoderPanels).
//
// Scores: additive v . tanh(q W_q + b_q + enc W_k) (Bahdanau; Luong's "concat"), general
// q . (enc W_k), dot q . enc. The decoder's input x_t = [emb_t; feed_t] is split in two: the
// embedding half of x . W + b is one GEMM over all steps before the loop, the feed half (c_t or
// h~_{t-1}) one small product per step on W_f packed once per call. The recurrence is rnn.hpp's
// (the T = 1 case of rnn_forward_rows / rnn_backward_packed_rows), scores and softmax + context are
// attention.hpp's.
// Luong's local attention keeps |s - p_t| <= D with the Gaussian exp(-(s - p_t)^2 / (2 (D/2)^2))
// (attention.hpp's local window): local-m p_t = t, local-p p_t = L sigmoid(v_p . tanh(h_t W_p)),
// L the row's real source length, with the gradient through p_t.
//
// Show, Attend and Tell (Xu et al. 2015) is the Bahdanau decoder over image regions with two options:
//   gated: the feed is beta_t c_t with the scalar gate beta_t = sigmoid(s_{t-1} . w_beta + b_beta);
//   hard:  c_t = enc[s_t], one region s_t drawn from a_t (inverse CDF of given uniforms) or its
//          argmax; no gradient reaches the scores through c_t: REINFORCE's arrives as dweights.
// decoder_backward also takes dweights, a gradient of the attention weights a_t themselves (the
// doubly stochastic regularization, REINFORCE), added to the scores' gradient.
//
// Batch rows never interact inside the time loop, so one thread runs every step of its rows
// (single-threaded BLAS, no synchronization per step) while the products over all steps use the
// whole thread budget.
//
// Per-step caches are time-major (T, B, ...) so that each step's slice is the contiguous (B, 1, ...)
// block the T = 1 kernels expect; dU, dW and dW_out are single GEMMs over all steps after the loop.
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "attnx/attention.hpp"
#include "attnx/bf16.hpp"
#include "attnx/dense.hpp"
#include "attnx/embedding.hpp"
#include "attnx/gemm.hpp"
#include "attnx/loss.hpp"
#include "attnx/packed.hpp"
#include "attnx/quantized.hpp"
#include "attnx/rnn.hpp"
#include "attnx/rnn_bf16.hpp"

namespace attnx {

enum class DecoderKind { bahdanau, luong };
enum class ScoreKind { additive, general, dot };  // Luong's "concat" is the additive score
enum class LocalMode { monotonic, predictive };   // Luong's local-m (p_t = t) and local-p (p_t predicted)

struct DecoderConfig {
    DecoderKind kind = DecoderKind::bahdanau;
    ScoreKind score = ScoreKind::additive;
    RNNCell cell = RNNCell::gru;  // gru (reset_after) or lstm
    int B = 0, T = 0, S = 0;      // batch, target steps, source steps
    int E = 0, K = 0, H = 0;      // target embedding, encoder output, decoder state sizes
    int U = 0, V = 0;             // additive score units, target vocabulary
    int local_window = -1;        // Luong local: attend to |s - p_t| <= D with a Gaussian (-1: global)
    LocalMode local_mode = LocalMode::monotonic;
    int P = 0;                    // local-p: hidden size of the position predictor
    int first_step = 0;           // target position of step 0 (local-m's p_t when decoding step by step)
    bool gated = false;           // Bahdanau: feed = beta_t c_t (Show, Attend and Tell's gating scalar)
    bool hard = false;            // Bahdanau: c_t = enc[s_t], one region per step
    bool sample = false;          // hard: s_t drawn with cache.uniforms (else the argmax of a_t)
    bool bf16 = false;            // mixed_bfloat16: the products over all steps on bf16 operands (sequence_dense_*)

    int F() const { return kind == DecoderKind::bahdanau ? K : H; }  // feed: c_t or h~_{t-1}
    int G() const { return (cell == RNNCell::lstm ? 4 : 3) * H; }
    int Dk() const { return score == ScoreKind::additive ? U : score == ScoreKind::general ? H : K; }
    bool local() const { return kind == DecoderKind::luong && local_window >= 0; }
    bool predictive() const { return local() && local_mode == LocalMode::predictive; }
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
    P position_kernel = nullptr;     // local-p: (H, P) = W_p
    P position_vector = nullptr;     // local-p: (P,) = v_p
    P gate_kernel = nullptr;         // gated: (H,) = w_beta
    P gate_bias = nullptr;           // gated: (1,) = b_beta
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
    T* context = nullptr;        // (T, B, K) Luong's c_t; gated Bahdanau's c_t before the gate
    T* gate = nullptr;           // (T, B) gated: beta_t
    int64_t* positions = nullptr;  // (T, B) hard: the region s_t (-1: a fully masked row attends nowhere)
    T* uniforms = nullptr;       // (T, B) hard sampling: s_t = the first s with a_t[0..s] summing past it
    T* concat = nullptr;         // (T, B, K + H) Luong [c_t; h_t]
    uint8_t* window = nullptr;   // (T, B, S) local: positions inside the window
    T* gauss = nullptr;          // (T, B, S) local: Gaussian factor
    T* position = nullptr;       // (T, B) local: the window's centre p_t
    T* position_hidden = nullptr;  // (T, B, P) local-p: tanh(h_t W_p)
    T* source_length = nullptr;  // (B,) local-p: real source tokens L_b
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

// The cache buffers a configuration uses, each from alloc(name, shape, tag) with tag a value of the
// element type; the others stay null. One layout for the bindings' NumPy arrays and owned buffers.
template <class T, class Alloc>
DecoderCache<T> decoder_cache_layout(const DecoderConfig& cfg, bool has_step_mask, Alloc&& alloc) {
    const size_t B = cfg.B, Tn = cfg.T, S = cfg.S, H = cfg.H, K = cfg.K, U = cfg.U;
    const bool luong = cfg.kind == DecoderKind::luong, additive = cfg.score == ScoreKind::additive;
    DecoderCache<T> c;
    c.ids = alloc("ids", std::vector<size_t>{Tn, B}, int64_t{});
    if (has_step_mask) c.step_mask = alloc("step_mask", std::vector<size_t>{Tn, B}, uint8_t{});
    if (cfg.score != ScoreKind::dot) c.keys = alloc("keys", std::vector<size_t>{B, S, (size_t)cfg.Dk()}, T{});
    c.emb = alloc("emb", std::vector<size_t>{Tn, B, (size_t)cfg.E}, T{});
    c.feed = alloc("feed", std::vector<size_t>{Tn, B, (size_t)cfg.F()}, T{});
    c.gates = alloc("gates", std::vector<size_t>{Tn, B, (size_t)cfg.G()}, T{});
    c.h_prev = alloc("h_prev", std::vector<size_t>{Tn, B, H}, T{});
    if (cfg.cell == RNNCell::lstm) c.c_prev = alloc("c_prev", std::vector<size_t>{Tn, B, H}, T{});
    c.aux = alloc("aux", std::vector<size_t>{Tn, B, H}, T{});
    c.states = alloc("states", std::vector<size_t>{Tn, B, H}, T{});
    if (additive) {
        c.query_proj = alloc("query_proj", std::vector<size_t>{Tn, B, U}, T{});
        c.score_hidden = alloc("score_hidden", std::vector<size_t>{Tn, B, S, U}, T{});
    }
    c.weights = alloc("weights", std::vector<size_t>{Tn, B, S}, T{});
    if (luong || cfg.gated) c.context = alloc("context", std::vector<size_t>{Tn, B, K}, T{});
    if (luong) c.concat = alloc("concat", std::vector<size_t>{Tn, B, K + H}, T{});
    if (cfg.gated) c.gate = alloc("gate", std::vector<size_t>{Tn, B}, T{});
    if (cfg.hard) c.positions = alloc("positions", std::vector<size_t>{Tn, B}, int64_t{});
    if (cfg.hard && cfg.sample) c.uniforms = alloc("uniforms", std::vector<size_t>{Tn, B}, T{});
    if (cfg.local()) {
        c.window = alloc("window", std::vector<size_t>{Tn, B, S}, uint8_t{});
        c.gauss = alloc("gauss", std::vector<size_t>{Tn, B, S}, T{});
        c.position = alloc("position", std::vector<size_t>{Tn, B}, T{});
    }
    if (cfg.predictive()) {
        c.position_hidden = alloc("position_hidden", std::vector<size_t>{Tn, B, (size_t)cfg.P}, T{});
        c.source_length = alloc("source_length", std::vector<size_t>{B}, T{});
    }
    c.out = alloc("out", std::vector<size_t>{B, Tn, H}, T{});
    return c;
}

// Every buffer a DecoderCache of `cfg` points to, owned (decoding loops, C++ tests).
template <class T> struct OwnedDecoderCache {
    std::vector<std::vector<char>> storage;  // moving a buffer keeps its address
    DecoderCache<T> cache;
    OwnedDecoderCache(const DecoderConfig& cfg, bool has_step_mask) {
        cache = decoder_cache_layout<T>(cfg, has_step_mask, [&](const char*, std::vector<size_t> shape, auto tag) {
            size_t n = 1;
            for (size_t d : shape) n *= d;
            storage.emplace_back(n * sizeof(tag));
            return reinterpret_cast<decltype(tag)*>(storage.back().data());
        });
    }
};

// A weight the decoder's steps multiply a few rows by (the feed half of the input kernel, the additive
// score's query kernel, their transposes in the backward steps), packed once per call for the register
// tiles (BLAS would repack it at every step), and under mixed_bfloat16 (bf16: float only) those panels'
// rows paired as bf16 (bf16.hpp's pair_panels) for the vdpbf16ps step tiles: a step pairs its left rows.
template <class T> struct StepRight {
    PackedRight<T> packed;
    Panels<uint32_t> pairs;  // empty: float32 products
    // W (K, N), or with `transposed` W^T of W (N, K)
    StepRight(const T* W, int K, int N, bool transposed, bool bf16) : packed(W, K, N, transposed) {
        if constexpr (std::is_same_v<T, float>)
            if (bf16) pair_panels(pairs, packed.panels.data(), K, N, packed.Q * tile_lanes<T>(), tile_lanes<T>());
    }
};

// out[r, n] = bias[n] + sum_k left[r, k] W[k, n] (+ out[r, n] when accumulate) for `rows` rows of left,
// lda apart; bias may be null. bf16 pairs: bf16(left) . bf16(W), sums in float32.
template <class T>
void step_rows(T* out, const T* left, size_t lda, int rows, const StepRight<T>& W, const T* bias, bool accumulate) {
    if constexpr (std::is_same_v<T, float>)
        if (!W.pairs.empty()) {
            const int K2 = (W.packed.K + 1) / 2, N = W.packed.N;
            const uint32_t* a = bf16_step_left(left, lda, rows, W.packed.K);
            const bool native = bf16_tiles().native;
            on_widest_lanes<float>([&](auto lanes) __attribute__((always_inline)) {
                using V = decltype(lanes);
                constexpr int L = Lanes<V>::W;
                auto run = [&](auto vectors) __attribute__((always_inline)) {
                    constexpr int Q = decltype(vectors)::value;
                    bf16_panels_product<V, Q>(
                        native, 0, rows, a, bf16_step_stride(K2), K2, packed_panels(W.pairs.data(), K2, N, Q * L, L), 0, N,
                        [&](int r, auto pre, int p) __attribute__((always_inline)) {
                            for (int q = 0; q < pre.count && (p * Q + q) * L < N; ++q) {
                                const int n0 = (p * Q + q) * L, m = std::min(L, N - n0);
                                if (bias) pre.q[q] += vload<V>(bias + n0, m);
                                if (accumulate) pre.q[q] += vload<V>(out + (size_t)r * N + n0, m);
                                vstore(out + (size_t)r * N + n0, pre.q[q], m);
                            }
                        });
                };
                if (W.packed.Q == 1) run(std::integral_constant<int, 1>{});
                else if (W.packed.Q == 2) run(std::integral_constant<int, 2>{});
                else run(std::integral_constant<int, 3>{});
            });
            return;
        }
    packed_rows<T>(out, LeftRows<T>{left, lda, W.packed.K, nullptr, 0, 0}, rows, W.packed, bias, false, accumulate);
}

// ------------------------------------------------------------------ greedy decoding's output layer, one row
// Greedy decoding reads of each step's logits l = b + x W_out (V of them) only their argmax, and at one
// row a step's time is the read of its weights, W_out the most of them (H = 256, V = 5000: 5.1 of 7.4 MB).
// OutputScreen keeps W_out quantized per word across calls (column v: s_v = max_k |W[k, v]| / 127,
// q[k, v] = round(W[k, v] / s_v), packed for quantized.hpp's int8 tiles: a quarter of the bytes); a step
// quantizes x (quantize_rows: sx, qx, residual r = x - sx qx) and screens with l~_v = b_v + sx s_v (qx . q_v),
// the product exact in int32. With d_v = W_v - s_v q_v (|d| <= 0.50004 s_v: the rounding of q) and
// N_v = s_v (|q_v|_2 + 0.50004 sqrt(H)) >= |W_v|_2:
//   x . W_v = sx s_v (qx . q_v) + sx (qx . d_v) + r . W_v, so
//   |l~_v - l_v| < e_v = 1.01 (0.50004 sx |qx|_1 s_v + (|r|_2 + gamma |x|_2 + 4u sx |qx|_2) N_v
//                              + (gamma + u) |b_v| + 2^-22 |l~_v|) + 2^-100
// (l_v float32's, within gamma = (H + 2) u of the exact sum, u = 2^-24; 4u sx |qx|_2 N_v the float
// products making l~; 2^-22 |l~| the rounding of l~ -+ e; 2^-100 underflows; 1.01 the bound's own float
// arithmetic). The words whose l~_v + e_v reaches T = max_u (l~_u - e_u) are computed again from W_out
// itself in float32, in their 16-column chunk as dense_row_streamed computes them; every other word has
// l~_v < l_v + e_v < T <= max_u l_u, so the argmax (ties to the lowest id) is float32's. A column of
// max |W| < 2^-60 keeps s_v = 1, q_v = 0 (its bound holds, and makes it a candidate); a non-finite x,
// weight, bias or screened logit, or an x of max |x| in (0, 2^-60), makes the whole row float32.
constexpr float kScreenTinyColumn = 0x1p-60f;

// d rounded up to a float
inline float float_at_least(double d) {
    const float f = (float)d;
    return f < d ? std::nextafter(f, std::numeric_limits<float>::infinity()) : f;
}


// v rounded half to even (|v| < 2^22), after an opaque copy so that no level fuses the rounding with
// the product before it: every level gives the same values (quantized.hpp's round_int8, unclamped)
template <class Vec> ATTNX_ALWAYS_INLINE Vec round_half_even(Vec v) {
    if constexpr (Lanes<Vec>::W == 16) asm("" : "+v"(v));
    else asm("" : "+x"(v));
    const Vec magic = vbroadcast<Vec>(12582912.f);
    return (v + magic) - magic;
}

// Whether W (H, V) quantizes to q (H, V) with the columns' inverse scales, every value: q[k, v] =
// round_half_even(W[k, v] * inverse[v]) (a value past +-127, inf or NaN never does), columns [n0, n1)
template <class Vec>
ATTNX_ALWAYS_INLINE bool screen_matches_on(const int8_t* q, const float* inverse, const float* W, int H, int V, int n0,
                                           int n1) {
    using I = typename Lanes<Vec>::I;
    constexpr int L = Lanes<Vec>::W;
    I largest = I{};       // max |value| as bits: NaN and inf order past 127
    uint64_t differ = 0;   // bits of bytes that differ
    for (int k = 0; k < H; ++k) {
        const float* row = W + (size_t)k * V;
        const int8_t* qrow = q + (size_t)k * V;
        int v = n0;
        for (; v + L <= n1; v += L) {
            const Vec r = round_half_even(vload<Vec>(row + v, L) * vload<Vec>(inverse + v, L));
            const I bits = (I)r & (I{} + 0x7fffffff);
            largest = bits > largest ? bits : largest;  // (an int select on an int compare: stays a vector)
            uint64_t made[2] = {}, stored[2] = {};  // L bytes (at most 16)
            store_int8((int8_t*)made, r);  // (in range: exact)
            std::memcpy(stored, qrow + v, (size_t)L);
            differ |= (made[0] ^ stored[0]) | (made[1] ^ stored[1]);
        }
        for (; v < n1; ++v) {
            const float r = std::nearbyint(row[v] * inverse[v]);
            if (!(std::abs(r) <= 127.0f) || (int8_t)r != qrow[v]) return false;
        }
        if (k % 16 == 15 || k == H - 1)  // (a changed weight stops the check within 16 rows)
            for (int j = 0; j < L; ++j)
                if (largest[j] > 0x42FE0000 || differ) return false;  // 127.0f
    }
    return true;
}

struct OutputScreen {
    const float* source;  // the W_out this was made from (the cache's key; its bytes are checked per call)
    int H, V;
    std::vector<int8_t> q;       // (H, V) row-major
    std::vector<float> scale;    // (V,) s_v
    std::vector<float> inverse;  // (V,) 127 / max_k |W[k, v]| (1 for a tiny column)
    std::vector<float> norm;     // (V,) N_v, rounded up
    Int8Packed packed;           // q for the tiles
    bool finite = true;          // no inf or NaN in W

    OutputScreen(const float* W, int H_, int V_)
        : source(W), H(H_), V(V_), q((size_t)H_ * V_), scale(V_), inverse(V_), norm(V_) {
        std::vector<float> largest((size_t)V, 0.0f);
        for (int k = 0; k < H; ++k)
            for (int v = 0; v < V; ++v) {
                const float a = std::abs(W[(size_t)k * V + v]);
                finite &= std::isfinite(a);
                largest[v] = std::max(largest[v], a);
            }
        for (int v = 0; v < V; ++v) {
            const bool tiny = !(largest[v] >= kScreenTinyColumn);
            scale[v] = tiny ? 1.0f : largest[v] / 127.0f;
            inverse[v] = tiny ? 1.0f : 127.0f / largest[v];
        }
        std::vector<int64_t> squares((size_t)V, 0);
        for (int k = 0; k < H; ++k)
            for (int v = 0; v < V; ++v) {
                const float r = std::nearbyint(W[(size_t)k * V + v] * inverse[v]);  // half to even, as the check's
                const int8_t b = (int8_t)(std::isfinite(r) ? std::max(-127.0f, std::min(127.0f, r)) : 0.0f);
                q[(size_t)k * V + v] = b;
                squares[v] += (int64_t)b * b;
            }
        for (int v = 0; v < V; ++v)
            norm[v] = float_at_least((double)scale[v] * (std::sqrt((double)squares[v]) + 0.50004 * std::sqrt((double)H)) *
                                     (1 + 0x1p-40));
        pack_int8(packed, q.data(), (size_t)V, H, V);
    }
    // W still quantizes to q, value for value (so |W - s q| <= 0.50004 s holds: see screened_output_row),
    // at any SIMD level; columns split across the thread budget
    bool current(const float* W) const {
        std::atomic<bool> same{true};
        constexpr int block = 256;  // columns per share (a multiple of every level's lanes)
        parallel_for((size_t)(V + block - 1) / block, double(H) * V, [&](size_t lo, size_t hi) {
            const int n0 = (int)lo * block, n1 = std::min(V, (int)hi * block);
            const bool ok = on_widest_lanes<float>([&](auto lanes) __attribute__((always_inline)) {
                return screen_matches_on<decltype(lanes)>(q.data(), inverse.data(), W, H, V, n0, n1);
            });
            if (!ok) same = false;
        });
        return same;
    }
};

// The screen of W_out (H, V), made again when W's bytes no longer quantize to it (an optimizer step,
// set_weights, a load, a write into the array: all checked, per call). The four most recently used are
// kept, keyed by the weight's address; a screen in use stays alive while a new one replaces it.
inline std::shared_ptr<const OutputScreen> output_screen(const float* W, int H, int V) {
    static std::mutex lock;
    static std::vector<std::shared_ptr<const OutputScreen>> kept;  // most recently used first
    std::lock_guard<std::mutex> guard(lock);
    std::shared_ptr<const OutputScreen> screen;
    for (size_t i = 0; i < kept.size() && !screen; ++i)
        if (kept[i]->source == W && kept[i]->H == H && kept[i]->V == V) {
            screen = kept[i];
            kept.erase(kept.begin() + (std::ptrdiff_t)i);
        }
    if (!screen || !screen->current(W)) screen = std::make_shared<const OutputScreen>(W, H, V);
    kept.insert(kept.begin(), screen);
    if (kept.size() > 4) kept.pop_back();
    return screen;
}

// logits[v0, v1) of one row x (H,), W (H, V): the values dense_row_streamed gives them, bit for bit (the
// same loop, columns in the same lanes: v0 a multiple of 16, the blocks' of 512 too)
inline void output_columns_as_streamed(float* logits, const float* x, const float* W, const float* b, int H, int V,
                                       int v0, int v1) {
    on_widest_lanes<float>([&](auto) __attribute__((always_inline)) {
        dense_row_columns<float>(logits + v0, x, W, (size_t)V, b ? b + v0 : nullptr, H, v0, v1);
    });
}

// reference: cpp/reference/seq2seq.hpp, output_word
// logits (V,) of one row x (H,) for greedy decoding (see OutputScreen): exact (dense_row_streamed's float32
// values) at every word that can be the argmax, within e_v elsewhere; W = screen's W_out, b (V,) or null
inline void screened_output_row(float* logits, const float* x, const float* W, const float* b, const OutputScreen& s) {
    const int H = s.H, V = s.V, Kp = s.packed.Kp, Np = s.packed.Np;
    double x1 = 0.0, x2 = 0.0, xmax = 0.0;  // |x|_1, |x|_2^2, max |x|
    for (int k = 0; k < H; ++k) {
        const double a = std::abs((double)x[k]);
        x1 += a, x2 += a * a, xmax = std::max(xmax, a);
    }
    bool bias_finite = true;
    for (int v = 0; b && v < V; ++v) bias_finite &= std::isfinite(b[v]);
    if (!s.finite || !std::isfinite(x1) || !bias_finite || (xmax > 0 && xmax < kScreenTinyColumn)) {
        dense_row_streamed<float>(logits, x, W, b, H, V);
        return;
    }
    thread_local std::vector<int8_t> qx;
    thread_local std::vector<int32_t> acc;
    thread_local std::vector<float> high;  // l~_v + e_v
    qx.resize((size_t)Kp), acc.resize((size_t)Np), high.resize((size_t)V);
    int8_t* qx_row = qx.data();  // (the lambdas below run on other threads, which have thread_locals of their own)
    int32_t* sums = acc.data();
    float* upper = high.data();
    float sx;
    quantize_rows(qx_row, (size_t)Kp, &sx, x, (size_t)H, 1, H, Kp);
    double r2 = 0.0, q1 = 0.0, q2 = 0.0;  // |r|_2^2, |qx|_1, |qx|_2^2 (r = x - sx qx: exact in double)
    for (int k = 0; k < H; ++k) {
        const double r = (double)x[k] - (double)sx * qx_row[k];
        r2 += r * r, q1 += std::abs((double)qx_row[k]), q2 += (double)qx_row[k] * qx_row[k];
    }
    // acc = qx . q, the columns split across threads in 16s
    parallel_for((size_t)(V + 15) / 16, double(H) * V / 4, [&](size_t lo, size_t hi) {
        int8_product(sums, (size_t)Np, qx_row, (size_t)Kp, 1, s.packed, (int)lo * 16,
                     std::min(V, (int)hi * 16));
    });
    constexpr double u = 0x1p-24;
    const double gamma = (H + 2) * u;
    const float a_scale = float_at_least(1.01 * 0.50004 * sx * q1);
    const float a_norm = float_at_least(1.01 * (std::sqrt(r2) * (1 + 0x1p-30) + gamma * std::sqrt(x2) * (1 + 0x1p-30) +
                                                4.001 * u * sx * std::sqrt(q2) * (1 + 0x1p-30)));
    const float a_bias = float_at_least(1.01 * (gamma + u)), a_logit = float_at_least(1.01 * 0x1p-22);
    const float a_floor = 0x1p-100f;
    // l~ and l~ + e per word; T = max (l~ - e); all finite
    const auto [top, finite] = on_widest_lanes<float>([&](auto lanes) __attribute__((always_inline)) {
        using Vec = decltype(lanes);
        using I = typename Lanes<Vec>::I;
        constexpr int L = Lanes<Vec>::W;
        Vec low = vbroadcast<Vec>(-std::numeric_limits<float>::infinity());
        I ok = I{} - 1;
        const Vec fmax = vbroadcast<Vec>(std::numeric_limits<float>::max());
        for (int v = 0; v < V; v += L) {
            const int n = std::min(L, V - v);
            I a;
            std::memcpy(&a, sums + v, sizeof a);  // acc holds Np >= v + L columns
            const Vec sv = vload<Vec>(s.scale.data() + v, n), nv = vload<Vec>(s.norm.data() + v, n);
            const Vec bv = b ? vload<Vec>(b + v, n) : Vec{};
            const Vec l = __builtin_convertvector(a, Vec) * (sx * sv) + bv;
            const Vec absb = (Vec)((I)bv & (I{} + 0x7fffffff)), absl = (Vec)((I)l & (I{} + 0x7fffffff));
            const Vec e = a_scale * sv + a_norm * nv + a_bias * absb + a_logit * absl + a_floor;
            const Vec hi = l + e;
            Vec lo = l - e;
            ok &= (I)(hi <= fmax) & (I)(lo >= -fmax);
            vstore(logits + v, l, n);
            vstore(upper + v, hi, n);
            for (int j = n; j < L; ++j) lo[j] = -std::numeric_limits<float>::infinity();
            low = lo > low ? lo : low;
        }
        float t = -std::numeric_limits<float>::infinity();
        bool all = true;
        for (int j = 0; j < L; ++j) t = std::max(t, lane(low, j)), all &= ok[j] != 0;
        return std::pair<float, bool>(t, all);
    });
    if (!finite) {
        dense_row_streamed<float>(logits, x, W, b, H, V);
        return;
    }
    const float cut = std::nextafter(top, -std::numeric_limits<float>::infinity());
    for (int v0 = 0; v0 < V; v0 += 16) {
        const int v1 = std::min(V, v0 + 16);
        bool reaches = false;
        for (int v = v0; v < v1; ++v) reaches |= upper[v] >= cut;
        if (reaches) output_columns_as_streamed(logits, x, W, b, H, V, v0, v1);
    }
}

// The weights a decoder call multiplies a few rows by at every step, packed once for all its steps
// (BLAS repacks its right operand on every call: at B = 64, V = 8000 that packing took 19% of greedy
// decoding): the recurrent kernel for the step's tiles, the feed half of the input kernel and the
// additive score's query kernel, paired as bf16 under mixed_bfloat16; the output layer too for a
// decoding loop, whose every step has a few rows (teacher forcing multiplies all steps' rows at once,
// where BLAS is faster). A float32 batch of one row packs nothing (`in_place`): its products read each
// weight once per step, streamed in place (dense_row_streamed, rnn.hpp's one-row step), and a copy
// would cost as much as a step's reads.
template <class T> struct DecoderPanels {
    Panels<T> recurrent;
    Panels<uint32_t> recurrent_pairs;  // bf16
    std::optional<StepRight<T>> feed, query;
    std::optional<PackedRight<T>> output;
    bool in_place = false;
    const OutputScreen* screen = nullptr;  // a greedy search at one row: its output layer (float32 only)
    DecoderPanels(const DecoderConfig& cfg, const DecoderParams<const T*>& w, bool with_output) {
        if (cfg.B == 1 && !cfg.bf16) {
            in_place = true;
            return;
        }
        bool paired = false;
        if constexpr (std::is_same_v<T, float>)
            if (cfg.bf16) pair_recurrent_kernel(recurrent_pairs, recurrent, cfg.rnn_step(), w.recurrent_kernel, nullptr), paired = true;
        if (!paired) pack_recurrent_kernel_rows(recurrent, cfg.rnn_step(), w.recurrent_kernel);
        feed.emplace(w.kernel + (size_t)cfg.E * cfg.G(), cfg.F(), cfg.G(), false, cfg.bf16);
        if (cfg.score == ScoreKind::additive) query.emplace(w.query_kernel, cfg.H, cfg.U, false, cfg.bf16);
        if (with_output) output.emplace(w.output_kernel, cfg.H, cfg.V, false);
    }
    // U for the recurrence's steps: streamed at one row, packed (bf16: paired) otherwise; a bf16 step
    // never streams U (its thread's rows may be one), so its rounding does not depend on the split
    RecurrentKernel<T> recurrent_kernel(const T* U) const {
        if (in_place) return {nullptr, nullptr, false, U};
        if (!recurrent_pairs.empty()) return {recurrent.data(), recurrent_pairs.data(), bf16_tiles().native, nullptr};
        return {recurrent.data(), nullptr, false, U};
    }
};

// ------------------------------------------------------------------------------ attention step
// Hard attention's region: with a uniform u, the first s whose cumulative weight a[0..s] exceeds u
// (a draw from a); without, the first maximum of a (np.argmax). Zero-weight (masked) regions are
// never picked; a row of zeros gives -1.
template <class T> int64_t pick_region(const T* weights, int S, const T* uniform) {
    int64_t chosen = -1;
    T best = 0, cumulative = 0;
    for (int s = 0; s < S; ++s) {
        if (!(weights[s] > T(0))) continue;
        if (uniform) {
            chosen = s;
            cumulative += weights[s];
            if (cumulative > *uniform) break;
        } else if (weights[s] > best) {
            best = weights[s];
            chosen = s;
        }
    }
    return chosen;
}

// reference: cpp/reference/seq2seq.hpp, decoder_attend
// a_t = masked_softmax(score(q_t, enc)) and c_t = a_t . enc for batch rows [b0, b1) of step t (Tq = 1).
// query (B, H) and context (B, K) are whole-batch buffers; only rows [b0, b1) are read / written.
template <class T>
void attend_step_forward(const DecoderConfig& cfg, const DecoderParams<const T*>& w, const DecoderPanels<T>& panels,
                         const DecoderCache<T>& cache, int t, int b0, int b1, const T* query, const T* enc,
                         const uint8_t* source_mask, T* context) {
    const int B = cfg.B, S = cfg.S, U = cfg.U, H = cfg.H, K = cfg.K, Dk = cfg.Dk(), nb = b1 - b0;
    const size_t tb = (size_t)t * B + b0, bs = tb * S;  // row b0 of step t in (T, B) and (T, B, S)
    const T* q = query + (size_t)b0 * H;
    T* scores = cache.weights + bs;  // scores, turned into weights in place
    if (cfg.score == ScoreKind::additive) {
        T* pq = cache.query_proj + tb * U;
        // pq = q W_q + b_q;  scores[b, s] = v . tanh(pq[b] + keys[b, s])
        if (panels.in_place) dense_row_streamed<T>(pq, q, w.query_kernel, w.query_bias, H, U);
        else step_rows<T>(pq, q, (size_t)H, nb, *panels.query, w.query_bias, false);
        additive_scores_forward<T>(scores, cache.score_hidden + bs * U, pq, cache.keys + (size_t)b0 * S * U,
                                   w.score_vector, nb, 1, S, U);
    } else {
        // scores[b, s] = q[b] . keys[b, s]  (keys = enc W_k for general, enc for dot)
        dot_scores_forward<T>(AttendShape{nb, 1, 1, S, Dk, 0}, scores, q, cache.keys_or_enc(enc) + (size_t)b0 * S * Dk,
                              T(1));
    }
    AttendMask mask;
    mask.data = source_mask ? source_mask + (size_t)b0 * S : nullptr;
    mask.stride_b = (size_t)S;
    const T* keep = nullptr;
    if (cfg.local()) {
        T* p = cache.position + tb;
        if (cfg.predictive()) {
            // local-p: p_t = L_b sigmoid(v_p . tanh(h_t W_p)), L_b the real source length of row b
            const int P = cfg.P;
            T* hidden = cache.position_hidden + tb * P;
            matmul<T>(hidden, q, w.position_kernel, nb, P, H);
            activate_block(Activation::tanh, hidden, nb * P);
            for (int i = 0; i < nb; ++i) {
                T z = 0;
                for (int u = 0; u < P; ++u) z += w.position_vector[u] * hidden[(size_t)i * P + u];
                p[i] = cache.source_length[b0 + i] * sigmoid(z);
            }
        } else {
            // local-m: p_t = t (clipped to the source)
            std::fill(p, p + nb, T(std::min(cfg.first_step + t, S - 1)));
        }
        local_window_forward<T>(cache.window + bs, cache.gauss + bs, p, mask.data, nb, 1, S, cfg.local_window);
        mask.data = cache.window + bs;
        keep = cache.gauss + bs;
    }
    softmax_context_forward<T>(AttendShape{nb, 1, 1, S, 0, K}, context + (size_t)b0 * K, scores, enc + (size_t)b0 * S * K,
                               mask, keep);
    if (cfg.hard) {
        // c_t = enc[s_t] replaces the soft context
        for (int i = 0; i < nb; ++i) {
            const int64_t s = pick_region(scores + (size_t)i * S, S, cache.uniforms ? cache.uniforms + tb + i : nullptr);
            cache.positions[tb + i] = s;
            T* ctx = context + (size_t)(b0 + i) * K;
            if (s < 0) std::fill(ctx, ctx + K, T(0));
            else std::copy_n(enc + ((size_t)(b0 + i) * S + s) * K, K, ctx);
        }
    }
}

// Workspace of the backward pass for all B rows, allocated once per call (never inside the time loop),
// and W_q^T packed once for the steps' dq += d(pq) W_q^T.
template <class T> struct AttendGradWork {
    std::vector<T> dscores, denc_step, dquery_step, dkeys_step, dgauss, dposition;
    std::optional<StepRight<T>> query_t;
    AttendGradWork(const DecoderConfig& cfg, const DecoderParams<const T*>& w)
        : dscores((size_t)cfg.B * cfg.S), denc_step((size_t)cfg.B * cfg.S * cfg.K),
          dquery_step((size_t)cfg.B * std::max(cfg.Dk(), cfg.U)), dkeys_step((size_t)cfg.B * cfg.S * cfg.Dk()),
          dgauss(cfg.predictive() ? (size_t)cfg.B * cfg.S : 0), dposition(cfg.predictive() ? cfg.B : 0) {
        if (cfg.score == ScoreKind::additive) query_t.emplace(w.query_kernel, cfg.U, cfg.H, true, cfg.bf16);
    }
};

// reference: cpp/reference/seq2seq.hpp, decoder_attend_backward
// Backward of attend_step_forward for rows [b0, b1); dweights (T, B, S) the gradient of the weights
// themselves, or null. Accumulates: dquery (B, H), denc (B, S, K),
// dkeys (B, S, Dk), dscore_vector (U,); overwrites the step's rows of dquery_proj (T, B, U) (additive,
// for dW_q after the loop) and of dposition_logit (T, B) and dposition_hidden (T, B, P) (local-p, for
// d v_p and dW_p after the loop).
template <class T>
void attend_step_backward(const DecoderConfig& cfg, const DecoderParams<const T*>& w, const DecoderCache<T>& cache,
                          int t, int b0, int b1, const T* query, const T* enc, const T* dcontext, const T* dweights,
                          T* dquery, T* denc, T* dkeys, T* dscore_vector, T* dquery_proj, T* dposition_logit,
                          T* dposition_hidden, AttendGradWork<T>& work) {
    const int B = cfg.B, S = cfg.S, U = cfg.U, H = cfg.H, K = cfg.K, Dk = cfg.Dk(), nb = b1 - b0;
    const size_t tb = (size_t)t * B + b0, bs = tb * S;
    const T* keep = cfg.local() ? cache.gauss + bs : nullptr;
    T* dscores = work.dscores.data() + (size_t)b0 * S;
    T* denc_step = work.denc_step.data() + (size_t)b0 * S * K;
    T* dkeys_step = work.dkeys_step.data() + (size_t)b0 * S * Dk;
    T* dgauss = cfg.predictive() ? work.dgauss.data() + (size_t)b0 * S : nullptr;
    const T* dweights_rows = dweights ? dweights + bs : nullptr;
    T* denc_rows = denc + (size_t)b0 * S * K;
    if (cfg.hard) {
        // c_t = enc[s_t]: denc[s_t] += dc_t; the scores learn from dweights alone
        for (int i = 0; i < nb; ++i) {
            const int64_t s = cache.positions[tb + i];
            if (s < 0) continue;
            const T* dc = dcontext + (size_t)(b0 + i) * K;
            T* de = denc_rows + ((size_t)i * S + s) * K;
            for (int k = 0; k < K; ++k) de[k] += dc[k];
        }
        if (dweights_rows) std::copy_n(dweights_rows, (size_t)nb * S, dscores);
        else std::fill(dscores, dscores + (size_t)nb * S, T(0));
        softmax_rows_backward(dscores, dscores, cache.weights + bs, (size_t)nb, (size_t)S);
    } else {
        softmax_context_backward<T>(AttendShape{nb, 1, 1, S, 0, K}, dscores, denc_step, dgauss,
                                    dcontext + (size_t)b0 * K, dweights_rows, cache.weights + bs,
                                    enc + (size_t)b0 * S * K, keep);
        // denc += a_t^T . dc_t (per row b)
        for (size_t i = 0; i < (size_t)nb * S * K; ++i) denc_rows[i] += denc_step[i];
    }
    T* dq = dquery + (size_t)b0 * H;
    if (cfg.score == ScoreKind::additive) {
        T* dpq = dquery_proj + tb * U;
        additive_scores_backward<T>(dpq, dkeys_step, dscore_vector, dscores, cache.score_hidden + bs * U,
                                    w.score_vector, nb, 1, S, U);
        // dq += d(pq) . W_q^T
        step_rows<T>(dq, dpq, (size_t)U, nb, *work.query_t, nullptr, true);
    } else {
        T* dq_step = work.dquery_step.data() + (size_t)b0 * Dk;
        dot_scores_backward<T>(AttendShape{nb, 1, 1, S, Dk, 0}, dq_step, dkeys_step, (T*)nullptr, dscores,
                               query + (size_t)b0 * H, cache.keys_or_enc(enc) + (size_t)b0 * S * Dk, T(1));
        for (size_t i = 0; i < (size_t)nb * H; ++i) dq[i] += dq_step[i];
    }
    // the keys' gradient: into dkeys (projected keys) or straight into denc (dot: keys = enc)
    T* dk_rows = (cfg.score == ScoreKind::dot ? denc : dkeys) + (size_t)b0 * S * Dk;
    for (size_t i = 0; i < (size_t)nb * S * Dk; ++i) dk_rows[i] += dkeys_step[i];
    if (cfg.predictive()) {
        // the Gaussian's centre p_t = L sigmoid(z), z = v_p . hidden, hidden = tanh(h_t W_p):
        //   dp from local_window_backward;  dz = dp p (1 - p / L);  d hidden = dz v_p (1 - hidden^2);
        //   dq += d hidden . W_p^T
        const int P = cfg.P;
        const T* p = cache.position + tb;
        T* dp = work.dposition.data() + b0;
        local_window_backward<T>(dp, dgauss, cache.gauss + bs, p, nb, 1, S, cfg.local_window);
        const T* hidden = cache.position_hidden + tb * P;
        T* dhidden = dposition_hidden + tb * P;
        for (int i = 0; i < nb; ++i) {
            const T L = cache.source_length[b0 + i];
            const T dz = L > T(0) ? dp[i] * p[i] * (T(1) - p[i] / L) : T(0);
            dposition_logit[tb + i] = dz;
            for (int u = 0; u < P; ++u) {
                const size_t k = (size_t)i * P + u;
                dhidden[k] = dz * w.position_vector[u] * (T(1) - hidden[k] * hidden[k]);
            }
        }
        gemm<T>(false, true, nb, H, P, T(1), dhidden, P, w.position_kernel, P, T(1), dq, H);
    }
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
// reference: cpp/reference/seq2seq.hpp, decoder_forward
// One step t of the recurrence and attention for batch rows [b0, b1) (see decoder_forward).
template <class T>
void decoder_step_forward(const DecoderConfig& cfg, int t, int b0, int b1, T* h, T* c, T* feed,
                          const DecoderCache<T>& cache, const DecoderParams<const T*>& w, const T* enc,
                          const uint8_t* source_mask, const DecoderPanels<T>& panels, T* hu) {
    const int B = cfg.B, Tn = cfg.T, E = cfg.E, F = cfg.F(), H = cfg.H, K = cfg.K, G = cfg.G(), nb = b1 - b0;
    const size_t tb = (size_t)t * B + b0;  // row b0 of step t in (T, B, .)
    T* feed_t = cache.feed + (size_t)t * B * F;
    T* states_t = cache.states + (size_t)t * B * H;
    if (cfg.kind == DecoderKind::bahdanau) {
        // c_t from s_{t-1} (the state entering the step) is the feed
        T* ctx_t = cfg.gated ? cache.context + (size_t)t * B * K : feed_t;
        attend_step_forward<T>(cfg, w, panels, cache, t, b0, b1, h, enc, source_mask, ctx_t);
        if (cfg.gated) {
            // beta_t = sigmoid(s_{t-1} . w_beta + b_beta);  feed_t = beta_t c_t
            for (int b = b0; b < b1; ++b) {
                T z = w.gate_bias[0];
                for (int j = 0; j < H; ++j) z += h[(size_t)b * H + j] * w.gate_kernel[j];
                const T beta = sigmoid(z);
                cache.gate[(size_t)t * B + b] = beta;
                for (int k = 0; k < K; ++k) feed_t[(size_t)b * K + k] = beta * ctx_t[(size_t)b * K + k];
            }
        }
    } else {
        std::copy(feed + (size_t)b0 * H, feed + (size_t)b1 * H, feed_t + (size_t)b0 * H);  // h~_{t-1}
    }
    // gates[t] += feed_t W_f; then the recurrence of one step (h, c updated in place)
    T* gates_t = cache.gates + tb * G;
    if (panels.in_place) {  // (one row; hu is the recurrence's workspace, free until it runs)
        dense_row_streamed<T>(hu, cache.feed + tb * F, w.kernel + (size_t)E * G, gates_t, F, G);
        std::copy(hu, hu + G, gates_t);
    } else {
        step_rows<T>(gates_t, cache.feed + tb * F, (size_t)F, nb, *panels.feed, nullptr, true);
    }
    rnn_forward_rows<T>(cfg.rnn_step(), b0, b1, states_t, h, c, cache.rnn_at(cfg, t),
                        panels.recurrent_kernel(w.recurrent_kernel),
                        w.bias_rec, cache.step_mask ? cache.step_mask + (size_t)t * B : nullptr, (const T*)nullptr,
                        hu);
    if (cfg.kind == DecoderKind::luong) {
        T* ctx_t = cache.context + (size_t)t * B * K;
        attend_step_forward<T>(cfg, w, panels, cache, t, b0, b1, states_t, enc, source_mask, ctx_t);
        // h~_t = tanh([c_t; h_t] W_c), the next step's feed
        T* cat = cache.concat + tb * (K + H);
        for (int b = b0; b < b1; ++b) {
            T* row = cache.concat + ((size_t)t * B + b) * (K + H);
            std::copy(ctx_t + (size_t)b * K, ctx_t + (size_t)(b + 1) * K, row);
            std::copy(states_t + (size_t)b * H, states_t + (size_t)(b + 1) * H, row + K);
        }
        T* feed_rows = feed + (size_t)b0 * H;
        matmul<T>(feed_rows, cat, w.attentional_kernel, nb, H, K + H);
        activate_block(Activation::tanh, feed_rows, nb * H);
        for (int b = b0; b < b1; ++b)  // out_t = h~_t, batch-major
            std::copy(feed + (size_t)b * H, feed + (size_t)(b + 1) * H, cache.out + ((size_t)b * Tn + t) * H);
    }
}

// Multiply-adds of the time loop, for the decision to split its rows across threads.
inline double decoder_loop_work(const DecoderConfig& cfg) {
    return (double)cfg.T * cfg.B * (cfg.G() * (cfg.H + cfg.F()) + cfg.S * (cfg.K + cfg.U) + cfg.H * cfg.U);
}

// reference: cpp/reference/seq2seq.hpp, decoder_forward
// Teacher-forced decoder over T steps (T = 1: one inference step).
//   ids (B, T) target inputs; enc (B, S, K); source_mask (B, S) and target_mask (B, T) nonzero =
//   real (null: all real). h, c (B, H): in the initial state, out the final one (c: LSTM only).
//   feed (B, F), Luong only: in h~ of the previous step (zeros at the start), out h~ of the last.
//   keys_ready: cache.keys already holds enc W_k (decoding steps reuse it).
//   logits (B, T, V) written. hu (B, G) is workspace. panels: the weights packed for the steps (a
//   decoding loop packs them once for all its calls); null: packed here.
// Batch rows never interact inside the time loop, so each thread runs every step of its own rows
// (single-threaded BLAS, no synchronization per step); the products over all steps run before
// and after it on the whole BLAS thread budget.
// The products over all B * T rows (keys, input gates, logits and their gradients): on bf16 operands with
// float32 sums under mixed_bfloat16 (cfg.bf16, float only: bf16.hpp), else the float kernels of dense.hpp.
// The per-step products h U, feed W_f and q W_q (and their transposes backward) run on weights paired
// once per call (DecoderPanels, StepRight); the scores and contexts stay float32.
//   z = x W + b
template <class T>
void sequence_dense_forward(const DecoderConfig& cfg, T* z, const T* x, const T* W, const T* b, int N, int C, int OC) {
    if constexpr (std::is_same_v<T, float>)
        if (cfg.bf16) return bf16_dense_forward(z, z, x, W, b, N, C, OC, Activation::linear);
    dense_forward<T>(z, x, W, b, N, C, OC);
}

//   dx = dz W^T (overwritten; dx may be null), dW += x^T dz, db += sum_n dz[n] (db may be null)
template <class T>
void sequence_dense_backward(const DecoderConfig& cfg, T* dx, T* dW, T* db, const T* dz, const T* x, const T* W,
                             int N, int C, int OC) {
    if constexpr (std::is_same_v<T, float>)
        if (cfg.bf16) return bf16_dense_backward(dx, dW, db, dz, x, W, N, C, OC);  // db summed as dz is paired
    dense_backward<T>(dx, dW, db, dz, x, W, N, C, OC);
}

//   C (M, N) += op(A) op(B), op(A) (M, K): A^T of A (K, M) when trans_a; op(B) (K, N): B^T of B (N, K) when trans_b
template <class T>
void sequence_matmul_add(const DecoderConfig& cfg, T* C, const T* A, const T* B, int M, int N, int K, bool trans_a,
                         bool trans_b) {
    if constexpr (std::is_same_v<T, float>)
        if (cfg.bf16)
            return bf16_gemm(C, (size_t)N, A, trans_a ? (size_t)M : (size_t)K, trans_a, B,
                             trans_b ? (size_t)K : (size_t)N, trans_b, M, N, K, true);
    matmul<T>(C, A, B, M, N, K, trans_a, trans_b, T(1));
}

template <class T>
void decoder_forward(const DecoderConfig& cfg, T* logits, T* h, T* c, T* feed, const DecoderCache<T>& cache,
                     const DecoderParams<const T*>& w, const int64_t* ids, const T* enc, const uint8_t* source_mask,
                     const uint8_t* target_mask, bool keys_ready, T* hu, const DecoderPanels<T>* panels = nullptr) {
    const int B = cfg.B, Tn = cfg.T, E = cfg.E, S = cfg.S, H = cfg.H, K = cfg.K, G = cfg.G();
    // keys = enc W_k, once for all steps
    if (cache.keys && !keys_ready)
        sequence_dense_forward<T>(cfg, cache.keys, enc, w.key_kernel, (const T*)nullptr, B * S, K, cfg.Dk());
    if (cfg.predictive())  // L_b, the scale of local-p's position
        for (int b = 0; b < B; ++b)
            cache.source_length[b] =
                source_mask ? T(std::count(source_mask + (size_t)b * S, source_mask + (size_t)(b + 1) * S, 1)) : T(S);
    // time-major ids and step mask, then emb[t, b] = embeddings[y[b, t]]
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < Tn; ++t) {
            cache.ids[(size_t)t * B + b] = ids[(size_t)b * Tn + t];
            if (cache.step_mask) cache.step_mask[(size_t)t * B + b] = target_mask ? target_mask[(size_t)b * Tn + t] : 1;
        }
    embedding_forward<T>(cache.emb, cache.ids, w.embeddings, (size_t)Tn * B, (size_t)E);
    // gates[t] = emb_t W_e + b_in for all steps in one GEMM (a decoding step of one row: streamed); the
    // feed half joins per step
    if (Tn * B == 1 && !cfg.bf16) dense_row_streamed<T>(cache.gates, cache.emb, w.kernel, w.bias_in, E, G);
    else sequence_dense_forward<T>(cfg, cache.gates, cache.emb, w.kernel, w.bias_in, Tn * B, E, G);
    std::optional<DecoderPanels<T>> own_panels;  // read by every step of every thread
    if (!panels) panels = &own_panels.emplace(cfg, w, false);
    parallel_for((size_t)B, decoder_loop_work(cfg), [&](size_t b0, size_t b1) {
        for (int t = 0; t < Tn; ++t)
            decoder_step_forward<T>(cfg, t, (int)b0, (int)b1, h, c, feed, cache, w, enc, source_mask, *panels, hu);
    });
    if (cfg.kind == DecoderKind::bahdanau) time_to_batch_major(cache.out, cache.states, Tn, B, H);
    // logits = out W_out + b_out: one GEMM over all B * T rows, or on the packed output layer
    if (cfg.bf16)
        sequence_dense_forward<T>(cfg, logits, cache.out, w.output_kernel, w.output_bias, B * Tn, H, cfg.V);
    else if (panels->output)
        packed_dense_rows<T>(logits, logits, cache.out, *panels->output, w.output_bias, B * Tn, Activation::linear);
    else if (panels->in_place && B * Tn == 1 && panels->screen) {
        if constexpr (std::is_same_v<T, float>)
            screened_output_row(logits, cache.out, w.output_kernel, w.output_bias, *panels->screen);
    } else if (panels->in_place && B * Tn == 1)
        dense_row_streamed<T>(logits, cache.out, w.output_kernel, w.output_bias, H, cfg.V);
    else
        dense_forward<T>(logits, cache.out, w.output_kernel, w.output_bias, B * Tn, H, cfg.V);
}

// ------------------------------------------------------------------------------------ backward
// Workspace of decoder_backward, allocated once per call. Step buffers are (B, .) and each thread
// touches only its rows; the (T, B, .) ones feed the GEMMs over all steps after the loop. U^T and
// W_f^T are packed once for the steps' products.
template <class T> struct DecoderGradWork {
    std::vector<T> dout, dgates, dhu_gru, dhrec, dfeed, dkeys, dquery_proj, dstate, dpre, dcat, dcontext, dfeed_next;
    std::vector<T> dposition_logit, dposition_hidden, dgate_logit, dweights;
    AttendGradWork<T> attend;
    Panels<T> recurrent_packed_t;
    Panels<uint32_t> recurrent_pairs_t;  // bf16
    RecurrentKernel<T> recurrent_t;      // U^T for the steps' dhu U^T
    StepRight<T> feed_t;
    DecoderGradWork(const DecoderConfig& cfg, const DecoderParams<const T*>& w)
        : dout((size_t)cfg.T * cfg.B * cfg.H), dgates((size_t)cfg.T * cfg.B * cfg.G()),
          dhu_gru(cfg.cell == RNNCell::gru ? dgates.size() : 0), dhrec((size_t)cfg.B * cfg.H),
          dfeed((size_t)cfg.B * cfg.F()), dkeys((size_t)cfg.B * cfg.S * cfg.Dk(), T(0)),
          dquery_proj(cfg.score == ScoreKind::additive ? (size_t)cfg.T * cfg.B * cfg.U : 0),
          dstate((size_t)cfg.B * cfg.H), dpre(luong(cfg) ? dout.size() : 0),
          dcat(luong(cfg) ? (size_t)cfg.B * (cfg.K + cfg.H) : 0), dcontext(luong(cfg) ? (size_t)cfg.B * cfg.K : 0),
          dfeed_next(luong(cfg) ? (size_t)cfg.B * cfg.H : 0, T(0)),
          dposition_logit(cfg.predictive() ? (size_t)cfg.T * cfg.B : 0),
          dposition_hidden(cfg.predictive() ? (size_t)cfg.T * cfg.B * cfg.P : 0),
          dgate_logit(cfg.gated ? (size_t)cfg.T * cfg.B : 0), attend(cfg, w),
          feed_t(w.kernel + (size_t)cfg.E * cfg.G(), cfg.G(), cfg.F(), true, cfg.bf16) {
        if constexpr (std::is_same_v<T, float>)
            if (cfg.bf16) {
                recurrent_t = pair_recurrent_kernel_t(recurrent_pairs_t, recurrent_packed_t, cfg.rnn_step(),
                                                      w.recurrent_kernel, nullptr);
                return;
            }
        pack_recurrent_kernel_rows_t(recurrent_packed_t, cfg.rnn_step(), w.recurrent_kernel);
        recurrent_t = RecurrentKernel<T>{recurrent_packed_t.data()};
    }
    static bool luong(const DecoderConfig& cfg) { return cfg.kind == DecoderKind::luong; }
    // d(h U + b_rec): its own buffer for GRU (the candidate's r * (.) splits it from dgates), else dgates
    T* dhu() { return dhu_gru.empty() ? dgates.data() : dhu_gru.data(); }
};

// reference: cpp/reference/seq2seq.hpp, decoder_backward
// Backward of decoder_step_forward: step t of rows [b0, b1). dh, dc (B, H) carry the state's
// gradient from step t + 1 to step t - 1; dscore_vector is this thread's partial sum.
template <class T>
void decoder_step_backward(const DecoderConfig& cfg, int t, int b0, int b1, T* denc, T* dh, T* dc, T* dscore_vector,
                           DecoderGradWork<T>& work, const DecoderCache<T>& cache, const DecoderParams<const T*>& w,
                           const T* enc) {
    const int B = cfg.B, Tn = cfg.T, E = cfg.E, F = cfg.F(), H = cfg.H, K = cfg.K, G = cfg.G(), nb = b1 - b0;
    T* dg_t = work.dgates.data() + (size_t)t * B * G;
    const T* dy_t = work.dout.data() + (size_t)t * B * H;
    // one step of rnn.hpp's BPTT (the decoder's cells are tanh / sigmoid): dh, dc from h_t to h_{t-1}
    auto rnn_step_backward = [&](const T* d_out) {
        rnn_backward_packed_rows<T>(cfg.rnn_step(), TanhSigmoidSlopes<T>{}, b0, b1, dh, dc, dg_t,
                                    work.dhu() + (size_t)t * B * G, work.dhrec.data(), d_out, cache.rnn_at(cfg, t),
                                    work.recurrent_t, cache.step_mask ? cache.step_mask + (size_t)t * B : nullptr,
                                    (const T*)nullptr);
    };
    auto attend_backward = [&](const T* dcontext, T* dquery) {
        attend_step_backward<T>(cfg, w, cache, t, b0, b1, cache.query_at(cfg, t), enc, dcontext,
                                work.dweights.empty() ? nullptr : work.dweights.data(), dquery, denc,
                                work.dkeys.data(), dscore_vector, work.dquery_proj.data(),
                                work.dposition_logit.data(), work.dposition_hidden.data(), work.attend);
    };
    if (cfg.kind == DecoderKind::bahdanau) {
        // s_t's gradient enters the recurrence; then d c_t = dgates_t W_f^T reaches s_{t-1} via attention
        rnn_step_backward(dy_t);
        step_rows<T>(work.dfeed.data() + (size_t)b0 * F, dg_t + (size_t)b0 * G, (size_t)G, nb, work.feed_t, nullptr,
                     false);
        if (cfg.gated) {
            // feed = beta c:  dz = (dfeed . c) beta (1 - beta);  ds_{t-1} += dz w_beta;  dc = beta dfeed
            const T* ctx_t = cache.context + (size_t)t * B * K;
            for (int b = b0; b < b1; ++b) {
                const T beta = cache.gate[(size_t)t * B + b];
                T* df = work.dfeed.data() + (size_t)b * K;
                T dbeta = 0;
                for (int k = 0; k < K; ++k) dbeta += df[k] * ctx_t[(size_t)b * K + k];
                const T dz = dbeta * beta * (T(1) - beta);
                work.dgate_logit[(size_t)t * B + b] = dz;
                for (int j = 0; j < H; ++j) dh[(size_t)b * H + j] += dz * w.gate_kernel[j];
                for (int k = 0; k < K; ++k) df[k] *= beta;
            }
        }
        attend_backward(work.dfeed.data(), dh);
        return;
    }
    // Luong: d h~_t = d out_t + (from step t + 1's input); d pre = d h~_t (1 - h~_t^2)
    T* dpre_t = work.dpre.data() + (size_t)t * B * H;
    const T* dfeed_next = work.dfeed_next.data();
    for (int b = b0; b < b1; ++b)
        for (int j = 0; j < H; ++j) {
            const size_t i = (size_t)b * H + j;
            const T a = cache.out[((size_t)b * Tn + t) * H + j];  // batch-major h~
            dpre_t[i] = (dy_t[i] + dfeed_next[i]) * (T(1) - a * a);
        }
    // d[c_t; h_t] = d pre W_c^T
    matmul<T>(work.dcat.data() + (size_t)b0 * (K + H), dpre_t + (size_t)b0 * H, w.attentional_kernel, nb, K + H, H,
              false, true);
    for (int b = b0; b < b1; ++b) {
        const T* row = work.dcat.data() + (size_t)b * (K + H);
        std::copy(row, row + K, work.dcontext.data() + (size_t)b * K);
        std::copy(row + K, row + K + H, work.dstate.data() + (size_t)b * H);
    }
    // h_t's gradient: from h~_t and from its score as the query
    attend_backward(work.dcontext.data(), work.dstate.data());
    rnn_step_backward(work.dstate.data());
    // d h~_{t-1} = dgates_t W_f^T (h~_{-1} is the given initial feed)
    step_rows<T>(work.dfeed_next.data() + (size_t)b0 * F, dg_t + (size_t)b0 * G, (size_t)G, nb, work.feed_t, nullptr,
                 false);
}

// reference: cpp/reference/seq2seq.hpp, decoder_backward
// Backward of decoder_forward with the caches of a training pass.
//   dlogits (B, T, V); dweights (B, T, S) the gradient of the attention weights, or null; dh, dc
//   (B, H): in the gradient of the final state (zeros if unused), out that of the initial state.
//   denc (B, S, K) overwritten. Parameter gradients in dw accumulate.
template <class T>
void decoder_backward(const DecoderConfig& cfg, T* denc, T* dh, T* dc, const DecoderParams<T*>& dw,
                      const T* dlogits, const T* dweights, const DecoderCache<T>& cache,
                      const DecoderParams<const T*>& w, const T* enc) {
    const int B = cfg.B, Tn = cfg.T, E = cfg.E, F = cfg.F(), H = cfg.H, K = cfg.K, G = cfg.G(), U = cfg.U;
    const int S = cfg.S, Dk = cfg.Dk(), TB = Tn * B;
    const bool luong = cfg.kind == DecoderKind::luong, additive = cfg.score == ScoreKind::additive;
    DecoderGradWork<T> work(cfg, w);

    // d out = dlogits W_out^T; dW_out += out^T dlogits; db_out += sum dlogits (one GEMM each)
    std::vector<T> dout_bm((size_t)TB * H);
    sequence_dense_backward<T>(cfg, dout_bm.data(), dw.output_kernel, dw.output_bias, dlogits, cache.out,
                               w.output_kernel, TB, H, cfg.V);
    batch_to_time_major(work.dout.data(), dout_bm.data(), Tn, B, H);
    if (dweights) {
        work.dweights.resize((size_t)TB * S);
        batch_to_time_major(work.dweights.data(), dweights, Tn, B, S);
    }

    std::fill(denc, denc + (size_t)B * S * K, T(0));
    std::mutex dscore_vector_lock;
    parallel_for((size_t)B, 2 * decoder_loop_work(cfg), [&](size_t b0, size_t b1) {
        std::vector<T> dscore_vector(additive ? U : 0, T(0));  // this thread's part of dv
        for (int t = Tn - 1; t >= 0; --t)
            decoder_step_backward<T>(cfg, t, (int)b0, (int)b1, denc, dh, dc, dscore_vector.data(), work, cache, w,
                                     enc);
        std::lock_guard<std::mutex> guard(dscore_vector_lock);
        for (int u = 0; u < (int)dscore_vector.size(); ++u) dw.score_vector[u] += dscore_vector[u];
    });
    // after the loop, one GEMM each over all T * B rows:
    // dW_e += emb^T dgates, db_in += sum dgates, d emb = dgates W_e^T -> dembeddings by id
    std::vector<T> demb((size_t)TB * E);
    sequence_dense_backward<T>(cfg, demb.data(), dw.kernel, dw.bias_in, work.dgates.data(), cache.emb, w.kernel, TB, E,
                               G);
    embedding_backward<T>(dw.embeddings, demb.data(), cache.ids, TB, (size_t)E);
    // dW_f += feed^T dgates
    sequence_matmul_add<T>(cfg, dw.kernel + (size_t)E * G, cache.feed, work.dgates.data(), F, G, TB, true, false);
    // dU += h_prev^T dhu, db_rec += sum dhu
    sequence_dense_backward<T>(cfg, (T*)nullptr, dw.recurrent_kernel, dw.bias_rec, work.dhu(), cache.h_prev,
                               w.recurrent_kernel, TB, H, G);
    if (luong) {
        // dW_c += [c; h]^T d pre
        sequence_matmul_add<T>(cfg, dw.attentional_kernel, cache.concat, work.dpre.data(), K + H, H, TB, true, false);
    }
    if (additive) {
        // dW_q += q^T d pq, db_q += sum d pq (q: s_{t-1} or h_t of every step)
        const T* queries = luong ? cache.states : cache.h_prev;
        sequence_dense_backward<T>(cfg, (T*)nullptr, dw.query_kernel, dw.query_bias, work.dquery_proj.data(), queries,
                                   w.query_kernel, TB, H, U);
    }
    if (cfg.gated) {
        // dw_beta += s_{t-1}^T dz;  db_beta += sum dz
        matmul<T>(dw.gate_kernel, cache.h_prev, work.dgate_logit.data(), H, 1, TB, true, false, T(1));
        for (int i = 0; i < TB; ++i) dw.gate_bias[0] += work.dgate_logit[i];
    }
    if (cfg.predictive()) {
        // dW_p += h^T d hidden;  d v_p += sum over steps and rows of dz hidden
        matmul<T>(dw.position_kernel, cache.states, work.dposition_hidden.data(), H, cfg.P, TB, true, false, T(1));
        matmul<T>(dw.position_vector, work.dposition_logit.data(), cache.position_hidden, 1, cfg.P, TB, false, false,
                  T(1));
    }
    if (cfg.score != ScoreKind::dot) {
        // keys = enc W_k: dW_k += enc^T dkeys, denc += dkeys W_k^T
        sequence_dense_backward<T>(cfg, (T*)nullptr, dw.key_kernel, (T*)nullptr, work.dkeys.data(), enc, w.key_kernel,
                                   B * S, K, Dk);
        sequence_matmul_add<T>(cfg, denc, work.dkeys.data(), w.key_kernel, B * S, K, Dk, false, true);
    }
}

// ------------------------------------------------------------------------------ the encoder, for decoding
// Seq2Seq's encoder (attnx.seq2seq.Encoder, one direction) over source ids (B, S), 0 = padding: the
// embedding's rows, the recurrence over the real steps (rnn_forward_products: the kernel the layer's
// forward calls, on the same operands, so its states and real steps' outputs are the eager ones bit for
// bit). A padded step's output is rnn_forward's 0, not Keras' carried last real output (the eager
// layer's zero_output_for_mask=False, layers/recurrent.py): the decoder's attention reads the outputs
// under the source mask, which gives padded steps weight 0, so what they hold never reaches a result.
// cfg: the recurrence (B, T = S, C = E, H). outputs (B, S, H), h, c (B, H; c LSTM only) and mask
// (B, S) (1 = real) written.
template <class T>
void encode_source(const RNNConfig& cfg, bool bf16, T* outputs, T* h, T* c, uint8_t* mask, const int64_t* ids,
                   const T* embeddings, const T* W, const T* U, const T* b_in, const T* b_rec) {
    const size_t B = cfg.B, S = cfg.T, E = cfg.C, H = cfg.H, G = cfg.G();
    for (size_t i = 0; i < B * S; ++i) mask[i] = ids[i] != 0;
    std::vector<T> x(B * S * E), gates(B * S * G), aux(B * S * H), hu(B * G);
    embedding_forward<T>(x.data(), ids, embeddings, B * S, E);
    RNNCache<T> cache;  // inference: gates and aux are workspace
    cache.gates = gates.data();
    cache.aux = cfg.cell != RNNCell::simple ? aux.data() : nullptr;
    std::fill(h, h + B * H, T(0));
    if (c) std::fill(c, c + B * H, T(0));
    rnn_forward_products<T>(bf16, cfg, outputs, h, c, cache, x.data(), W, U, b_in, b_rec, mask, (const T*)nullptr,
                            hu.data());
}

// ------------------------------------------------------------------------------ decoding
// The step functor of search.hpp (its header names the interface) over an attention decoder: steps
// of decoder_forward (T = 1) on the rows still decoding, its state (h, c for LSTM, feed for Luong,
// the encoder outputs, source mask and projected keys of each row) reordered by row index in select.
//   cfg: the sizes of the start (B rows); rows: the most rows a step takes (B * width). h0, c0 (B, H):
//   the initial state; enc (B, S, K), source_mask (B, S) or null. argmax_only: the search reads of each
//   step's logits only the argmax and the log-sum-exp (greedy): a float32 row screens its output layer
//   (OutputScreen: the argmax exact, the log-sum-exp within its bound).
template <class T> class AttentionDecoderSearchStep {
public:
    using logits_type = T;
    using attention_type = T;

    AttentionDecoderSearchStep(const DecoderConfig& cfg, int rows, const DecoderParams<const T*>& w, const T* h0,
                               const T* c0, const T* enc, const uint8_t* source_mask, bool argmax_only = false)
        : cfg_(sized(cfg, rows)), w_(w), cache_(cfg_, false), panels_(cfg_, w, true), rows_(cfg.B) {
        const size_t B = cfg.B, S = cfg.S, H = cfg.H;
        if constexpr (std::is_same_v<T, float>)
            if (argmax_only && panels_.in_place) {
                screen_ = output_screen(w.output_kernel, cfg.H, cfg.V);
                panels_.screen = screen_.get();
            }
        h_.assign(h0, h0 + B * H), h_.resize((size_t)rows * H);
        if (cfg.cell == RNNCell::lstm) c_.assign(c0, c0 + B * H), c_.resize((size_t)rows * H);
        if (cfg.kind == DecoderKind::luong) feed_.assign((size_t)rows * cfg.F(), T(0));  // h~_{-1} = 0
        enc_.assign(enc, enc + B * S * cfg.K), enc_.resize((size_t)rows * S * cfg.K);
        if (source_mask) mask_.assign(source_mask, source_mask + B * S), mask_.resize((size_t)rows * S);
        logits_.resize((size_t)rows * cfg.V), hu_.resize((size_t)rows * cfg.G());
    }

    const T* step(const int64_t* ids, int rows, int position) {
        DecoderConfig c = cfg_;
        c.B = rows_ = rows, c.first_step = position;
        decoder_forward<T>(c, logits_.data(), h_.data(), c_.empty() ? nullptr : c_.data(),
                           feed_.empty() ? nullptr : feed_.data(), cache_.cache, w_, ids, enc_.data(),
                           mask_.empty() ? nullptr : mask_.data(), nullptr, position > 0, hu_.data(), &panels_);
        return logits_.data();
    }
    const T* attention() const { return cache_.cache.weights; }
    int attention_heads() const { return 1; }
    int attention_keys() const { return cfg_.S; }
    int vocab() const { return cfg_.V; }

    // the state of rows `rows` of the last step's, in that order
    void select(const int32_t* rows, int count) {
        const size_t S = cfg_.S;
        gather(h_, rows, count, cfg_.H);
        gather(c_, rows, count, cfg_.H);
        gather(feed_, rows, count, cfg_.F());
        gather(enc_, rows, count, S * cfg_.K);
        gather(mask_, rows, count, S);
        if (cache_.cache.keys) gather_into(cache_.cache.keys, rows, count, S * cfg_.Dk());
        rows_ = count;
    }

private:
    static DecoderConfig sized(DecoderConfig c, int rows) {
        c.B = rows, c.T = 1;
        return c;
    }
    template <class U> void gather(std::vector<U>& a, const int32_t* rows, int count, size_t width) {
        if (!a.empty()) gather_into(a.data(), rows, count, width);
    }
    template <class U> void gather_into(U* a, const int32_t* rows, int count, size_t width) {
        std::vector<U> picked((size_t)count * width);
        for (int j = 0; j < count; ++j) std::copy(a + rows[j] * width, a + (rows[j] + 1) * width, picked.begin() + j * width);
        std::copy(picked.begin(), picked.end(), a);
    }

    DecoderConfig cfg_;  // B: the most rows
    DecoderParams<const T*> w_;
    OwnedDecoderCache<T> cache_;  // one step's buffers, for the most rows
    DecoderPanels<T> panels_;     // the weights packed once for every step
    std::shared_ptr<const OutputScreen> screen_;  // argmax_only at one float32 row
    int rows_;
    std::vector<T> h_, c_, feed_, enc_, logits_, hu_;
    std::vector<uint8_t> mask_;
};

}  // namespace attnx
