// Transformer building blocks around the attention core (attention.hpp): layer normalization,
// positional encodings, and the dropout / residual pieces of an encoder or decoder layer.
// Projections and the feed-forward network reuse dense_forward / dense_backward (dense.hpp).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "attnx/activations.hpp"
#include "attnx/dense.hpp"
#include "attnx/parallel.hpp"
#include "attnx/random.hpp"

namespace attnx {

// ------------------------------------------------------------------------ layer normalization
// reference: cpp/reference/transformer.hpp, layernorm_forward
// Over the last axis of x (N rows of C features). gamma / beta may be null (scale 1, shift 0).
// mean and rstd (N each) are materialized for the backward pass.
// y[n, c] = (x[n, c] - mean[n]) * rstd[n] * gamma[c] + beta[c],
// mean[n] = sum_c x[n, c] / C,  rstd[n] = 1 / sqrt(sum_c (x[n, c] - mean[n])^2 / C + eps)
template <class T>
void layernorm_forward(T* y, T* mean, T* rstd, const T* x, const T* gamma, const T* beta, size_t N, size_t C,
                       T eps) {
    parallel_for(N, double(N) * C * 4, [&](size_t lo, size_t hi) {
        on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {  // the loops vectorize to each level's width
            for (size_t n = lo; n < hi; ++n) {
                const T* xr = x + n * C;
                T* yr = y + n * C;
                const T m = sum_lanes<T>(C, [&](size_t c) __attribute__((always_inline)) { return xr[c]; }) / T(C);
                // two passes: the one-pass E[x^2] - m^2 loses precision for large means
                const T sq = sum_lanes<T>(
                    C, [&](size_t c) __attribute__((always_inline)) { return (xr[c] - m) * (xr[c] - m); });
                const T s = T(1) / std::sqrt(sq / T(C) + eps);
                for (size_t c = 0; c < C; ++c)
                    yr[c] = (xr[c] - m) * s * (gamma ? gamma[c] : T(1)) + (beta ? beta[c] : T(0));
                mean[n] = m;
                rstd[n] = s;
            }
        });
    });
}

// reference: cpp/reference/transformer.hpp, layernorm_backward
// With xhat = (x - mean) * rstd and g = dy * gamma:
// dx[n, c] = rstd[n] * (g[n, c] - mean_c g[n, :] - xhat[n, c] * mean_c (g[n, :] xhat[n, :])) (overwritten),
// dgamma[c] += sum_n dy[n, c] xhat[n, c],  dbeta[c] += sum_n dy[n, c]. dx may alias dy, or be null.
template <class T>
void layernorm_backward(T* dx, T* dgamma, T* dbeta, const T* dy, const T* x, const T* mean, const T* rstd,
                        const T* gamma, size_t N, size_t C) {
    std::mutex sums_lock;
    parallel_for(N, double(N) * C * 8, [&](size_t lo, size_t hi) {
        // this thread's rows' share of dgamma and dbeta, added in once at the end
        std::vector<T> dgamma_part(dgamma ? C : 0, T(0)), dbeta_part(dbeta ? C : 0, T(0)), g(C), xhat(C);
        on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {  // the loops vectorize to each level's width
            for (size_t n = lo; n < hi; ++n) {
                const T* xr = x + n * C;
                const T* dyr = dy + n * C;
                T* dxr = dx + n * C;
                const T m = mean[n], s = rstd[n];
                for (size_t c = 0; c < C; ++c) xhat[c] = (xr[c] - m) * s;
                for (size_t c = 0; c < C; ++c) g[c] = gamma ? dyr[c] * gamma[c] : dyr[c];
                if (dgamma)
                    for (size_t c = 0; c < C; ++c) dgamma_part[c] += dyr[c] * xhat[c];
                if (dbeta)
                    for (size_t c = 0; c < C; ++c) dbeta_part[c] += dyr[c];
                if (!dx) continue;  // the parameter gradients only (need_dx=False)
                const T g_mean = sum_lanes<T>(C, [&](size_t c) __attribute__((always_inline)) { return g[c]; }) / T(C);
                const T gx_mean =
                    sum_lanes<T>(C, [&](size_t c) __attribute__((always_inline)) { return g[c] * xhat[c]; }) / T(C);
                for (size_t c = 0; c < C; ++c) dxr[c] = s * (g[c] - g_mean - xhat[c] * gx_mean);
            }
        });
        std::lock_guard<std::mutex> guard(sums_lock);
        for (size_t c = 0; c < dgamma_part.size(); ++c) dgamma[c] += dgamma_part[c];
        for (size_t c = 0; c < dbeta_part.size(); ++c) dbeta[c] += dbeta_part[c];
    });
}

// ------------------------------------------------------------------------ positional encodings
// reference: cpp/reference/transformer.hpp, sinusoidal_table
// Sinusoidal table of Vaswani et al. (2017), T positions by D features:
// table[t, 2i] = sin(t / 10000^(2i / D)),  table[t, 2i + 1] = cos(t / 10000^(2i / D))
template <class T>
void sinusoidal_table(T* table, size_t num_positions, size_t D, double max_wavelength = 10000.0) {
    for (size_t t = 0; t < num_positions; ++t)
        for (size_t d = 0; d < D; ++d) {
            const double angle = double(t) / std::pow(max_wavelength, double(d - d % 2) / double(D));
            table[t * D + d] = T(d % 2 == 0 ? std::sin(angle) : std::cos(angle));
        }
}

