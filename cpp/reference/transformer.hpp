// Reference transformer pieces: what transformer.hpp computes (layer normalization, the sinusoidal
// positions, dropout's keep mask, residual adds, the inference feed-forward), one value at a time
// in double.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "reference/dense.hpp"

namespace attnx::reference {

// mean[n] = sum_c x[n, c] / C;  rstd[n] = 1 / sqrt(sum_c (x[n, c] - mean[n])^2 / C + eps)
// y[n, c] = (x[n, c] - mean[n]) rstd[n] gamma[c] + beta[c]      (gamma, beta null: 1, 0)
inline void layernorm_forward(double* y, double* mean, double* rstd, const double* x, const double* gamma,
                              const double* beta, size_t N, size_t C, double eps) {
    for (size_t n = 0; n < N; ++n) {
        double m = 0, var = 0;
        for (size_t c = 0; c < C; ++c) m += x[n * C + c];
        m /= C;
        for (size_t c = 0; c < C; ++c) var += (x[n * C + c] - m) * (x[n * C + c] - m);
        var /= C;
        mean[n] = m, rstd[n] = 1 / std::sqrt(var + eps);
        for (size_t c = 0; c < C; ++c)
            y[n * C + c] = (x[n * C + c] - m) * rstd[n] * (gamma ? gamma[c] : 1) + (beta ? beta[c] : 0);
    }
}

// y = xhat gamma + beta,  xhat = (x - mean) rstd
// => dgamma[c] += sum_n dy xhat,  dbeta[c] += sum_n dy,  with g = dy gamma:
//    dx[n, c] = rstd (g - mean_c g - xhat mean_c (g xhat))  (overwritten; dx null: skipped)
inline void layernorm_backward(double* dx, double* dgamma, double* dbeta, const double* dy, const double* x,
                               const double* mean, const double* rstd, const double* gamma, size_t N, size_t C) {
    for (size_t n = 0; n < N; ++n) {
        double g_mean = 0, gx_mean = 0;
        for (size_t c = 0; c < C; ++c) {
            const double xhat = (x[n * C + c] - mean[n]) * rstd[n], g = dy[n * C + c] * (gamma ? gamma[c] : 1);
            if (dgamma) dgamma[c] += dy[n * C + c] * xhat;
            if (dbeta) dbeta[c] += dy[n * C + c];
            g_mean += g / C, gx_mean += g * xhat / C;
        }
        if (!dx) continue;
        for (size_t c = 0; c < C; ++c) {
            const double xhat = (x[n * C + c] - mean[n]) * rstd[n], g = dy[n * C + c] * (gamma ? gamma[c] : 1);
            dx[n * C + c] = rstd[n] * (g - g_mean - xhat * gx_mean);
        }
    }
}

// table[t, d] = sin(t / 10000^(2i / D)) for d = 2i, cos(t / 10000^(2i / D)) for d = 2i + 1
inline void sinusoidal_table(double* table, size_t T, size_t D, double max_wavelength = 10000.0) {
    for (size_t t = 0; t < T; ++t)
        for (size_t i = 0; 2 * i < D; ++i) {
            const double angle = t / std::pow(max_wavelength, 2.0 * i / D);
            table[t * D + 2 * i] = std::sin(angle);
            if (2 * i + 1 < D) table[t * D + 2 * i + 1] = std::cos(angle);
        }
}

// y[b, t, d] = x[b, t, d] + table[t, d]
inline void add_positions_forward(double* y, const double* x, const double* table, size_t B, size_t T, size_t D) {
    for (size_t b = 0; b < B; ++b)
        for (size_t i = 0; i < T * D; ++i) y[b * T * D + i] = x[b * T * D + i] + table[i];
}

// y[b, t, d] = x[b, t, d] + table[t, d]  =>  dtable[t, d] += sum_b dy[b, t, d]
inline void add_positions_backward(double* dtable, const double* dy, size_t B, size_t T, size_t D) {
    for (size_t b = 0; b < B; ++b)
        for (size_t i = 0; i < T * D; ++i) dtable[i] += dy[b * T * D + i];
}

// y = x keep (dropout; applied to dy, its backward)
inline void apply_keep(double* y, const double* x, const double* keep, size_t n) {
    for (size_t i = 0; i < n; ++i) y[i] = x[i] * keep[i];
}

// y = x + keep sub (keep null: 1)
inline void residual_add(double* y, const double* x, const double* sub, const double* keep, size_t n) {
    for (size_t i = 0; i < n; ++i) y[i] = x[i] + (keep ? keep[i] : 1) * sub[i];
}

// y = act(x W1 + b1) W2 + b2
inline void feed_forward_forward(double* y, const double* x, const double* W1, const double* b1, const double* W2,
                                 const double* b2, int N, int C, int F, int OC, Activation a) {
    std::vector<double> z((size_t)N * F), hidden((size_t)N * F), z2((size_t)N * OC);
    dense_forward(hidden.data(), z.data(), x, W1, b1, N, C, F, a);
    dense_forward(y, z2.data(), hidden.data(), W2, b2, N, F, OC, Activation::linear);
}

}  // namespace attnx::reference
