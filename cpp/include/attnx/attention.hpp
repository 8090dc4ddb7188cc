// The attention pipeline: scores -> masked softmax over source positions -> context, forward and
// backward, for every score the tutorials name, plus Luong's local-attention window.
//
// Layouts (row-major). A batch of B sequences, each with H heads (H = 1 for plain attention):
//   query   (B, Tq, H, Dk)      key (B, S, H, Dk)      value (B, S, H, Dv)
//   context (B, Tq, H, Dv)      weights / scores (B, H, Tq, S)
// so multi-head attention reads the (B, T, H * d) projections in place, without transposes.
// One "problem" n = b * H + h is one (batch row, head) pair; kernels parallelize over problems.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "attnx/activations.hpp"
#include "attnx/bf16.hpp"
#include "attnx/gemm.hpp"
#include "attnx/packed.hpp"
#include "attnx/parallel.hpp"
#include "attnx/random.hpp"

namespace attnx {

// ----------------------------------------------------------------------------- masks
// Which source positions query t of batch row b may attend to (Keras: nonzero = may attend):
//   allowed(b, t, s) = data[b * stride_b + t * stride_t + s] (all allowed when data is null)
//                      and (s <= t when causal)
// A key padding mask (B, S) has stride_b = S, stride_t = 0; a full mask (B, Tq, S) has
// stride_b = Tq * S, stride_t = S; a mask shared by the batch has stride_b = 0.
struct AttendMask {
    const uint8_t* data = nullptr;
    size_t stride_b = 0, stride_t = 0;
    bool causal = false;

    // The mask row masked_softmax_row expects (null: everything allowed); `scratch` (S bytes)
    // holds the row when it has to be combined with the causal limit.
    const uint8_t* row(uint8_t* scratch, size_t b, size_t t, size_t S) const {
        const uint8_t* given = data ? data + b * stride_b + t * stride_t : nullptr;
        if (!causal) return given;
        for (size_t s = 0; s < S; ++s) scratch[s] = (s <= t) && (!given || given[s]);
        return scratch;
    }
};

// Sizes of one attention call: B batch rows, H heads, Tq queries, S source positions, Dk and Dv
// the per-head query/key and value sizes (a kernel that reads no keys or values ignores Dk or Dv).
struct AttendShape {
    int B = 0, H = 1, Tq = 0, S = 0, Dk = 0, Dv = 0;
};

// Attention's KeepStream (random.hpp) stands for the (B, H, Tq, S) mask random_keep(keep, B, H * Tq * S,
// key, first_row, rate) would write.

// Rows [t0, t0 + r) of problem n's keep mask (r x S, rows S apart): the given (B, H, Tq, S) mask's in
// place, else drawn from `drawn` into scratch; null when there is no dropout
template <class T>
const T* keep_rows(const T* keep, const KeepStream& drawn, size_t n, int H, int Tq, int S, int t0, int r,
                   std::vector<T>& scratch) {
    if (keep) return keep + (n * Tq + t0) * (size_t)S;
    if (drawn.rate == 0) return nullptr;
    scratch.resize((size_t)r * S);
    const KeepRule<T> rule(drawn.rate);
    const uint64_t row_key = fold_in(drawn.key, drawn.first_row + n / H);  // the batch row's stream
    on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {
        for (int t = 0; t < r; ++t)
            rule.span(scratch.data() + (size_t)t * S, row_key, ((n % H) * (size_t)Tq + t0 + t) * S, (size_t)S);
    });
    return scratch.data();
}

// ----------------------------------------------------------------------------- softmax + context
// reference: cpp/reference/attention.hpp, masked_softmax_scores
// weights[n, t, :] = masked_softmax(scores[n, t, :]) for the B * H * Tq rows of (B, H, Tq, S)
// scores; weights may alias scores. Fully masked rows become zeros.
template <class T>
void masked_softmax_scores(const AttendShape& shape, T* weights, const T* scores, const AttendMask& mask) {
    const int B = shape.B, H = shape.H, Tq = shape.Tq, S = shape.S;
    const size_t N = (size_t)B * H;
    parallel_for(N, double(N) * Tq * S * 8, [&](size_t lo, size_t hi) {
        std::vector<uint8_t> row_mask(mask.causal ? S : 0);
        for (size_t n = lo; n < hi; ++n)
            for (int t = 0; t < Tq; ++t) {
                const size_t off = (n * Tq + t) * (size_t)S;
                masked_softmax_row(weights + off, scores + off, mask.row(row_mask.data(), n / H, t, S), (size_t)S);
            }
    });
}

