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
#include <utility>
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
// A run's sums keep this many partial sums each (two AVX-512 vectors of either type), so that the adds
// do not wait on each other
template <class T> constexpr size_t kRunLanes = 128 / sizeof(T);
// A pass over x splits across threads from this many elements on (4 MiB of floats, ~0.1-0.2 ms a pass on
// one core). Below it the half pass saved is worth less than a second thread's wake-up can cost: on a
// host shared with other work (or a VM whose idle vCPU halted) that wait reached milliseconds, where
// NumPy, on one thread, paid none (issue 41's 0.3x on (256, 1024)).
constexpr double kParallelMinElements = 1 << 20;

// body() compiled for the widest level this CPU runs, for floats and doubles alike: the loops here name
// no vector type, so doubles vectorize too (on_widest_lanes<double> keeps to baseline x86-64 for the
// kernels whose lanes are float vectors)
template <class Body> auto on_widest_level(Body&& body) {
    return on_widest_lanes<float>(body);
}

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
// terms is an always-inline lambda of float arithmetic that vectorizes along a row or a run. The
// threads' shares are added in the order of their rows, so that the sums do not depend on which thread
// finishes first.
template <class T, size_t K, bool masked, class Terms>
void channel_sums(const BatchNormConfig& cfg, const uint8_t* mask, double* sums, Terms&& terms) {
    const size_t C = cfg.C, inner = cfg.inner, span = cfg.mask_span;
    std::vector<std::pair<size_t, std::vector<double>>> shares;  // (first row or run, its sums)
    std::mutex shares_lock;
    split_x(cfg, mask, [&](size_t lo, size_t hi) {
        std::vector<double> part(K * C, 0.0);  // this thread's share
        on_widest_level([&](auto) __attribute__((always_inline)) {  // the loops vectorize to each level's width
            if (rows_layout(cfg, mask)) {
                // acc[k C + c] += terms(row r, c)[k]: each row added into a row of accumulators
                std::vector<T> block(K * C);
                T* acc = block.data();
                for (size_t r0 = lo; r0 < hi; r0 += kBlockRows) {
                    std::fill(acc, acc + K * C, T(0));
                    for (size_t r = r0; r < std::min(hi, r0 + kBlockRows); ++r) {
                        const T w = masked ? T(mask[r * C / span]) : T(1);
                        for (size_t c = 0; c < C; ++c) {
                            const std::array<T, K> t = terms(r * C + c, c, w);
                            for (size_t k = 0; k < K; ++k) acc[k * C + c] += t[k];
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
        std::lock_guard<std::mutex> guard(shares_lock);
        shares.emplace_back(lo, std::move(part));
    });
    std::sort(shares.begin(), shares.end());
    std::fill(sums, sums + K * C, 0.0);
    for (const auto& share : shares)
        for (size_t i = 0; i < K * C; ++i) sums[i] += share.second[i];
}

// fn(e, c, w_e) for every element e of x (channel c, mask flag w_e: a constant 1 unless masked), split
// across the thread budget
template <class T, bool masked, class Fn> void for_each_element(const BatchNormConfig& cfg, const uint8_t* mask, Fn&& fn) {
    const size_t C = cfg.C, inner = cfg.inner, span = cfg.mask_span;
    split_x(cfg, mask, [&](size_t lo, size_t hi) {
        on_widest_level([&](auto) __attribute__((always_inline)) {
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

// Adds block b's moments (weight n_b, mean_b, m2_b = sum of w (x - mean_b)^2) into the moments (n, mean,
// m2) of the blocks before it (Chan, Golub and LeVeque's update). A block of weight 0 (masked out) adds
// nothing but m2_b, which is 0 unless the masked elements carried a NaN or an infinity, as w x would.
inline void merge_moments(double& n, double& mean, double& m2, double n_b, double mean_b, double m2_b) {
    if (n_b == 0) {
        m2 += m2_b;
        return;
    }
    const double total = n + n_b, delta = mean_b - mean;
    mean += delta * (n_b / total);
    m2 += m2_b + delta * delta * (n * n_b / total);
    n = total;
}

// One thread's share of channel_moments: per channel, the blocks' weights n, and their sums about a shift
// k[c] (the first block's mean): sum_b n_b (mean_b - k) and sum_b m2_b + n_b (mean_b - k)^2, in double.
// Adding a block is a few multiply-adds, no division; the shift keeps the squares' cancellation in
// moments() small, as the blocks' means lie among the data.
struct ShiftedMoments {
    size_t first = 0;  // the share's first row or run: shares merge in this order
    std::vector<double> k, n, shifted, squares;
    std::vector<uint8_t> started;
    explicit ShiftedMoments(size_t C) : k(C), n(C), shifted(C), squares(C), started(C) {}
    void add(size_t c, double n_b, double mean_b, double m2_b) {
        if (n_b == 0) {
            squares[c] += m2_b;
            return;
        }
        if (!started[c]) k[c] = mean_b, started[c] = 1;
        const double d = mean_b - k[c];
        n[c] += n_b, shifted[c] += n_b * d, squares[c] += m2_b + n_b * d * d;
    }
    // channel c's (n, mean, m2): mean = k + shifted / n, m2 = squares - shifted^2 / n
    void moments(size_t c, double& n_c, double& mean_c, double& m2_c) const {
        n_c = n[c];
        mean_c = n[c] > 0 ? k[c] + shifted[c] / n[c] : 0.0;
        m2_c = n[c] > 0 ? squares[c] - shifted[c] * shifted[c] / n[c] : squares[c];
    }
};

// Per channel c, over its elements e with mask flags w_e (1 without a mask): n[c] = sum_e w_e,
// mean[c] = sum_e w_e x_e / n[c] (0 where n[c] = 0), m2[c] = sum_e w_e (x_e - mean[c])^2; in one pass
// over x: each block (kBlockRows rows, or kBlockRun elements of a run) is summed twice while in cache,
// the second time about its own mean (no cancellation), and its moments added in double. Overwritten.
// The threads' shares merge in the order of their rows, so that the result does not depend on which
// thread finishes first.
template <class T, bool masked>
void channel_moments(const BatchNormConfig& cfg, const T* x, const uint8_t* mask, double* n, double* mean,
                     double* m2) {
    const size_t C = cfg.C, inner = cfg.inner, span = cfg.mask_span;
    std::vector<ShiftedMoments> shares;
    std::mutex shares_lock;
    split_x(cfg, mask, [&](size_t lo, size_t hi) {
        ShiftedMoments share(C);
        share.first = lo;
        on_widest_level([&](auto) __attribute__((always_inline)) {  // the loops vectorize to each level's width
            if (rows_layout(cfg, mask)) {
                std::vector<T> sums(2 * C);
                T *centre = sums.data(), *square = sums.data() + C;
                for (size_t r0 = lo; r0 < hi; r0 += kBlockRows) {
                    const size_t r1 = std::min(hi, r0 + kBlockRows);
                    std::fill(centre, centre + 2 * C, T(0));
                    size_t rows = 0;  // the block's weight, one per unmasked row
                    for (size_t r = r0; r < r1; ++r) {
                        const T w = masked ? T(mask[r * C / span]) : T(1);
                        rows += w != T(0);
                        const T* xr = x + r * C;
                        for (size_t c = 0; c < C; ++c) centre[c] += w * xr[c];
                    }
                    const T inverse = rows ? T(1) / T(rows) : T(0);
                    for (size_t c = 0; c < C; ++c) centre[c] *= inverse;  // the block's means
                    for (size_t r = r0; r < r1; ++r) {
                        const T w = masked ? T(mask[r * C / span]) : T(1);
                        const T* xr = x + r * C;
                        for (size_t c = 0; c < C; ++c) {
                            const T d = xr[c] - centre[c];
                            square[c] += w * d * d;
                        }
                    }
                    for (size_t c = 0; c < C; ++c) share.add(c, double(rows), centre[c], square[c]);
                }
                return;
            }
            // runs: the flag is constant along a run, so each block's sums are of x alone, weighted once
            constexpr size_t L = kRunLanes<T>;
            const T inverse_run = T(1) / T(std::min(kBlockRun, inner));  // of every block but a long run's last
            for (size_t run = lo; run < hi; ++run) {
                const size_t c = run % C, e0 = run * inner;
                const double w = masked ? double(mask[e0 / span]) : 1.0;
                for (size_t i0 = 0; i0 < inner; i0 += kBlockRun) {
                    const T* xb = x + e0 + i0;
                    const size_t len = std::min(kBlockRun, inner - i0);
                    const T sum = sum_lanes<T, L>(len, [&](size_t i) __attribute__((always_inline)) { return xb[i]; });
                    const T centre = len == kBlockRun || len == inner ? sum * inverse_run : sum / T(len);
                    const T square = sum_lanes<T, L>(len, [&](size_t i) __attribute__((always_inline)) {
                        const T d = xb[i] - centre;
                        return d * d;
                    });
                    share.add(c, w * double(len), centre, w * double(square));
                }
            }
        });
        std::lock_guard<std::mutex> guard(shares_lock);
        shares.push_back(std::move(share));
    });
    std::sort(shares.begin(), shares.end(),
              [](const ShiftedMoments& a, const ShiftedMoments& b) { return a.first < b.first; });
    std::fill(n, n + C, 0.0), std::fill(mean, mean + C, 0.0), std::fill(m2, m2 + C, 0.0);
    for (const ShiftedMoments& share : shares)
        for (size_t c = 0; c < C; ++c) {
            double n_s, mean_s, m2_s;
            share.moments(c, n_s, mean_s, m2_s);
            merge_moments(n[c], mean[c], m2[c], n_s, mean_s, m2_s);
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
        // the moments of the unmasked elements; the masked count's epsilon then scales the mean and
        // adds its shift to the squares: sum_e w_e (x_e - m)^2 = m2 + n (batch_mean - m)^2
        std::vector<double> n(C), batch_mean(C), m2(C);
        if (mask) channel_moments<T, true>(cfg, x, mask, n.data(), batch_mean.data(), m2.data());
        else channel_moments<T, false>(cfg, x, mask, n.data(), batch_mean.data(), m2.data());
        const T momentum = T(cfg.momentum);
        for (size_t c = 0; c < C; ++c) {
            const double total = mask ? n[c] + kMaskedCountEpsilon : n[c];
            const double m = batch_mean[c] * (n[c] / total), shift = batch_mean[c] - m;
            const double var = (m2[c] + n[c] * shift * shift) / total;
            count[c] = T(total);
            centre[c] = mean[c] = T(m);
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
