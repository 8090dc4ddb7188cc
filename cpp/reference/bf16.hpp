// Reference bfloat16 products: what bf16.hpp's packed tiles compute, one output at a time in double.
// The operands are rounded to bf16 as the fast kernels round them, with an independent rule (the
// nearest multiple of the value's bf16 quantum, ties to even, through frexp / nearbyint), and the
// products summed in double; the fast kernels differ from it by their float32 sums only.
#pragma once
#include <cfenv>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "reference/attention.hpp"
#include "reference/conv.hpp"
#include "reference/dense.hpp"

namespace attnx::reference {

// x rounded to the nearest bf16 (8 significant bits, float's exponent range; ties to even); past
// bf16's largest finite value (0x7F7F: (2 - 2^-7) 2^127) by half a quantum or more: inf
inline double round_to_bf16(double x) {
    if (!std::isfinite(x) || x == 0) return x;
    int e;
    std::frexp(x, &e);  // |x| = m 2^e, m in [0.5, 1)
    const int quantum_exp = std::max(e, -125) - 8;  // 8 significant bits; subnormal below 2^-126
    const double r = std::nearbyint(std::ldexp(x, -quantum_exp));  // the default mode: to nearest, ties even
    const double y = std::ldexp(r, quantum_exp);
    const double largest = std::ldexp(255.0, 127 - 7);
    return std::abs(y) > largest ? std::copysign(std::numeric_limits<double>::infinity(), x) : y;
}

inline std::vector<double> rounded_to_bf16(const double* x, size_t n) {
    std::vector<double> y(x, x + n);
    for (auto& v : y) v = round_to_bf16(v);
    return y;
}

// C[m, n] = sum_k bf16(op(A)[m, k]) bf16(op(B)[k, n])   (+ C[m, n] when accumulate)
// op(A) = A (M, K), or A^T of A (K, M) when trans_a; op(B) = B (K, N), or B^T of B (N, K) when trans_b
inline void bf16_gemm(double* C, const double* A, bool trans_a, const double* B, bool trans_b, int M, int N, int K,
                      bool accumulate) {
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            double acc = accumulate ? C[(size_t)m * N + n] : 0;
            for (int k = 0; k < K; ++k) {
                const double a = trans_a ? A[(size_t)k * M + m] : A[(size_t)m * K + k];
                const double b = trans_b ? B[(size_t)n * K + k] : B[(size_t)k * N + n];
                acc += round_to_bf16(a) * round_to_bf16(b);
            }
            C[(size_t)m * N + n] = acc;
        }
}

// z[n, o] = b[o] + sum_c bf16(x[n, c]) bf16(W[c, o]);  y = act(z)
inline void bf16_dense_forward(double* y, double* z, const double* x, const double* W, const double* b, int N, int C,
                               int OC, Activation a) {
    const auto xr = rounded_to_bf16(x, (size_t)N * C), Wr = rounded_to_bf16(W, (size_t)C * OC);
    dense_forward(y, z, xr.data(), Wr.data(), b, N, C, OC, a);
}

// z[n, o] = b[o] + sum_c bf16(x[n, c]) bf16(W[c, o])
// => dx[n, c] = sum_o bf16(dz[n, o]) bf16(W[c, o]) (overwritten),  dW[c, o] += sum_n bf16(x[n, c]) bf16(dz[n, o]),
//    db[o] += sum_n dz[n, o] (not rounded: a reduction)
inline void bf16_dense_backward(double* dx, double* dW, double* db, const double* dz, const double* x, const double* W,
                                int N, int C, int OC) {
    const auto xr = rounded_to_bf16(x, (size_t)N * C), Wr = rounded_to_bf16(W, (size_t)C * OC);
    const auto dzr = rounded_to_bf16(dz, (size_t)N * OC);
    dense_backward(dx, dW, nullptr, dzr.data(), xr.data(), Wr.data(), N, C, OC);
    if (db)
        for (int n = 0; n < N; ++n)
            for (int o = 0; o < OC; ++o) db[o] += dz[(size_t)n * OC + o];
}