// Problem n's block in the (B, T, H, D) layout: rows are H * D apart.
template <class T> inline T* head_block(T* base, size_t n, int H, int T_, int D) {
    return base + ((n / H) * (size_t)T_ * H + n % H) * (size_t)D;
}

// Per-thread scratch of the tiled attention loops (sized by their first use, reused per problem)
template <class T> struct AttendScratch {
    Panels<T> key_panels, value_panels;
    std::vector<T> scores, dropped, row_norm, keep;
    std::vector<uint8_t> row_mask;
};

// V (S, Dv), rows ldv apart, as the right operand of softmax_context_rows: in place when its rows
// split into whole panels of `width`, else packed (pack_panels) into scratch.value_panels.
template <class T>
RightPanels<T> value_panels(const T* value, size_t ldv, int S, int Dv, int width, int lanes,
                            AttendScratch<T>& scratch) {
    if (Dv % width == 0) return {value, ldv, (size_t)width, ldv};
    pack_panels(scratch.value_panels, value, ldv, S, Dv, width, lanes);
    return packed_panels(scratch.value_panels.data(), S, Dv, width, lanes);
}

// reference: cpp/reference/attention.hpp, softmax_context_forward
// One problem's softmax and context for r query rows (the first is query t0), from their scores
// w (rows ldw apart, overwritten):
//   weights = masked_softmax(scores)                            (r, S), saved for backward and plotting
//   context = (weights * keep) . V                              (r, Dv), rows ldc apart
// `keep` (r, S) multiplies the weights after the softmax: the dropout keep mask scaled by
// 1 / (1 - rate), local attention's Gaussian, or null. Without `normalize` (callers that discard
// the weights), the normalization moves after the product, onto r * Dv entries instead of r * S
// (w is left unnormalized):
//   context = diag(row_norm) . ((exp(scores - rowmax) * keep) . V),  row_norm = 1 / rowsum(exp(...))
// The product runs in register tiles of Q vectors V on `value` (from value_panels).
template <class V, int Q, class T>
ATTNX_ALWAYS_INLINE void softmax_context_rows(T* context, size_t ldc, T* w, size_t ldw, RightPanels<T> value,
                                              const AttendMask& mask, size_t b, int t0, const T* keep, int r, int S,
                                              int Dv, bool normalize, AttendScratch<T>& scratch) {
    constexpr int W = Lanes<V>::W, width = Q * W;
    scratch.row_norm.resize(r);
    scratch.row_mask.resize(mask.causal ? S : 0);
    for (int t = 0; t < r; ++t) {
        T* wt = w + (size_t)t * ldw;
        const uint8_t* allowed = mask.row(scratch.row_mask.data(), b, t0 + t, S);
        if (normalize) masked_softmax_row_lanes<V>(wt, wt, allowed, (size_t)S), scratch.row_norm[t] = T(1);
        else scratch.row_norm[t] = masked_exp_row_lanes<V>(wt, wt, allowed, (size_t)S);
    }
    const T* used = w;
    if (keep) {
        scratch.dropped.resize((size_t)r * ldw);
        for (int t = 0; t < r; ++t)
            for (int s = 0; s < S; ++s)
                scratch.dropped[(size_t)t * ldw + s] = w[(size_t)t * ldw + s] * keep[(size_t)t * S + s];
        used = scratch.dropped.data();
    }
    const T* row_norm = scratch.row_norm.data();
    panels_product<V, Q>(0, r, LeftRows<T>{used, ldw, S, nullptr, 0, 0}, value, 0, Dv,
                         [&](int t, auto sum, int p) __attribute__((always_inline)) {
                             for (int j = 0; j < sum.count; ++j) {
                                 const int d0 = p * width + j * W;
                                 if (d0 < Dv)
                                     vstore(context + (size_t)t * ldc + d0, sum.q[j] * row_norm[t],
                                            std::min(W, Dv - d0));
                             }
                         });
}

// Vectors per tile row of the attention products (Q * lanes columns per panel)
constexpr int kAttendTileVectors = 4;

