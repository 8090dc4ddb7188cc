// Batch normalization (Keras' BatchNormalization): each channel of the feature axis normalized by the
// batch's mean and variance over every other axis (training, where the moving statistics move) or by
// the moving statistics (inference). x is read as (outer, C, inner), row-major: C the feature axis,
// outer the axes before it, inner those after it. Every loop reads x in memory order, in one of two
// layouts: rows of C channels (inner = 1, channels last), whose sums add each row into a row of
// per-channel accumulators (column vectors across rows); or runs of `inner` contiguous elements of one
// channel (channels first, e.g. an image's pixels), each reduced on its own.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <type_traits>
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

// T partial sums over blocks of rows or of a run's elements, added into double: one float sum over
// millions of elements would lose digits
constexpr size_t kBlockRows = 64, kBlockRun = 4096;
// A run's sums keep this many partial sums each (two AVX-512 vectors of floats; four SSE2 vectors of
// doubles), so that the adds do not wait on each other
template <class T> constexpr size_t kRunLanes = std::is_same_v<T, float> ? 32 : 8;
// A pass over x splits across threads from this many elements on: below it a thread's wake-up
// costs more than the half pass it saves
constexpr double kParallelMinElements = 1 << 17;

// The mask's flags are constant along a run (mask_span is a multiple of inner). The rows layout needs
// one flag per row: a (B, T, 1) mask on axis 1 has one per element, and takes the runs layout.
inline bool rows_layout(const BatchNormConfig& cfg, const uint8_t* mask) {
    return cfg.inner == 1 && (!mask || cfg.mask_span % cfg.C == 0);
}

// for_each_span(lo, hi) over the rows (rows layout) or runs (o C + c, runs layout) of x, split across the
// thread budget when x is large enough
template <class Fn> void split_x(const BatchNormConfig& cfg, const uint8_t* mask, Fn&& for_each_span) {
    const size_t spans = rows_layout(cfg, mask) ? cfg.outer : cfg.outer * cfg.C;
    const double elements = double(cfg.outer) * cfg.C * cfg.inner;
    parallel_for(spans, elements < kParallelMinElements ? 0.0 : elements * 2, for_each_span);
}

// sums[k * C + c] = sum over the elements e of channel c of terms(e, c, w_e)[k], w_e the element's
// mask flag (masked: a template constant 1 without a mask, so that w * ... folds away); overwritten.
// terms is an always-inline lambda of float arithmetic that vectorizes along a row or a run.
template <class T, size_t K, bool masked, class Terms>
void channel_sums(const BatchNormConfig& cfg, const uint8_t* mask, double* sums, Terms&& terms) {
    const size_t C = cfg.C, inner = cfg.inner, span = cfg.mask_span;
    std::fill(sums, sums + K * C, 0.0);
    std::mutex sums_lock;
    split_x(cfg, mask, [&](size_t lo, size_t hi) {
        std::vector<double> part(K * C, 0.0);  // this thread's share, added in once at the end
        on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {  // the loops vectorize to each level's width
            if (rows_layout(cfg, mask)) {
                // acc[k C + c] += terms(row r, c)[k]: each row added into a row of accumulators
                std::vector<T> block(K * C);
                T* acc = block.data();
                for (size_t r0 = lo; r0 < hi; r0 += kBlockRows) {
                    std::fill(acc, acc + K * C, T(0));
                    for (size_t r = r0; r < std::min(hi, r0 + kBlockRows); ++r) {
                        if constexpr (masked) {
                            const T w = T(mask[r * C / span]);
                            for (size_t c = 0; c < C; ++c) {
                                const std::array<T, K> t = terms(r * C + c, c, w);
                                for (size_t k = 0; k < K; ++k) acc[k * C + c] += t[k];
                            }
                        } else {
                            for (size_t c = 0; c < C; ++c) {
                                const std::array<T, K> t = terms(r * C + c, c, T(1));
                                for (size_t k = 0; k < K; ++k) acc[k * C + c] += t[k];
                            }
                        }
                    }
                    for (size_t i = 0; i < K * C; ++i) part[i] += acc[i];
                }
                return;
            }
            // each run (o, c) of inner contiguous elements summed in kRunLanes<T> partial sums per term
            constexpr size_t L = kRunLanes<T>;
            for (size_t run = lo; run < hi; ++run) {
                const size_t c = run % C, e0 = run * inner;
                const T w = masked ? T(mask[e0 / span]) : T(1);
                for (size_t i0 = 0; i0 < inner; i0 += kBlockRun) {
                    const size_t n = std::min(kBlockRun, inner - i0), body = n - n % L, e1 = e0 + i0;
                    T lanes[K][L] = {};
                    for (size_t i = 0; i < body; i += L)
                        for (size_t j = 0; j < L; ++j) {
                            const std::array<T, K> t = terms(e1 + i + j, c, w);
                            for (size_t k = 0; k < K; ++k) lanes[k][j] += t[k];
                        }
                    for (size_t k = 0; k < K; ++k) {
                        T sum = 0;
                        for (size_t i = body; i < n; ++i) sum += terms(e1 + i, c, w)[k];
                        for (size_t j = 0; j < L; ++j) sum += lanes[k][j];
                        part[k * C + c] += sum;
                    }
                }
            }
        });
        std::lock_guard<std::mutex> guard(sums_lock);
        for (size_t i = 0; i < K * C; ++i) sums[i] += part[i];
    });
}

