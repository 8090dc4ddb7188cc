// Reference dense layer: what dense.hpp's BLAS and register-tiled paths compute, one output at a
// time in double. x (N, C), W (C, OC) as Keras stores it, b (OC).
#pragma once
#include <cstddef>

#include "reference/activations.hpp"

namespace attnx::reference {

// z[n, o] = b[o] + sum_c x[n, c] W[c, o];  y = act(z)
inline void dense_forward(double* y, double* z, const double* x, const double* W, const double* b, int N, int C, int OC,
                          Activation a) {
    for (int n = 0; n < N; ++n)
        for (int o = 0; o < OC; ++o) {
            double acc = b ? b[o] : 0;
            for (int c = 0; c < C; ++c) acc += x[(size_t)n * C + c] * W[(size_t)c * OC + o];
            z[(size_t)n * OC + o] = acc;
        }
    activation_forward(y, z, N, OC, a);
}

// z[n, o] = b[o] + sum_c x[n, c] W[c, o]
// => dx[n, c] = sum_o dz[n, o] W[c, o] (overwritten),  dW[c, o] += sum_n x[n, c] dz[n, o],  db[o] += sum_n dz[n, o]
inline void dense_backward(double* dx, double* dW, double* db, const double* dz, const double* x, const double* W, int N,
                           int C, int OC) {
    for (int n = 0; n < N; ++n) {
        for (int c = 0; c < C; ++c) {
            double acc = 0;
            for (int o = 0; o < OC; ++o) {
                acc += dz[(size_t)n * OC + o] * W[(size_t)c * OC + o];
                dW[(size_t)c * OC + o] += x[(size_t)n * C + c] * dz[(size_t)n * OC + o];
            }
            if (dx) dx[(size_t)n * C + c] = acc;
        }
        if (db)
            for (int o = 0; o < OC; ++o) db[o] += dz[(size_t)n * OC + o];
    }
}

}  // namespace attnx::reference