// C[m, n] *= alpha for m < M, n < N (rows ldc apart)
template <class T> void scale_rows(T* C, int M, int N, size_t ldc, T alpha) {
    on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {
        for (int m = 0; m < M; ++m)
            for (int n = 0; n < N; ++n) C[(size_t)m * ldc + n] *= alpha;
    });
}

// One problem's product C = alpha op(A) op(B) (C overwritten; + C when accumulate, then alpha must be 1;
// op: the transpose when trans_*). `bf16` (mixed_bfloat16, float only): on operands rounded to bf16 with
// float32 sums (bf16.hpp's bf16_gemm), alpha applied to the sums; else gemm.hpp's.
template <class T>
void attend_product(bool bf16, bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda,
                    const T* B, int ldb, T* C, int ldc, bool accumulate = false) {
    if constexpr (std::is_same_v<T, float>) {
        if (bf16) {
            bf16_gemm(C, (size_t)ldc, A, (size_t)lda, trans_a, B, (size_t)ldb, trans_b, M, N, K, accumulate);
            if (alpha != 1.0f) scale_rows(C, M, N, (size_t)ldc, alpha);
            return;
        }
    }
    gemm<T>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, accumulate ? T(1) : T(0), C, ldc);
}

// reference: cpp/reference/attention.hpp, softmax_context_backward (bf16: cpp/reference/bf16.hpp)
// Backward of softmax_context_rows for r query rows of one problem (dvalue overwritten, or added to
// when accumulate: the rows' share of a problem taken in blocks; rows ldv apart):
//   dV       = (P * keep)^T . dC
//   dkeep    = (dC . V^T) * P                                   (only when dkeep is not null)
//   dP       = (dC . V^T) * keep + dweights                     (dweights may be null)
//   dscores  = P * (dP - rowsum(dP * P))                         (masked entries have P = 0)
template <class T>
void softmax_context_backward_problem(T* dscores, T* dvalue, T* dkeep, const T* dcontext, const T* dweights,
                                      const T* weights, const T* value, const T* keep, int r, int S, int Dv, int ldv,
                                      T* dropped, bool bf16 = false, bool accumulate = false) {
    // dC . V^T first, then one pass over the rows, each row of the weights read once (in L1, not again from
    // memory for dV's operand and again for the softmax backward), then dV from the weights * keep
    attend_product<T>(bf16, false, true, r, S, Dv, T(1), dcontext, ldv, value, ldv, dscores, S);
    on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {
        for (int t = 0; t < r; ++t) {
            T* ds = dscores + (size_t)t * S;
            const size_t at = (size_t)t * S;
            if (keep)
                for (int j = 0; j < S; ++j) dropped[at + j] = weights[at + j] * keep[at + j];
            if (dkeep)
                for (int j = 0; j < S; ++j) dkeep[at + j] = ds[j] * weights[at + j];
            if (keep)
                for (int j = 0; j < S; ++j) ds[j] *= keep[at + j];
            if (dweights)
                for (int j = 0; j < S; ++j) ds[j] += dweights[at + j];
            softmax_rows_backward(ds, ds, weights + at, 1, (size_t)S);
        }
    });
    attend_product<T>(bf16, true, false, S, Dv, r, T(1), keep ? dropped : weights, S, dcontext, ldv, dvalue, ldv,
                      accumulate);
}

// reference: cpp/reference/attention.hpp, softmax_context_forward
// Softmax and context from precomputed scores (any score kernel), all B * H problems.
// `weights` holds the scores on entry and the attention weights on return.
template <class T>
void softmax_context_forward(const AttendShape& shape, T* context, T* weights, const T* value, const AttendMask& mask,
                             const T* keep) {
    const int B = shape.B, H = shape.H, Tq = shape.Tq, S = shape.S, Dv = shape.Dv;
    const size_t N = (size_t)B * H, block = (size_t)Tq * S;
    parallel_for(N, double(N) * block * (Dv + 4), [&](size_t lo, size_t hi) {
        on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
            using V = decltype(lanes);
            constexpr int Q = kAttendTileVectors;
            AttendScratch<T> scratch;
            for (size_t n = lo; n < hi; ++n) {
                const RightPanels<T> v = value_panels(head_block(value, n, H, S, Dv), (size_t)H * Dv, S, Dv,
                                                      Q * Lanes<V>::W, Lanes<V>::W, scratch);
                softmax_context_rows<V, Q>(head_block(context, n, H, Tq, Dv), (size_t)H * Dv, weights + n * block,
                                           (size_t)S, v, mask, n / H, 0, keep ? keep + n * block : nullptr, Tq, S,
                                           Dv, true, scratch);
            }
        });
    });
}

