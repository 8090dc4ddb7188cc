// One cached decoding position through a whole stack of transformer decoder layers, for N rows at
// once: the step CTranslate2's decoder takes, in one call (no Python between the layers).
// Each layer (TransformerDecoderLayer, ARCHITECTURE.md) is three residual blocks:
//   post-norm: x = norm1(x + self_attend(x)),  x = norm2(x + cross_attend(x)),  x = norm3(x + ff(x))
//   pre-norm:  x = x + self_attend(norm1(x)),  x = x + cross_attend(norm2(x)),  x = x + ff(norm3(x))
// The self-attention of position t reads the keys / values of positions 0..t from a cache the step
// extends by row t; the cross-attention reads the encoder output's keys / values, projected once
// per sentence. Products reuse dense_forward (dense.hpp), the feed-forward network
// feed_forward_forward and the norms layernorm_forward (transformer.hpp); the one-query attention
// is its own loop here: attention.hpp's tiled core packs K^T per problem, which one query row
// does not repay, and it reads keys S rows per batch row where this cache holds `capacity`.
//
// Layouts (row-major): x (N, D); caches (layers, N, capacity, D) and cross keys / values
// (layers, N, S, D), heads side by side in D = H * Dh as MultiHeadAttention projects them;
// source_mask (N, S) (nonzero = real token, null = all real); cross_weights (N, H, S).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnx/activations.hpp"
#include "attnx/dense.hpp"
#include "attnx/parallel.hpp"
#include "attnx/transformer.hpp"

namespace attnx {

// One decoder layer's weights, MultiHeadAttention's kernels as (in, out) matrices (D, D); a bias or a
// norm's beta may be null (use_bias=False, center=False), gamma too (scale=False). A layer without
// cross-attention (an encoder layer run causally, as a decoder-only model's) leaves cross_query and
// the rest of that block null: its blocks are then self-attention and feed-forward (norm3).
template <class T> struct DecoderLayerWeights {
    const T *norm1_gamma = nullptr, *norm1_beta = nullptr;
    const T *self_query = nullptr, *self_query_bias = nullptr, *self_key = nullptr, *self_key_bias = nullptr;
    const T *self_value = nullptr, *self_value_bias = nullptr, *self_output = nullptr, *self_output_bias = nullptr;
    const T *norm2_gamma = nullptr, *norm2_beta = nullptr;
    const T *cross_query = nullptr, *cross_query_bias = nullptr, *cross_output = nullptr, *cross_output_bias = nullptr;
    const T *norm3_gamma = nullptr, *norm3_beta = nullptr;
    const T *ff_kernel1 = nullptr, *ff_bias1 = nullptr, *ff_kernel2 = nullptr, *ff_bias2 = nullptr;
};

// Sizes and options of one step: N rows, model size D in H heads, feed-forward width F, S source
// positions, cache rows `capacity` > position (the target position being decoded).
struct DecoderStepConfig {
    int layers = 0, N = 0, D = 0, H = 1, F = 0, S = 0, capacity = 0, position = 0;
    bool norm_first = false;
    double epsilon = 1e-5;
    Activation activation = Activation::relu;
};

// reference: cpp/reference/decoder_step.hpp, attend_one_query
// One query row per (row n, head h), problems split across threads:
//   w[n, h, s] = masked_softmax_s(scale * q[n, h, :] . K[n, s, h, :])   s < keys, allowed[n, s]
//   context[n, h, :] = sum_s w[n, h, s] V[n, s, h, :]
// K, V rows D apart, batch rows `row_stride` rows apart; weights (N, H, keys) written when not null.
template <class T>
void attend_one_query(T* context, T* weights, const T* q, const T* K, const T* V, const uint8_t* allowed, int N,
                      int H, int D, int keys, size_t row_stride) {
    const int Dh = D / H;
    const T scale = T(1) / std::sqrt(T(Dh));
    parallel_for((size_t)N * H, double(N) * keys * D * 4, [&](size_t lo, size_t hi) {
        std::vector<T> row((size_t)keys);
        on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {  // the loops vectorize to each level's width
            for (size_t p = lo; p < hi; ++p) {
                const size_t n = p / H, h = p % H;
                const T* qh = q + n * D + h * Dh;
                const T* Kn = K + n * row_stride * D + h * Dh;
                const T* Vn = V + n * row_stride * D + h * Dh;
                for (int s = 0; s < keys; ++s) {
                    const T* ks = Kn + (size_t)s * D;
                    row[s] = scale * sum_lanes<T>(Dh, [&](size_t d) __attribute__((always_inline)) {
                        return qh[d] * ks[d];
                    });
                }
                masked_softmax_row(row.data(), row.data(), allowed ? allowed + n * keys : nullptr, (size_t)keys);
                T* ch = context + n * D + h * Dh;
                for (int d = 0; d < Dh; ++d) ch[d] = T(0);
                for (int s = 0; s < keys; ++s) {
                    const T w = row[s];
                    const T* vs = Vn + (size_t)s * D;
                    for (int d = 0; d < Dh; ++d) ch[d] += w * vs[d];
                }
                if (weights) std::copy(row.begin(), row.end(), weights + p * keys);
            }
        });
    });
}

