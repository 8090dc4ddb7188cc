// Reference batch normalization: what batch_norm.hpp computes, one value at a time in double.
// x (outer, C, inner); element e = (o C + c) inner + i has channel c and mask flag mask[e / mask_span].
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnx/batch_norm.hpp"  // BatchNormConfig, kMaskedCountEpsilon

namespace attnx::reference {

// w(e): the mask flag of element e (1 without a mask)
inline double batch_norm_weight(const BatchNormConfig& cfg, const uint8_t* mask, size_t e) {
    return mask ? mask[e / cfg.mask_span] : 1.0;
}

// Batch statistics: count[c] = sum_e w_e (+ kMaskedCountEpsilon with a mask),
//   mean[c] = sum_e w_e x_e / count[c],  var[c] = sum_e w_e (x_e - mean[c])^2 / count[c],
//   moving = moving momentum + batch (1 - momentum)
// Moving statistics: mean, var = moving_mean, moving_variance; so too for an empty batch (count 0), whose
// moving statistics do not move.
// rstd[c] = 1 / sqrt(var[c] + epsilon),  y_e = (x_e - mean[c]) rstd[c] gamma[c] + beta[c]
inline void batch_norm_forward(const BatchNormConfig& cfg, double* y, double* mean, double* rstd, double* count,
                               double* moving_mean, double* moving_variance, const double* x, const double* gamma,
                               const double* beta, const uint8_t* mask) {
    const size_t C = cfg.C, inner = cfg.inner;
    auto index = [&](size_t o, size_t c, size_t i) { return (o * C + c) * inner + i; };
    for (size_t c = 0; c < C; ++c) {
        double var;
        if (cfg.batch_statistics) count[c] = 0;
        if (cfg.batch_statistics && cfg.outer * inner > 0) {
            double n = 0, sum = 0;
            for (size_t o = 0; o < cfg.outer; ++o)
                for (size_t i = 0; i < inner; ++i) {
                    const double w = batch_norm_weight(cfg, mask, index(o, c, i));
                    n += w, sum += w * x[index(o, c, i)];
                }
            if (mask) n += kMaskedCountEpsilon;
            count[c] = n, mean[c] = sum / n;
            double sq = 0;
            for (size_t o = 0; o < cfg.outer; ++o)
                for (size_t i = 0; i < inner; ++i) {
                    const double d = x[index(o, c, i)] - mean[c];
                    sq += batch_norm_weight(cfg, mask, index(o, c, i)) * d * d;
                }
            var = sq / n;
            moving_mean[c] = moving_mean[c] * cfg.momentum + mean[c] * (1 - cfg.momentum);
            moving_variance[c] = moving_variance[c] * cfg.momentum + var * (1 - cfg.momentum);
        } else {
            mean[c] = moving_mean[c], var = moving_variance[c];
        }
        rstd[c] = 1 / std::sqrt(var + cfg.epsilon);
        for (size_t o = 0; o < cfg.outer; ++o)
            for (size_t i = 0; i < inner; ++i)
                y[index(o, c, i)] =
                    (x[index(o, c, i)] - mean[c]) * rstd[c] * (gamma ? gamma[c] : 1) + (beta ? beta[c] : 0);
    }
}

// y_e = xhat_e gamma + beta,  xhat_e = (x_e - mean) rstd
// => dbeta[c] += sum_e dy_e,  dgamma[c] += sum_e dy_e xhat_e,  dxhat_e = dy_e gamma
// moving statistics (constants): dx_e = dxhat_e rstd
// batch statistics (mean = sum w x / n, var = sum w (x - mean)^2 / n, n = count):
//   dvar = -rstd^2 / 2 sum_e dxhat_e xhat_e,  dmean = -rstd sum_e dxhat_e + dvar (-2 sum_e w_e (x_e - mean) / n)
//   dx_e = rstd dxhat_e + w_e (dmean + 2 (x_e - mean) dvar) / n     (overwritten; dx null: skipped)
inline void batch_norm_backward(const BatchNormConfig& cfg, double* dx, double* dgamma, double* dbeta,
                                const double* dy, const double* x, const double* mean, const double* rstd,
                                const double* count, const double* gamma, const uint8_t* mask) {
    const size_t C = cfg.C, inner = cfg.inner;
    auto index = [&](size_t o, size_t c, size_t i) { return (o * C + c) * inner + i; };
    for (size_t c = 0; c < C; ++c) {
        const double g = gamma ? gamma[c] : 1;
        double sum_dxhat = 0, sum_dxhat_xhat = 0, sum_w_centered = 0;
        for (size_t o = 0; o < cfg.outer; ++o)
            for (size_t i = 0; i < inner; ++i) {
                const size_t e = index(o, c, i);
                const double xhat = (x[e] - mean[c]) * rstd[c];
                if (dbeta) dbeta[c] += dy[e];
                if (dgamma) dgamma[c] += dy[e] * xhat;
                sum_dxhat += dy[e] * g, sum_dxhat_xhat += dy[e] * g * xhat;
                sum_w_centered += batch_norm_weight(cfg, mask, e) * (x[e] - mean[c]);
            }
        if (!dx) continue;
        double dvar = 0, dmean = 0, n = 1;
        if (cfg.batch_statistics && count[c] > 0) {
            n = count[c];
            dvar = -0.5 * rstd[c] * rstd[c] * sum_dxhat_xhat;
            dmean = -rstd[c] * sum_dxhat + dvar * (-2 * sum_w_centered / n);
        }
        for (size_t o = 0; o < cfg.outer; ++o)
            for (size_t i = 0; i < inner; ++i) {
                const size_t e = index(o, c, i);
                dx[e] = rstd[c] * dy[e] * g +
                        batch_norm_weight(cfg, mask, e) * (dmean + 2 * (x[e] - mean[c]) * dvar) / n;
            }
    }
}

}  // namespace attnx::reference