// reference: cpp/reference/attention.hpp, softmax_context_backward
// Backward of softmax_context_forward: dscores (B, H, Tq, S), dvalue and dkeep (if not null) overwritten.
template <class T>
void softmax_context_backward(const AttendShape& shape, T* dscores, T* dvalue, T* dkeep, const T* dcontext,
                              const T* dweights, const T* weights, const T* value, const T* keep) {
    const int B = shape.B, H = shape.H, Tq = shape.Tq, S = shape.S, Dv = shape.Dv;
    const size_t N = (size_t)B * H, block = (size_t)Tq * S;
    parallel_for(N, double(N) * block * (2 * Dv + 4), [&](size_t lo, size_t hi) {
        std::vector<T> dropped(keep ? block : 0);
        for (size_t n = lo; n < hi; ++n)
            softmax_context_backward_problem(dscores + n * block, head_block(dvalue, n, H, S, Dv),
                                             dkeep ? dkeep + n * block : nullptr, head_block(dcontext, n, H, Tq, Dv),
                                             dweights ? dweights + n * block : nullptr, weights + n * block,
                                             head_block(value, n, H, S, Dv), keep ? keep + n * block : nullptr, Tq, S,
                                             Dv, H * Dv, dropped.data());
    });
}

// ----------------------------------------------------------------------------- dot scores
// One problem's dot score: scores = scale * Q . K^T (Tq, S); Q and K rows ldk apart.
template <class T>
void dot_scores_problem(T* scores, const T* q, const T* k, int Tq, int S, int Dk, int ldk, T scale) {
    gemm<T>(false, true, Tq, S, Dk, scale, q, ldk, k, ldk, T(0), scores, S);
}

// Backward of dot_scores_problem for r query rows (dq overwritten; dk overwritten, or added to when
// accumulate: a problem's rows taken in blocks) before dk's scale, which the caller applies once the
// problem's rows are all in (scale_rows); returns sum(dscores * Q . K^T), the gradient of a learned
// scale, when want_dscale:
//   dQ = scale * dS . K,   dK = dS^T . Q  (times scale after),   dscale = sum((dS . K) * Q)
template <class T>
T dot_scores_backward_problem(T* dq, T* dk, const T* dscores, const T* q, const T* k, int r, int S, int Dk, int ldk,
                              T scale, bool want_dscale, bool bf16 = false, bool accumulate = false) {
    attend_product<T>(bf16, false, false, r, Dk, S, T(1), dscores, S, k, ldk, dq, ldk);
    T dscale = 0;
    for (int t = 0; t < r; ++t)
        for (int d = 0; d < Dk; ++d) {
            const size_t i = (size_t)t * ldk + d;
            if (want_dscale) dscale += dq[i] * q[i];
            dq[i] *= scale;
        }
    attend_product<T>(bf16, true, false, S, Dk, r, T(1), dscores, S, q, ldk, dk, ldk, accumulate);
    return dscale;
}

// reference: cpp/reference/attention.hpp, dot_scores_forward
// scores[n] = scale * Q[n] . K[n]^T for all B * H problems; scores (B, H, Tq, S).
template <class T>
void dot_scores_forward(const AttendShape& shape, T* scores, const T* q, const T* k, T scale) {
    const int B = shape.B, H = shape.H, Tq = shape.Tq, S = shape.S, Dk = shape.Dk;
    const size_t N = (size_t)B * H, block = (size_t)Tq * S;
    parallel_for(N, double(N) * block * Dk, [&](size_t lo, size_t hi) {
        for (size_t n = lo; n < hi; ++n)
            dot_scores_problem(scores + n * block, head_block(q, n, H, Tq, Dk), head_block(k, n, H, S, Dk), Tq, S, Dk,
                               H * Dk, scale);
    });
}

