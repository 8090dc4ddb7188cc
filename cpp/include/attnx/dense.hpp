// Dense (fully connected) layer: y = act(x . W + b) over the last axis.
// x: (N, C) rows (leading axes flattened), W: (C, OC) as Keras stores it, b: (OC,).
#pragma once
#include <algorithm>

#include "attnx/activations.hpp"
#include "attnx/gemm.hpp"
#include "attnx/parallel.hpp"

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

// y = act(z), z = x . W + b, in blocks of rows split across threads (single-threaded BLAS each):
// for tall products (B * T rows, a few hundred columns) this beats OpenBLAS' own threading (by
// 25% at 4096 x 128 x 128 on 2 cores), and the activation reads each block (<= 1 MiB) while it
// is in cache. A product that is one block and small runs on the calling thread alone: OpenBLAS'
// threads, woken for it, took longer than the product (a CNN's last Dense, 64 x 2048 x 10, took
// 0.19 ms after the pooling layer before it, 0.03 ms alone). y may alias z (gelu's backward needs z;
// every other activation's only y).
template <class T>
void dense_forward_rows(T* y, T* z, const T* x, const T* W, const T* b, int N, int C, int OC, Activation act) {
    const int rows = std::max(16, (1 << 18) / std::max(OC, 1));
    const size_t blocks = ((size_t)N + rows - 1) / rows;
    auto run_blocks = [&](size_t lo, size_t hi) {
        for (size_t block = lo; block < hi; ++block) {
            const size_t r0 = block * rows;
            const int r = std::min(rows, N - (int)r0);
            dense_forward<T>(z + r0 * OC, x + r0 * C, W, b, r, C, OC);
            activation_forward<T>(y + r0 * OC, z + r0 * OC, (size_t)r, (size_t)OC, act);
        }
    };
    const double work = double(N) * C * OC;
    if (blocks == 1 && work < kBlasThreadsMinWork) {
        SingleThreadedBlas blas_guard;
        return run_blocks(0, 1);
    }
    parallel_for(blocks, work, run_blocks);
}

// dx = dz . W^T (overwritten), dW += x^T . dz, db += sum_n dz[n, :]. dx may be null.
template <class T>
void dense_backward(T* dx, T* dW, T* db, const T* dz, const T* x, const T* W, int N, int C, int OC) {
    if (dx) matmul<T>(dx, dz, W, N, C, OC, false, true);
    matmul<T>(dW, x, dz, C, OC, N, true, false, T(1));
    if (db)  // compiled for the widest vectors (the baseline copy was 3% of an LSTM(256) backward)
        on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {
            for (int n = 0; n < N; ++n)
                for (int o = 0; o < OC; ++o) db[o] += dz[(size_t)n * OC + o];
        });
}

}  // namespace attnx
