// Losses fused with their gradient: each returns the reduced loss and writes d(loss)/d(pred).
// Reduction: loss = sum_i w_i * l_i / denom, with w_i = 1 where no weights are given. The caller
// picks denom (element count for Keras' sum_over_batch_size, or the unmasked count).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "attnx/activations.hpp"
#include "attnx/parallel.hpp"

namespace attnx {

constexpr double kProbEpsilon = 1e-7;  // Keras' backend epsilon for losses on probabilities

template <class T> inline T weight_at(const T* w, size_t i) { return w ? w[i] : T(1); }

// max_k x[k] (n >= 1), four running maxima so that the loop vectorizes
template <class T> T row_max(const T* x, size_t n) {
    T m[4] = {x[0], x[0], x[0], x[0]};
    size_t k = 0;
    for (; k + 4 <= n; k += 4)
        for (int j = 0; j < 4; ++j) m[j] = x[k + j] > m[j] ? x[k + j] : m[j];
    for (; k < n; ++k) m[0] = x[k] > m[0] ? x[k] : m[0];
    return std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
}

// The first k with x[k] = max x (n >= 1), as np.argmax; 0 if x[0] is NaN. The maximum first, in
// vectorized passes, then a scan for it: std::max_element's one compare-and-branch per value cost
// 0.25 ms per greedy decoding step at B = 64, V = 8000.
template <class T> size_t row_argmax(const T* x, size_t n) {
    const T m = row_max(x, n);
    for (size_t k = 0; k < n; ++k)
        if (x[k] == m) return k;
    return 0;
}

// dst[k] = e^(src[k] - shift) for k < n (activations.hpp's exp kernel); returns their sum in double
template <class T> double exp_shifted(T* dst, const T* src, size_t n, T shift) {
    for (size_t k = 0; k < n; ++k) dst[k] = src[k] - shift;
    exp_array(dst, dst, n);
    return sum_lanes<double>(n, [&](size_t k) { return double(dst[k]); });
}

// reference: cpp/reference/loss.hpp, bce_logits
// l = max(z, 0) - z y + log(1 + exp(-|z|)),  dl/dz = sigmoid(z) - y
template <class T>
T bce_logits(T* dz, const T* z, const T* y, const T* w, size_t n, T denom) {
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
        const T wi = weight_at(w, i);
        total += double(wi) * (std::max(z[i], T(0)) - z[i] * y[i] + std::log1p(std::exp(-std::abs(z[i]))));
        dz[i] = wi * (sigmoid(z[i]) - y[i]) / denom;
    }
    return T(total / double(denom));
}

// reference: cpp/reference/loss.hpp, bce_probs
// Keras: p_c = clip(p, eps, 1 - eps); l = -(y log(p_c + eps) + (1 - y) log(1 - p_c + eps));
// the clip stops the gradient outside (eps, 1 - eps).
template <class T>
T bce_probs(T* dp, const T* p, const T* y, const T* w, size_t n, T denom) {
    const T eps = T(kProbEpsilon);
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
        const T wi = weight_at(w, i);
        const T pc = std::min(std::max(p[i], eps), T(1) - eps);
        total -= double(wi) * (y[i] * std::log(pc + eps) + (T(1) - y[i]) * std::log(T(1) - pc + eps));
        const bool inside = p[i] > eps && p[i] < T(1) - eps;
        dp[i] = inside ? wi * (-y[i] / (pc + eps) + (T(1) - y[i]) / (T(1) - pc + eps)) / denom : T(0);
    }
    return T(total / double(denom));
}