// reference: cpp/reference/attention.hpp, dot_scores_backward
// Backward of dot_scores_forward: dq, dk overwritten; dscale (null to skip) accumulates.
template <class T>
void dot_scores_backward(const AttendShape& shape, T* dq, T* dk, T* dscale, const T* dscores, const T* q, const T* k,
                         T scale) {
    const int B = shape.B, H = shape.H, Tq = shape.Tq, S = shape.S, Dk = shape.Dk;
    const size_t N = (size_t)B * H, block = (size_t)Tq * S;
    std::mutex dscale_lock;
    parallel_for(N, double(N) * block * Dk * 2, [&](size_t lo, size_t hi) {
        T dscale_sum = 0;
        for (size_t n = lo; n < hi; ++n) {
            dscale_sum += dot_scores_backward_problem(head_block(dq, n, H, Tq, Dk), head_block(dk, n, H, S, Dk),
                                                      dscores + n * block, head_block(q, n, H, Tq, Dk),
                                                      head_block(k, n, H, S, Dk), Tq, S, Dk, H * Dk, scale,
                                                      dscale != nullptr);
            scale_rows(head_block(dk, n, H, S, Dk), S, Dk, (size_t)H * Dk, scale);
        }
        if (dscale) {
            std::lock_guard<std::mutex> guard(dscale_lock);
            *dscale += dscale_sum;
        }
    });
}

// ----------------------------------------------------------------------------- fused core
// Query rows per block of the fused core: a (rows, S) block of scores (<= 128 KiB of floats)
// stays in the core's L2 cache between the score product, the softmax and the context product.
inline int sdpa_block_rows(int Tq, int S) { return std::max(1, std::min(Tq, 32768 / std::max(S, 1))); }
// The same under bf16 (whose products pack each block's operands): blocks of <= 256 KiB (an encoder's
// B 8, 8 heads, T 512 on AMX, 2 threads, forward + backward: 64 rows 47.6 ms, 128 rows 44.1, 256 rows 45.6)
inline int sdpa_bf16_block_rows(int Tq, int S) { return std::max(1, std::min(Tq, 65536 / std::max(S, 1))); }

