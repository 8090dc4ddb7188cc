// The orthogonal initializer's factor (Keras' Orthogonal; Saxe et al. 2014): Q of A = QR on OpenBLAS'
// LAPACK (dgeqrf, dorgqr) on one thread. A factorization is dozens of small products, between which
// OpenBLAS' threads busy-wait: on a 2-core host running other work NumPy's threaded QR of a 400 x 100
// normal matrix (an LSTM(100)'s recurrent kernel) took 0.7-4.8 s, against 2 ms on one thread.
#pragma once
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnx/gemm.hpp"
#include "attnx/parallel.hpp"

#ifdef ATTNX_SCIPY_OPENBLAS
#define dgeqrf_ scipy_dgeqrf_
#define dorgqr_ scipy_dorgqr_
#endif

extern "C" {
void dgeqrf_(const int* m, const int* n, double* a, const int* lda, double* tau, double* work, const int* lwork,
             int* info);
void dorgqr_(const int* m, const int* n, const int* k, double* a, const int* lda, const double* tau, double* work,
             const int* lwork, int* info);
}

namespace attnx {

// q (m x n, m >= n, row-major) = Q of A = QR (A m x n, row-major), column j times sign(R[j, j]) (+1 for
// 0): Q is then uniform over the matrices with orthonormal columns when A is Gaussian (Mezzadri 2007)
inline void orthogonal_factor(double* q, const double* A, int m, int n) {
    if (n == 0) return;
    std::vector<double> a((size_t)m * n), tau(n);  // column-major, as LAPACK reads it
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) a[(size_t)j * m + i] = A[(size_t)i * n + j];
    const SingleThreadedBlas one_thread;
    int info = 0, lwork = -1;
    double best = 0;
    dgeqrf_(&m, &n, a.data(), &m, tau.data(), &best, &lwork, &info);
    std::vector<double> work(std::max(1, (int)best));
    lwork = (int)work.size();
    dgeqrf_(&m, &n, a.data(), &m, tau.data(), work.data(), &lwork, &info);
    if (info != 0) throw std::runtime_error("orthogonal_factor: dgeqrf failed, info " + std::to_string(info));
    std::vector<double> sign(n);
    for (int j = 0; j < n; ++j) sign[j] = a[(size_t)j * m + j] < 0 ? -1.0 : 1.0;  // R[j, j]
    lwork = -1;
    dorgqr_(&m, &n, &n, a.data(), &m, tau.data(), &best, &lwork, &info);
    work.resize(std::max(1, (int)best));
    lwork = (int)work.size();
    dorgqr_(&m, &n, &n, a.data(), &m, tau.data(), work.data(), &lwork, &info);
    if (info != 0) throw std::runtime_error("orthogonal_factor: dorgqr failed, info " + std::to_string(info));
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) q[(size_t)i * n + j] = a[(size_t)j * m + i] * sign[j];
}

}  // namespace attnx
