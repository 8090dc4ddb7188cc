// Reference int8 inference: what quantized.hpp's Dense and recurrent forward passes compute, one
// row and output at a time, products summed in double. The activations are quantized as the
// kernels do (per row, symmetric, round half to even, in float: the same bytes), coarse rows
// (quantized.hpp's rule, its sums in double here) take the residual's second pass; weights are int8
// qW (K, N) with a float scale per column sW (N).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnx/quantized.hpp"  // Int8Kernel
#include "attnx/rnn.hpp"  // RNNConfig, RNNCell
#include "reference/activations.hpp"

namespace attnx::reference {

// q (K) and the scale of x (K) as one int8 row: s = max|x| / 127, q = round_half_even(x * (127 / max|x|))
inline float quantize_row_int8(int8_t* q, const float* x, int K) {
    float m = 0.f;
    for (int k = 0; k < K; ++k) m = std::max(m, std::abs(x[k]));
    const float inv = m > 0.f ? 127.f / m : 0.f;
    for (int k = 0; k < K; ++k) q[k] = (int8_t)std::clamp(std::nearbyint(x[k] * inv), -127.f, 127.f);
    return m / 127.f;
}

// qW (K, N) of a packed Int8Kernel, read back from its layout (quantized.hpp's header)
inline std::vector<int8_t> unpack_int8(const Int8Kernel& w) {
    std::vector<int8_t> q((size_t)w.K * w.N);
    for (int k = 0; k < w.K; ++k)
        for (int n = 0; n < w.N; ++n) {
            const Int8Packed& p = n < w.split ? w.head : w.tail;
            const int j = n < w.split ? n : n - w.split;
            q[(size_t)k * w.N + n] = p.data[((size_t)(k / 4) * p.Np + j) * 4 + k % 4];
        }
    return q;
}

// kw[k] = max_n |qW[k, n]| of qW (K, N): how much feature k can reach the output
inline std::vector<float> feature_weights_int8(const int8_t* qW, int K, int N) {
    std::vector<float> kw(K, 0.f);
    for (int k = 0; k < K; ++k)
        for (int n = 0; n < N; ++n) kw[k] = std::max(kw[k], (float)std::abs((int)qW[(size_t)k * N + n]));
    return kw;
}

// One row x (K) as the int8 layers quantize it for features weighing kw: x ~ s q, and when the row is
// coarse (sum |e| kw > sum |x| kw / 16, e = x - s q) its residual e ~ se qe (else se = 0, qe = 0).
// Returns whether it is coarse.
inline bool quantize_row_two_pass_int8(int8_t* q, float& s, int8_t* qe, float& se, const float* x, const float* kw,
                                       int K) {
    std::vector<float> e(K);
    s = quantize_row_int8(q, x, K);
    double error = 0, magnitude = 0;
    for (int k = 0; k < K; ++k) {
        e[k] = x[k] - s * (float)q[k];
        error += std::abs((double)e[k]) * kw[k];
        magnitude += std::abs((double)x[k]) * kw[k];
    }
    const bool coarse = error * 16 > magnitude;
    std::fill(qe, qe + K, int8_t(0));
    se = coarse ? quantize_row_int8(qe, e.data(), K) : 0.f;
    return coarse;
}

// out[n] = (x qW sW)[n] for one row x (K) as the int8 layers multiply it:
//   x ~ s q (+ se qe when the row is coarse, quantize_row_two_pass_int8)
//   out[n] = sum_k (s q[k] + se qe[k]) qW[k, n] sW[n]
inline void int8_row_product(double* out, const float* x, const int8_t* qW, const float* sW, int K, int N) {
    std::vector<int8_t> q(K), qe(K);
    float s, se;
    quantize_row_two_pass_int8(q.data(), s, qe.data(), se, x, feature_weights_int8(qW, K, N).data(), K);
    for (int n = 0; n < N; ++n) {
        double a = 0, ae = 0;
        for (int k = 0; k < K; ++k) {
            a += (double)q[k] * qW[(size_t)k * N + n];
            ae += (double)qe[k] * qW[(size_t)k * N + n];
        }
        out[n] = (a * s + ae * se) * sW[n];
    }
}

// y (R, N) = act(x (R, K) qW sW + b)
inline void dense_forward_int8(double* y, const float* x, const int8_t* qW, const float* sW, const float* b, int R,
                               int K, int N, Activation a) {
    for (int r = 0; r < R; ++r) {
        double* yr = y + (size_t)r * N;
        int8_row_product(yr, x + (size_t)r * K, qW, sW, K, N);
        for (int n = 0; n < N; ++n) yr[n] += b ? b[n] : 0.0;
    }
    activation_forward(y, y, R, N, a);
}

// y (R, N) = act(x (R, K) qW1 sW1 + b1) qW2 sW2 + b2: two int8 Dense layers, the hidden rows (R, F)
// rounded to float between them as the kernel holds them
inline void feed_forward_forward_int8(double* y, const float* x, const int8_t* qW1, const float* sW1, const float* b1,
                                      Activation a, const int8_t* qW2, const float* sW2, const float* b2, int R, int K,
                                      int F, int N) {
    std::vector<double> hidden((size_t)R * F);
    dense_forward_int8(hidden.data(), x, qW1, sW1, b1, R, K, F, a);
    const std::vector<float> hidden_float(hidden.begin(), hidden.end());
    dense_forward_int8(y, hidden_float.data(), qW2, sW2, b2, R, F, N, Activation::linear);
}

// One level of SimpleRNN / GRU / LSTM on int8 kernels W (C, G), U (H, G), the equations of
// reference/rnn.hpp with every product an int8_row_product (h_{t-1} quantized from its float
// value, as the kernel holds it); y (B, T, H) may be null, h, c (B, H) in and out, mask as there
inline void rnn_forward_int8(const RNNConfig& cfg, double* y, double* h, double* c, const float* x, const int8_t* qW,
                             const float* sW, const int8_t* qU, const float* sU, const float* b_in, const float* b_rec,
                             const uint8_t* mask) {
    const int B = cfg.B, T = cfg.T, C = cfg.C, H = cfg.H, G = cfg.G();
    const Activation act = cfg.activation, ract = cfg.recurrent_activation;
    std::vector<double> xw(G), hu(G), rhu(H), n(H);
    std::vector<float> hf(H), rh(H);
    // the classic GRU's candidate columns of U, apart (the kernel's Int8Kernel tail)
    std::vector<int8_t> qUn((size_t)H * H);
    for (int k = 0; k < H && cfg.cell == RNNCell::gru; ++k)
        for (int j = 0; j < H; ++j) qUn[(size_t)k * H + j] = qU[(size_t)k * G + 2 * H + j];
    const bool classic = cfg.cell == RNNCell::gru && !cfg.reset_after;
    for (int b = 0; b < B; ++b)
        for (int s = 0; s < T; ++s) {
            const int t = cfg.time_at(s);
            const size_t bt = (size_t)b * T + t;
            double* hb = h + (size_t)b * H;
            if (mask && !mask[bt]) {
                if (y) std::fill(y + bt * H, y + (bt + 1) * H, 0.0);
                continue;
            }
            // xw = x_t W + b_in;  hu = h_{t-1} U (+ b_rec) (classic GRU: its r and z columns only)
            int8_row_product(xw.data(), x + bt * C, qW, sW, C, G);
            for (int j = 0; j < H; ++j) hf[j] = (float)hb[j];
            if (classic) {
                std::vector<int8_t> qUrz((size_t)H * 2 * H);
                for (int k = 0; k < H; ++k)
                    for (int j = 0; j < 2 * H; ++j) qUrz[(size_t)k * 2 * H + j] = qU[(size_t)k * G + j];
                int8_row_product(hu.data(), hf.data(), qUrz.data(), sU, H, 2 * H);
            } else {
                int8_row_product(hu.data(), hf.data(), qU, sU, H, G);
            }
            for (int j = 0; j < G; ++j) xw[j] += b_in ? b_in[j] : 0.0;
            for (int j = 0; j < G && b_rec; ++j) hu[j] += b_rec[j];
            for (int j = 0; j < H; ++j) {
                switch (cfg.cell) {
                    case RNNCell::simple:  // h_t = act(x_t W + b + h_{t-1} U)
                        n[j] = reference::act(act, xw[j] + hu[j]);
                        break;
                    case RNNCell::lstm: {  // i, f, o = ract(.), g = act(.); c_t = f c + i g; h_t = o act(c_t)
                        const double i = reference::act(ract, xw[j] + hu[j]);
                        const double f = reference::act(ract, xw[H + j] + hu[H + j]);
                        const double g = reference::act(act, xw[2 * H + j] + hu[2 * H + j]);
                        const double o = reference::act(ract, xw[3 * H + j] + hu[3 * H + j]);
                        double& cb = c[(size_t)b * H + j];
                        cb = f * cb + i * g;
                        n[j] = o * reference::act(act, cb);
                        break;
                    }
                    case RNNCell::gru:  // r = ract(.); the candidate below
                        rhu[j] = reference::act(ract, xw[j] + hu[j]);
                        break;
                }
            }
            if (cfg.cell == RNNCell::gru) {
                std::vector<double> z(H), cand(H);
                for (int j = 0; j < H; ++j) z[j] = reference::act(ract, xw[H + j] + hu[H + j]);
                if (classic) {  // n = act(x_n + b_n + (r * h_{t-1}) U_n)
                    for (int j = 0; j < H; ++j) rh[j] = (float)(rhu[j] * hf[j]);
                    int8_row_product(cand.data(), rh.data(), qUn.data(), sU + 2 * H, H, H);
                    for (int j = 0; j < H; ++j) cand[j] = reference::act(act, xw[2 * H + j] + cand[j]);
                } else {  // n = act(x_n + b_n + r * (h U_n + b_hn))
                    for (int j = 0; j < H; ++j) cand[j] = reference::act(act, xw[2 * H + j] + rhu[j] * hu[2 * H + j]);
                }
                for (int j = 0; j < H; ++j) n[j] = z[j] * hf[j] + (1 - z[j]) * cand[j];  // h_t = z h + (1 - z) n
            }
            for (int j = 0; j < H; ++j) hb[j] = n[j];
            if (y) std::copy(n.begin(), n.end(), y + bt * H);
        }
}

}  // namespace attnx::reference