// reference: cpp/reference/attention.hpp, sdpa_forward
// Scaled dot-product attention for one or more heads (the core multi-head attention uses):
//   scores[n]  = scale * Q[n] . K[n]^T                          (Tq, S)
//   weights[n] = masked_softmax(scores[n]),  context[n] = (weights[n] * keep[n]) . V[n]
// Fused per problem and block of query rows (sdpa_block_rows), both products in register tiles on
// K^T and V packed once per problem. `weights` null (inference without the weights): each block
// lives in per-thread scratch, the (B, H, Tq, S) weights are never written, and the softmax is
// normalized on the context (softmax_context_rows without normalize).
// `drawn`: the keep mask drawn from its stream as each block uses it, in place of `keep` (null then).
// `bf16` (mixed_bfloat16, float only; reference: cpp/reference/bf16.hpp, bf16_sdpa_forward): both products on
// operands rounded to bf16 with float32 sums, per problem as whole products (attend_product): the scores
// (scale after the sums), their masked softmax in float32, the context from the rounded weights * keep.
template <class T>
void sdpa_forward(const AttendShape& shape, T* context, T* weights, const T* q, const T* k, const T* v,
                  const AttendMask& mask, const T* keep, T scale, bool bf16 = false, const KeepStream& drawn = {}) {
    const int B = shape.B, H = shape.H, Tq = shape.Tq, S = shape.S, Dk = shape.Dk, Dv = shape.Dv;
    const size_t N = (size_t)B * H, block = (size_t)Tq * S;
    if (bf16) {
        const int rows = sdpa_bf16_block_rows(Tq, S);
        parallel_for(N, double(N) * block * (Dk + Dv), [&](size_t lo, size_t hi) {
            std::vector<T> scores(weights ? 0 : (size_t)rows * S), dropped, keep_scratch;
            std::vector<uint8_t> row_mask(mask.causal ? S : 0);
            for (size_t n = lo; n < hi; ++n)
                for (int t0 = 0; t0 < Tq; t0 += rows) {
                    const int r = std::min(rows, Tq - t0);
                    T* w = weights ? weights + n * block + (size_t)t0 * S : scores.data();
                    // w = Q . K^T, then row by row (in L1): w *= scale (after the sums), its masked
                    // softmax, and the weights * keep the context multiplies
                    attend_product<T>(true, false, true, r, S, Dk, T(1),
                                      head_block(q, n, H, Tq, Dk) + (size_t)t0 * H * Dk, H * Dk,
                                      head_block(k, n, H, S, Dk), H * Dk, w, S);
                    const T* kept = keep_rows(keep, drawn, n, H, Tq, S, t0, r, keep_scratch);
                    if (kept) dropped.resize((size_t)r * S);
                    on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
                        for (int t = 0; t < r; ++t) {
                            T* wt = w + (size_t)t * S;
                            for (int j = 0; j < S; ++j) wt[j] *= scale;
                            masked_softmax_row_lanes<decltype(lanes)>(
                                wt, wt, mask.row(row_mask.data(), n / H, t0 + t, S), (size_t)S);
                            if (kept)
                                for (int j = 0; j < S; ++j) dropped[(size_t)t * S + j] = wt[j] * kept[(size_t)t * S + j];
                        }
                    });
                    const T* used = kept ? dropped.data() : w;
                    // context = (weights * keep) . V
                    attend_product<T>(true, false, false, r, Dv, S, T(1), used, S, head_block(v, n, H, S, Dv), H * Dv,
                                      head_block(context, n, H, Tq, Dv) + (size_t)t0 * H * Dv, H * Dv);
                }
        });
        return;
    }
    const int rows = sdpa_block_rows(Tq, S);
    parallel_for(N, double(N) * block * (Dk + Dv), [&](size_t lo, size_t hi) {
        on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
            using V = decltype(lanes);
            constexpr int Q = kAttendTileVectors, W = Lanes<V>::W, width = Q * W;
            // scratch score rows are padded to whole panels, so every store is a full vector
            const int ld_scratch = (S + width - 1) / width * width;
            AttendScratch<T> scratch;
            if (!weights) scratch.scores.resize((size_t)rows * ld_scratch);
            for (size_t n = lo; n < hi; ++n) {
                pack_panels_t(scratch.key_panels, head_block(k, n, H, S, Dk), (size_t)H * Dk, Dk, S, width, W);
                const RightPanels<T> keys = packed_panels(scratch.key_panels.data(), Dk, S, width, W);
                const RightPanels<T> value = value_panels(head_block(v, n, H, S, Dv), (size_t)H * Dv, S, Dv, width,
                                                          W, scratch);
                for (int t0 = 0; t0 < Tq; t0 += rows) {
                    const int r = std::min(rows, Tq - t0);
                    const size_t first = n * block + (size_t)t0 * S;  // row t0 of problem n in (B, H, Tq, S)
                    T* w = weights ? weights + first : scratch.scores.data();
                    const size_t ldw = weights ? (size_t)S : (size_t)ld_scratch;
                    // w = scale * Q . K^T
                    const LeftRows<T> query{head_block(q, n, H, Tq, Dk) + (size_t)t0 * H * Dk, (size_t)H * Dk, Dk,
                                            nullptr, 0, 0};
                    panels_product<V, Q>(0, r, query, keys, 0, S,
                                         [&](int t, auto dot, int p) __attribute__((always_inline)) {
                                             for (int j = 0; j < dot.count; ++j) {
                                                 const int s0 = p * width + j * W;
                                                 if (s0 < (int)ldw)
                                                     vstore(w + (size_t)t * ldw + s0, dot.q[j] * scale,
                                                            std::min(W, (int)ldw - s0));
                                             }
                                         });
                    softmax_context_rows<V, Q>(head_block(context, n, H, Tq, Dv) + (size_t)t0 * H * Dv,
                                               (size_t)H * Dv, w, ldw, value, mask, n / H, t0,
                                               keep_rows(keep, drawn, n, H, Tq, S, t0, r, scratch.keep), r, S, Dv,
                                               weights != nullptr, scratch);
                }
            }
        });
    });
}

