// Where an LSTM(100) time step at batch 32 (T = 32) goes: the main job's and the sentiment plan's shape.
// Per step, median wall time over the call's 32 steps:
//   - the plan's float32 inference steps (rnn_forward_rows, the input projection precomputed), against the
//     recurrent product alone in the same tiles (the cell a sink), at B 32 and B 16 (one thread's half);
//     over token ids, the input rows from a table copied into gates against read in place (per call);
//   - the training kernels (rnn_forward_products / rnn_backward_products, float32 and bf16, input C = 32
//     fused, return_sequences' dy, dx for the embedding), on 1 and 2 threads;
//   - the worker's wake: a 2-thread bf16 forward after `gap` microseconds of the caller busy elsewhere (as
//     Python between a train step's kernels), against back to back.
//   g++ -std=c++17 -O3 -ffp-contract=off -fno-math-errno -fno-trapping-math -Wno-psabi -Icpp/include \
//       -o /tmp/rnn_step benchmarks/rnn_step.cpp -lopenblas -lpthread && /tmp/rnn_step
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "attnx/rnn_bf16.hpp"

using namespace attnx;

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// median wall seconds of `runs` calls after two untimed
template <class F> static double median_wall(F&& f, int runs = 41) {
    f(), f();
    std::vector<double> t;
    for (int i = 0; i < runs; ++i) {
        const double t0 = now();
        f();
        t.push_back(now() - t0);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

static void busy_for(double seconds) {
    const double until = now() + seconds;
    while (now() < until) {
    }
}

struct Lstm {
    RNNConfig cfg;
    std::vector<float> x, W, U, b, dy, h, c, gates, h_prev, c_prev, aux, y, hu, dx, dW, dU, db, dh, dc, dgates, dhrec;
    RNNCache<float> cache;
    explicit Lstm(int B, int T = 32, int C = 32, int H = 100) {
        cfg.cell = RNNCell::lstm, cfg.B = B, cfg.T = T, cfg.C = C, cfg.H = H;
        const int G = cfg.G();
        const size_t BT = (size_t)B * T;
        std::mt19937 rng(3);
        std::normal_distribution<float> normal;
        auto values = [&](size_t n, float scale) {
            std::vector<float> v(n);
            for (auto& e : v) e = scale * normal(rng);
            return v;
        };
        x = values(BT * C, 1.0f), W = values((size_t)C * G, 0.15f), U = values((size_t)H * G, 0.1f), b = values(G, 0.1f);
        dy = values(BT * H, 0.1f);
        h.resize((size_t)B * H), c.resize((size_t)B * H), gates = values(BT * G, 0.5f), h_prev.resize(BT * H);
        c_prev.resize(BT * H), aux.resize(BT * H), y.resize(BT * H), hu.resize((size_t)B * G), dx.resize(BT * C);
        dW.resize((size_t)C * G), dU.resize((size_t)H * G), db.resize(G), dh.resize((size_t)B * H), dc.resize((size_t)B * H);
        dgates.resize(BT * G), dhrec.resize((size_t)B * H);
        cache.gates = gates.data(), cache.h_prev = h_prev.data(), cache.c_prev = c_prev.data(), cache.aux = aux.data();
    }
    void forward(bool bf16) {
        std::fill(h.begin(), h.end(), 0.0f), std::fill(c.begin(), c.end(), 0.0f);
        rnn_forward_products<float>(bf16, cfg, y.data(), h.data(), c.data(), cache, x.data(), W.data(), U.data(), b.data(),
                                    nullptr, nullptr, nullptr, hu.data());
    }
    void backward(bool bf16) {
        std::fill(dh.begin(), dh.end(), 0.0f), std::fill(dc.begin(), dc.end(), 0.0f);
        rnn_backward_products<float>(bf16, cfg, dx.data(), dW.data(), dU.data(), db.data(), nullptr, dh.data(), dc.data(),
                                     dy.data(), cache, x.data(), W.data(), U.data(), nullptr, nullptr, dgates.data(),
                                     dgates.data(), dhrec.data());
    }
};

// The plan's inference steps (gates: the input projection, read only without a cache) and the product alone
static void inference_steps(int B) {
    Lstm m(B);
    RNNConfig cfg = m.cfg;
    cfg.C = 0;
    const int H = cfg.H, T = cfg.T;
    Panels<float> packed;
    pack_recurrent_kernel_rows<float>(packed, cfg, m.U.data());
    RNNCache<float> cache;
    cache.gates = m.gates.data(), cache.aux = m.aux.data();
    auto steps = [&] {
        std::fill(m.h.begin(), m.h.end(), 0.0f), std::fill(m.c.begin(), m.c.end(), 0.0f);
        rnn_forward_rows<float>(cfg, 0, B, nullptr, m.h.data(), m.c.data(), cache, RecurrentKernel<float>{packed.data()},
                                nullptr, nullptr, nullptr, m.hu.data());
    };
    float sink = 0;
    auto products = [&] {
        on_widest_lanes<float>([&](auto lanes) __attribute__((always_inline)) {
            using V = decltype(lanes);
            constexpr int Wl = Lanes<V>::W;
            const int r = lstm_tail_units(4, H, Wl), blocks = (H - r) / Wl;
            const LeftRows<float> left{m.h.data(), (size_t)H, H, nullptr, 0, 0};
            V acc{};
            for (int t = 0; t < T; ++t) {
                recurrent_product<V, 4>(0, B, left, packed.data(), H, H - r, 4, 0,
                                        [&](int, TileRow<V, 4> pre, int, int) __attribute__((always_inline)) {
                                            acc += pre.q[0] + pre.q[1] + pre.q[2] + pre.q[3];
                                        });
                if (r)
                    packed_product<V, 1>(0, B, left, packed.data() + (size_t)blocks * H * 4 * Wl, Wl, 0, 1,
                                         [&](int, TileRow<V, 1> pre, int) __attribute__((always_inline)) { acc += pre.q[0]; });
            }
            for (int j = 0; j < Wl; ++j) sink += acc[j];
        });
    };
    // the plan over token ids: the input rows from a table of 5000 (the embedded projection's), copied
    // into gates first (as the plan did) or read in place (RNNCache::input_rows)
    const int V = 5000, G = cfg.G();
    std::vector<float> table((size_t)V * G);
    std::mt19937 rng(5);
    for (auto& v : table) v = 0.5f * std::normal_distribution<float>()(rng);
    std::vector<const float*> rows((size_t)B * T);
    for (auto& row : rows) row = table.data() + (size_t)(rng() % V) * G;
    auto copied = [&] {
        for (size_t i = 0; i < rows.size(); ++i) std::copy(rows[i], rows[i] + G, m.gates.data() + i * G);
        steps();
    };
    auto in_place = [&] {
        cache.input_rows = rows.data();
        steps();
        cache.input_rows = nullptr;
    };
    const double flops = 2.0 * B * H * 4 * H;  // per step
    double a = 0, p = 0, cp = 0, ip = 0;
    for (int round = 0; round < 3; ++round) {  // interleaved
        const double sa = median_wall(steps), sp = median_wall(products), sc = median_wall(copied), si = median_wall(in_place);
        a = round ? std::min(a, sa) : sa, p = round ? std::min(p, sp) : sp;
        cp = round ? std::min(cp, sc) : sc, ip = round ? std::min(ip, si) : si;
    }
    std::printf("  B=%2d float32 plan step %6.2f us (%4.0f GFLOP/s)   product alone %6.2f us (%4.0f GFLOP/s)   rest %5.2f us%s\n",
                B, a / T * 1e6, flops * T / a * 1e-9, p / T * 1e6, flops * T / p * 1e-9, (a - p) / T * 1e6,
                sink == 12345 ? " " : "");
    std::printf("       over token ids (5000-row table), per call: rows copied into gates %6.1f us, read in place %6.1f us\n",
                cp * 1e6, ip * 1e6);
}

static void training_kernels(int B, int threads) {
    Lstm m(B);
    set_blas_threads(threads);
    const int T = m.cfg.T;
    const double fwd = 2.0 * B * T * (m.cfg.C + m.cfg.H) * m.cfg.G(), bwd = 2 * fwd;  // backward: [dh, dx], [dW; dU]
    for (bool bf16 : {false, true}) {
        const double f = median_wall([&] { m.forward(bf16); });
        m.forward(bf16);
        const double bw = median_wall([&] { m.backward(bf16); });
        std::printf("  B=%2d %d thread(s) %-7s forward %7.1f us (%5.2f us/step, %4.0f GFLOP/s)  backward %7.1f us (%5.2f us/step, "
                    "%4.0f GFLOP/s)\n",
                    B, threads, bf16 ? "bf16" : "float32", f * 1e6, f / T * 1e6, fwd / f * 1e-9, bw * 1e6, bw / T * 1e6,
                    bwd / bw * 1e-9);
    }
    set_blas_threads(1);
}

// A 2-thread bf16 forward after the caller spent `gap` seconds elsewhere (the worker spins 100 us, then sleeps)
static void wake(Lstm& m) {
    set_blas_threads(2);
    for (double gap : {0.0, 50e-6, 200e-6, 1e-3, 5e-3}) {
        std::vector<double> t;
        for (int i = 0; i < 41; ++i) {
            busy_for(gap);
            const double t0 = now();
            m.forward(true);
            t.push_back(now() - t0);
        }
        std::sort(t.begin(), t.end());
        std::printf("  bf16 forward B=32, 2 threads, after %6.0f us elsewhere: median %7.1f us, p90 %7.1f us\n", gap * 1e6,
                    t[t.size() / 2] * 1e6, t[t.size() * 9 / 10] * 1e6);
    }
    set_blas_threads(1);
}

int main() {
    set_blas_threads(1);
    std::printf("LSTM(100) T=32, %s lanes, bf16 tiles %s\n", simd_level_name(simd_level()),
                bf16_tiles().native ? "vdpbf16ps" : "float lanes");
    std::printf("inference steps, 1 thread (per step):\n");
    inference_steps(32);
    inference_steps(16);
    std::printf("training kernels (C=32 fused, dy, dx), per call:\n");
    training_kernels(32, 1);
    training_kernels(16, 1);
    training_kernels(32, 2);
    std::printf("2-thread wake:\n");
    Lstm m(32);
    wake(m);
    return 0;
}
