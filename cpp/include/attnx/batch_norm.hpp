// Batch normalization (Keras' BatchNormalization): each channel of the feature axis normalized by the
// batch's mean and variance over every other axis (training, where the moving statistics move) or by
// the moving statistics (inference). x is read as (outer, C, inner), row-major: C the feature axis,
// outer the axes before it, inner those after it. inner = 1 (channels last) is the fast path: its
// loops run along the channels of a row, so they vectorize without a reduction.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "attnx/activations.hpp"
#include "attnx/parallel.hpp"

namespace attnx {

// Keras adds backend.epsilon() to the count of a masked mean and variance
constexpr double kMaskedCountEpsilon = 1e-7;

struct BatchNormConfig {
    size_t outer = 0, C = 0, inner = 1;  // x (outer, C, inner)
    // Elements of x each mask flag covers, in x's order: a (B, T) mask of x (B, T, ...) covers the
    // product of x's axes after the second, a multiple of inner since the feature axis is not the batch's
    size_t mask_span = 1;
    bool batch_statistics = false;  // the batch's mean and variance (training), else the moving ones
    double momentum = 0.99, epsilon = 1e-3;
};

namespace batch_norm_detail {

// T partial sums over blocks of rows (channels last) or of a run's elements, added into double: one
// float sum over millions of rows would lose digits
constexpr size_t kBlockRows = 256, kBlockRun = 4096;

// The channel-last loops need one mask flag per row of C channels
inline bool channels_last(const BatchNormConfig& cfg, const uint8_t* mask) {
    return cfg.inner == 1 && (!mask || cfg.mask_span % cfg.C == 0);
}

// sums[k * C + c] = sum over the elements e of channel c of terms(e, c, w_e)[k], w_e the element's mask
// flag (1 without a mask); overwritten
template <class T, size_t K, class Terms>
void channel_sums(const BatchNormConfig& cfg, const uint8_t* mask, double* sums, Terms&& terms) {
    const size_t C = cfg.C, inner = cfg.inner, span = cfg.mask_span;
    std::fill(sums, sums + K * C, 0.0);
    std::mutex sums_lock;
    parallel_for(cfg.outer, double(cfg.outer) * C * inner * K * 2, [&](size_t lo, size_t hi) {
        std::vector<double> part(K * C, 0.0);  // this thread's rows' share, added in once at the end
        std::vector<T> block(K * C);
        on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {  // the loops vectorize to each level's width
            if (channels_last(cfg, mask)) {
                for (size_t r0 = lo; r0 < hi; r0 += kBlockRows) {
                    std::fill(block.begin(), block.end(), T(0));
                    for (size_t r = r0; r < std::min(hi, r0 + kBlockRows); ++r) {
                        const T w = mask ? T(mask[r * C / span]) : T(1);
                        for (size_t c = 0; c < C; ++c) {
                            const std::array<T, K> t = terms(r * C + c, c, w);
                            for (size_t k = 0; k < K; ++k) block[k * C + c] += t[k];
                        }
                    }
                    for (size_t i = 0; i < K * C; ++i) part[i] += block[i];
                }
                return;
            }
            for (size_t o = lo; o < hi; ++o)
                for (size_t c = 0; c < C; ++c) {
                    const size_t e0 = (o * C + c) * inner;
                    const T w = mask ? T(mask[e0 / span]) : T(1);
                    for (size_t i0 = 0; i0 < inner; i0 += kBlockRun)
                        for (size_t k = 0; k < K; ++k)
                            part[k * C + c] += sum_lanes<T>(
                                std::min(kBlockRun, inner - i0),
                                [&](size_t i) __attribute__((always_inline)) { return terms(e0 + i0 + i, c, w)[k]; });
                }
        });
        std::lock_guard<std::mutex> guard(sums_lock);
        for (size_t i = 0; i < K * C; ++i) sums[i] += part[i];
    });
}

// fn(e, c, w_e) for every element e of x (channel c, mask flag w_e), split across the thread budget
template <class T, class Fn> void for_each_element(const BatchNormConfig& cfg, const uint8_t* mask, Fn&& fn) {
    const size_t C = cfg.C, inner = cfg.inner, span = cfg.mask_span;
    parallel_for(cfg.outer, double(cfg.outer) * C * inner * 2, [&](size_t lo, size_t hi) {
        on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {
            if (channels_last(cfg, mask)) {
                for (size_t r = lo; r < hi; ++r) {
                    const T w = mask ? T(mask[r * C / span]) : T(1);
                    for (size_t c = 0; c < C; ++c) fn(r * C + c, c, w);
                }
                return;
            }
            for (size_t o = lo; o < hi; ++o)
                for (size_t c = 0; c < C; ++c) {
                    const size_t e0 = (o * C + c) * inner;
                    const T w = mask ? T(mask[e0 / span]) : T(1);
                    for (size_t i = 0; i < inner; ++i) fn(e0 + i, c, w);
                }
        });
    });
}

}  // namespace batch_norm_detail