// z[b, oh, ow, f] = bias[f] + sum_{i, j, c} bf16(x[b, oh SH - pad_top + i, ow SW - pad_left + j, c]) bf16(K[i, j, c, f]);
// y = act(z)
inline void bf16_conv2d_forward(double* y, double* z, const double* x, const double* K, const double* bias,
                                const Window2D& w, int F, Activation a) {
    const auto xr = rounded_to_bf16(x, (size_t)w.B * w.H * w.W * w.C), Kr = rounded_to_bf16(K, (size_t)w.patch() * F);
    conv2d_forward(y, z, xr.data(), Kr.data(), bias, w, F, a);
}

// y = act(z), z as above
// => dz = dy act'(z);  dx = sum bf16(dz) bf16(K) (overwritten; null: skipped);  dK += sum bf16(x) bf16(dz);
//    dbias += sum dz (not rounded: a reduction)
inline void bf16_conv2d_backward(double* dx, double* dK, double* dbias, const double* dy, const double* x,
                                 const double* K, const double* y, const double* z, const Window2D& w, int F,
                                 Activation a) {
    const size_t rows = (size_t)w.B * w.OH * w.OW;
    std::vector<double> dz(rows * F);
    activation_backward(dz.data(), dy, z, y, rows, F, a);
    const auto xr = rounded_to_bf16(x, (size_t)w.B * w.H * w.W * w.C), Kr = rounded_to_bf16(K, (size_t)w.patch() * F);
    const auto dzr = rounded_to_bf16(dz.data(), dz.size());
    conv2d_backward(dx, dK, nullptr, dzr.data(), xr.data(), Kr.data(), dzr.data(), dzr.data(), w, F, Activation::linear);
    if (dbias)
        for (size_t r = 0; r < rows; ++r)
            for (int f = 0; f < F; ++f) dbias[f] += dz[r * F + f];
}

// The context of bf16_sdpa_forward (below) from given weights: context[b, t, h, :] = sum_s bf16(weights keep) bf16(v[b, s, h, :])
inline void bf16_weighted_values(const AttendShape& sh, double* context, const double* weights, const double* v,
                                 const double* keep) {
    weighted_values(sh, context, weights, v, keep, round_to_bf16);
}

// Scaled dot-product attention on bf16 operands (attention.hpp's sdpa_forward with bf16):
//   weights = masked_softmax(scale sum_d bf16(q) bf16(k));  context = sum_s bf16(weights keep) bf16(v)
inline void bf16_sdpa_forward(const AttendShape& sh, double* context, double* weights, const double* q,
                              const double* k, const double* v, const AttendMask& mask, const double* keep,
                              double scale) {
    const auto qr = rounded_to_bf16(q, (size_t)sh.B * sh.Tq * sh.H * sh.Dk);
    const auto kr = rounded_to_bf16(k, (size_t)sh.B * sh.S * sh.H * sh.Dk);
    std::vector<double> scores((size_t)sh.B * sh.H * sh.Tq * sh.S);
    dot_scores_forward(sh, scores.data(), qr.data(), kr.data(), scale);
    masked_softmax_scores(sh, weights, scores.data(), mask);
    bf16_weighted_values(sh, context, weights, v, keep);
}

// context = sum_s bf16(weights keep) bf16(v);  weights = masked_softmax(scale sum_d bf16(q) bf16(k))
// => dv[b, s, h, :] = sum_t bf16(weights keep) bf16(dcontext[b, t, h, :])
//    dp = sum_d bf16(dcontext) bf16(v);  dscores = softmax backward of (dp keep + dweights)  (into dscores)
//    dq = scale sum_s bf16(dscores) bf16(k),  dk = scale sum_t bf16(dscores) bf16(q),
//    dscale += sum (sum_s bf16(dscores) bf16(k)) q        (q not rounded, as the kernel's sums meet it)
inline void bf16_sdpa_backward(const AttendShape& sh, double* dq, double* dk, double* dv, double* dscale,
                               double* dscores, const double* dcontext, const double* dweights, const double* weights,
                               const double* q, const double* k, const double* v, const double* keep, double scale) {
    softmax_context_backward(sh, dscores, dv, nullptr, dcontext, dweights, weights, v, keep, round_to_bf16);
    dot_scores_backward(sh, dq, dk, dscale, dscores, q, k, scale, round_to_bf16);
}

}  // namespace attnx::reference
