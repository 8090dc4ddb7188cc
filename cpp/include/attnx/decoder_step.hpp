// One cached decoding position through a whole stack of transformer decoder layers, for N rows at
// once: the step CTranslate2's decoder takes, in one call (no Python between the layers).
// Each layer (TransformerDecoderLayer, ARCHITECTURE.md) is three residual blocks:
//   post-norm: x = norm1(x + self_attend(x)),  x = norm2(x + cross_attend(x)),  x = norm3(x + ff(x))
//   pre-norm:  x = x + self_attend(norm1(x)),  x = x + cross_attend(norm2(x)),  x = x + ff(norm3(x))
// The self-attention of position t reads the keys / values of positions 0..t from a cache the step
// extends by row t; the cross-attention reads the encoder output's keys / values, projected once
// per sentence. Every product goes through step_product (a float kernel read in place by dense.hpp's
// tiles, or an int8 kernel on quantized.hpp's: a quantized model decodes in the same step), the norms
// through layernorm_forward (transformer.hpp); the one-query attention
// is its own loop here: attention.hpp's tiled core packs K^T per problem, which one query row
// does not repay, and it reads keys S rows per batch row where this cache holds `capacity`.
//
// Layouts (row-major): x (N, D); caches (layers, N, capacity, D) and cross keys / values
// (layers, N, S, D), heads side by side in D = H * Dh as MultiHeadAttention projects them;
// source_mask (N, S) (nonzero = real token, null = all real); cross_weights (N, H, S). With
// memory_rows, row n attends to memory row memory_rows[n] of the cross keys / values (layers,
// memory_batch, S, D) and of the source mask (memory_batch, S): a beam search's rows share their
// sentence's memory instead of copying it per beam and per reorder. With cache_rows, row n's keys /
// values of position s sit in cache row cache_rows[n * capacity + s] of the caches (layers, cache_batch,
// capacity, D), and the step writes its position there: a beam search reorders its rows by rewriting
// that table (the rows' histories shared, as the beams' are), never the caches.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnx/activations.hpp"
#include "attnx/dense.hpp"
#include "attnx/packed.hpp"
#include "attnx/parallel.hpp"
#include "attnx/quantized.hpp"
#include "attnx/search.hpp"
#include "attnx/transformer.hpp"