// reference: cpp/reference/batch_norm.hpp, batch_norm_forward
// Outputs y (like x) and, per channel, mean, rstd and (batch statistics only) count; gamma / beta may be
// null (scale 1, shift 0); mask (one flag per mask_span elements) may be null.
// Batch statistics, w_e the mask flag of element e (1 without a mask), sums over channel c's elements:
//   count[c] = sum_e w_e (+ kMaskedCountEpsilon with a mask),  mean[c] = sum_e w_e x_e / count[c],
//   var[c] = sum_e w_e (x_e - mean[c])^2 / count[c]
//   moving_mean[c] = moving_mean[c] momentum + mean[c] (1 - momentum), moving_variance likewise with var
// Moving statistics: mean = moving_mean, var = moving_variance (neither written, count not written).
// An empty batch (no elements per channel) has no statistics: it reads the moving ones, which do not
// move, and its count is 0.
// rstd[c] = 1 / sqrt(var[c] + epsilon),  y_e = (x_e - mean[c]) rstd[c] gamma[c] + beta[c]
template <class T>
void batch_norm_forward(const BatchNormConfig& cfg, T* y, T* mean, T* rstd, T* count, T* moving_mean,
                        T* moving_variance, const T* x, const T* gamma, const T* beta, const uint8_t* mask) {
    using namespace batch_norm_detail;
    const size_t C = cfg.C;
    if (cfg.batch_statistics && cfg.outer * cfg.inner == 0) std::fill(count, count + C, T(0));
    if (cfg.batch_statistics && cfg.outer * cfg.inner > 0) {
        std::vector<double> sums(2 * C), n(C);
        channel_sums<T, 2>(cfg, mask, sums.data(), [&](size_t e, size_t, T w) __attribute__((always_inline)) {
            return std::array<T, 2>{w, w * x[e]};
        });
        for (size_t c = 0; c < C; ++c) {
            n[c] = mask ? sums[c] + kMaskedCountEpsilon : double(cfg.outer * cfg.inner);
            count[c] = T(n[c]);
            mean[c] = T(sums[C + c] / n[c]);
        }
        // a second pass for the variance: E[x^2] - mean^2 cancels for large means
        channel_sums<T, 1>(cfg, mask, sums.data(), [&](size_t e, size_t c, T w) __attribute__((always_inline)) {
            const T d = x[e] - mean[c];
            return std::array<T, 1>{w * d * d};
        });
        const T momentum = T(cfg.momentum);
        for (size_t c = 0; c < C; ++c) {
            const double var = sums[c] / n[c];
            moving_mean[c] = moving_mean[c] * momentum + mean[c] * (T(1) - momentum);
            moving_variance[c] = moving_variance[c] * momentum + T(var) * (T(1) - momentum);
            rstd[c] = T(1 / std::sqrt(var + cfg.epsilon));
        }
    } else {
        for (size_t c = 0; c < C; ++c) {
            mean[c] = moving_mean[c];
            rstd[c] = T(1 / std::sqrt(double(moving_variance[c]) + cfg.epsilon));
        }
    }
    std::vector<T> scale(C), shift(C);
    for (size_t c = 0; c < C; ++c) {
        scale[c] = rstd[c] * (gamma ? gamma[c] : T(1));
        shift[c] = beta ? beta[c] : T(0);
    }
    for_each_element<T>(cfg, nullptr, [&](size_t e, size_t c, T) __attribute__((always_inline)) {
        y[e] = (x[e] - mean[c]) * scale[c] + shift[c];
    });
}

