// Reference attention pooling: what pooling.hpp computes, one value at a time in double.
// x (B, T, C), W (C), bias (T) or (1), mask (B, T) or null.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "attnx/pooling.hpp"  // PoolingConfig
#include "reference/activations.hpp"

namespace attnx::reference {

// energy[b, t]  = tanh(sum_c x[b, t, c] W[c] + bias[t or 0])
// weights[b, :] = masked_softmax(energy[b, :])
// out[b, c]     = sum_t weights[b, t] x[b, t, c]      (return_sequences: out[b, t, c] = weights[b, t] x[b, t, c])
inline void attention_pooling_forward(const PoolingConfig& cfg, double* out, double* weights, double* energy,
                                      const double* x, const double* W, const double* bias, const uint8_t* mask) {
    const int B = cfg.B, T = cfg.T, C = cfg.C;
    for (int b = 0; b < B; ++b) {
        for (int t = 0; t < T; ++t) {
            double z = bias[cfg.bias_per_step ? t : 0];
            for (int c = 0; c < C; ++c) z += x[((size_t)b * T + t) * C + c] * W[c];
            energy[(size_t)b * T + t] = std::tanh(z);
        }
        softmax_forward(weights + (size_t)b * T, energy + (size_t)b * T, mask ? mask + (size_t)b * T : nullptr, 1, T);
        for (int c = 0; c < C; ++c) {
            double acc = 0;
            for (int t = 0; t < T; ++t) {
                const double wx = weights[(size_t)b * T + t] * x[((size_t)b * T + t) * C + c];
                if (cfg.return_sequences) out[((size_t)b * T + t) * C + c] = wx;
                acc += wx;
            }
            if (!cfg.return_sequences) out[(size_t)b * C + c] = acc;
        }
    }
}

// out = sum_t weights x (or weights x);  weights = softmax(energy);  energy = tanh(x W + bias)
// => dweights'[b, t] = sum_c dout x + dweights;  denergy = softmax backward;  dz = denergy (1 - energy^2)
//    dx = weights dout + dz W (overwritten);  dW += sum dz x;  dbias[t or 0] += sum_b dz
inline void attention_pooling_backward(const PoolingConfig& cfg, double* dx, double* dW, double* dbias,
                                       const double* dout, const double* dweights, const double* weights,
                                       const double* energy, const double* x, const double* W) {
    const int B = cfg.B, T = cfg.T, C = cfg.C;
    std::vector<double> da(T), dz(T);
    for (int b = 0; b < B; ++b) {
        auto dout_at = [&](int t, int c) {
            return cfg.return_sequences ? dout[((size_t)b * T + t) * C + c] : dout[(size_t)b * C + c];
        };
        for (int t = 0; t < T; ++t) {
            da[t] = dweights ? dweights[(size_t)b * T + t] : 0;
            for (int c = 0; c < C; ++c) da[t] += dout_at(t, c) * x[((size_t)b * T + t) * C + c];
        }
        softmax_backward(dz.data(), da.data(), weights + (size_t)b * T, 1, T);
        for (int t = 0; t < T; ++t) {
            const double e = energy[(size_t)b * T + t];
            dz[t] *= 1 - e * e;
            dbias[cfg.bias_per_step ? t : 0] += dz[t];
            for (int c = 0; c < C; ++c) {
                const size_t i = ((size_t)b * T + t) * C + c;
                if (dx) dx[i] = weights[(size_t)b * T + t] * dout_at(t, c) + dz[t] * W[c];
                dW[c] += dz[t] * x[i];
            }
        }
    }
}

}  // namespace attnx::reference