// fn(e, c, w_e) for every element e of x (channel c, mask flag w_e: a constant 1 unless masked), split
// across the thread budget
template <class T, bool masked, class Fn> void for_each_element(const BatchNormConfig& cfg, const uint8_t* mask, Fn&& fn) {
    const size_t C = cfg.C, inner = cfg.inner, span = cfg.mask_span;
    split_x(cfg, mask, [&](size_t lo, size_t hi) {
        on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {
            if (rows_layout(cfg, mask)) {
                for (size_t r = lo; r < hi; ++r) {
                    const T w = masked ? T(mask[r * C / span]) : T(1);
                    for (size_t c = 0; c < C; ++c) fn(r * C + c, c, w);
                }
                return;
            }
            for (size_t run = lo; run < hi; ++run) {
                const size_t c = run % C, e0 = run * inner;
                const T w = masked ? T(mask[e0 / span]) : T(1);
                for (size_t i = 0; i < inner; ++i) fn(e0 + i, c, w);
            }
        });
    });
}

// n[c] = the number of unmasked elements of channel c (mask null: outer inner), from the mask alone
inline void channel_counts(const BatchNormConfig& cfg, const uint8_t* mask, double* n) {
    const size_t C = cfg.C;
    if (!mask) {
        std::fill(n, n + C, double(cfg.outer * cfg.inner));
    } else if (rows_layout(cfg, mask)) {
        size_t rows = 0;
        for (size_t r = 0; r < cfg.outer; ++r) rows += mask[r * C / cfg.mask_span] != 0;
        std::fill(n, n + C, double(rows));
    } else {
        std::fill(n, n + C, 0.0);
        for (size_t run = 0; run < cfg.outer * C; ++run)
            n[run % C] += mask[run * cfg.inner / cfg.mask_span] ? double(cfg.inner) : 0.0;
    }
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
    // per channel, as locals the loops read without doubt of aliasing y
    std::vector<T> centre(C), scale(C), shift(C);
    if (cfg.batch_statistics && cfg.outer * cfg.inner == 0) std::fill(count, count + C, T(0));
    if (cfg.batch_statistics && cfg.outer * cfg.inner > 0) {
        std::vector<double> sums(C), n(C);
        channel_counts(cfg, mask, n.data());
        auto weighted_x = [&](size_t e, size_t, T w) __attribute__((always_inline)) {
            return std::array<T, 1>{w * x[e]};
        };
        if (mask) channel_sums<T, 1, true>(cfg, mask, sums.data(), weighted_x);
        else channel_sums<T, 1, false>(cfg, mask, sums.data(), weighted_x);
        for (size_t c = 0; c < C; ++c) {
            if (mask) n[c] += kMaskedCountEpsilon;
            count[c] = T(n[c]);
            centre[c] = mean[c] = T(sums[c] / n[c]);
        }
        // a second pass for the variance: E[x^2] - mean^2 cancels for large means
        auto weighted_square = [&](size_t e, size_t c, T w) __attribute__((always_inline)) {
            const T d = x[e] - centre[c];
            return std::array<T, 1>{w * d * d};
        };
        if (mask) channel_sums<T, 1, true>(cfg, mask, sums.data(), weighted_square);
        else channel_sums<T, 1, false>(cfg, mask, sums.data(), weighted_square);
        const T momentum = T(cfg.momentum);
        for (size_t c = 0; c < C; ++c) {
            const double var = sums[c] / n[c];
            moving_mean[c] = moving_mean[c] * momentum + mean[c] * (T(1) - momentum);
            moving_variance[c] = moving_variance[c] * momentum + T(var) * (T(1) - momentum);
            rstd[c] = T(1 / std::sqrt(var + cfg.epsilon));
        }
    } else {
        for (size_t c = 0; c < C; ++c) {
            centre[c] = mean[c] = moving_mean[c];
            rstd[c] = T(1 / std::sqrt(double(moving_variance[c]) + cfg.epsilon));
        }
    }
    for (size_t c = 0; c < C; ++c) {
        scale[c] = rstd[c] * (gamma ? gamma[c] : T(1));
        shift[c] = beta ? beta[c] : T(0);
    }
    for_each_element<T, false>(cfg, nullptr, [&](size_t e, size_t c, T) __attribute__((always_inline)) {
        y[e] = (x[e] - centre[c]) * scale[c] + shift[c];
    });
}

