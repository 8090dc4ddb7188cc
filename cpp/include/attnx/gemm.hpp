// Matrix products on OpenBLAS. Every hot product in attnx goes through gemm() so that
// alpha/beta accumulate into preallocated buffers (backward passes use beta = 1).
#pragma once
#include <atomic>
#include <cstddef>

// The OpenBLAS of the scipy-openblas32 wheel (what the Python module links, see CMakeLists.txt)
// prefixes every symbol with scipy_ so that it never collides with another BLAS in the process;
// renaming before the declarations below makes them declare, and the calls reach, those symbols.
#ifdef ATTNX_SCIPY_OPENBLAS
#define cblas_sgemm scipy_cblas_sgemm
#define cblas_dgemm scipy_cblas_dgemm
#define openblas_set_num_threads scipy_openblas_set_num_threads
#define openblas_get_num_threads scipy_openblas_get_num_threads
#define openblas_get_config scipy_openblas_get_config
#define openblas_get_corename scipy_openblas_get_corename
#endif

// xtensor-blas' own CBLAS declarations (the system cblas.h would clash with them wherever both
// are included); the symbols come from OpenBLAS at link time.
#include <xtensor-blas/xblas_config.hpp>
#include <xflens/cxxblas/drivers/cblas.h>

extern "C" {
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
char* openblas_get_config(void);
char* openblas_get_corename(void);
}

namespace attnx {

inline CBLAS_TRANSPOSE blas_op(bool trans) { return trans ? CblasTrans : CblasNoTrans; }

// Products running now outside our parallel regions, which OpenBLAS may split across its own
// threads (it keeps the smallest on the caller; counted all the same). The worker pool's idle threads
// stop spinning while there are any (parallel.hpp), so that OpenBLAS' threads find the cores free
// (they waited out the spin: a product of 2.6 M multiply-adds took 0.19 ms after a pooled layer,
// 0.03 ms alone).
inline std::atomic<int>& blas_threaded_products() {
    static std::atomic<int> running{0};
    return running;
}

// C[M,N] = alpha * op(A)[M,K] . op(B)[K,N] + beta * C, all row-major.
// Empty products are handled here so callers never hand BLAS a zero leading dimension.
template <class T>
inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda,
                 const T* B, int ldb, T beta, T* C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        for (int m = 0; m < M; ++m)
            for (int n = 0; n < N; ++n) C[(size_t)m * ldc + n] = beta == T(0) ? T(0) : beta * C[(size_t)m * ldc + n];
        return;
    }
    const bool threaded = openblas_get_num_threads() > 1;  // 1 inside our own parallel regions
    if (threaded) blas_threaded_products().fetch_add(1);
    if constexpr (sizeof(T) == sizeof(float)) {
        cblas_sgemm(CblasRowMajor, blas_op(trans_a), blas_op(trans_b), M, N, K, alpha, A, lda, B, ldb,
                    beta, C, ldc);
    } else {
        cblas_dgemm(CblasRowMajor, blas_op(trans_a), blas_op(trans_b), M, N, K, alpha, A, lda, B, ldb,
                    beta, C, ldc);
    }
    if (threaded) blas_threaded_products().fetch_sub(1);
}

// Dense shorthand for contiguous operands: C[M,N] (+)= op(A) . op(B).
template <class T>
inline void matmul(T* C, const T* A, const T* B, int M, int N, int K, bool trans_a = false,
                   bool trans_b = false, T beta = T(0), T alpha = T(1)) {
    gemm<T>(trans_a, trans_b, M, N, K, alpha, A, trans_a ? M : K, B, trans_b ? K : N, beta, C, N);
}

// The thread budget (attnx.set_num_threads). Kernels read it here and never back from OpenBLAS,
// whose setting a kernel running in another Python thread may have lowered to 1 for a moment
// (for_batch_halves): reading that would make the result of a call depend on what ran beside it.
inline std::atomic<int>& thread_budget() {
    static std::atomic<int> n{openblas_get_num_threads()};
    return n;
}
inline void set_blas_threads(int n) {
    thread_budget() = n;
    openblas_set_num_threads(n);
}
inline int get_blas_threads() { return thread_budget(); }

}  // namespace attnx