// reference: cpp/reference/batch_norm.hpp, batch_norm_backward
// y_e = xhat_e gamma + beta, xhat_e = (x_e - mean) rstd  (per channel; sums over its elements):
//   dbeta[c] += sum_e dy_e,  dgamma[c] += rstd sum_e dy_e (x_e - mean)      (each null: skipped)
// Moving statistics (constants): dx_e = gamma rstd dy_e.
// Batch statistics, n = count[c], mean = sum_e w_e x_e / n, var = sum_e w_e (x_e - mean)^2 / n:
//   dvar  = -rstd^3 / 2 gamma sum_e dy_e (x_e - mean)
//   dmean = -rstd gamma sum_e dy_e + dvar (-2 sum_e w_e (x_e - mean) / n)   (the second term is zero
//           but for the masked count's epsilon)
//   dx_e  = gamma rstd dy_e + w_e (dmean + 2 (x_e - mean) dvar) / n
// dx is overwritten, or null to skip it; count is read with batch statistics only.
template <class T>
void batch_norm_backward(const BatchNormConfig& cfg, T* dx, T* dgamma, T* dbeta, const T* dy, const T* x,
                         const T* mean, const T* rstd, const T* count, const T* gamma, const uint8_t* mask) {
    using namespace batch_norm_detail;
    const size_t C = cfg.C;
    std::vector<double> sums(3 * C);
    channel_sums<T, 3>(cfg, mask, sums.data(), [&](size_t e, size_t c, T w) __attribute__((always_inline)) {
        const T d = x[e] - mean[c];
        return std::array<T, 3>{dy[e], dy[e] * d, w * d};
    });
    const double* sum_dy = sums.data();
    const double* sum_dy_centered = sums.data() + C;
    const double* sum_w_centered = sums.data() + 2 * C;
    for (size_t c = 0; c < C; ++c) {
        if (dbeta) dbeta[c] += T(sum_dy[c]);
        if (dgamma) dgamma[c] += T(rstd[c] * sum_dy_centered[c]);
    }
    if (!dx) return;
    // dx_e = direct[c] dy_e + w_e (offset[c] + slope[c] (x_e - mean[c]))
    std::vector<T> direct(C), offset(C, T(0)), slope(C, T(0));
    for (size_t c = 0; c < C; ++c) {
        const double g = gamma ? gamma[c] : 1.0, s = rstd[c];
        direct[c] = T(g * s);
        const double n = cfg.batch_statistics ? double(count[c]) : 0.0;
        if (n == 0) continue;  // the moving statistics (constants), or an empty batch
        const double dvar = -0.5 * s * s * s * g * sum_dy_centered[c];
        const double dmean = -s * g * sum_dy[c] + dvar * (-2 * sum_w_centered[c] / n);
        offset[c] = T(dmean / n);
        slope[c] = T(2 * dvar / n);
    }
    for_each_element<T>(cfg, mask, [&](size_t e, size_t c, T w) __attribute__((always_inline)) {
        dx[e] = direct[c] * dy[e] + w * (offset[c] + slope[c] * (x[e] - mean[c]));
    });
}

}  // namespace attnx