// reference: cpp/reference/attention.hpp, sdpa_backward
// Backward of sdpa_forward. Overwrites dq, dk, dv (same layouts as q, k, v); dweights (the
// gradient flowing into the returned weights, or null) joins before the softmax backward;
// dscale (null to skip) accumulates d loss / d scale for a learned scale. `bf16`: the products as in the
// forward (cpp/reference/bf16.hpp, bf16_sdpa_backward), the softmax backward in float32; `drawn` as there.
template <class T>
void sdpa_backward(const AttendShape& shape, T* dq, T* dk, T* dv, T* dscale, const T* dcontext, const T* dweights,
                   const T* weights, const T* q, const T* k, const T* v, const T* keep, T scale, bool bf16 = false,
                   const KeepStream& drawn = {}) {
    const int B = shape.B, H = shape.H, Tq = shape.Tq, S = shape.S, Dk = shape.Dk, Dv = shape.Dv;
    const size_t N = (size_t)B * H, block = (size_t)Tq * S;
    const int rows = bf16 ? sdpa_bf16_block_rows(Tq, S) : sdpa_block_rows(Tq, S);
    std::mutex dscale_lock;
    parallel_for(N, double(N) * block * (2 * Dk + 2 * Dv), [&](size_t lo, size_t hi) {
        std::vector<T> dscores((size_t)rows * S), dropped(keep || drawn.rate != 0 ? (size_t)rows * S : 0), keep_scratch;
        T dscale_sum = 0;
        for (size_t n = lo; n < hi; ++n) {
            for (int t0 = 0; t0 < Tq; t0 += rows) {
                const int r = std::min(rows, Tq - t0);
                const size_t first = n * block + (size_t)t0 * S;  // row t0 of problem n in (B, H, Tq, S)
                softmax_context_backward_problem(dscores.data(), head_block(dv, n, H, S, Dv), (T*)nullptr,
                                                 head_block(dcontext, n, H, Tq, Dv) + (size_t)t0 * H * Dv,
                                                 dweights ? dweights + first : nullptr, weights + first,
                                                 head_block(v, n, H, S, Dv),
                                                 keep_rows(keep, drawn, n, H, Tq, S, t0, r, keep_scratch), r, S, Dv,
                                                 H * Dv, dropped.data(), bf16, t0 > 0);
                dscale_sum += dot_scores_backward_problem(
                    head_block(dq, n, H, Tq, Dk) + (size_t)t0 * H * Dk, head_block(dk, n, H, S, Dk), dscores.data(),
                    head_block(q, n, H, Tq, Dk) + (size_t)t0 * H * Dk, head_block(k, n, H, S, Dk), r, S, Dk, H * Dk,
                    scale, dscale != nullptr, bf16, t0 > 0);
            }
            scale_rows(head_block(dk, n, H, S, Dk), S, Dk, (size_t)H * Dk, scale);
        }
        if (dscale) {
            std::lock_guard<std::mutex> guard(dscale_lock);
            *dscale += dscale_sum;
        }
    });
}

// ----------------------------------------------------------------------------- additive / concat scores
// reference: cpp/reference/attention.hpp, additive_scores_forward
// Bahdanau's additive and Luong's concat score from the projected query pq = W2 q (+ b) and keys
// pk = W1 k (W_a [q; k] split into its query and key halves, so [q; k] is never formed):
//   hidden[b, t, s, u] = tanh(pq[b, t, u] + pk[b, s, u])         saved for backward
//   scores[b, t, s]    = sum_u v[u] hidden[b, t, s, u]
template <class T>
void additive_scores_forward(T* scores, T* hidden, const T* pq, const T* pk, const T* v, int B, int Tq, int S, int U) {
    parallel_for((size_t)B, double(B) * Tq * S * U * 8, [&](size_t lo, size_t hi) {
        on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
            using V = decltype(lanes);
            constexpr int W = Lanes<V>::W;
            for (size_t b = lo; b < hi; ++b)
                for (int t = 0; t < Tq; ++t) {
                    const T* pqt = pq + (b * Tq + t) * (size_t)U;
                    for (int s = 0; s < S; ++s) {
                        const size_t row = (b * Tq + t) * (size_t)S + s;
                        const T* pks = pk + (b * S + s) * (size_t)U;
                        T* h = hidden + row * U;
                        // one pass: the hidden vector is scored while still in registers
                        V score = {};
                        for (int u = 0; u < U; u += W) {
                            const int n = std::min(W, U - u);
                            const V hu = activate(Activation::tanh, vload<V>(pqt + u, n) + vload<V>(pks + u, n));
                            vstore(h + u, hu, n);
                            score += vload<V>(v + u, n) * hu;
                        }
                        scores[row] = sum_of_lanes(score);
                    }
                }
        });
    });
}

