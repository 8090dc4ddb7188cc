// attnx's bf16 product (cpp/include/attnx/bf16.hpp: operands rounded and packed per call, float32 sums)
// on one thread, on AMX tiles where the CPU has them and on the AVX-512 / AVX2 tiles, against OpenBLAS sgemm on the same shapes, in GFLOP/s of thread CPU time (other
// processes on the core do not count), to set against the bf16 peak of benchmarks/fma_peak.c. The
// shapes are an LSTM(256) B=64 T=128 training step's: the input projection over all steps, one
// step's recurrent product, the kernel gradient over all steps and the input gradient. Then that
// LSTM's whole forward and backward kernels (rnn_bf16.hpp against rnn.hpp's float32 ones) on
// `threads` threads (default 2), in wall time and GFLOP/s over their 19.3 GFLOP (6.4 in the forward).
//   g++ -std=c++17 -O3 -ffp-contract=off -fno-math-errno -fno-trapping-math -Wno-psabi -Icpp/include \
//       -o /tmp/bf16_gemm benchmarks/bf16_gemm.cpp -lopenblas && /tmp/bf16_gemm [threads]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <vector>

#include "attnx/bf16.hpp"
#include "attnx/gemm.hpp"
#include "attnx/rnn_bf16.hpp"

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

static double wall_now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The median wall time of `runs` calls after one untimed
template <class F> static double median_wall(F&& f, int runs = 9) {
    f();
    std::vector<double> t;
    for (int i = 0; i < runs; ++i) {
        const double t0 = wall_now();
        f();
        t.push_back(wall_now() - t0);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// bench_bf16.py's LSTM(256): x (64, 128, 128), the final state's gradient only (return_sequences off)
static void lstm_kernels(int threads) {
    using namespace attnx;
    RNNConfig cfg;
    cfg.cell = RNNCell::lstm, cfg.B = 64, cfg.T = 128, cfg.C = 128, cfg.H = 256;
    const int B = cfg.B, T = cfg.T, C = cfg.C, H = cfg.H, G = cfg.G();
    const size_t BT = (size_t)B * T;
    std::mt19937 rng(2);
    std::normal_distribution<float> normal;
    auto values = [&](size_t n, float scale) {
        std::vector<float> v(n);
        for (auto& e : v) e = scale * normal(rng);
        return v;
    };
    const auto x = values(BT * C, 1.0f), W = values((size_t)C * G, 0.09f), U = values((size_t)H * G, 0.06f);
    const auto b = values(G, 0.1f), dh_last = values((size_t)B * H, 1.0f);
    std::vector<float> h((size_t)B * H), c((size_t)B * H), gates(BT * G), h_prev(BT * H), c_prev(BT * H), aux(BT * H),
        hu((size_t)B * G), dx(BT * C), dW((size_t)C * G), dU((size_t)H * G), db(G), dh((size_t)B * H), dc((size_t)B * H),
        dgates(BT * G), dhrec((size_t)B * H);
    RNNCache<float> cache;
    cache.gates = gates.data(), cache.h_prev = h_prev.data(), cache.c_prev = c_prev.data(), cache.aux = aux.data();
    set_blas_threads(threads);
    const double fwd_flops = 2.0 * BT * (C + H) * G, step_flops = 3 * fwd_flops;  // backward: dh, dx, dW, dU
    std::printf("\nLSTM(256) B=64 T=128 C=128 kernels on %d thread(s), median wall time (GFLOP/s):\n", threads);
    for (bool bf16 : {false, true}) {
        auto forward = [&] {
            std::fill(h.begin(), h.end(), 0.0f), std::fill(c.begin(), c.end(), 0.0f);
            rnn_forward_products<float>(bf16, cfg, nullptr, h.data(), c.data(), cache, x.data(), W.data(), U.data(),
                                        b.data(), nullptr, nullptr, nullptr, hu.data());
        };
        auto backward = [&] {
            std::copy(dh_last.begin(), dh_last.end(), dh.begin()), std::fill(dc.begin(), dc.end(), 0.0f);
            rnn_backward_products<float>(bf16, cfg, dx.data(), dW.data(), dU.data(), db.data(), nullptr, dh.data(),
                                         dc.data(), nullptr, cache, x.data(), W.data(), U.data(), nullptr, nullptr,
                                         dgates.data(), dgates.data(), dhrec.data());
        };
        const double f = median_wall(forward), bw = median_wall(backward);
        std::printf("  %-8s forward %7.2f ms (%5.0f)  backward %7.2f ms (%5.0f)  both %7.2f ms (%5.0f)\n",
                    bf16 ? "bf16" : "float32", f * 1e3, fwd_flops / f * 1e-9, bw * 1e3,
                    (step_flops - fwd_flops) / bw * 1e-9, (f + bw) * 1e3, step_flops / (f + bw) * 1e-9);
    }
}

int main(int argc, char** argv) {
    attnx::set_blas_threads(1);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    struct Shape { const char* what; int M, N, K; bool ta, tb; };
    const Shape shapes[] = {
        {"input projection x.W  (8192x256 . 256x1024)", 8192, 1024, 256, false, false},
        {"recurrent step h.U    (64x256 . 256x1024)", 64, 1024, 256, false, false},
        {"kernel grad x^T.dz    (256x8192 . 8192x1024)", 256, 1024, 8192, true, false},
        {"input grad dz.W^T     (8192x1024 . 1024x256)", 8192, 256, 1024, false, true},
        {"transformer FFN x.W1  (1536x256 . 256x1024)", 1536, 1024, 256, false, false},
        {"output projection     (1536x256 . 256x8000)", 1536, 8000, 256, false, false},
        {"output kernel grad    (256x1536 . 1536x8000)", 256, 8000, 1536, true, false},
    };
    const bool amx = attnx::cpu_amx_support().bf16;
    const auto t = attnx::bf16_tiles();
    std::printf("one thread; bf16 tiles: %s, %d lanes x %d vectors x %d rows\n",
                t.native ? "vdpbf16ps" : "float lanes", t.W, t.Q, t.R);
    std::printf("%-48s %12s %12s %12s %8s %8s\n", "product", "AMX GFLOP/s", "bf16 GFLOP/s", "sgemm GFLOP/s",
                "AMX/sgemm", "bf16/sgemm");
    for (const auto& s : shapes) {
        std::vector<float> A((size_t)s.M * s.K), B((size_t)s.K * s.N), C((size_t)s.M * s.N);
        for (auto& v : A) v = normal(rng);
        for (auto& v : B) v = normal(rng);
        const size_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
        const double flops = 2.0 * s.M * s.N * s.K;
        auto product = [&] { attnx::bf16_gemm(C.data(), s.N, A.data(), lda, s.ta, B.data(), ldb, s.tb, s.M, s.N, s.K, false); };
        const double tiles = amx ? best_seconds(product) : 0;
        attnx::amx_allowed() = false;
        const double bf16 = best_seconds(product);
        attnx::amx_allowed() = true;
        const double f32 = best_seconds([&] {
            attnx::gemm<float>(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), (int)lda, B.data(), (int)ldb, 0.0f, C.data(), s.N);
        });
        std::printf("%-48s %12.1f %12.1f %12.1f %8.2f %8.2f\n", s.what, amx ? flops / tiles * 1e-9 : 0.0,
                    flops / bf16 * 1e-9, flops / f32 * 1e-9, amx ? f32 / tiles : 0.0, f32 / bf16);
    }
    lstm_kernels(argc > 1 ? std::atoi(argv[1]) : 2);
    return 0;
}
