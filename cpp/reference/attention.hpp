// Reference attention: what attention.hpp's fused, register-tiled kernels compute, as the equations
// read, one (batch row, head, query, source position) at a time in double. Layouts as attention.hpp:
//   query (B, Tq, H, Dk)   key (B, S, H, Dk)   value (B, S, H, Dv)   context (B, Tq, H, Dv)
//   scores / weights / keep (B, H, Tq, S)
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnx/attention.hpp"  // AttendShape, AttendMask
#include "reference/activations.hpp"

namespace attnx::reference {

// Query t of batch row b may attend to source position s
inline bool allowed(const AttendMask& mask, int b, int t, int s) {
    if (mask.causal && s > t) return false;
    return !mask.data || mask.data[b * mask.stride_b + t * mask.stride_t + s];
}

// The operands' rounding of the float kernels: none (bf16's for the bf16 kernels: reference/bf16.hpp)
inline double unrounded(double x) { return x; }

// element (b, t, h, d) of a (B, T, H, D) array
inline size_t at4(int b, int t, int h, int d, int T, int H, int D) { return (((size_t)b * T + t) * H + h) * D + d; }
// element (b, h, t, s) of a (B, H, Tq, S) array
inline size_t at_score(const AttendShape& sh, int b, int h, int t, int s) {
    return (((size_t)b * sh.H + h) * sh.Tq + t) * sh.S + s;
}

// scores[b, h, t, s] = scale * sum_d q[b, t, h, d] k[b, s, h, d]
inline void dot_scores_forward(const AttendShape& sh, double* scores, const double* q, const double* k, double scale) {
    for (int b = 0; b < sh.B; ++b)
        for (int h = 0; h < sh.H; ++h)
            for (int t = 0; t < sh.Tq; ++t)
                for (int s = 0; s < sh.S; ++s) {
                    double dot = 0;
                    for (int d = 0; d < sh.Dk; ++d) dot += q[at4(b, t, h, d, sh.Tq, sh.H, sh.Dk)] * k[at4(b, s, h, d, sh.S, sh.H, sh.Dk)];
                    scores[at_score(sh, b, h, t, s)] = scale * dot;
                }
}

// scores[b, h, t, s] = scale * sum_d q[b, t, h, d] k[b, s, h, d]
// => dq = scale dscores . k,  dk = scale dscores^T . q,  dscale += sum dscores * (q . k^T)
// (the products' operands op-rounded; dscale's q is not, as the kernels meet it after their sums)
template <class Op = double (*)(double)>
inline void dot_scores_backward(const AttendShape& sh, double* dq, double* dk, double* dscale, const double* dscores,
                                const double* q, const double* k, double scale, Op op = unrounded) {
    for (size_t i = 0; i < (size_t)sh.B * sh.Tq * sh.H * sh.Dk; ++i) dq[i] = 0;
    for (size_t i = 0; i < (size_t)sh.B * sh.S * sh.H * sh.Dk; ++i) dk[i] = 0;
    for (int b = 0; b < sh.B; ++b)
        for (int h = 0; h < sh.H; ++h)
            for (int t = 0; t < sh.Tq; ++t)
                for (int s = 0; s < sh.S; ++s) {
                    const double ds = op(dscores[at_score(sh, b, h, t, s)]);
                    for (int d = 0; d < sh.Dk; ++d) {
                        const size_t iq = at4(b, t, h, d, sh.Tq, sh.H, sh.Dk), ik = at4(b, s, h, d, sh.S, sh.H, sh.Dk);
                        dq[iq] += scale * ds * op(k[ik]);
                        dk[ik] += scale * ds * op(q[iq]);
                        if (dscale) *dscale += ds * op(k[ik]) * q[iq];
                    }
                }
}

// weights[b, h, t, :] = softmax(scores[b, h, t, :]) over the allowed positions (0 elsewhere; a
// fully masked row is all 0)
inline void masked_softmax_scores(const AttendShape& sh, double* weights, const double* scores, const AttendMask& mask) {
    std::vector<uint8_t> row(sh.S);
    for (int b = 0; b < sh.B; ++b)
        for (int h = 0; h < sh.H; ++h)
            for (int t = 0; t < sh.Tq; ++t) {
                for (int s = 0; s < sh.S; ++s) row[s] = allowed(mask, b, t, s);
                const size_t off = at_score(sh, b, h, t, 0);
                softmax_forward(weights + off, scores + off, row.data(), 1, sh.S);
            }
}

// context[b, t, h, :] = sum_s op(weights[b, h, t, s] keep[b, h, t, s]) op(value[b, s, h, :]), op the operands'
// rounding (the identity; bf16's for the bf16 kernels, reference/bf16.hpp)
template <class Op = double (*)(double)>
inline void weighted_values(const AttendShape& sh, double* context, const double* weights, const double* value,
                            const double* keep, Op op = unrounded) {
    for (int b = 0; b < sh.B; ++b)
        for (int h = 0; h < sh.H; ++h)
            for (int t = 0; t < sh.Tq; ++t)
                for (int d = 0; d < sh.Dv; ++d) {
                    double acc = 0;
                    for (int s = 0; s < sh.S; ++s) {
                        const size_t i = at_score(sh, b, h, t, s);
                        acc += op(weights[i] * (keep ? keep[i] : 1.0)) * op(value[at4(b, s, h, d, sh.S, sh.H, sh.Dv)]);
                    }
                    context[at4(b, t, h, d, sh.Tq, sh.H, sh.Dv)] = acc;
                }
}

// weights = masked_softmax(scores);  context[b, t, h, :] = sum_s weights[b, h, t, s] keep[b, h, t, s] value[b, s, h, :]
// (keep: the dropout keep mask scaled by 1 / (1 - rate), or a local window's Gaussian; null = 1)
inline void softmax_context_forward(const AttendShape& sh, double* context, double* weights, const double* scores,
                                    const double* value, const AttendMask& mask, const double* keep) {
    masked_softmax_scores(sh, weights, scores, mask);
    weighted_values(sh, context, weights, value, keep);
}

// context = sum_s weights keep value;  weights = masked_softmax(scores)
// => dvalue[b, s, h, :] = sum_t weights keep dcontext[b, t, h, :]
//    dweights' = (dcontext . value^T) keep + dweights,  dkeep = (dcontext . value^T) weights
//    dscores = softmax backward of dweights'
// (the products' operands op-rounded: weights keep, dcontext, value)
template <class Op = double (*)(double)>
inline void softmax_context_backward(const AttendShape& sh, double* dscores, double* dvalue, double* dkeep,
                                     const double* dcontext, const double* dweights, const double* weights,
                                     const double* value, const double* keep, Op op = unrounded) {
    for (size_t i = 0; i < (size_t)sh.B * sh.S * sh.H * sh.Dv; ++i) dvalue[i] = 0;
    std::vector<double> dw(sh.S);
    for (int b = 0; b < sh.B; ++b)
        for (int h = 0; h < sh.H; ++h)
            for (int t = 0; t < sh.Tq; ++t) {
                const size_t row = at_score(sh, b, h, t, 0);
                for (int s = 0; s < sh.S; ++s) {
                    double dp = 0;  // d (weights keep)[s] = dcontext . value[s]
                    const double used = op(weights[row + s] * (keep ? keep[row + s] : 1.0));
                    for (int d = 0; d < sh.Dv; ++d) {
                        const double dc = op(dcontext[at4(b, t, h, d, sh.Tq, sh.H, sh.Dv)]);
                        dp += dc * op(value[at4(b, s, h, d, sh.S, sh.H, sh.Dv)]);
                        dvalue[at4(b, s, h, d, sh.S, sh.H, sh.Dv)] += used * dc;
                    }
                    if (dkeep) dkeep[row + s] = dp * weights[row + s];
                    dw[s] = dp * (keep ? keep[row + s] : 1.0) + (dweights ? dweights[row + s] : 0.0);
                }
                softmax_backward(dscores + row, dw.data(), weights + row, 1, sh.S);
            }
}

// Scaled dot-product attention: scores = scale q . k^T; weights = masked_softmax(scores);
// context = (weights * keep) . value
inline void sdpa_forward(const AttendShape& sh, double* context, double* weights, const double* q, const double* k,
                         const double* v, const AttendMask& mask, const double* keep, double scale) {
    std::vector<double> scores((size_t)sh.B * sh.H * sh.Tq * sh.S);
    dot_scores_forward(sh, scores.data(), q, k, scale);
    softmax_context_forward(sh, context, weights, scores.data(), v, mask, keep);
}

// context = (masked_softmax(scale q . k^T) * keep) . value: backward through the context and
// softmax, then the scores
inline void sdpa_backward(const AttendShape& sh, double* dq, double* dk, double* dv, double* dscale,
                          const double* dcontext, const double* dweights, const double* weights, const double* q,
                          const double* k, const double* v, const double* keep, double scale) {
    std::vector<double> dscores((size_t)sh.B * sh.H * sh.Tq * sh.S);
    softmax_context_backward(sh, dscores.data(), dv, nullptr, dcontext, dweights, weights, v, keep);
    dot_scores_backward(sh, dq, dk, dscale, dscores.data(), q, k, scale);
}

// Additive (Bahdanau) / concat (Luong) score from pq (B, Tq, U) and pk (B, S, U):
//   hidden[b, t, s, u] = tanh(pq[b, t, u] + pk[b, s, u]);  scores[b, t, s] = sum_u v[u] hidden[b, t, s, u]
inline void additive_scores_forward(double* scores, double* hidden, const double* pq, const double* pk, const double* v,
                                    int B, int Tq, int S, int U) {
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < Tq; ++t)
            for (int s = 0; s < S; ++s) {
                double acc = 0;
                for (int u = 0; u < U; ++u) {
                    const double hid = std::tanh(pq[((size_t)b * Tq + t) * U + u] + pk[((size_t)b * S + s) * U + u]);
                    hidden[(((size_t)b * Tq + t) * S + s) * U + u] = hid;
                    acc += v[u] * hid;
                }
                scores[((size_t)b * Tq + t) * S + s] = acc;
            }
}

