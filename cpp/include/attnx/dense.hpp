// Dense (fully connected) layer: y = act(x . W + b) over the last axis.
// x: (N, C) rows (leading axes flattened), W: (C, OC) as Keras stores it, b: (OC,).
#pragma once
#include <algorithm>

#include "attnx/activations.hpp"
#include "attnx/gemm.hpp"

namespace attnx {

// z[n, o] = b[o] + sum_c x[n, c] W[c, o]
template <class T>
void dense_forward(T* z, const T* x, const T* W, const T* b, int N, int C, int OC) {
    for (int n = 0; n < N; ++n) {
        T* zr = z + (size_t)n * OC;
        if (b) std::copy(b, b + OC, zr);
        else std::fill(zr, zr + OC, T(0));
    }
    matmul<T>(z, x, W, N, OC, C, false, false, T(1));
}

// dx = dz . W^T (overwritten), dW += x^T . dz, db += sum_n dz[n, :]. dx may be null.
template <class T>
void dense_backward(T* dx, T* dW, T* db, const T* dz, const T* x, const T* W, int N, int C, int OC) {
    if (dx) matmul<T>(dx, dz, W, N, C, OC, false, true);
    matmul<T>(dW, x, dz, C, OC, N, true, false, T(1));
    if (db)
        for (int n = 0; n < N; ++n)
            for (int o = 0; o < OC; ++o) db[o] += dz[(size_t)n * OC + o];
}

}  // namespace attnx