// reference: cpp/reference/attention.hpp, additive_scores_backward
// Backward of additive_scores_forward (dpq, dpk overwritten; dv accumulates):
//   dpre[b, t, s, u] = dscores[b, t, s] v[u] (1 - hidden^2)
//   dpq[b, t, u] = sum_s dpre,   dpk[b, s, u] = sum_t dpre,   dv[u] += sum_{b,t,s} dscores hidden
template <class T>
void additive_scores_backward(T* dpq, T* dpk, T* dv, const T* dscores, const T* hidden, const T* v, int B, int Tq,
                              int S, int U) {
    std::fill(dpk, dpk + (size_t)B * S * U, T(0));
    std::mutex dv_lock;
    parallel_for((size_t)B, double(B) * Tq * S * U * 6, [&](size_t lo, size_t hi) {
        std::vector<T> dv_part(U, T(0));
        on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
            using V = decltype(lanes);
            constexpr int W = Lanes<V>::W;
            for (size_t b = lo; b < hi; ++b)
                for (int t = 0; t < Tq; ++t) {
                    T* dpqt = dpq + (b * Tq + t) * (size_t)U;
                    std::fill(dpqt, dpqt + U, T(0));
                    for (int s = 0; s < S; ++s) {
                        const size_t row = (b * Tq + t) * (size_t)S + s;
                        const T ds = dscores[row];
                        if (ds == T(0)) continue;  // masked positions: nothing flows back
                        const T* h = hidden + row * U;
                        T* dpks = dpk + (b * S + s) * (size_t)U;
                        for (int u = 0; u < U; u += W) {
                            const int n = std::min(W, U - u);
                            const V hu = vload<V>(h + u, n);
                            const V dpre = ds * vload<V>(v + u, n) * (T(1) - hu * hu);
                            vstore(dpqt + u, vload<V>(dpqt + u, n) + dpre, n);
                            vstore(dpks + u, vload<V>(dpks + u, n) + dpre, n);
                            vstore(dv_part.data() + u, vload<V>(dv_part.data() + u, n) + ds * hu, n);
                        }
                    }
                }
        });
        std::lock_guard<std::mutex> guard(dv_lock);
        for (int u = 0; u < U; ++u) dv[u] += dv_part[u];
    });
}

// ----------------------------------------------------------------------------- local attention
// reference: cpp/reference/attention.hpp, local_window_forward
// Luong et al. (2015) local attention around an aligned source position p[b, t] with half-width D:
//   allowed[b, t, s] = |s - p[b, t]| <= D and source_mask[b, s]      (restricts the softmax)
//   gauss[b, t, s]   = exp(-(s - p[b, t])^2 / (2 sigma^2)) inside the window, sigma = D / 2
// The Gaussian multiplies the softmaxed alignment (the `keep` of softmax_context_forward).
// D = 0 keeps only s = p with factor 1. source_mask (B, S) may be null.
template <class T>
void local_window_forward(uint8_t* allowed, T* gauss, const T* p, const uint8_t* source_mask, int B, int Tq, int S,
                          int D) {
    const T inv_two_var = D > 0 ? T(2) / (T(D) * T(D)) : T(0);  // 1 / (2 sigma^2) with sigma = D / 2
    for (size_t bt = 0; bt < (size_t)B * Tq; ++bt) {
        const size_t b = bt / Tq;
        for (int s = 0; s < S; ++s) {
            const T dist = T(s) - p[bt];
            const bool in = std::abs(dist) <= T(D) && (!source_mask || source_mask[b * S + s]);
            allowed[bt * S + s] = in;
            gauss[bt * S + s] = in ? std::exp(-dist * dist * inv_two_var) : T(0);
        }
    }
}

// reference: cpp/reference/attention.hpp, local_window_backward
// Backward of the Gaussian factor (the window edges are piecewise constant in p):
//   dp[b, t] = sum_s dgauss[b, t, s] * gauss[b, t, s] * (s - p[b, t]) / sigma^2      (overwritten)
template <class T>
void local_window_backward(T* dp, const T* dgauss, const T* gauss, const T* p, int B, int Tq, int S, int D) {
    const T inv_var = D > 0 ? T(4) / (T(D) * T(D)) : T(0);
    for (size_t bt = 0; bt < (size_t)B * Tq; ++bt) {
        T acc = 0;
        for (int s = 0; s < S; ++s) acc += dgauss[bt * S + s] * gauss[bt * S + s] * (T(s) - p[bt]);
        dp[bt] = acc * inv_var;
    }
}

}  // namespace attnx