// reference: cpp/reference/batch_norm.hpp, batch_norm_backward
// y_e = xhat_e gamma + beta, xhat_e = (x_e - mean) rstd  (per channel; sums over its elements):
//   dbeta[c] += sum_e dy_e,  dgamma[c] += rstd sum_e dy_e (x_e - mean)      (each null: skipped)
// Moving statistics (constants): dx_e = gamma rstd dy_e.
// Batch statistics, n = count[c], mean = sum_e w_e x_e / n, var = sum_e w_e (x_e - mean)^2 / n:
//   dvar  = -rstd^3 / 2 gamma sum_e dy_e (x_e - mean)
//   dmean = -rstd gamma sum_e dy_e + dvar (-2 sum_e w_e (x_e - mean) / n)   (the second term is zero
//           but for the masked count's epsilon, so it is summed with a mask only)
//   dx_e  = gamma rstd dy_e + w_e (dmean + 2 (x_e - mean) dvar) / n
// dx is overwritten, or null to skip it; count is read with batch statistics only.
template <class T>
void batch_norm_backward(const BatchNormConfig& cfg, T* dx, T* dgamma, T* dbeta, const T* dy, const T* x,
                         const T* mean, const T* rstd, const T* count, const T* gamma, const uint8_t* mask) {
    using namespace batch_norm_detail;
    const size_t C = cfg.C;
    const std::vector<T> centre(mean, mean + C);  // a local the loops read without doubt of aliasing dx
    std::vector<double> sums(3 * C, 0.0);
    const bool masked_statistics = mask && cfg.batch_statistics;
    if (masked_statistics)
        channel_sums<T, 3, true>(cfg, mask, sums.data(), [&](size_t e, size_t c, T w) __attribute__((always_inline)) {
            const T d = x[e] - centre[c];
            return std::array<T, 3>{dy[e], dy[e] * d, w * d};
        });
    else
        channel_sums<T, 2, false>(cfg, nullptr, sums.data(), [&](size_t e, size_t c, T) __attribute__((always_inline)) {
            return std::array<T, 2>{dy[e], dy[e] * (x[e] - centre[c])};
        });
    const double* sum_dy = sums.data();
    const double* sum_dy_centered = sums.data() + C;
    const double* sum_w_centered = sums.data() + 2 * C;  // zeros without masked statistics
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
    auto gradient = [&](size_t e, size_t c, T w) __attribute__((always_inline)) {
        dx[e] = direct[c] * dy[e] + w * (offset[c] + slope[c] * (x[e] - centre[c]));
    };
    if (masked_statistics) for_each_element<T, true>(cfg, mask, gradient);
    else if (cfg.batch_statistics) for_each_element<T, false>(cfg, nullptr, gradient);
    else for_each_element<T, false>(cfg, nullptr, [&](size_t e, size_t c, T) __attribute__((always_inline)) {
        dx[e] = direct[c] * dy[e];
    });
}

}  // namespace attnx