// The step of decoder_stack_step for its rows [lo, hi): every layer on those rows alone.
template <class T>
void decoder_stack_rows(T* x_all, T* self_keys, T* self_values, T* cross_weights_all, const T* cross_keys,
                        const T* cross_values, const uint8_t* source_mask_all, const DecoderLayerWeights<T>* layers,
                        const DecoderStepConfig& c, size_t lo, size_t hi) {
    const int N = (int)(hi - lo), D = c.D, S = c.S, t = c.position;
    const size_t rows = (size_t)N * D;
    T* x = x_all + lo * D;
    T* cross_weights = cross_weights_all ? cross_weights_all + lo * c.H * S : nullptr;
    const uint8_t* source_mask = source_mask_all ? source_mask_all + lo * S : nullptr;
    std::vector<T> h(rows), q(rows), k(rows), v(rows), context(rows), out(rows), mean(N), rstd(N);
    const T eps = T(c.epsilon);
    // one residual block: x = norm(x + sublayer(x)) or x = x + sublayer(norm(x)); sublayer(in, out)
    auto residual = [&](const T* gamma, const T* beta, auto&& sublayer) {
        const T* in = x;
        if (c.norm_first) {
            layernorm_forward<T>(h.data(), mean.data(), rstd.data(), x, gamma, beta, N, D, eps);
            in = h.data();
        }
        sublayer(in, out.data());
        for (size_t i = 0; i < rows; ++i) x[i] += out[i];
        if (!c.norm_first) {
            layernorm_forward<T>(h.data(), mean.data(), rstd.data(), x, gamma, beta, N, D, eps);
            std::copy(h.begin(), h.end(), x);
        }
    };
    for (int l = 0; l < c.layers; ++l) {
        const DecoderLayerWeights<T>& w = layers[l];
        // this layer's cache rows of rows lo.. (layers are N_all rows apart)
        const size_t layer_rows = (size_t)l * c.N + lo;
        T* keys = self_keys + layer_rows * c.capacity * D;
        T* values = self_values + layer_rows * c.capacity * D;
        residual(w.norm1_gamma, w.norm1_beta, [&](const T* in, T* result) {
            dense_forward<T>(q.data(), in, w.self_query, w.self_query_bias, N, D, D);
            dense_forward<T>(k.data(), in, w.self_key, w.self_key_bias, N, D, D);
            dense_forward<T>(v.data(), in, w.self_value, w.self_value_bias, N, D, D);
            for (int n = 0; n < N; ++n) {
                std::copy(k.data() + (size_t)n * D, k.data() + (size_t)(n + 1) * D,
                          keys + ((size_t)n * c.capacity + t) * D);
                std::copy(v.data() + (size_t)n * D, v.data() + (size_t)(n + 1) * D,
                          values + ((size_t)n * c.capacity + t) * D);
            }
            attend_one_query<T>(context.data(), nullptr, q.data(), keys, values, nullptr, N, c.H, D, t + 1,
                                (size_t)c.capacity);
            dense_forward<T>(result, context.data(), w.self_output, w.self_output_bias, N, D, D);
        });
        if (w.cross_query) {  // an encoder layer decoding causally has no cross-attention block
            residual(w.norm2_gamma, w.norm2_beta, [&](const T* in, T* result) {
                dense_forward<T>(q.data(), in, w.cross_query, w.cross_query_bias, N, D, D);
                const size_t offset = layer_rows * S * D;
                attend_one_query<T>(context.data(), l == c.layers - 1 ? cross_weights : nullptr, q.data(),
                                    cross_keys + offset, cross_values + offset, source_mask, N, c.H, D, S,
                                    (size_t)S);
                dense_forward<T>(result, context.data(), w.cross_output, w.cross_output_bias, N, D, D);
            });
        }
        residual(w.norm3_gamma, w.norm3_beta, [&](const T* in, T* result) {
            feed_forward_forward<T>(result, in, w.ff_kernel1, w.ff_bias1, w.ff_kernel2, w.ff_bias2, N, D, c.F, D,
                                    c.activation);
        });
    }
}

// reference: cpp/reference/decoder_step.hpp, decoder_stack_step
// x (N, D): the embedded tokens of `position` in, the last layer's output out. Per layer l:
//   self-attention: q, k, v = h W^Q + b^Q, h W^K + b^K, h W^V + b^V   (h: x, or norm1(x) pre-norm)
//                   keys[l, n, position] = k[n], values[l, n, position] = v[n]
//                   out = attend(q, keys[l, n, 0..position], values[...]) W^O + b^O
//   cross-attention: q = h W^Q + b^Q, out = attend(q, cross_keys[l], cross_values[l], source_mask) W^O + b^O
//   feed-forward: out = act(h W1 + b1) W2 + b2
// each in its residual block as the header says. cross_weights (N, H, S): the last layer's
// cross-attention weights, when not null. The rows are split across threads once for the whole
// stack (one parallel region per step, each thread's products on its own rows), not per product:
// a step's products are small, and ten regions per layer cost more in wake-ups than they share.
template <class T>
void decoder_stack_step(T* x, T* self_keys, T* self_values, T* cross_weights, const T* cross_keys,
                        const T* cross_values, const uint8_t* source_mask, const DecoderLayerWeights<T>* layers,
                        const DecoderStepConfig& c) {
    const double D = c.D, per_row = D * (6 * D + 2 * c.F + 2 * (c.position + 1 + c.S));
    parallel_for((size_t)c.N, per_row * c.N * c.layers, [&](size_t lo, size_t hi) {
        decoder_stack_rows<T>(x, self_keys, self_values, cross_weights, cross_keys, cross_values, source_mask,
                              layers, c, lo, hi);
    });
}

}  // namespace attnx