// scores = sum_u v[u] tanh(pq + pk)
// => dpre = dscores v (1 - hidden^2);  dpq = sum_s dpre;  dpk = sum_t dpre;  dv += sum dscores hidden
inline void additive_scores_backward(double* dpq, double* dpk, double* dv, const double* dscores, const double* hidden,
                                     const double* v, int B, int Tq, int S, int U) {
    for (size_t i = 0; i < (size_t)B * Tq * U; ++i) dpq[i] = 0;
    for (size_t i = 0; i < (size_t)B * S * U; ++i) dpk[i] = 0;
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < Tq; ++t)
            for (int s = 0; s < S; ++s) {
                const double ds = dscores[((size_t)b * Tq + t) * S + s];
                for (int u = 0; u < U; ++u) {
                    const double hid = hidden[(((size_t)b * Tq + t) * S + s) * U + u];
                    const double dpre = ds * v[u] * (1 - hid * hid);
                    dpq[((size_t)b * Tq + t) * U + u] += dpre;
                    dpk[((size_t)b * S + s) * U + u] += dpre;
                    dv[u] += ds * hid;
                }
            }
}

// Luong's local attention window around p[b, t] with half-width D (sigma = D / 2):
//   allowed = |s - p| <= D and source_mask[b, s];  gauss = exp(-(s - p)^2 / (2 sigma^2)) where allowed, else 0
inline void local_window_forward(uint8_t* allowed_out, double* gauss, const double* p, const uint8_t* source_mask, int B,
                                 int Tq, int S, int D) {
    const double sigma = D / 2.0;
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < Tq; ++t)
            for (int s = 0; s < S; ++s) {
                const size_t i = ((size_t)b * Tq + t) * S + s;
                const double dist = s - p[(size_t)b * Tq + t];
                const bool in = std::abs(dist) <= D && (!source_mask || source_mask[(size_t)b * S + s]);
                allowed_out[i] = in;
                gauss[i] = !in ? 0 : D == 0 ? 1 : std::exp(-dist * dist / (2 * sigma * sigma));
            }
}

// gauss = exp(-(s - p)^2 / (2 sigma^2))  =>  dp = sum_s dgauss gauss (s - p) / sigma^2
inline void local_window_backward(double* dp, const double* dgauss, const double* gauss, const double* p, int B, int Tq,
                                  int S, int D) {
    const double sigma = D / 2.0;
    for (size_t bt = 0; bt < (size_t)B * Tq; ++bt) {
        dp[bt] = 0;
        if (D == 0) continue;
        for (int s = 0; s < S; ++s) dp[bt] += dgauss[bt * S + s] * gauss[bt * S + s] * (s - p[bt]) / (sigma * sigma);
    }
}

}  // namespace attnx::reference