// reference: cpp/reference/loss.hpp, sparse_cce
// Sparse categorical cross-entropy over rows of K scores; label == ignore_index contributes nothing.
// from logits: l = logsumexp(z) - z[y],  dz = softmax(z) - onehot(y)
//   with label smoothing e (from logits only), the log-sum-exp of the smoothed target's terms cancels:
//   l += e (z[y] - mean_k z),  dz += e (onehot(y) - 1 / K)   (in the row's pass: a pass of its own over
//   the (B T, V) logits ran on one core, 4 ms per Transformer step at V = 8000)
// from probs (Keras): q = p / sum(p), q_c = clip(q, eps, 1 - eps), l = -log(q_c[y]),
//                     dp_k = -[k == y] / p_y + 1 / sum(p)   while q[y] is inside the clip range
template <class T>
T sparse_cce(T* dz, const T* z, const int64_t* labels, const T* w, size_t rows, size_t K, bool from_logits,
             int64_t ignore_index, T denom, double label_smoothing = 0) {
    const T eps = T(kProbEpsilon);
    std::vector<double> row_loss(rows, 0.0);  // rows run in parallel; summed in order afterwards
    parallel_for(rows, double(rows) * K * 4, [&](size_t lo, size_t hi) {
        for (size_t r = lo; r < hi; ++r) {
            const T* zr = z + r * K;
            T* dzr = dz + r * K;
            const int64_t label = labels[r];
            const T wr = weight_at(w, r);
            if (label == ignore_index || wr == T(0)) { std::fill(dzr, dzr + K, T(0)); continue; }
            if (from_logits) {
                // one exp per score: dz holds exp(z - max) until it is normalised into softmax - onehot
                const T maxv = row_max(zr, K);
                const double sum = exp_shifted(dzr, zr, K, maxv);
                row_loss[r] = double(wr) * (std::log(sum) + double(maxv) - double(zr[label]));
                const T scale = T(double(wr) / (double(denom) * sum));
                for (size_t k = 0; k < K; ++k) dzr[k] *= scale;
                dzr[label] -= wr / denom;
                if (label_smoothing) {
                    const double z_mean = sum_lanes<double>(K, [&](size_t k) { return double(zr[k]); }) / double(K);
                    row_loss[r] += label_smoothing * double(wr) * (double(zr[label]) - z_mean);
                    const T share = wr / denom, spread = T(label_smoothing / double(K)) * share;
                    for (size_t k = 0; k < K; ++k) dzr[k] -= spread;
                    dzr[label] += T(label_smoothing) * share;
                }
            } else {
                T sum = 0;
                for (size_t k = 0; k < K; ++k) sum += zr[k];
                const T q = zr[label] / sum;
                const T qc = std::min(std::max(q, eps), T(1) - eps);
                row_loss[r] = -double(wr) * std::log(qc);
                const bool inside = q > eps && q < T(1) - eps;
                for (size_t k = 0; k < K; ++k) dzr[k] = inside ? wr * (T(1) / sum) / denom : T(0);
                if (inside) dzr[label] -= wr / (zr[label] * denom);
            }
        }
    });
    double total = 0;
    for (double l : row_loss) total += l;
    return T(total / double(denom));
}

// reference: cpp/reference/loss.hpp, categorical_cce
// Categorical cross-entropy against (soft) one-hot targets y over rows of K scores.
// from logits: l = logsumexp(z) sum_k y_k - sum_k y_k z_k,  dz = softmax(z) sum_k y_k - y
// from probs (Keras): q = p / sum(p), clipped; l = -sum_k y_k log q_k
template <class T>
T categorical_cce(T* dz, const T* z, const T* y, const T* w, size_t rows, size_t K, bool from_logits, T denom) {
    const T eps = T(kProbEpsilon);
    double total = 0;
    for (size_t r = 0; r < rows; ++r) {
        const T* zr = z + r * K;
        const T* yr = y + r * K;
        T* dzr = dz + r * K;
        const T wr = weight_at(w, r);
        T ysum = 0;
        for (size_t k = 0; k < K; ++k) ysum += yr[k];
        if (from_logits) {
            T maxv = *std::max_element(zr, zr + K);
            double sum = 0;
            for (size_t k = 0; k < K; ++k) sum += std::exp(double(zr[k] - maxv));
            const double lse = std::log(sum) + double(maxv);
            double l = 0;
            for (size_t k = 0; k < K; ++k) l += double(yr[k]) * (lse - double(zr[k]));
            total += double(wr) * l;
            softmax_rows(dzr, zr, 1, K);
            for (size_t k = 0; k < K; ++k) dzr[k] = wr * (dzr[k] * ysum - yr[k]) / denom;
        } else {
            T sum = 0;
            for (size_t k = 0; k < K; ++k) sum += zr[k];
            T dsum = 0;  // d l / d sum, from the normalisation
            for (size_t k = 0; k < K; ++k) {
                const T q = zr[k] / sum;
                const bool inside = q > eps && q < T(1) - eps;
                total -= double(wr) * double(yr[k]) * std::log(std::min(std::max(q, eps), T(1) - eps));
                dzr[k] = inside ? -yr[k] / zr[k] : T(0);
                if (inside) dsum += yr[k] / sum;
            }
            for (size_t k = 0; k < K; ++k) dzr[k] = wr * (dzr[k] + dsum) / denom;
        }
    }
    return T(total / double(denom));
}

// reference: cpp/reference/loss.hpp, mse
// l = (p - y)^2,  dl/dp = 2 (p - y)
template <class T>
T mse(T* dp, const T* p, const T* y, const T* w, size_t n, T denom) {
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
        const T wi = weight_at(w, i);
        const T diff = p[i] - y[i];
        total += double(wi) * double(diff) * double(diff);
        dp[i] = T(2) * wi * diff / denom;
    }
    return T(total / double(denom));
}

}  // namespace attnx
