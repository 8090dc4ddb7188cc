// Reference cached decoder step: what decoder_step.hpp computes, one layer, block and value at a
// time in double, composed from the reference norms and dense layers; a product on an int8 kernel is
// reference/quantized.hpp's (its input rounded to float, as the kernel holds it).
// Layouts as decoder_step.hpp: x (N, D), caches (layers, N, capacity, D), cross keys / values
// (layers, N, S, D), source_mask (N, S), cross_weights (N, H, S); with c.memory_rows, row n reads
// memory row memory_rows[n] of cross keys / values (layers, memory_batch, S, D) and source_mask; with
// c.cache_rows, row n's keys / values of position s are cache row cache_rows[n * capacity + s] of the
// caches (layers, cache_batch, capacity, D).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnx/decoder_step.hpp"  // DecoderLayerWeights, DecoderStepConfig
#include "reference/dense.hpp"
#include "reference/quantized.hpp"
#include "reference/transformer.hpp"

namespace attnx::reference {

// w[n, h, s] = softmax_s(q[n, h, :] . K[n, s, h, :] / sqrt(Dh)) over s < keys with allowed[n, s]
// (a row with nothing allowed: all 0);  context[n, h, :] = sum_s w[n, h, s] V[n, s, h, :]
inline void attend_one_query(double* context, double* weights, const double* q, const double* K, const double* V,
                             const uint8_t* allowed, int N, int H, int D, int keys, size_t row_stride) {
    const int Dh = D / H;
    std::vector<double> w(keys);
    for (int n = 0; n < N; ++n)
        for (int h = 0; h < H; ++h) {
            double top = -INFINITY, total = 0;
            for (int s = 0; s < keys; ++s) {
                double dot = 0;
                for (int d = 0; d < Dh; ++d)
                    dot += q[(size_t)n * D + h * Dh + d] * K[((size_t)n * row_stride + s) * D + h * Dh + d];
                w[s] = dot / std::sqrt((double)Dh);
                if (!allowed || allowed[(size_t)n * keys + s]) top = std::max(top, w[s]);
            }
            for (int s = 0; s < keys; ++s) {
                w[s] = (!allowed || allowed[(size_t)n * keys + s]) ? std::exp(w[s] - top) : 0;
                total += w[s];
            }
            for (int s = 0; s < keys; ++s) w[s] = total > 0 ? w[s] / total : 0;
            for (int d = 0; d < Dh; ++d) {
                double acc = 0;
                for (int s = 0; s < keys; ++s) acc += w[s] * V[((size_t)n * row_stride + s) * D + h * Dh + d];
                context[(size_t)n * D + h * Dh + d] = acc;
            }
            if (weights)
                for (int s = 0; s < keys; ++s) weights[((size_t)n * H + h) * keys + s] = w[s];
        }
}

// y (N, OC) = act(x (N, K) W + b) for a StepLinear: reference dense_forward on a float kernel, or per row
// the int8 product of x as float (int8_row_product) on an int8 kernel
inline void step_product(double* y, const double* x, const StepLinear<double>& w, int N, int K, int OC,
                         Activation a = Activation::linear) {
    if (!w.int8) {
        std::vector<double> z((size_t)N * OC);
        dense_forward(y, z.data(), x, w.kernel, w.bias, N, K, OC, a);
        return;
    }
    const std::vector<int8_t> qW = unpack_int8(*w.int8);
    std::vector<float> row(K);
    for (int n = 0; n < N; ++n) {
        for (int k = 0; k < K; ++k) row[k] = (float)x[(size_t)n * K + k];
        double* yn = y + (size_t)n * OC;
        int8_row_product(yn, row.data(), qW.data(), w.int8->scale.data(), K, OC);
        for (int o = 0; o < OC; ++o) yn[o] += w.bias ? w.bias[o] : 0.0;
    }
    activation_forward(y, y, N, OC, a);
}

// Per layer: x = norm1(x + self_attend(x)), x = norm2(x + cross_attend(x)), x = norm3(x + ff(x))
// (pre-norm: x = x + sublayer(norm(x))); the self-attention appends position's k, v to the cache
// and attends over positions 0..position; the last layer's cross-attention weights are kept.
inline void decoder_stack_step(double* x, double* self_keys, double* self_values, double* cross_weights,
                               const double* cross_keys, const double* cross_values, const uint8_t* source_mask,
                               const DecoderLayerWeights<double>* layers, const DecoderStepConfig& c) {
    const int N = c.N, D = c.D;
    const size_t rows = (size_t)N * D;
    std::vector<double> h(rows), qkv(3 * rows), q(rows), context(rows), out(rows), hidden((size_t)N * c.F), mean(N),
        rstd(N);
    auto residual = [&](const double* gamma, const double* beta, auto&& sublayer) {
        if (c.norm_first) layernorm_forward(h.data(), mean.data(), rstd.data(), x, gamma, beta, N, D, c.epsilon);
        else h.assign(x, x + rows);
        sublayer(h.data(), out.data());
        for (size_t i = 0; i < rows; ++i) x[i] += out[i];
        if (!c.norm_first) {
            layernorm_forward(h.data(), mean.data(), rstd.data(), x, gamma, beta, N, D, c.epsilon);
            for (size_t i = 0; i < rows; ++i) x[i] = h[i];
        }
    };
    for (int l = 0; l < c.layers; ++l) {
        const DecoderLayerWeights<double>& w = layers[l];
        const size_t cache_batch = c.cache_rows ? (size_t)c.cache_batch : (size_t)N;
        double* keys = self_keys + (size_t)l * cache_batch * c.capacity * D;
        double* values = self_values + (size_t)l * cache_batch * c.capacity * D;
        // the cache row of row n's position s
        auto cache_row = [&](int n, int s) {
            return c.cache_rows ? (size_t)c.cache_rows[(size_t)n * c.capacity + s] : (size_t)n;
        };
        residual(w.norm1_gamma, w.norm1_beta, [&](const double* in, double* result) {
            // qkv (N, 3D): q, k, v of each row side by side, from one product (D, 3D) or three
            if (w.self_key.present()) {
                std::vector<double> part(rows);
                const StepLinear<double>* projections[3] = {&w.self_query, &w.self_key, &w.self_value};
                for (int i = 0; i < 3; ++i) {
                    step_product(part.data(), in, *projections[i], N, D, D);
                    for (int n = 0; n < N; ++n)
                        for (int d = 0; d < D; ++d) qkv[((size_t)n * 3 + i) * D + d] = part[(size_t)n * D + d];
                }
            } else {
                step_product(qkv.data(), in, w.self_query, N, D, 3 * D);
            }
            for (int n = 0; n < N; ++n)
                for (int d = 0; d < D; ++d) {
                    const size_t at = (cache_row(n, c.position) * c.capacity + c.position) * D + d;
                    q[(size_t)n * D + d] = qkv[(size_t)n * 3 * D + d];
                    keys[at] = qkv[(size_t)n * 3 * D + D + d];
                    values[at] = qkv[(size_t)n * 3 * D + 2 * D + d];
                }
            // one row at a time, on its keys and values of positions 0..position gathered from their rows
            const int seen = c.position + 1;
            std::vector<double> row_keys((size_t)seen * D), row_values(row_keys.size());
            for (int n = 0; n < N; ++n) {
                for (int s = 0; s < seen; ++s) {
                    const size_t at = (cache_row(n, s) * c.capacity + s) * D;
                    std::copy(keys + at, keys + at + D, row_keys.begin() + (size_t)s * D);
                    std::copy(values + at, values + at + D, row_values.begin() + (size_t)s * D);
                }
                attend_one_query(context.data() + (size_t)n * D, nullptr, q.data() + (size_t)n * D, row_keys.data(),
                                 row_values.data(), nullptr, 1, c.H, D, seen, (size_t)seen);
            }
            step_product(result, context.data(), w.self_output, N, D, D);
        });
        if (w.cross_query.present()) {  // no cross-attention block: an encoder layer run causally
            residual(w.norm2_gamma, w.norm2_beta, [&](const double* in, double* result) {
                step_product(q.data(), in, w.cross_query, N, D, D);
                // one row at a time, on its own memory row
                const size_t memory_batch = c.memory_rows ? (size_t)c.memory_batch : (size_t)N;
                for (int n = 0; n < N; ++n) {
                    const size_t m = c.memory_rows ? (size_t)c.memory_rows[n] : (size_t)n;
                    const size_t offset = ((size_t)l * memory_batch + m) * c.S * D;
                    attend_one_query(context.data() + (size_t)n * D,
                                     l == c.layers - 1 && cross_weights ? cross_weights + (size_t)n * c.H * c.S
                                                                        : nullptr,
                                     q.data() + (size_t)n * D, cross_keys + offset, cross_values + offset,
                                     source_mask ? source_mask + m * c.S : nullptr, 1, c.H, D, c.S, c.S);
                }
                step_product(result, context.data(), w.cross_output, N, D, D);
            });
        }
        residual(w.norm3_gamma, w.norm3_beta, [&](const double* in, double* result) {
            step_product(hidden.data(), in, w.ff1, N, D, c.F, c.activation);
            step_product(result, hidden.data(), w.ff2, N, c.F, D);
        });
    }
}

}  // namespace attnx::reference