namespace attnx {

// One product of the step, y = act(x W + b), x (rows, K), W (K, N): W is the float kernel (row-major,
// read in place by dense.hpp's tiles, or from a copy in panels that a search packed once: packed.hpp) or
// an int8 kernel packed once by the caller (quantized.hpp: per-column scales; the rows of x quantized
// per call), b float (may be null). step_product is the one place the step picks between them.
template <class T> struct StepLinear {
    const T* kernel = nullptr;          // (K, N) float, or null
    const Int8Kernel* int8 = nullptr;   // (K, N) int8, or null (float steps only)
    const T* bias = nullptr;            // (N,) or null
    const PackedRight<T>* packed = nullptr;  // kernel in panels (search_decoder_batches), or null
    bool present() const { return kernel || int8; }
};

// One decoder layer's weights, MultiHeadAttention's projections as (in, out) matrices (D, D); a bias or
// a norm's beta may be null (use_bias=False, center=False), gamma too (scale=False). The self-attention
// may project q, k and v in one product: self_query then holds the three side by side (D, 3D; biases
// likewise) and self_key, self_value are empty. A layer without cross-attention (an encoder layer run
// causally, as a decoder-only model's) leaves that block empty: its blocks are then self-attention and
// feed-forward (norm3).
template <class T> struct DecoderLayerWeights {
    const T *norm1_gamma = nullptr, *norm1_beta = nullptr;
    StepLinear<T> self_query, self_key, self_value, self_output;
    const T *norm2_gamma = nullptr, *norm2_beta = nullptr;
    StepLinear<T> cross_query, cross_output;
    const T *norm3_gamma = nullptr, *norm3_beta = nullptr;
    StepLinear<T> ff1, ff2;
};

// A layer's weights from the 22 slots the bindings take (TransformerDecoderLayer.step_weights' order):
//   0 norm1 gamma, 1 beta, 2 self query kernel, 3 bias, 4 self key, 5, 6 self value, 7, 8 self output, 9,
//   10 norm2 gamma, 11 beta, 12 cross query, 13, 14 cross output, 15, 16 norm3 gamma, 17 beta,
//   18 feed-forward kernel1, 19 bias1, 20 kernel2, 21 bias2
// p[i] a float array or null; int8[i] (null, or a null array) the int8 kernel of a kernel slot i
template <class T>
DecoderLayerWeights<T> decoder_layer_weights(const T* const* p, const Int8Kernel* const* int8 = nullptr) {
    auto product = [&](int i) { return StepLinear<T>{p[i], int8 ? int8[i] : nullptr, p[i + 1]}; };
    DecoderLayerWeights<T> w;
    w.norm1_gamma = p[0], w.norm1_beta = p[1];
    w.self_query = product(2), w.self_key = product(4), w.self_value = product(6), w.self_output = product(8);
    w.norm2_gamma = p[10], w.norm2_beta = p[11];
    w.cross_query = product(12), w.cross_output = product(14);
    w.norm3_gamma = p[16], w.norm3_beta = p[17];
    w.ff1 = product(18), w.ff2 = product(20);
    return w;
}

// What a thread's int8 products reuse within one step: the quantized rows and the int32 sums
struct StepScratch {
    Int8Activations rows;
    std::vector<int32_t> acc;
};

// y (rows, N) = act(x (rows, K) W + b) for a StepLinear: all N columns, split across threads when the
// caller is not already split, or with n1 >= 0 the columns [n0, n1) alone on the calling thread (a
// team member's share; n0 a multiple of 16 for an int8 kernel). int8: x quantized once per call, then
// the columns in blocks of 128 (the widest one-row int8 tile).
template <class T>
void step_product(T* y, const T* x, const StepLinear<T>& w, int rows, int K, int N, StepScratch& scratch,
                  Activation act = Activation::linear, int n0 = 0, int n1 = -1) {
    const bool all_columns = n1 < 0;
    if (all_columns) n0 = 0, n1 = N;
    if (n0 >= n1) return;
    if constexpr (std::is_same_v<T, float>) {
        if (w.int8) {
            const Int8Packed& B = w.int8->head;
            Int8Activations& q = scratch.rows;
            q.resize(rows, K, B.Kp, B.Np);
            scratch.acc.resize((size_t)rows * B.Np);
            on_widest_lanes<float>([&](auto lanes) __attribute__((always_inline)) {
                q.quantize_on<decltype(lanes)>(x, (size_t)K, rows, B.feature_weight.data());
            });
            auto columns = [&](int c0, int c1) {
                q.product(scratch.acc.data(), (size_t)B.Np, rows, B, c0, c1);
                on_widest_lanes<float>([&](auto) __attribute__((always_inline)) {
                    q.dequantize(y, (size_t)N, scratch.acc.data(), (size_t)B.Np, rows, w.int8->scale.data(), w.bias,
                                 c0, c1, (size_t)B.Np);
                });
            };
            constexpr int block = 128;
            if (all_columns)
                parallel_for((size_t)(N + block - 1) / block, double(rows) * K * N / 4, [&](size_t lo, size_t hi) {
                    columns((int)lo * block, std::min(N, (int)hi * block));
                });
            else
                columns(n0, n1);
            if (act != Activation::linear)
                for (int r = 0; r < rows; ++r)
                    activation_forward<float>(y + (size_t)r * N + n0, y + (size_t)r * N + n0, 1, (size_t)(n1 - n0), act);
            return;
        }
    }
    if (all_columns) dense_rows_in_place<T>(y, x, w.kernel, w.bias, rows, K, N, act, w.packed);
    else dense_rows_in_place_columns<T>(y, x, w.kernel, w.bias, rows, K, N, n0, n1, act, w.packed);
}

// Sizes and options of one step: N rows, model size D in H heads, feed-forward width F, S source
// positions, cache rows `capacity` > position (the target position being decoded).
struct DecoderStepConfig {
    int layers = 0, N = 0, D = 0, H = 1, F = 0, S = 0, capacity = 0, position = 0;
    bool norm_first = false;
    double epsilon = 1e-5;
    Activation activation = Activation::relu;
    const int32_t* memory_rows = nullptr;  // (N,) each row's memory row; null: row n reads memory row n
    int memory_batch = 0;                  // memory rows per layer of the cross keys / values (with memory_rows)
    // (N, capacity) each row's cache row per position, distinct rows at `position`; null: row n's own
    const int32_t* cache_rows = nullptr;
    int cache_batch = 0;  // cache rows per layer of the self-attention caches (with cache_rows)
};

// reference: cpp/reference/decoder_step.hpp, attend_one_query
// One query row per (row n, head h), problems split across threads:
//   w[n, h, s] = masked_softmax_s(scale * q[n, h, :] . K[n, s, h, :])   s < keys, allowed[n, s]
//   context[n, h, :] = sum_s w[n, h, s] V[n, s, h, :]
// q rows ldq apart; K, V rows D apart, batch rows `row_stride` rows apart; row n reads batch row
// key_rows[n] of K, V and `allowed` (null: row n), or with position_rows its key s from batch row
// position_rows[n * row_stride + s]; weights (N, H, keys) written when not null. Only the heads
// [h0, h1) when h1 >= 0 (a team member's: their columns of q, K, V, context and weights alone).
template <class T>
void attend_one_query(T* context, T* weights, const T* q, size_t ldq, const T* K, const T* V, const uint8_t* allowed,
                      const int32_t* key_rows, int N, int H, int D, int keys, size_t row_stride, int h0 = 0,
                      int h1 = -1, const int32_t* position_rows = nullptr) {
    const int Dh = D / H, heads = (h1 < 0 ? H : h1) - h0;
    const T scale = T(1) / std::sqrt(T(Dh));
    parallel_for((size_t)N * heads, double(N) * keys * Dh * heads * 4, [&](size_t lo, size_t hi) {
        std::vector<T> row((size_t)keys);
        on_widest_lanes<T>([&](auto lane) __attribute__((always_inline)) {  // the loops vectorize to each level's width
            using Vec = decltype(lane);
            constexpr int L = Lanes<Vec>::W;
            for (size_t p = lo; p < hi; ++p) {
                const size_t n = p / heads, h = h0 + p % heads, m = key_rows ? (size_t)key_rows[n] : n;
                const T* qh = q + n * ldq + h * Dh;
                const int32_t* from = position_rows ? position_rows + n * row_stride : nullptr;
                // key s's offset from K + h Dh (and V's): in row m, or in its own row
                auto at = [&](int s) __attribute__((always_inline)) {
                    return ((from ? (size_t)from[s] : m) * row_stride + s) * D + h * Dh;
                };
                for (int s = 0; s < keys; ++s) {
                    const T* ks = K + at(s);
                    row[s] = scale * sum_lanes<T>(Dh, [&](size_t d) __attribute__((always_inline)) {
                        return qh[d] * ks[d];
                    });
                }
                masked_softmax_row(row.data(), row.data(), allowed ? allowed + m * keys : nullptr, (size_t)keys);
                // each vector of the context summed over s in a register (s in order, as a plain loop)
                T* ch = context + n * D + h * Dh;
                for (int d = 0; d < Dh; d += L) {
                    const int width = std::min(L, Dh - d);
                    Vec acc{};
                    for (int s = 0; s < keys; ++s)
                        acc += vbroadcast<Vec>(row[s]) * vload<Vec>(V + at(s) + d, width);
                    vstore(ch + d, acc, width);
                }
                if (weights) std::copy(row.begin(), row.end(), weights + (n * H + h) * keys);
            }
        });
    });
}

// What one thread's part of a step works in, kept from step to step (every value is written before it
// is read). A team's members write their columns of one set of the products' outputs (qkv, context,
// out, hidden: the first member's) and keep the rest (the normed rows, the int8 scratch; x for all but
// the first) each in its own.
template <class T> struct StepBuffers {
    std::vector<T> x, h, qkv, context, out, mean, rstd, hidden;
    StepScratch scratch;

    void resize(int N, const DecoderStepConfig& c) {
        const size_t rows = (size_t)N * c.D;
        x.resize(rows), h.resize(rows), qkv.resize(3 * rows), context.resize(rows), out.resize(rows);
        mean.resize(N), rstd.resize(N), hidden.resize((size_t)N * c.F);
    }
};

// A team member's share [begin, end) of `width` columns: equal parts cut at multiples of `grain`. A
// product of several rows on the float tiles is cut at 48, three vectors at every level, so that the
// tiles' panels of a share begin where one thread's do (a one-row tile's chains depend on its panel's
// vectors) and the shares give one thread's bits; one that gives the same bits however its columns are
// cut (step_cut_anywhere) at 16, one vector: a 256-wide product then splits 128 + 128, not 96 + 160
inline std::pair<int, int> member_columns(int width, const TeamMember& team, int grain = 48) {
    auto cut = [&](unsigned i) {
        return i >= team.members ? width : (int)((int64_t)width * i / team.members) / grain * grain;
    };
    return {cut(team.index), cut(team.index + 1)};
}

// True when step_product over `rows` rows gives the same bits for any cut of w's columns at a multiple
// of 16: one float row sums every column in the same order wherever it is cut (dense_row_columns), an
// int8 kernel sums integers (exact)
template <class T> bool step_cut_anywhere(const StepLinear<T>& w, int rows) { return w.int8 || rows == 1; }

// The step of decoder_stack_step for its rows [lo, hi), every layer, by one member of `team`: alone
// (a team of one: all of every product), or in lock step with its partners on the same rows, each on
// its share of every product's columns (member_columns) and on its heads of both attentions (their
// cache columns are its own), syncing where a part reads every member's results.
// Each member keeps its own x and norms (the same values: cheaper than a sync). Then
// finish(x, lo, hi, own, team): the last layer's output, by every member.
template <class T, class Finish>
void decoder_stack_rows(T* x_all, T* self_keys, T* self_values, T* cross_weights_all, const T* cross_keys,
                        const T* cross_values, const uint8_t* source_mask_all, const DecoderLayerWeights<T>* layers,
                        const DecoderStepConfig& c, size_t lo, size_t hi, StepBuffers<T>& shared, StepBuffers<T>& own,
                        const TeamMember& team, Finish&& finish) {
    const int N = (int)(hi - lo), D = c.D, S = c.S, t = c.position;
    const size_t rows = (size_t)N * D;
    // the first member updates the rows in place, the others a copy, taken before their first sync (the
    // first member writes x only after it)
    T* x = x_all + lo * D;
    if (team.index > 0) {
        std::copy(x, x + rows, own.x.data());
        x = own.x.data();
    }
    T* cross_weights = cross_weights_all ? cross_weights_all + lo * c.H * S : nullptr;
    // the memory rows of rows lo..: through memory_rows, or rows lo.. themselves
    const int32_t* memory_rows = c.memory_rows ? c.memory_rows + lo : nullptr;
    const size_t memory_batch = c.memory_rows ? (size_t)c.memory_batch : (size_t)c.N;
    const size_t first_memory_row = c.memory_rows ? 0 : lo;
    const uint8_t* source_mask = source_mask_all ? source_mask_all + first_memory_row * S : nullptr;
    T *h = own.h.data(), *mean = own.mean.data(), *rstd = own.rstd.data();
    T *qkv = shared.qkv.data(), *context = shared.context.data(), *out = shared.out.data();
    T* hidden = shared.hidden.data();
    // this member's heads [h0, h1) and their columns [d0, d1)
    const int h0 = c.H * team.index / team.members, h1 = c.H * (team.index + 1) / team.members;
    const int d0 = h0 * (D / c.H), d1 = h1 * (D / c.H);
    // y = act(in W + b): all of it alone (split as the product likes), else this member's share of the columns
    auto product = [&](T* y, const T* in, const StepLinear<T>& w, int K, int width,
                       Activation act = Activation::linear) {
        if (team.members == 1) {
            step_product<T>(y, in, w, N, K, width, own.scratch, act);
        } else {
            const auto [n0, n1] = member_columns(width, team, step_cut_anywhere(w, N) ? 16 : 48);
            step_product<T>(y, in, w, N, K, width, own.scratch, act, n0, n1);
        }
    };
    // Whether the members compute a query (key, value) product on their heads' columns alone, [d0, d1)
    // of each D: each one's attention then reads only what it wrote, and the team need not sync before
    // it. The whole team's answer (their syncs must match): every member's columns begin at a vector.
    bool heads_at_vectors = D % 16 == 0;
    for (unsigned i = 1; i < team.members; ++i) heads_at_vectors &= c.H * i / team.members * (D / c.H) % 16 == 0;
    auto own_heads = [&](const StepLinear<T>& w) {
        return team.members > 1 && heads_at_vectors && step_cut_anywhere(w, N);
    };
    // y's columns [d0, d1) of each of the `parts` D-wide blocks side by side in w (q; or q, k, v fused)
    auto heads_product = [&](T* y, const T* in, const StepLinear<T>& w, int parts) {
        for (int part = 0; part < parts; ++part)
            step_product<T>(y, in, w, N, D, parts * D, own.scratch, Activation::linear, part * D + d0, part * D + d1);
    };
    const T eps = T(c.epsilon);
    // one residual block: x = norm(x + sublayer(x)) or x = x + sublayer(norm(x)); sublayer(in, out)
    // leaves out whole (its last sync)
    auto residual = [&](const T* gamma, const T* beta, auto&& sublayer) {
        const T* in = x;
        if (c.norm_first) {
            layernorm_forward<T>(h, mean, rstd, x, gamma, beta, N, D, eps);
            in = h;
        }
        sublayer(in, out);
        for (size_t i = 0; i < rows; ++i) x[i] += out[i];
        if (!c.norm_first) {
            layernorm_forward<T>(h, mean, rstd, x, gamma, beta, N, D, eps);
            std::copy(h, h + rows, x);
        }
    };
    // rows lo..'s cache rows per position (through cache_rows, from the layer's first row), or their own
    const int32_t* cache_rows = c.cache_rows ? c.cache_rows + lo * c.capacity : nullptr;
    const size_t cache_batch = c.cache_rows ? (size_t)c.cache_batch : (size_t)c.N;
    for (int l = 0; l < c.layers; ++l) {
        const DecoderLayerWeights<T>& w = layers[l];
        const size_t first_row = (size_t)l * cache_batch + (cache_rows ? 0 : lo);
        T* keys = self_keys + first_row * c.capacity * D;
        T* values = self_values + first_row * c.capacity * D;
        residual(w.norm1_gamma, w.norm1_beta, [&](const T* in, T* result) {
            // q, k, v side by side in qkv: (N, 3D) from one product, or three (N, D) apart
            const bool fused = !w.self_key.present();
            const size_t ldq = fused ? 3 * D : D;
            T *q = qkv, *k = fused ? q + D : q + rows, *v = fused ? q + 2 * D : k + rows;
            if (fused && own_heads(w.self_query)) {
                heads_product(qkv, in, w.self_query, 3);
            } else if (!fused && own_heads(w.self_query) && own_heads(w.self_key) && own_heads(w.self_value)) {
                heads_product(q, in, w.self_query, 1);
                heads_product(k, in, w.self_key, 1);
                heads_product(v, in, w.self_value, 1);
            } else {
                if (fused) {
                    product(qkv, in, w.self_query, D, 3 * D);
                } else {
                    product(q, in, w.self_query, D, D);
                    product(k, in, w.self_key, D, D);
                    product(v, in, w.self_value, D, D);
                }
                team.sync();  // every column of q, k, v
            }
            for (int n = 0; n < N; ++n) {  // this member's heads' columns of the caches
                const size_t to = cache_rows ? (size_t)cache_rows[(size_t)n * c.capacity + t] : (size_t)n;
                const size_t row = (size_t)n * ldq, cached = (to * c.capacity + t) * D;
                std::copy(k + row + d0, k + row + d1, keys + cached + d0);
                std::copy(v + row + d0, v + row + d1, values + cached + d0);
            }
            attend_one_query<T>(context, nullptr, q, ldq, keys, values, nullptr, nullptr, N, c.H, D, t + 1,
                                (size_t)c.capacity, h0, h1, cache_rows);
            team.sync();  // every head's context
            product(result, context, w.self_output, D, D);
            team.sync();
        });
        if (w.cross_query.present()) {  // an encoder layer decoding causally has no cross-attention block
            residual(w.norm2_gamma, w.norm2_beta, [&](const T* in, T* result) {
                if (own_heads(w.cross_query)) {
                    heads_product(qkv, in, w.cross_query, 1);
                } else {
                    product(qkv, in, w.cross_query, D, D);
                    team.sync();
                }
                const size_t offset = ((size_t)l * memory_batch + first_memory_row) * S * D;
                attend_one_query<T>(context, l == c.layers - 1 ? cross_weights : nullptr, qkv, (size_t)D,
                                    cross_keys + offset, cross_values + offset, source_mask, memory_rows, N, c.H, D,
                                    S, (size_t)S, h0, h1);
                team.sync();
                product(result, context, w.cross_output, D, D);
                team.sync();
            });
        }
        residual(w.norm3_gamma, w.norm3_beta, [&](const T* in, T* result) {
            product(hidden, in, w.ff1, D, c.F, c.activation);
            team.sync();  // the whole hidden layer
            product(result, hidden, w.ff2, c.F, D);
            team.sync();
        });
    }
    finish(x, lo, hi, own, team);
}

constexpr int kStepRowsPerThread = 6;

// decoder_stack_step's work, then finish(x, lo, hi, own buffers, team) by each thread on its rows (see
// decoder_stack_rows). Many rows split across threads by rows, each thread's products on its own rows;
// fewer (a few rows share each load of the weights in one tile: split, each thread would read all the
// weights for them; kStepRowsPerThread measured) by columns, by a team of every thread that runs the
// whole step in lock step (each member's share of the weights stays in its own core's cache): one
// parallel region per step either way, where a region per product cost a wake-up and a join each.
template <class T, class Finish>
void decoder_stack_run(T* x, T* self_keys, T* self_values, T* cross_weights, const T* cross_keys,
                       const T* cross_values, const uint8_t* source_mask, const DecoderLayerWeights<T>* layers,
                       const DecoderStepConfig& c, Finish&& finish) {
    const double D = c.D, per_row = D * (6 * D + 2 * c.F + 2 * (c.position + 1 + c.S));
    const double work = per_row * c.N * c.layers;
    if (c.N >= 2 * kStepRowsPerThread) {
        parallel_for((size_t)c.N, work, [&](size_t lo, size_t hi) {
            thread_local StepBuffers<T> own;
            own.resize((int)(hi - lo), c);
            decoder_stack_rows<T>(x, self_keys, self_values, cross_weights, cross_keys, cross_values, source_mask,
                                  layers, c, lo, hi, own, own, TeamMember{}, finish);
        });
        return;
    }
    const unsigned members = work >= kParallelMinWork ? kernel_threads() : 1;
    // the calling thread's, named here: inside the members a thread_local name is the member's own
    thread_local std::vector<StepBuffers<T>> team_buffers;
    std::vector<StepBuffers<T>>& buffers = team_buffers;
    if (buffers.size() < members) buffers.resize(members);
    for (unsigned m = 0; m < members; ++m) buffers[m].resize(c.N, c);  // here: a member must not throw
    run_team(members, [&](const TeamMember& team) {
        decoder_stack_rows<T>(x, self_keys, self_values, cross_weights, cross_keys, cross_values, source_mask, layers,
                              c, 0, (size_t)c.N, buffers[0], buffers[team.index], team, finish);
    });
}

// reference: cpp/reference/decoder_step.hpp, decoder_stack_step
// x (N, D): the embedded tokens of `position` in, the last layer's output out. Per layer l:
//   self-attention: q, k, v = h W^Q + b^Q, h W^K + b^K, h W^V + b^V   (h: x, or norm1(x) pre-norm)
//                   keys[l, n, position] = k[n], values[l, n, position] = v[n]
//                   out = attend(q, keys[l, n, 0..position], values[...]) W^O + b^O
//   cross-attention: q = h W^Q + b^Q, out = attend(q, cross_keys[l], cross_values[l], source_mask) W^O + b^O
//   feed-forward: out = act(h W1 + b1) W2 + b2
// each in its residual block as the header says. cross_weights (N, H, S): the last layer's
// cross-attention weights, when not null. Threads: decoder_stack_run.
template <class T>
void decoder_stack_step(T* x, T* self_keys, T* self_values, T* cross_weights, const T* cross_keys,
                        const T* cross_values, const uint8_t* source_mask, const DecoderLayerWeights<T>* layers,
                        const DecoderStepConfig& c) {
    decoder_stack_run<T>(x, self_keys, self_values, cross_weights, cross_keys, cross_values, source_mask, layers, c,
                         [](T*, size_t, size_t, StepBuffers<T>&, const TeamMember&) {});
}

// What turns token ids into the decoder stack's input and its output into logits (the Transformer
// translator's step, python/attnx/translation.py): x = E[id] * scale + positions[position], E's rows
// float or int8 times a scale per row (a quantized Embedding: E[id] = q[id] * row_scale[id]);
// logits = norm(x) W + b (a StepLinear: float or int8), or norm(x) E^T when the output is tied to the
// (float) embedding (output empty).
template <class T> struct DecoderEnds {
    const T* embedding = nullptr;             // (vocab, D), or null with embedding_int8
    const int8_t* embedding_int8 = nullptr;   // (vocab, D)
    const float* embedding_row_scale = nullptr;  // (vocab,) with embedding_int8
    T embedding_scale = T(1);       // sqrt(D)
    const T* positions = nullptr;   // (max_length, D), a row per target position
    const T *norm_gamma = nullptr, *norm_beta = nullptr;
    double norm_epsilon = 1e-5;
    StepLinear<T> output;           // (D, vocab), (vocab,)
    int vocab = 0;
};

// DecoderSearchStep's self-attention caches of `size` values each, kept on the thread from one search to
// the next (up to kKeptBytes): allocating them per call paid a page fault per 4 KiB and a zeroing pass
// (21 MB for 32 sentences x 4 beams x 20 positions, with the spares select copied into then), though every
// value is written before it is read. A search nested on the thread (a Python step's) holds caches of its own.
template <class T> class SearchCaches {
  public:
    static constexpr size_t kKeptBytes = size_t(64) << 20;
    std::vector<T> keys, values;

    // The thread's kept caches (or, while another search on the thread holds them, new ones) for one
    // search, given back when it ends
    class Lease {
      public:
        explicit Lease(size_t size) {
            thread_local SearchCaches kept;
            if (kept.taken_) own_ = std::make_unique<SearchCaches>();
            caches_ = own_ ? own_.get() : &kept;
            caches_->keys.resize(size), caches_->values.resize(size);
            caches_->taken_ = true;
        }
        ~Lease() {
            caches_->taken_ = false;
            if (2 * caches_->keys.size() * sizeof(T) > kKeptBytes) *caches_ = SearchCaches();
        }
        Lease(const Lease&) = delete;
        Lease& operator=(const Lease&) = delete;
        SearchCaches& operator*() const { return *caches_; }

      private:
        std::unique_ptr<SearchCaches> own_;
        SearchCaches* caches_;
    };

  private:
    bool taken_ = false;
};

// The step functor of search.hpp (its header names the interface) over a decoder stack: the caches of
// N rows (layers, N, capacity, D), each step's row n writing cache row n at its position, and each row
// reading its history through its cache row per position (cache_rows), which select reorders: a kept
// row's history stays where it was written, shared by the rows descending from it (the memory likewise
// through memory_rows); nothing is copied. config: the stack's sizes, with N the most rows a step takes,
// capacity the most positions and memory_batch the memory's rows.
template <class T> class DecoderSearchStep {
public:
    using logits_type = T;
    using attention_type = T;

    DecoderSearchStep(const DecoderLayerWeights<T>* layers, const DecoderStepConfig& config, const T* cross_keys,
                      const T* cross_values, const uint8_t* source_mask, const DecoderEnds<T>& ends,
                      bool keep_attention)
        : layers_(layers), c_(config), cross_keys_(cross_keys), cross_values_(cross_values),
          source_mask_(source_mask), ends_(ends), keep_attention_(keep_attention),
          caches_((size_t)c_.layers * c_.N * c_.capacity * c_.D) {
        memory_rows_.resize((size_t)c_.memory_batch);  // the first step: row n is sentence n
        for (int n = 0; n < c_.memory_batch; ++n) memory_rows_[n] = n;
        cache_rows_.resize((size_t)c_.N * c_.capacity), spare_cache_rows_.resize(cache_rows_.size());
        x_.resize((size_t)c_.N * c_.D), h_.resize(x_.size()), mean_.resize(c_.N), rstd_.resize(c_.N);
        logits_.resize((size_t)c_.N * ends_.vocab);
        if (keep_attention_) weights_.resize((size_t)c_.N * c_.H * c_.S);
    }

    const T* step(const int64_t* ids, int rows, int position) {
        const int D = c_.D;
        length_ = position + 1;
        // x = E[id] * sqrt(D) + P[position]
        const T* p = ends_.positions + (size_t)position * D;
        for (int n = 0; n < rows; ++n) {
            T* xn = x_.data() + (size_t)n * D;
            if (ends_.embedding_int8) {  // the quantized Embedding's row (q s, in float), then as a float row
                const int8_t* e = ends_.embedding_int8 + (size_t)ids[n] * D;
                const float s = ends_.embedding_row_scale[ids[n]];
                for (int d = 0; d < D; ++d) xn[d] = T((float)e[d] * s) * ends_.embedding_scale + p[d];
            } else {
                const T* e = ends_.embedding + (size_t)ids[n] * D;
                for (int d = 0; d < D; ++d) xn[d] = e[d] * ends_.embedding_scale + p[d];
            }
        }
        for (int n = 0; n < rows; ++n) cache_rows_[(size_t)n * c_.capacity + position] = n;
        DecoderStepConfig c = c_;
        c.N = rows, c.position = position, c.memory_rows = memory_rows_.data();
        c.cache_rows = cache_rows_.data(), c.cache_batch = c_.N;
        // logits = norm(x) W + b by the threads that ran the stack, on their rows or columns
        auto logits = [&](const T* x, size_t lo, size_t hi, StepBuffers<T>& own, const TeamMember& team) {
            if (!ends_.output.present()) return;
            const int n = (int)(hi - lo);
            layernorm_forward<T>(own.h.data(), own.mean.data(), own.rstd.data(), x, ends_.norm_gamma, ends_.norm_beta,
                                 n, D, T(ends_.norm_epsilon));
            T* y = logits_.data() + lo * ends_.vocab;
            if (team.members == 1) {
                step_product<T>(y, own.h.data(), ends_.output, n, D, ends_.vocab, own.scratch);
            } else {
                const auto [v0, v1] =
                    member_columns(ends_.vocab, team, step_cut_anywhere(ends_.output, n) ? 16 : 48);
                step_product<T>(y, own.h.data(), ends_.output, n, D, ends_.vocab, own.scratch, Activation::linear, v0, v1);
            }
        };
        decoder_stack_run<T>(x_.data(), (*caches_).keys.data(), (*caches_).values.data(), keep_attention_ ? weights_.data() : nullptr,
                             cross_keys_, cross_values_, source_mask_, layers_, c, logits);
        if (!ends_.output.present()) {  // tied to the embedding
            layernorm_forward<T>(h_.data(), mean_.data(), rstd_.data(), x_.data(), ends_.norm_gamma, ends_.norm_beta,
                                 rows, D, T(ends_.norm_epsilon));
            matmul<T>(logits_.data(), h_.data(), ends_.embedding, rows, ends_.vocab, D, false, true);
        }
        return logits_.data();
    }

    const T* attention() const { return weights_.data(); }
    int attention_heads() const { return c_.H; }
    int attention_keys() const { return c_.S; }
    int vocab() const { return ends_.vocab; }

    // the state of rows `rows` (of the last step's), in that order: their cache rows of the decoded
    // positions (the caches stay as they are)
    void select(const int32_t* rows, int count) {
        const size_t capacity = c_.capacity;
        for (int j = 0; j < count; ++j)
            std::copy_n(cache_rows_.data() + rows[j] * capacity, length_, spare_cache_rows_.data() + j * capacity);
        cache_rows_.swap(spare_cache_rows_);
        std::vector<int32_t> memory((size_t)count);
        for (int j = 0; j < count; ++j) memory[j] = memory_rows_[rows[j]];
        memory_rows_.swap(memory);
    }

private:
    const DecoderLayerWeights<T>* layers_;
    DecoderStepConfig c_;
    const T *cross_keys_, *cross_values_;
    const uint8_t* source_mask_;
    DecoderEnds<T> ends_;
    bool keep_attention_;
    typename SearchCaches<T>::Lease caches_;
    int length_ = 0;
    std::vector<T> x_, h_, mean_, rstd_, logits_, weights_;
    std::vector<int32_t> memory_rows_;
    std::vector<int32_t> cache_rows_, spare_cache_rows_;  // (N, capacity): each row's cache row per position
};

// Steps of this many rows and more (a batch times the beam width) read the float kernels from panels
// packed once per search_decoder_batches call (step_product), fewer read them in place. Measured on a
// Sapphire Rapids core, one step's products of the translation example's decoder (2 layers, D 256, FF
// 512, 6000 words; 11 MB, from L3): 16 rows 1.11x, 32 rows 1.19x, 128 rows 1.21x as fast packed, 4 rows
// 0.9x; packing them all into kept panels costs about one step of 32 rows. The panels give the same bits
// as W in place (rows_on_panels), so a search's results do not depend on this choice.
constexpr int kPackedStepRows = 16;

// A decoder stack's weights with every float kernel (and the output layer's) also in packed panels
// (StepLinear::packed): the layers and ends pointing to them. The panels are the thread's, kept from one
// call to the next (up to kKeptBytes) and packed again by every call: fresh ones cost a page fault per
// 4 KiB, 2800 for the translation example's 11 MB, which took as long as seven steps of 32 rows under KVM.
// A call nested on the thread (none runs today: the search runs no Python) packs into panels of its own.
template <class T> class PackedStepWeights {
  public:
    static constexpr size_t kKeptBytes = size_t(64) << 20;
    std::vector<DecoderLayerWeights<T>> layers;
    DecoderEnds<T> ends;

    PackedStepWeights(const DecoderLayerWeights<T>* from, const DecoderStepConfig& c, const DecoderEnds<T>& ends_)
        : layers(from, from + c.layers), ends(ends_) {
        thread_local Kept kept;
        if (kept.taken) own_ = std::make_unique<Kept>();
        kept_ = own_ ? own_.get() : &kept;
        kept_->taken = true;
        const int D = c.D, F = c.F;
        struct Product { StepLinear<T>* w; int K, N; };
        std::vector<Product> products;  // the float products (K, N), each packed once
        auto add = [&](StepLinear<T>& w, int K, int N) {
            if (w.kernel && !w.int8) products.push_back({&w, K, N});
        };
        for (auto& l : layers) {
            add(l.self_query, D, l.self_key.present() ? D : 3 * D);  // q alone, or q, k, v side by side
            add(l.self_key, D, D), add(l.self_value, D, D), add(l.self_output, D, D);
            add(l.cross_query, D, D), add(l.cross_output, D, D);
            add(l.ff1, D, F), add(l.ff2, F, D);
        }
        add(ends.output, D, ends.vocab);
        std::vector<PackedRight<T>>& panels = kept_->panels;
        if (panels.size() < products.size()) panels.resize(products.size());
        parallel_for(products.size(), double(products.size()) * D * D, [&](size_t lo, size_t hi) {
            for (size_t i = lo; i < hi; ++i) {
                panels[i].pack(products[i].w->kernel, products[i].K, products[i].N, false);
                products[i].w->packed = &panels[i];
            }
        });
    }
    ~PackedStepWeights() {
        kept_->taken = false;
        size_t bytes = 0;
        for (const auto& p : kept_->panels) bytes += p.panels.capacity() * sizeof(T);
        if (bytes > kKeptBytes) kept_->panels = {};
    }
    PackedStepWeights(const PackedStepWeights&) = delete;
    PackedStepWeights& operator=(const PackedStepWeights&) = delete;

  private:
    struct Kept {
        std::vector<PackedRight<T>> panels;
        bool taken = false;
    };
    std::unique_ptr<Kept> own_;
    Kept* kept_;
};

// search.hpp's search over a decoder stack for the `search.batch` inputs of the memory (layers, B, S, D),
// `batch` at a time: each batch a search of its own, over its inputs' memory rows cut after their last
// real position (a batch of short sources attends over fewer keys), as separate calls on the cut memory
// would run, bit for bit; one call for all of them saves a crossing from Python per batch (translate_batch
// at batch 1: a call per sentence). config: the stack's sizes (N, memory_batch and S are set here).
// Returns the batches' results as one: steps the longest batch's, tokens 0 past a batch's steps, the
// attention (B, W, heads, steps, S) 0 past a batch's steps and keys.
template <class T>
SearchResult<T> search_decoder_batches(const DecoderLayerWeights<T>* layers, DecoderStepConfig config,
                                       const T* cross_keys, const T* cross_values, const uint8_t* source_mask,
                                       const DecoderEnds<T>& ends, const SearchConfig& search_config, int batch) {
    const int B = search_config.batch, W = search_config.width, S = config.S, D = config.D, layers_count = config.layers;
    batch = std::max(1, std::min(batch, B));
    std::vector<SearchResult<T>> parts;
    std::vector<int> part_keys;
    std::vector<T> keys, values;  // a batch's cut memory, (layers, n, S', D)
    std::vector<uint8_t> mask;    // (n, S')
    std::unique_ptr<PackedStepWeights<T>> packed;  // packed at the first search of kPackedStepRows rows or more
    for (int b0 = 0; b0 < B; b0 += batch) {
        const int n = std::min(batch, B - b0);
        int cut = source_mask ? 1 : S;  // the batch's last real position + 1 (at least one key)
        for (int b = b0; source_mask && b < b0 + n; ++b)
            for (int s = S; s > cut; --s)
                if (source_mask[(size_t)b * S + s - 1]) { cut = s; break; }
        const T *pk = cross_keys, *pv = cross_values;
        const uint8_t* pm = source_mask;
        if (n < B || cut < S) {
            keys.resize((size_t)layers_count * n * cut * D), values.resize(keys.size());
            for (int l = 0; l < layers_count; ++l)
                for (int b = 0; b < n; ++b) {
                    const size_t from = (((size_t)l * B + b0 + b) * S) * D, to = (((size_t)l * n + b) * cut) * D;
                    std::copy_n(cross_keys + from, (size_t)cut * D, keys.data() + to);
                    std::copy_n(cross_values + from, (size_t)cut * D, values.data() + to);
                }
            pk = keys.data(), pv = values.data();
            if (source_mask) {
                mask.resize((size_t)n * cut);
                for (int b = 0; b < n; ++b) std::copy_n(source_mask + (size_t)(b0 + b) * S, cut, mask.data() + (size_t)b * cut);
                pm = mask.data();
            }
        }
        DecoderStepConfig c = config;
        c.N = n * W, c.memory_batch = n, c.S = cut;
        SearchConfig sc = search_config;
        sc.batch = n;
        if (c.N >= kPackedStepRows && !packed) packed = std::make_unique<PackedStepWeights<T>>(layers, config, ends);
        const bool on_panels = c.N >= kPackedStepRows;
        DecoderSearchStep<T> step(on_panels ? packed->layers.data() : layers, c, pk, pv, pm,
                                  on_panels ? packed->ends : ends, sc.attention);
        parts.push_back(search(step, sc));
        part_keys.push_back(cut);
    }
    if (parts.size() == 1 && part_keys[0] == S) return std::move(parts[0]);
    SearchResult<T> out;
    out.batch = B, out.width = W, out.keys = S;
    for (const auto& p : parts) out.steps = std::max(out.steps, p.steps), out.heads = std::max(out.heads, p.heads);
    const size_t steps = out.steps, heads = out.heads;
    out.tokens.assign((size_t)B * W * steps, 0);
    if (search_config.attention) out.attention.assign((size_t)B * W * heads * steps * S, T(0));
    int b0 = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
        const SearchResult<T>& p = parts[i];
        const size_t rows = (size_t)p.batch * W, first = (size_t)b0 * W;
        out.lengths.insert(out.lengths.end(), p.lengths.begin(), p.lengths.end());
        out.scores.insert(out.scores.end(), p.scores.begin(), p.scores.end());
        out.normalized.insert(out.normalized.end(), p.normalized.begin(), p.normalized.end());
        for (size_t r = 0; r < rows; ++r) {
            std::copy_n(p.tokens.begin() + r * p.steps, p.steps, out.tokens.begin() + (first + r) * steps);
            for (size_t j = 0; search_config.attention && j < heads * p.steps; ++j)  // (heads, steps, keys) rows
                std::copy_n(p.attention.begin() + (r * heads * p.steps + j) * part_keys[i], part_keys[i],
                            out.attention.begin() + ((first + r) * heads * steps + j / p.steps * steps + j % p.steps) * S);
        }
        b0 += p.batch;
    }
    return out;
}

}  // namespace attnx