// reference: cpp/reference/transformer.hpp, add_positions_forward
// y[b, t, :] = x[b, t, :] + table[t, :] for x (B, T, D); y may alias x.
template <class T> void add_positions_forward(T* y, const T* x, const T* table, size_t B, size_t Tn, size_t D) {
    const size_t row = Tn * D;
    for (size_t b = 0; b < B; ++b)
        for (size_t i = 0; i < row; ++i) y[b * row + i] = x[b * row + i] + table[i];
}

// reference: cpp/reference/transformer.hpp, add_positions_backward
// dtable[t, :] += sum_b dy[b, t, :]   (dx = dy needs no kernel)
template <class T> void add_positions_backward(T* dtable, const T* dy, size_t B, size_t Tn, size_t D) {
    const size_t row = Tn * D;
    for (size_t b = 0; b < B; ++b)
        for (size_t i = 0; i < row; ++i) dtable[i] += dy[b * row + i];
}

// ------------------------------------------------------------------------ dropout and residuals
// reference: cpp/reference/transformer.hpp, apply_keep
// y[i] = x[i] * keep[i]: dropout's forward and, applied to dy, its backward. y may alias x.
template <class T> void apply_keep(T* y, const T* x, const T* keep, size_t n) {
    parallel_for(n, double(n), [&](size_t lo, size_t hi) {
        on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {
            for (size_t i = lo; i < hi; ++i) y[i] = x[i] * keep[i];
        });
    });
}

// apply_keep on x (rows, cols) with the mask `drawn` stands for (random.hpp's KeepStream), drawn block by
// block as it is used: the same y, and no (rows, cols) mask written, kept and read back
template <class T> void apply_keep(T* y, const T* x, size_t rows, size_t cols, const KeepStream& drawn) {
    for_keep_blocks<T>(rows, cols, drawn, [&](size_t row, size_t c0, size_t n, const T* keep) __attribute__((always_inline)) {
        const size_t at = row * cols + c0;
        for (size_t j = 0; j < n; ++j) y[at + j] = x[at + j] * keep[j];
    });
}

// reference: cpp/reference/transformer.hpp, residual_add
// y[i] = x[i] + dropout(sub)[i] = x[i] + keep[i] * sub[i]   (keep null: no dropout).
// Its backward needs no kernel of its own: dx = dy, dsub = apply_keep(dy).
template <class T> void residual_add(T* y, const T* x, const T* sub, const T* keep, size_t n) {
    parallel_for(n, double(n), [&](size_t lo, size_t hi) {
        on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {
            if (keep)
                for (size_t i = lo; i < hi; ++i) y[i] = x[i] + keep[i] * sub[i];
            else
                for (size_t i = lo; i < hi; ++i) y[i] = x[i] + sub[i];
        });
    });
}

// residual_add on (rows, cols) with the mask `drawn` stands for, drawn as it is used (apply_keep's)
template <class T>
void residual_add(T* y, const T* x, const T* sub, size_t rows, size_t cols, const KeepStream& drawn) {
    for_keep_blocks<T>(rows, cols, drawn, [&](size_t row, size_t c0, size_t n, const T* keep) __attribute__((always_inline)) {
        const size_t at = row * cols + c0;
        for (size_t j = 0; j < n; ++j) y[at + j] = x[at + j] + keep[j] * sub[at + j];
    });
}

// ------------------------------------------------------------------------ feed-forward (inference)
// reference: cpp/reference/transformer.hpp, feed_forward_forward
// The position-wise feed-forward network of a transformer layer when nothing will run backward
// (training keeps the hidden activations, through two dense layers):
//   y[n, :] = act(x[n, :] . W1 + b1) . W2 + b2          x (N, C), W1 (C, F), W2 (F, OC)
// per block of rows, blocks split across threads: each block's hidden activations (<= 1 MiB)
// stay in the core's cache between the two products instead of making (N, F) round trips.
template <class T>
void feed_forward_forward(T* y, const T* x, const T* W1, const T* b1, const T* W2, const T* b2, int N, int C, int F,
                          int OC, Activation act) {
    const int rows = std::clamp((1 << 18) / std::max(F, 1), 16, 256);
    const size_t blocks = ((size_t)N + rows - 1) / rows;
    parallel_for(blocks, double(N) * F * (C + OC), [&](size_t lo, size_t hi) {
        std::vector<T> hidden((size_t)std::min(rows, N) * F);
        for (size_t block = lo; block < hi; ++block) {
            const int r0 = (int)block * rows, r = std::min(rows, N - r0);
            dense_forward_rows<T>(hidden.data(), hidden.data(), x + (size_t)r0 * C, W1, b1, r, C, F, act);
            dense_forward_rows<T>(y + (size_t)r0 * OC, y + (size_t)r0 * OC, hidden.data(), W2, b2, r, F, OC,
                                  Activation::linear);
        }
    });
}

}  // namespace attnx
