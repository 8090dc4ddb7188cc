// Attention pooling (the Keras sentiment tutorial's layer): a learned weight per time step,
// softmax over time, weighted sum of the inputs. x: (B, T, C), W: (C,), bias: (T,) or (1,).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "attnx/activations.hpp"
#include "attnx/attention.hpp"
#include "attnx/gemm.hpp"
#include "attnx/parallel.hpp"

namespace attnx {

// Sizes and options of one pooling call: x (B, T, C); a bias per time step or one for all.
struct PoolingConfig {
    int B = 0, T = 0, C = 0;
    bool bias_per_step = false;     // bias (T,) rather than (1,)
    bool return_sequences = false;  // out (B, T, C) = weights * x instead of the pooled (B, C)
};

// reference: cpp/reference/pooling.hpp, attention_pooling_forward
// energy[b, t]  = tanh(sum_c x[b, t, c] W[c] + bias[t or 0])       saved for backward
// weights[b, :] = masked_softmax(energy[b, :])                      (mask (B, T) or null)
// out[b, c]     = sum_t weights[b, t] x[b, t, c]                     (pooled, (B, C))
//            or = weights[b, t] x[b, t, c]                           (return_sequences, (B, T, C))
template <class T>
void attention_pooling_forward(const PoolingConfig& cfg, T* out, T* weights, T* energy, const T* x, const T* W,
                               const T* bias, const uint8_t* mask) {
    const int B = cfg.B, Tn = cfg.T, C = cfg.C;
    const bool bias_per_step = cfg.bias_per_step, return_sequences = cfg.return_sequences;
    {
        // a matrix-vector product of ~10 us: OpenBLAS' own threads would wake for it, and wait out
        // our pool's spin for the second core (issue 40: 0.5 ms a call at 2 threads)
        SingleThreadedBlas blas_guard;
        matmul<T>(energy, x, W, B * Tn, 1, C);
    }
    parallel_for((size_t)B, double(B) * Tn * C * 2, [&](size_t lo, size_t hi) {
        for (size_t b = lo; b < hi; ++b) {
            T* e = energy + b * Tn;
            for (int t = 0; t < Tn; ++t) e[t] += bias[bias_per_step ? t : 0];
            activate_block(Activation::tanh, e, Tn);  // the vector tanh_rational (libm for double)
            T* a = weights + b * Tn;
            masked_softmax_row(a, e, mask ? mask + b * Tn : nullptr, (size_t)Tn);
            const T* xb = x + b * (size_t)Tn * C;
            if (return_sequences) {
                T* ob = out + b * (size_t)Tn * C;
                for (int t = 0; t < Tn; ++t)
                    for (int c = 0; c < C; ++c) ob[(size_t)t * C + c] = a[t] * xb[(size_t)t * C + c];
            } else {
                gemm<T>(true, false, 1, C, Tn, T(1), a, 1, xb, C, T(0), out + b * (size_t)C, C);
            }
        }
    });
}

// reference: cpp/reference/pooling.hpp, attention_pooling_backward
// Backward (dx overwritten, or null to skip it; dW, dbias accumulate; dweights, the gradient into the
// returned weights, may be null):
//   dA[b, t] = sum_c dout[b, c] x[b, t, c]   (pooled)   or   sum_c dout[b, t, c] x[b, t, c]   (sequences)
//              + dweights[b, t]
//   dE       = softmax_backward(dA, weights),   dZ = dE * (1 - energy^2)
//   dx[b, t, c] = weights[b, t] dout[b, (t,) c] + dZ[b, t] W[c]
//   dW[c] += sum_{b,t} dZ[b, t] x[b, t, c],   dbias[t or 0] += sum_b dZ[b, t]
template <class T>
void attention_pooling_backward(const PoolingConfig& cfg, T* dx, T* dW, T* dbias, const T* dout, const T* dweights,
                                const T* weights, const T* energy, const T* x, const T* W) {
    const int B = cfg.B, Tn = cfg.T, C = cfg.C;
    const bool bias_per_step = cfg.bias_per_step, return_sequences = cfg.return_sequences;
    std::vector<T> dz((size_t)B * Tn);
    parallel_for((size_t)B, double(B) * Tn * C * 3, [&](size_t lo, size_t hi) {
        // on vectors: the dot products' one running sum chained each add behind the last (70 us of
        // the main job's 100 us pooling step)
        on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
            using V = decltype(lanes);
            constexpr int W = Lanes<V>::W;
            for (size_t b = lo; b < hi; ++b) {
                const T* xb = x + b * (size_t)Tn * C;
                const T* a = weights + b * Tn;
                T* dxb = dx ? dx + b * (size_t)Tn * C : nullptr;
                T* dzb = dz.data() + b * Tn;
                for (int t = 0; t < Tn; ++t) {
                    const T* dot = return_sequences ? dout + (b * Tn + t) * (size_t)C : dout + b * (size_t)C;
                    V acc = {};
                    for (int c = 0; c < C; c += W) {
                        const int n = std::min(W, C - c);
                        const V d = vload<V>(dot + c, n);
                        acc += d * vload<V>(xb + (size_t)t * C + c, n);
                        if (dxb) vstore(dxb + (size_t)t * C + c, a[t] * d, n);
                    }
                    dzb[t] = sum_of_lanes(acc) + (dweights ? dweights[b * Tn + t] : T(0));
                }
                softmax_rows_backward(dzb, dzb, a, 1, (size_t)Tn);
                for (int t = 0; t < Tn; ++t) {
                    const T e = energy[b * Tn + t];
                    dzb[t] *= T(1) - e * e;
                }
            }
        });
    });
    // dx += dZ W^T, dW += x^T dZ (one GEMM each over all B * T rows; small: on this thread, as the forward's)
    SingleThreadedBlas blas_guard;
    if (dx) matmul<T>(dx, dz.data(), W, B * Tn, C, 1, false, true, T(1));
    matmul<T>(dW, x, dz.data(), C, 1, B * Tn, true, false, T(1));
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < Tn; ++t) dbias[bias_per_step ? t : 0] += dz[(size_t)b * Tn + t];
}

}  // namespace attnx
