// attnx's bf16 product (cpp/include/attnx/bf16.hpp: operands rounded and packed per call, float32 sums)
// on one thread against OpenBLAS sgemm on the same shapes, in GFLOP/s of thread CPU time (other
// processes on the core do not count), to set against the bf16 peak of benchmarks/fma_peak.c. The
// shapes are an LSTM(256) B=64 T=128 training step's: the input projection over all steps, one
// step's recurrent product, the kernel gradient over all steps and the input gradient.
//   g++ -std=c++17 -O2 -Wno-psabi -Icpp/include -o /tmp/bf16_gemm benchmarks/bf16_gemm.cpp -lopenblas && /tmp/bf16_gemm
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <random>
#include <vector>

#include "attnx/bf16.hpp"
#include "attnx/gemm.hpp"

static double cpu_now() {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

template <class F> static double best_seconds(F&& f, double budget = 0.5) {
    double best = 1e30, spent = 0;
    for (int i = 0; i < 3 || spent < budget; ++i) {
        const double t0 = cpu_now();
        f();
        const double t = cpu_now() - t0;
        best = std::min(best, t), spent += t;
    }
    return best;
}

int main() {
    attnx::set_blas_threads(1);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    struct Shape { const char* what; int M, N, K; bool ta, tb; };
    const Shape shapes[] = {
        {"input projection x.W  (8192x256 . 256x1024)", 8192, 1024, 256, false, false},
        {"recurrent step h.U    (64x256 . 256x1024)", 64, 1024, 256, false, false},
        {"kernel grad x^T.dz    (256x8192 . 8192x1024)", 256, 1024, 8192, true, false},
        {"input grad dz.W^T     (8192x1024 . 1024x256)", 8192, 256, 1024, false, true},
    };
    const auto t = attnx::bf16_tiles();
    std::printf("one thread; bf16 tiles: %s, %d lanes x %d vectors x %d rows\n",
                t.native ? "vdpbf16ps" : "float lanes", t.W, t.Q, t.R);
    std::printf("%-48s %12s %12s %8s\n", "product", "bf16 GFLOP/s", "sgemm GFLOP/s", "ratio");
    for (const auto& s : shapes) {
        std::vector<float> A((size_t)s.M * s.K), B((size_t)s.K * s.N), C((size_t)s.M * s.N);
        for (auto& v : A) v = normal(rng);
        for (auto& v : B) v = normal(rng);
        const size_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
        const double flops = 2.0 * s.M * s.N * s.K;
        const double bf16 = best_seconds([&] {
            attnx::bf16_gemm(C.data(), s.N, A.data(), lda, s.ta, B.data(), ldb, s.tb, s.M, s.N, s.K, false);
        });
        const double f32 = best_seconds([&] {
            attnx::gemm<float>(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), (int)lda, B.data(), (int)ldb, 0.0f, C.data(), s.N);
        });
        std::printf("%-48s %12.1f %12.1f %8.2f\n", s.what, flops / bf16 * 1e-9, flops / f32 * 1e-9, f32 / bf16);
    }
    return 0;
}
