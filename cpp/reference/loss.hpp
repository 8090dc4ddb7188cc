// Reference losses: what loss.hpp's fused loss-and-gradient kernels compute, one element or row at
// a time in double. Each returns loss = sum_i w_i l_i / denom (w null: 1) and writes d loss / d pred.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "reference/activations.hpp"

namespace attnx::reference {

constexpr double kProbEpsilon = 1e-7;  // Keras' backend epsilon

inline double weight_at(const double* w, size_t i) { return w ? w[i] : 1; }
inline double clip(double v, double lo, double hi) { return std::min(std::max(v, lo), hi); }

// l = max(z, 0) - z y + log(1 + exp(-|z|))   (= -y log sigmoid(z) - (1 - y) log(1 - sigmoid(z)))
// => dz = w (sigmoid(z) - y) / denom
inline double bce_logits(double* dz, const double* z, const double* y, const double* w, size_t n, double denom) {
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
        total += weight_at(w, i) * (std::max(z[i], 0.0) - z[i] * y[i] + std::log1p(std::exp(-std::abs(z[i]))));
        dz[i] = weight_at(w, i) * (act(Activation::sigmoid, z[i]) - y[i]) / denom;
    }
    return total / denom;
}

// p_c = clip(p, eps, 1 - eps);  l = -(y log(p_c + eps) + (1 - y) log(1 - p_c + eps))
// => dp = w (-y / (p_c + eps) + (1 - y) / (1 - p_c + eps)) / denom inside (eps, 1 - eps), else 0
inline double bce_probs(double* dp, const double* p, const double* y, const double* w, size_t n, double denom,
                        double eps = kProbEpsilon) {
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
        const double pc = clip(p[i], eps, 1 - eps);
        total -= weight_at(w, i) * (y[i] * std::log(pc + eps) + (1 - y[i]) * std::log(1 - pc + eps));
        const bool inside = p[i] > eps && p[i] < 1 - eps;
        dp[i] = inside ? weight_at(w, i) * (-y[i] / (pc + eps) + (1 - y[i]) / (1 - pc + eps)) / denom : 0;
    }
    return total / denom;
}

// Sparse categorical cross-entropy over rows of K; a row whose label is ignore_index (or whose
// weight is 0) contributes nothing.
// logits: l = log sum_k exp(z_k) - z_y          => dz = w (softmax(z) - onehot(y)) / denom
//   with label smoothing e (PyTorch's), against the target t = (1 - e) onehot(y) + e / K:
//         l = -sum_k t_k log softmax(z)_k        => dz = w (softmax(z) - t) / denom
// probs:  q = p / sum(p);  l = -log clip(q_y)   => dp_k = w (1 / sum(p) - [k == y] / p_y) / denom inside the clip, else 0
inline double sparse_cce(double* dz, const double* z, const int64_t* labels, const double* w, size_t rows, size_t K,
                         bool from_logits, int64_t ignore_index, double denom, double label_smoothing = 0,
                         double eps = kProbEpsilon) {
    double total = 0;
    std::vector<double> soft(K);
    for (size_t r = 0; r < rows; ++r) {
        const double* zr = z + r * K;
        double* dzr = dz + r * K;
        const int64_t y = labels[r];
        const double wr = weight_at(w, r);
        std::fill(dzr, dzr + K, 0.0);
        if (y == ignore_index || wr == 0) continue;
        if (from_logits) {
            softmax_forward(soft.data(), zr, nullptr, 1, K);
            const double e = label_smoothing;
            for (size_t k = 0; k < K; ++k) {
                const double target = (1 - e) * (k == (size_t)y) + e / double(K);
                if (target != 0) total -= wr * target * std::log(soft[k]);  // not 0 log 0
                dzr[k] = wr * (soft[k] - target) / denom;
            }
        } else {
            double sum = 0;
            for (size_t k = 0; k < K; ++k) sum += zr[k];
            const double q = zr[y] / sum;
            total -= wr * std::log(clip(q, eps, 1 - eps));
            if (!(q > eps && q < 1 - eps)) continue;
            for (size_t k = 0; k < K; ++k) dzr[k] = wr * (1 / sum - (k == (size_t)y) / zr[y]) / denom;
        }
    }
    return total / denom;
}

// Categorical cross-entropy against (soft) targets y over rows of K.
// logits: l = -sum_k y_k log softmax(z)_k       => dz = w (softmax(z) sum_k y_k - y) / denom
// probs:  q = p / sum(p);  l = -sum_k y_k log clip(q_k)
//         => dp_k = w (-y_k / p_k [q_k inside] + sum_j y_j [q_j inside] / sum(p)) / denom
inline double categorical_cce(double* dz, const double* z, const double* y, const double* w, size_t rows, size_t K,
                              bool from_logits, double denom, double eps = kProbEpsilon) {
    double total = 0;
    std::vector<double> soft(K);
    for (size_t r = 0; r < rows; ++r) {
        const double *zr = z + r * K, *yr = y + r * K;
        double* dzr = dz + r * K;
        const double wr = weight_at(w, r);
        double ysum = 0;
        for (size_t k = 0; k < K; ++k) ysum += yr[k];
        if (from_logits) {
            softmax_forward(soft.data(), zr, nullptr, 1, K);
            for (size_t k = 0; k < K; ++k) {
                total -= wr * yr[k] * std::log(soft[k]);
                dzr[k] = wr * (soft[k] * ysum - yr[k]) / denom;
            }
        } else {
            double sum = 0, dsum = 0;
            for (size_t k = 0; k < K; ++k) sum += zr[k];
            for (size_t k = 0; k < K; ++k) {
                const double q = zr[k] / sum;
                total -= wr * yr[k] * std::log(clip(q, eps, 1 - eps));
                const bool inside = q > eps && q < 1 - eps;
                dzr[k] = inside ? -yr[k] / zr[k] : 0;
                if (inside) dsum += yr[k] / sum;
            }
            for (size_t k = 0; k < K; ++k) dzr[k] = wr * (dzr[k] + dsum) / denom;
        }
    }
    return total / denom;
}

// l = (p - y)^2  =>  dp = 2 w (p - y) / denom
inline double mse(double* dp, const double* p, const double* y, const double* w, size_t n, double denom) {
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
        total += weight_at(w, i) * (p[i] - y[i]) * (p[i] - y[i]);
        dp[i] = 2 * weight_at(w, i) * (p[i] - y[i]) / denom;
    }
    return total / denom;
}

}  // namespace attnx::reference
