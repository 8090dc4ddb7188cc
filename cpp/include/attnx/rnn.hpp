// Recurrent layers (SimpleRNN, GRU, LSTM): whole-sequence forward and backpropagation through time
// over batch-first row-major buffers, with step masks, either time order, initial states and one
// recurrent-dropout mask per sequence. The step-by-step cells are the T = 1 case of the same code.
//
// Shapes: x (B, T, C); kernel W (C, G*H); recurrent kernel U (H, G*H); G gates of H units each,
// in the order SimpleRNN (h), GRU (r, z, n), LSTM (i, f, g, o).
//
// Plan (ARCHITECTURE.md, "Threads and SIMD"): each step computes [h_{t-1}, x_t] . [U; W] in register tiles (R
// rows x Q gates x W units) on a copy of [U; W] packed once per call, and applies the gate math to
// the tile while it is still in registers: no per-step BLAS call (whose packing of U cost as much as
// the product at these sizes), no pre-activation buffer round trip. GRU reset_after projects its
// input with one GEMM first (its candidate keeps x_n W_n apart). Batch rows never interact, so
// the rows are split across the thread budget (parallel_for) for the whole call. Backward walks
// the steps in reverse with the same tiles for dgates . U^T (LSTM and SimpleRNN: dgates . [U; W]^T,
// dx with dh) and sums the bias gradients per step, then computes each thread's dW and dU (and
// GRU's dx) with one GEMM each over its steps (single-threaded BLAS). The time loops are
// compiled for baseline x86-64, AVX2 + FMA and AVX-512, and the CPU picks at run time.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <vector>

#include "attnx/activations.hpp"
#include "attnx/bf16.hpp"
#include "attnx/dense.hpp"
#include "attnx/gemm.hpp"
#include "attnx/packed.hpp"
#include "attnx/parallel.hpp"

namespace attnx {

enum class RNNCell { simple, gru, lstm };

struct RNNConfig {
    RNNCell cell = RNNCell::lstm;
    bool reset_after = true;  // GRU: PyTorch's n = act(x_n + r * (h U_n + b_hn)); false: Keras' act(x_n + (r * h) U_n)
    bool reverse = false;     // process t = T-1 .. 0 (backward direction of a bidirectional layer)
    Activation activation = Activation::tanh;               // candidate / cell output (SimpleRNN's only one)
    Activation recurrent_activation = Activation::sigmoid;  // the gates
    int B = 0, T = 0, C = 0, H = 0;
    bool split_batch = true;  // split the time loop's batch rows across threads (parallel_for)

    int gates() const { return cell == RNNCell::lstm ? 4 : cell == RNNCell::gru ? 3 : 1; }
    int G() const { return gates() * H; }
    int time_at(int step) const { return reverse ? T - 1 - step : step; }
};

// What backward needs, indexed by (batch row, time step) like the input; each (B, T, .) row-major.
template <class T> struct RNNCache {
    T* gates = nullptr;   // (B, T, G*H): x . W + b, overwritten in the loop by the activated gates
                          //   (SimpleRNN h_t; GRU r, z, n; LSTM i, f, g, o)
    T* h_prev = nullptr;  // (B, T, H): state entering step t
    T* h_rec = nullptr;   // (B, T, H): h_prev * recurrent dropout mask; null without recurrent dropout
    T* c_prev = nullptr;  // (B, T, H): LSTM cell state entering step t
    T* aux = nullptr;     // (B, T, H): LSTM act(c_t); GRU reset_after h U_n + b_hn; GRU classic r * h_rec
    // Steps without the input projection fused (rnn_forward_rows): the row of x_t W + b_in for (b, t) at
    // input_rows[b * T + t], read in place instead of from gates (which then only receives what the
    // steps write); null: gates holds them. The plan's embedded table rows: their copy into gates cost
    // 32 us a call (1024 rows of 1.6 KB at the sentiment LSTM's batch 32; its steps take 450).
    const T* const* input_rows = nullptr;
    // the state multiplied into U at step t: h_rec with recurrent dropout, else h_prev
    const T* recurrent_input() const { return h_rec ? h_rec : h_prev; }
};

// Activations the recurrent cells accept (the derivative must follow from the output alone).
inline bool rnn_activation_ok(Activation a) {
    return a == Activation::tanh || a == Activation::sigmoid || a == Activation::relu || a == Activation::linear;
}

// The cells' activations as a policy: the default (tanh, sigmoid) pair compiles without a switch in
// the time loop; any other pair goes through activate's.
struct TanhSigmoid {
    template <class V> ATTNX_ALWAYS_INLINE V act(V v) const { return activate(Activation::tanh, v); }
    template <class V> ATTNX_ALWAYS_INLINE V ract(V v) const { return activate(Activation::sigmoid, v); }
};
struct AnyActivations {
    Activation a, r;
    template <class V> ATTNX_ALWAYS_INLINE V act(V v) const { return activate(a, v); }
    template <class V> ATTNX_ALWAYS_INLINE V ract(V v) const { return activate(r, v); }
};

// d act(x) / dx written through y = act(x), which is what the caches hold
template <class T> inline T act_slope(Activation a, T y) {
    switch (a) {
        case Activation::tanh: return T(1) - y * y;
        case Activation::sigmoid: return y * (T(1) - y);
        case Activation::relu: return y > T(0) ? T(1) : T(0);
        default: return T(1);
    }
}

// Runs the time loop fn(b0, b1) over batch rows split across the thread budget (rows never
// interact, so the threads need no synchronization per step; each runs single-threaded BLAS).
template <class F> void for_batch_rows(const RNNConfig& cfg, F&& fn) {
    if (!cfg.split_batch) {
        fn(0, cfg.B);
        return;
    }
    const double work = (double)cfg.B * cfg.T * cfg.G() * cfg.H;  // multiply-adds of h . U
    parallel_for((size_t)cfg.B, work, [&](size_t b0, size_t b1) { fn((int)b0, (int)b1); });
}

// ------------------------------------------------------------------------------------- forward
// LSTM units past the last whole block of W that share one vector, the four gates' side by side
// (gate q of unit H - r + j at lane q r + j): r = H mod W when 4 r <= W, else 0 (the last block
// then runs padded to W units). At H = 100 on 16 lanes the padded block was 10.7% of a step's
// multiply-adds; as one vector it is 4x fewer. None when the step products run on AMX tiles (`amx`):
// there a tail block is a second pass of the step's rows through the tiles, whose loads, not their
// products, set the pace, and it cost more than the padded block (LSTM(100) B=32 T=32 bf16 forward,
// one thread, median of 8 runs: 0.60 ms with it, 0.56 without).
inline int lstm_tail_units(int Q, int H, int W, bool amx = false) {
    const int r = H % W;
    return Q == 4 && r > 0 && 4 * r <= W && !amx ? r : 0;
}

// The recurrent kernel U (H, Q*H) stacked on the input kernel W (C, Q*H; C = 0 when the input
// projection is not fused) and repacked for the time loop: per block of W units, per row k of
// [U; W], the Q gates' W columns side by side, zero past H:
//   packed[((u0 / W) * (H + C) + k) * Q + q][lane] = [U; W][k, q*H + u0 + lane]
// so that one step's product streams each block contiguously (and no 4 KiB stride aliases in L1).
// LSTM's tail units (lstm_tail_units) follow the whole blocks as one vector per row k:
//   packed[(u0 / W) * (H + C) * Q + k][q r + j] = [U; W][k, q*H + u0 + j], u0 = H - r.
template <class T>
void pack_recurrent_kernel(Panels<T>& packed, const T* U, const T* Wx, int H, int C, int Q, int W, bool amx = false) {
    const int r = lstm_tail_units(Q, H, W, amx), blocks = (H - r + W - 1) / W, K = H + C;
    const size_t G = (size_t)Q * H;
    auto row_of = [&](int k) { return k < H ? U + (size_t)k * G : Wx + (size_t)(k - H) * G; };
    packed.assign(((size_t)blocks * Q + (r ? 1 : 0)) * K * W, T(0));
    for (int u0 = 0; u0 < H - r; u0 += W)
        for (int k = 0; k < K; ++k)
            for (int q = 0; q < Q; ++q)
                std::copy(row_of(k) + (size_t)q * H + u0, row_of(k) + (size_t)q * H + std::min(H, u0 + W),
                          packed.data() + (((size_t)(u0 / W) * K + k) * Q + q) * W);
    T* tail = packed.data() + (size_t)blocks * K * Q * W;
    for (int k = 0; r && k < K; ++k)
        for (int q = 0; q < Q; ++q)
            std::copy(row_of(k) + (size_t)q * H + H - r, row_of(k) + (size_t)(q + 1) * H, tail + (size_t)k * W + q * r);
}

// [h, x] . [U; W] on pack_recurrent_kernel's layout: for every block of W units of the first
// `units` (from u0, n of them real) and every row b of [b0, b1):
// pre.q[q] = left[b - b0] . [U; W][:, (q0 + q)*H + u0 .. + W); then cell(b, pre, u0, n). left is
// one run of H values (its segments 1) and x's C.
template <class V, int Q, class T, class Cell>
ATTNX_ALWAYS_INLINE void recurrent_product(int b0, int b1, const LeftRows<T>& left, const T* packed, int H, int units,
                                           int Qt, int q0, Cell&& cell) {
    constexpr int W = Lanes<V>::W;
    const size_t k_stride = (size_t)Qt * W;
    packed_product<V, Q>(b0, b1, left, packed + (size_t)q0 * W, k_stride, (size_t)(H + left.C) * k_stride,
                         (units + W - 1) / W,
                         [&](int b, TileRow<V, Q> pre, int c) __attribute__((always_inline)) {
                             cell(b, pre, c * W, std::min(W, units - c * W));
                         });
}

// The recurrent kernel as the time loops multiply it: float32 panels (forward: pack_recurrent_kernel's
// layout; backward: pack_recurrent_kernel_rows_t's), or under mixed_bfloat16 the same panels with
// their rows paired along k as bf16 (rnn_bf16.hpp), whose steps pair their left rows (h_{t-1}, or
// the step's gate gradients) too and sum in float32 (bf16.hpp's step products). `rows`: U itself
// (H, G) row-major, which a step of one row with the input projection apart reads in place
// (one_row_step), streamed whole (dense_row_columns): Seq2Seq's decoder at batch 1, which packs none
// of its weights (seq2seq.hpp's DecoderPanels::in_place). Where U is packed anyway the packed one-row
// tiles were faster (the plan's LSTM(100) at batch 1: 51 us packed, 67 us in place).
template <class T> struct RecurrentKernel {
    const T* packed = nullptr;
    const uint32_t* pairs = nullptr;  // float only
    bool native = false;              // pairs on vdpbf16ps (bf16_tiles)
    const T* rows = nullptr;          // U (H, G) row-major, or null
};

// Whether the steps of rows [b0, b1) multiply U in place, one row at a time (RecurrentKernel::rows):
// one row, the input projection apart (C = 0)
template <class T> inline bool one_row_step(const RecurrentKernel<T>& kernel, int b0, int b1, int C) {
    return kernel.rows && b1 - b0 == 1 && C == 0;
}

// recurrent_product on the kernel's float32 or bf16 panels (the left [h_rec, x_t] paired per step)
template <class V, int Q, class T, class Cell>
ATTNX_ALWAYS_INLINE void step_product(const RecurrentKernel<T>& kernel, int b0, int b1, const LeftRows<T>& left, int H,
                                      int units, int Qt, int q0, Cell&& cell) {
    if (one_row_step(kernel, b0, b1, left.C)) {
        // pre[(q0 + q) H + u] = h . U[:, (q0 + q) H + u] for the Q gates, then the cell per W units
        constexpr int W = Lanes<V>::W;
        const int G = Qt * H;
        thread_local std::vector<T> pre_row;
        if (pre_row.size() < (size_t)G) pre_row.resize((size_t)G);
        dense_row_columns<T>(pre_row.data(), left.a, kernel.rows, (size_t)G, nullptr, H, q0 * H, (q0 + Q) * H);
        for (int u0 = 0; u0 < units; u0 += W) {
            const int n = std::min(W, units - u0);
            TileRow<V, Q> pre;
            for (int q = 0; q < Q; ++q) pre.q[q] = vload<V>(pre_row.data() + (size_t)q * H + u0, n);
            cell(b0, pre, u0, n);
        }
        return;
    }
    if constexpr (std::is_same_v<T, float>)
        if (kernel.pairs) {
            constexpr int W = Lanes<V>::W;
            const int K2 = (H + left.C + 1) / 2;  // [h_rec, x_t] when the input projection is fused
            bf16_step_product<V, Q>(kernel.native, b0, b1, bf16_step_left(left, b1 - b0), bf16_step_stride(K2),
                                    K2, kernel.pairs + (size_t)q0 * W, (size_t)Qt * W, (size_t)K2 * Qt * W,
                                    (units + W - 1) / W,
                                    [&](int b, TileRow<V, Q> pre, int c) __attribute__((always_inline)) {
                                        cell(b, pre, c * W, std::min(W, units - c * W));
                                    });
            return;
        }
    recurrent_product<V, Q>(b0, b1, left, kernel.packed, H, units, Qt, q0, cell);
}

// LSTM's tail units (lstm_tail_units): the block of one vector after the `blocks` whole ones
template <class V, class T, class Cell>
ATTNX_ALWAYS_INLINE void tail_step_product(const RecurrentKernel<T>& kernel, int b0, int b1, const LeftRows<T>& left,
                                           int H, int blocks, Cell&& cell) {
    constexpr int W = Lanes<V>::W;
    if constexpr (std::is_same_v<T, float>)
        if (kernel.pairs) {
            const int K2 = (H + left.C + 1) / 2;
            bf16_step_product<V, 1>(kernel.native, b0, b1, bf16_step_left(left, b1 - b0), bf16_step_stride(K2),
                                    K2, kernel.pairs + (size_t)blocks * K2 * 4 * W, W, 0, 1, cell);
            return;
        }
    packed_product<V, 1>(b0, b1, left, kernel.packed + (size_t)blocks * (H + left.C) * 4 * W, W, 0, 1, cell);
}

// v's lanes from m on, moved to the front (the lanes after them: any of v's)
template <class V> ATTNX_ALWAYS_INLINE V lanes_from(V v, int m) {
    constexpr int W = Lanes<V>::W;
    if constexpr (W == 1) {
        return v;
    } else {
        typename Lanes<V>::I lane;
        for (int j = 0; j < W; ++j) lane[j] = j;
        return __builtin_shuffle(v, (lane + m) & (W - 1));
    }
}

// pre.q[q] += the input term of gate q0 + q for n units from u0: b_in when the step's product holds
// x_t W, else the projection that gates (at unit u0 of the step's row) holds
template <class V, int Q, class T>
ATTNX_ALWAYS_INLINE void add_input_terms(TileRow<V, Q>& pre, int q0, bool fused, const T* gates, const T* b_in, int H,
                                  int u0, int n) {
    for (int q = 0; q < Q; ++q) {
        const size_t at = (size_t)(q0 + q) * H;
        if (!fused) pre.q[q] += vload<V>(gates + at, n);
        else if (b_in) pre.q[q] += vload<V>(b_in + at + u0, n);
    }
}

// reference: cpp/reference/rnn.hpp, rnn_forward
// Steps of rows [b0, b1) on vectors V, [U; W] packed by pack_recurrent_kernel with W = Lanes<V>::W.
// With x (B, T, C) the input projection x_t W + b_in is fused into each step's product (W packed
// under U); without, cache.gates holds it on entry (the decoder's steps). h, c (B, H) hold the
// initial state and leave with the final one; hu (B, >= H) receives h_t while h_{t-1} is still
// read. Without cache.h_prev (inference) nothing is kept for backward.
template <class V, class T, class Acts>
ATTNX_ALWAYS_INLINE void rnn_steps(const RNNConfig& cfg, const Acts& acts, int b0, int b1, T* y, T* h, T* c,
                            const RNNCache<T>& cache, const T* x, const T* b_in, const RecurrentKernel<T>& packed_u, const T* b_rec,
                            const uint8_t* mask, const T* rec_mask, T* hu, size_t ld_hu) {
    constexpr int W = Lanes<V>::W;
    const int Tn = cfg.T, H = cfg.H, G = cfg.G(), Q = cfg.gates();
    const size_t TH = (size_t)Tn * H, TG = (size_t)Tn * G;
    const bool keep = cache.h_prev != nullptr;
    // LSTM's tail units (lstm_tail_units): src[q*H + j] (a row of gates or b_in from the tail's first
    // unit) at lane q r + j, as pack_recurrent_kernel lays out their weights
    const int tail_units =
        cfg.cell == RNNCell::lstm && !one_row_step(packed_u, b0, b1, x ? cfg.C : 0)
            ? lstm_tail_units(Q, H, W, packed_u.pairs && bf16_steps_on_amx(packed_u.native))
            : 0;
    auto interleave_tail = [&](const T* src) __attribute__((always_inline)) {
        T lanes[W] = {};
        for (int q = 0; q < 4; ++q)
            for (int j = 0; j < tail_units; ++j) lanes[q * tail_units + j] = src[(size_t)q * H + j];
        return vload<V>(lanes, W);
    };
    const V tail_bias = tail_units && b_in ? interleave_tail(b_in + H - tail_units) : V{};
    // H values in vectors, inline: a row's copy is a few vectors, and a memmove call per row and step
    // (three of them with the caches) cost more than the copy
    auto copy_row = [&](T* to, const T* from) __attribute__((always_inline)) {
        for (int j = 0; j < H; j += W) vstore(to + j, vload<V>(from + j, std::min(W, H - j)), std::min(W, H - j));
    };
    for (int s = 0; s < Tn; ++s) {
        const int t = cfg.time_at(s);
        auto real = [&](int b) __attribute__((always_inline)) { return !mask || mask[(size_t)b * Tn + t]; };
        // input rows read in place come from a table larger than L2: the next step's, fetched into L2
        // while this one multiplies
        for (int b = b0; cache.input_rows && s + 1 < Tn && b < b1; ++b) {
            const char* next = reinterpret_cast<const char*>(cache.input_rows[(size_t)b * Tn + cfg.time_at(s + 1)]);
            for (size_t at = 0; at < (size_t)G * sizeof(T); at += 64) __builtin_prefetch(next + at, 0, 2);
        }
        // cache the state entering step t (and its dropped-out copy that meets U)
        for (int b = b0; b < b1; ++b) {
            const size_t row = (size_t)b * TH + (size_t)t * H;
            if (keep) copy_row(cache.h_prev + row, h + (size_t)b * H);
            if (keep && cache.c_prev) copy_row(cache.c_prev + row, c + (size_t)b * H);
            if (rec_mask)
                for (int j = 0; j < H; ++j) cache.h_rec[row + j] = h[(size_t)b * H + j] * rec_mask[(size_t)b * H + j];
        }
        const T* hr = rec_mask ? cache.h_rec + (size_t)b0 * TH + (size_t)t * H : h + (size_t)b0 * H;
        const size_t ld_hr = rec_mask ? TH : (size_t)H;
        const size_t TC = (size_t)Tn * cfg.C;
        const T* x_t = x ? x + (size_t)b0 * TC + (size_t)t * cfg.C : nullptr;
        const LeftRows<T> left{hr, ld_hr, H, x_t, TC, x ? cfg.C : 0};  // [h_rec, x_t]
        const bool fused = x != nullptr;
        // where one block of row b's step lives: gates (x W + b pre-activations in, activated gates
        // out), aux, y, the state, and h_t's staging row
        // (in: where the input terms are read, gates or the step's input row)
        struct Block {
            T *g, *aux, *y, *h, *h_next;
            const T* in;
        };
        auto block = [&](int b, int u0) __attribute__((always_inline)) -> Block {
            const size_t row = (size_t)b * TH + (size_t)t * H + u0;
            T* g = cache.gates + (size_t)b * TG + (size_t)t * G + u0;
            return {g, cache.aux ? cache.aux + row : nullptr, y ? y + row : nullptr, h + (size_t)b * H + u0,
                    hu + (size_t)b * ld_hu + u0, cache.input_rows ? cache.input_rows[(size_t)b * Tn + t] + u0 : g};
        };
        // padded step: the state carries through, the output is 0 (and aux, which meets dU's GEMM)
        auto carry = [&](const Block& k, int n) __attribute__((always_inline)) {
            vstore(k.h_next, vload<V>(k.h, n), n);
            if (k.y) vstore(k.y, V{}, n);
            if (k.aux) vstore(k.aux, V{}, n);
        };
        auto emit = [&](const Block& k, V h_t, int n) __attribute__((always_inline)) {
            vstore(k.h_next, h_t, n);
            if (k.y) vstore(k.y, h_t, n);
        };
        switch (cfg.cell) {
            case RNNCell::simple:
                // h_t = act(x_t W + b + h_{t-1} U)
                step_product<V, 1>(packed_u, b0, b1, left, H, H, Q, 0,
                                        [&](int b, TileRow<V, 1> hu_, int u0, int n) __attribute__((always_inline)) {
                                            const Block k = block(b, u0);
                                            if (!real(b)) return carry(k, n);
                                            add_input_terms(hu_, 0, fused, k.in, b_in, H, u0, n);
                                            const V h_t = acts.act(hu_.q[0]);
                                            if (keep) vstore(k.g, h_t, n);
                                            emit(k, h_t, n);
                                        });
                break;
            case RNNCell::lstm: {
                // i, f, o = ract(.), g = act(.); c_t = f c_{t-1} + i g; h_t = o act(c_t) (from the
                // activated gates)
                auto lstm_cell = [&](const Block& k, int b, int u0, int n, V i, V f, V g, V o)
                    __attribute__((always_inline)) {
                        T* cb = c + (size_t)b * H + u0;
                        const V c_t = f * vload<V>(cb, n) + i * g;
                        const V act_c = acts.act(c_t);
                        vstore(cb, c_t, n);
                        if (keep) {
                            vstore(k.g, i, n), vstore(k.g + H, f, n), vstore(k.g + 2 * H, g, n);
                            vstore(k.g + 3 * H, o, n), vstore(k.aux, act_c, n);
                        }
                        emit(k, o * act_c, n);
                    };
                const int r = tail_units, u_tail = H - r;
                step_product<V, 4>(packed_u, b0, b1, left, H, u_tail, Q, 0,
                                        [&](int b, TileRow<V, 4> hu_, int u0, int n) __attribute__((always_inline)) {
                                            const Block k = block(b, u0);
                                            if (!real(b)) return carry(k, n);
                                            add_input_terms(hu_, 0, fused, k.in, b_in, H, u0, n);
                                            lstm_cell(k, b, u0, n, acts.ract(hu_.q[0]), acts.ract(hu_.q[1]),
                                                      acts.act(hu_.q[2]), acts.ract(hu_.q[3]));
                                        });
                if (!r) break;
                // the tail units' four gates in one vector (pack_recurrent_kernel): both activations
                // of the whole vector (two, not four of it), then each gate's r lanes moved to the front
                tail_step_product<V>(
                    packed_u, b0, b1, left, H, u_tail / W,
                    [&](int b, TileRow<V, 1> pre, int) __attribute__((always_inline)) {
                        const Block k = block(b, u_tail);
                        if (!real(b)) return carry(k, r);
                        const V z = pre.q[0] + (fused ? tail_bias : interleave_tail(k.in));
                        const V sig = acts.ract(z), act_z = acts.act(z);
                        lstm_cell(k, b, u_tail, r, sig, lanes_from(sig, r), lanes_from(act_z, 2 * r),
                                  lanes_from(sig, 3 * r));
                    });
                break;
            }
            case RNNCell::gru:
                if (cfg.reset_after) {
                    // r, z = ract(x W + b_in + h U + b_rec); n = act(x_n + r * (h U_n + b_hn));
                    // h_t = z h_{t-1} + (T(1) - z) n
                    step_product<V, 3>(
                        packed_u, b0, b1, left, H, H, Q, 0,
                        [&](int b, TileRow<V, 3> hu_, int u0, int n) __attribute__((always_inline)) {
                            const Block k = block(b, u0);
                            if (!real(b)) return carry(k, n);
                            // (never fused: x W + b_in is in gates)
                            V pre_r = vload<V>(k.in, n) + hu_.q[0], pre_z = vload<V>(k.in + H, n) + hu_.q[1];
                            V hn = hu_.q[2];
                            if (b_rec) {
                                pre_r += vload<V>(b_rec + u0, n), pre_z += vload<V>(b_rec + H + u0, n);
                                hn += vload<V>(b_rec + 2 * H + u0, n);
                            }
                            const V r = acts.ract(pre_r), z = acts.ract(pre_z);
                            const V nn = acts.act(vload<V>(k.in + 2 * H, n) + r * hn);
                            if (keep) {
                                vstore(k.g, r, n), vstore(k.g + H, z, n), vstore(k.g + 2 * H, nn, n);
                                vstore(k.aux, hn, n);
                            }
                            emit(k, z * vload<V>(k.h, n) + (T(1) - z) * nn, n);
                        });
                } else {
                    // r, z = ract(x W + b + h_rec U_rz); aux = r * h_rec, which the candidate's product needs
                    step_product<V, 2>(
                        packed_u, b0, b1, left, H, H, Q, 0,
                        [&](int b, TileRow<V, 2> hu_, int u0, int n) __attribute__((always_inline)) {
                            const Block k = block(b, u0);
                            if (!real(b)) return carry(k, n);
                            add_input_terms(hu_, 0, fused, k.in, b_in, H, u0, n);
                            const V r = acts.ract(hu_.q[0]);
                            vstore(k.g, r, n), vstore(k.g + H, acts.ract(hu_.q[1]), n);
                            vstore(k.aux, r * vload<V>(hr + (size_t)(b - b0) * ld_hr + u0, n), n);
                        });
                    // n = act(x_n + (r * h_rec) U_n); h_t = z h_{t-1} + (T(1) - z) n
                    step_product<V, 1>(
                        packed_u, b0, b1, LeftRows<T>{cache.aux + (size_t)b0 * TH + (size_t)t * H, TH, H, x_t, TC, left.C},
                        H, H, Q, 2,
                        [&](int b, TileRow<V, 1> hu_, int u0, int n) __attribute__((always_inline)) {
                            const Block k = block(b, u0);
                            if (!real(b)) return;  // carried in the first pass
                            add_input_terms(hu_, 2, fused, k.in, b_in, H, u0, n);
                            const V nn = acts.act(hu_.q[0]), z = vload<V>(k.g + H, n);
                            if (keep) vstore(k.g + 2 * H, nn, n);
                            emit(k, z * vload<V>(k.h, n) + (T(1) - z) * nn, n);
                        });
                }
                break;
        }
        for (int b = b0; b < b1; ++b) copy_row(h + (size_t)b * H, hu + (size_t)b * ld_hu);
    }
}

// rnn_steps on the widest vectors this CPU runs, with the activations known at compile time for
// the default pair
template <class T>
void rnn_packed_rows(const RNNConfig& cfg, int b0, int b1, T* y, T* h, T* c, const RNNCache<T>& cache, const T* x,
                     const T* b_in, const RecurrentKernel<T>& packed_u, const T* b_rec, const uint8_t* mask, const T* rec_mask, T* hu,
                     size_t ld_hu) {
    auto run = [&](const auto& acts) {
        on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
            rnn_steps<decltype(lanes)>(cfg, acts, b0, b1, y, h, c, cache, x, b_in, packed_u, b_rec, mask, rec_mask,
                                       hu, ld_hu);
        });
    };
    if (cfg.activation == Activation::tanh && cfg.recurrent_activation == Activation::sigmoid) run(TanhSigmoid{});
    else run(AnyActivations{cfg.activation, cfg.recurrent_activation});
}

// The recurrent kernel U packed for rnn_forward_rows (once per call of a caller that steps).
template <class T> void pack_recurrent_kernel_rows(Panels<T>& packed, const RNNConfig& cfg, const T* U) {
    pack_recurrent_kernel(packed, U, (const T*)nullptr, cfg.H, 0, cfg.gates(), tile_lanes<T>());
}

// Steps of rows [b0, b1) with cache.gates (or cache.input_rows) holding the input projection (the
// decoder's per-step calls, the plan's); kernel: U packed by pack_recurrent_kernel_rows, or U itself when the rows are
// one (RecurrentKernel::rows). hu (B, G*H) is workspace.
template <class T>
void rnn_forward_rows(const RNNConfig& cfg, int b0, int b1, T* y, T* h, T* c, const RNNCache<T>& cache,
                      const RecurrentKernel<T>& kernel, const T* b_rec, const uint8_t* mask, const T* rec_mask, T* hu) {
    rnn_packed_rows<T>(cfg, b0, b1, y, h, c, cache, nullptr, nullptr, kernel, b_rec, mask, rec_mask, hu,
                       (size_t)cfg.G());
}

// reference: cpp/reference/rnn.hpp, rnn_forward
// Whole-sequence forward. y (B, T, H): h_t at real steps, 0 at padded ones (null: not needed). h, c (B, H): in the
// initial state (zeros if none), out the final state (after each row's last real step). c and
// cache.c_prev are LSTM only. b_in (G*H) / b_rec (G*H, GRU reset_after) may be null. mask (B, T)
// nonzero = real step, null = all real. rec_mask (B, H) multiplies the state entering U (then
// cache.h_rec must be given). Inference leaves cache.h_prev null: then cache.gates and cache.aux
// are workspace only. hu: workspace (B, G*H).
template <class T>
void rnn_forward(const RNNConfig& cfg, T* y, T* h, T* c, const RNNCache<T>& cache, const T* x, const T* W,
                 const T* U, const T* b_in, const T* b_rec, const uint8_t* mask, const T* rec_mask, T* hu) {
    // x_t W joins h_{t-1} U in each step's product: the projection never makes a round trip
    // through memory (a (B, T, G*H) buffer that outgrows the caches). Not for GRU reset_after,
    // whose candidate needs x_n W_n apart from r * (h U_n): its projection is one GEMM per thread.
    const bool fuse = !(cfg.cell == RNNCell::gru && cfg.reset_after);
    thread_local Panels<T> packed;
    pack_recurrent_kernel(packed, U, fuse ? W : nullptr, cfg.H, fuse ? cfg.C : 0, cfg.gates(), tile_lanes<T>());
    const T* packed_u = packed.data();  // this thread's buffer, read by every thread of the batch split
    const size_t TG = (size_t)cfg.T * cfg.G(), TC = (size_t)cfg.T * cfg.C;
    for_batch_rows(cfg, [&](int b0, int b1) {
        if (!fuse) dense_forward<T>(cache.gates + b0 * TG, x + b0 * TC, W, b_in, (b1 - b0) * cfg.T, cfg.C, cfg.G());
        rnn_packed_rows<T>(cfg, b0, b1, y, h, c, cache, fuse ? x : nullptr, b_in, RecurrentKernel<T>{packed_u}, b_rec, mask, rec_mask, hu,
                           (size_t)cfg.G());
    });
}

// ------------------------------------------------------------------------------------ backward
// Activation slopes as a policy: the default (tanh, sigmoid) pair compiles branch-free so that the
// backward gate loops vectorize; any other pair goes through act_slope's switch.
template <class T> struct TanhSigmoidSlopes {
    T act(T y) const { return T(1) - y * y; }
    T ract(T y) const { return y * (T(1) - y); }
};
template <class T> struct AnySlopes {
    Activation a, r;
    T act(T y) const { return act_slope(a, y); }
    T ract(T y) const { return act_slope(r, y); }
};

// Backward gate math of one real step of one batch row (restrict parameters: these loops vectorize).
// dh holds the gradient of h_t on entry and the direct part of that of h_{t-1} on exit.

// reference: cpp/reference/rnn.hpp, rnn_backward
// SimpleRNN: d pre = dh act'(h_t); h_{t-1} reaches h_t only through U
template <class T, class Slopes>
ATTNX_ALWAYS_INLINE void simple_row_backward(const Slopes& slope, int H, T* __restrict__ dg, T* __restrict__ dh, const T* __restrict__ g) {
    for (int j = 0; j < H; ++j) {
        dg[j] = dh[j] * slope.act(g[j]);
        dh[j] = T(0);
    }
}

// reference: cpp/reference/rnn.hpp, rnn_backward
// LSTM: dc_t += dh o act'(c_t); di = dc g, df = dc c_{t-1}, dg = dc i, do = dh act(c_t), each times
// its activation's slope; dc_{t-1} = dc_t f
template <class T, class Slopes>
ATTNX_ALWAYS_INLINE void lstm_row_backward(const Slopes& slope, int H, T* __restrict__ dg, T* __restrict__ dh, T* __restrict__ dc,
                       const T* __restrict__ g, const T* __restrict__ act_c, const T* __restrict__ c_prev) {
    for (int j = 0; j < H; ++j) {
        const T i = g[j], f = g[H + j], gg = g[2 * H + j], o = g[3 * H + j];
        const T dcj = dc[j] + dh[j] * o * slope.act(act_c[j]);
        dg[j] = dcj * gg * slope.ract(i);
        dg[H + j] = dcj * c_prev[j] * slope.ract(f);
        dg[2 * H + j] = dcj * i * slope.act(gg);
        dg[3 * H + j] = dh[j] * act_c[j] * slope.ract(o);
        dc[j] = dcj * f;
        dh[j] = T(0);
    }
}

// reference: cpp/reference/rnn.hpp, rnn_backward
// GRU: dn = dh (T(1) - z) act'(n), dz = dh (h_{t-1} - n) ract'(z), direct dh_{t-1} = dh z. The reset
// gate's gradient follows in gru_after_row_backward or, for the classic form, after U_n^T.
template <class T, class Slopes>
ATTNX_ALWAYS_INLINE void gru_row_backward(const Slopes& slope, int H, T* __restrict__ dg, T* __restrict__ dh, const T* __restrict__ g,
                      const T* __restrict__ h_prev) {
    for (int j = 0; j < H; ++j) {
        const T z = g[H + j], n = g[2 * H + j];
        dg[2 * H + j] = dh[j] * (T(1) - z) * slope.act(n);
        dg[H + j] = dh[j] * (h_prev[j] - n) * slope.ract(z);
        dh[j] *= z;
    }
}

// reference: cpp/reference/rnn.hpp, rnn_backward
// GRU reset_after: n's pre-activation is x_n + r * hn, so dr = dn hn and d hn = dn r; dhu is the
// gradient of h U + b_rec
template <class T, class Slopes>
ATTNX_ALWAYS_INLINE void gru_after_row_backward(const Slopes& slope, int H, T* __restrict__ dg, T* __restrict__ dhu,
                            const T* __restrict__ g, const T* __restrict__ hn) {
    for (int j = 0; j < H; ++j) {
        const T r = g[j], dn = dg[2 * H + j];
        dg[j] = dn * hn[j] * slope.ract(r);
        dhu[j] = dg[j];
        dhu[H + j] = dg[H + j];
        dhu[2 * H + j] = dn * r;
    }
}

// out[b, :N) = dA[b, n0 .. n0 + K) . B[n0 .. n0 + K, :N) for rows [b0, b1) (dA row b at
// dA + (b - b0) * lda) on B (G, N) packed by pack_recurrent_kernel_rows_t (B = U^T, or [U^T | 0 | W^T]),
// handed to out(b, k0, vector, n) per W columns from k0 (n of them real)
template <class V, class T, class Out>
ATTNX_ALWAYS_INLINE void recurrent_product_t(int b0, int b1, const T* dA, size_t lda, int n0, int K, const T* packed_t,
                                             int N, int G, Out&& out) {
    constexpr int W = Lanes<V>::W, width = 3 * W;
    panels_product<V, 3>(b0, b1, LeftRows<T>{dA + n0, lda, K, nullptr, 0, 0}, packed_panels(packed_t, G, N, width, W),
                         n0, N, [&](int b, auto pre, int p) __attribute__((always_inline)) {
                             for (int q = 0; q < pre.count; ++q) {
                                 const int k0 = p * width + q * W;
                                 if (k0 < N) out(b, k0, pre.q[q], std::min(W, N - k0));
                             }
                         });
}

// recurrent_product_t on the kernel's float32 or bf16 panels
template <class V, class T, class Out>
ATTNX_ALWAYS_INLINE void step_product_t(const RecurrentKernel<T>& kernel, int b0, int b1, const T* dA, size_t lda,
                                        int n0, int K, int N, int G, Out&& out) {
    if constexpr (std::is_same_v<T, float>)
        if (kernel.pairs) {
            constexpr int W = Lanes<V>::W, width = 3 * W;
            const int K2 = (K + 1) / 2;  // n0 is even (0 or 2H): row pairs of U^T and of dA line up
            bf16_panels_product<V, 3>(kernel.native, b0, b1, bf16_step_left(dA + n0, lda, b1 - b0, K), bf16_step_stride(K2), K2,
                                      packed_panels(kernel.pairs, (G + 1) / 2, N, width, W), n0 / 2, N,
                                      [&](int b, auto pre, int p) __attribute__((always_inline)) {
                                          for (int q = 0; q < pre.count; ++q) {
                                              const int k0 = p * width + q * W;
                                              if (k0 < N) out(b, k0, pre.q[q], std::min(W, N - k0));
                                          }
                                      });
            return;
        }
    recurrent_product_t<V>(b0, b1, dA, lda, n0, K, kernel.packed, N, G, out);
}

// The units H rounded up to whole vectors of `lanes`: where W^T starts in the columns of a packed
// [U^T | 0 | W^T], so that no vector holds both dh and dx
inline int padded_units(int H, int lanes) { return (H + lanes - 1) / lanes * lanes; }

// What the reverse-time steps can produce besides dh, dc and dgates while a step's gradients are in
// cache (each may be null): dx (B, T, C) = dgates . W^T in the same tiles as d h_rec, for LSTM and
// SimpleRNN only (their dhu is dgates, so one product has one left operand; packed_t then has W^T
// beside U^T), and the bias gradients db_in += sum dgates, db_rec += sum dhu, summed over the steps.
// Under mixed_bfloat16 (rnn_bf16.hpp, LSTM and SimpleRNN) also the operands of
// [dW; dU] += [x | h_rec]^T . dgates, paired along the sequence rows as the steps finish them, while a
// step's rows are in cache: each batch row's steps (t, t + 1) as one pair row (an odd T's last step
// with zeros), pair row k = b (T + 1) / 2 + t / 2, so that a thread's rows make whole pairs
//   left   (B (T + 1) / 2, C + H): left[k * (C + H) + c] = ([x | h_rec][2 rows of k], column c), k-major
//   right  per thread of rows [b0, b1) from pair row k0 = b0 (T + 1) / 2 on, its n = (b1 - b0) (T + 1) / 2
//          pair rows of dgates in panels of `width` columns (bf16.hpp's right layout):
//          right[k0 * panels * width + (p * n + k - k0) * width + j] = (dgates[2 rows of k], p * width + j)
struct StepPairs {
    uint32_t* left = nullptr;
    uint32_t* right = nullptr;
    int width = 0;
    const float* x = nullptr;
    const float* h_rec = nullptr;
};

template <class T> struct StepGradients {
    T* dx = nullptr;
    T* db_in = nullptr;
    T* db_rec = nullptr;
    const StepPairs* pairs = nullptr;  // float only
};

// StepPairs' pair rows of rows [b0, b1) after step t, once both of the pair's steps are done (an odd T's
// last step alone), on lanes V
template <class V>
ATTNX_ALWAYS_INLINE void pair_step_rows(const StepPairs& pairs, const RNNConfig& cfg, int b0, int b1, int t,
                                        const float* dgates) {
    const int T = cfg.T, t0 = t & ~1, count = std::min(2, T - t0);
    if (count == 2 && t == (cfg.reverse ? t0 : t0 + 1)) return;  // the pair's other step comes next in the walk
    const int C = cfg.C, H = cfg.H, G = cfg.G(), T2 = (T + 1) / 2, width = pairs.width;
    const int panels = (G + width - 1) / width;
    const size_t k0 = (size_t)b0 * T2, n = (size_t)(b1 - b0) * T2, CH = (size_t)C + H;
    uint32_t* right = pairs.right + k0 * panels * width;
    const bool converting = bf16_packs_converting();  // (pack_bf16_columns' choice, made once per step)
    auto pack = [&](uint32_t* to, size_t k_stride, const float* from, size_t ld, int cols, int pad_cols)
                    __attribute__((always_inline)) {
        if (converting) pack_bf16_columns_converting(to, k_stride, from, ld, count, cols, pad_cols, nullptr);
        else pack_bf16_columns_on<V>(to, k_stride, from, ld, count, cols, pad_cols, nullptr);
    };
    for (int b = b0; b < b1; ++b) {
        const size_t row = (size_t)b * T + t0, k = (size_t)b * T2 + t0 / 2;
        pack(pairs.left + k * CH, CH, pairs.x + row * C, (size_t)C, C, C);
        pack(pairs.left + k * CH + C, CH, pairs.h_rec + row * H, (size_t)H, H, H);
        for (int p = 0; p < panels; ++p)
            pack(right + ((size_t)p * n + k - k0) * width, (size_t)width, dgates + row * G + p * width, (size_t)G,
                 std::min(width, G - p * width), width);
    }
}

// Reverse-time steps of rows [b0, b1) on vectors V, U^T (and W^T for grads.dx) packed by
// pack_recurrent_kernel_rows_t for W = Lanes<V>::W. dh, dc (B, H) come in as the gradient of the
// final state and leave as that of the initial state. dgates (B, T, G*H) receives d(x W + b_in) per
// step; dhu (B, T, G*H) receives d(h_rec U + b_rec) (the same buffer as dgates except for GRU
// reset_after); dhrec (B, H) is workspace.
template <class V, class T, class Slopes>
ATTNX_ALWAYS_INLINE void rnn_backward_steps(const RNNConfig& cfg, const Slopes& slope, int b0, int b1, T* dh, T* dc,
                                            T* dgates, T* dhu, T* dhrec, const T* dy, const RNNCache<T>& cache,
                                            const RecurrentKernel<T>& packed_t, const uint8_t* mask, const T* rec_mask,
                                            const StepGradients<T>& grads) {
    constexpr int W = Lanes<V>::W;
    const int Tn = cfg.T, H = cfg.H, G = cfg.G(), C = cfg.C;
    const size_t TH = (size_t)Tn * H, TG = (size_t)Tn * G;
    const bool gru_classic = cfg.cell == RNNCell::gru && !cfg.reset_after;
    // dh_{t-1} += d h_rec * recurrent dropout mask (padded rows have d h_rec = 0)
    auto add_to_dh = [&](int b, int k0, V d_hrec, int n) __attribute__((always_inline)) {
        T* d = dh + (size_t)b * H + k0;
        if (rec_mask) d_hrec *= vload<V>(rec_mask + (size_t)b * H + k0, n);
        vstore(d, vload<V>(d, n) + d_hrec, n);
    };
    // sum += the rows [b0, b1) of step t (bias gradients, while the step's rows are in cache)
    auto add_rows = [&](T* sum, const T* rows, int t) __attribute__((always_inline)) {
        for (int b = b0; b < b1; ++b) {
            const T* row = rows + (size_t)b * TG + (size_t)t * G;
            for (int j = 0; j < G; j += W) {
                const int n = std::min(W, G - j);
                vstore(sum + j, vload<V>(sum + j, n) + vload<V>(row + j, n), n);
            }
        }
    };
    for (int s = Tn - 1; s >= 0; --s) {
        const int t = cfg.time_at(s);
        for (int b = b0; b < b1; ++b) {
            const size_t row = (size_t)b * TH + (size_t)t * H, grow = (size_t)b * TG + (size_t)t * G;
            T* dg = dgates + grow;
            if (mask && !mask[(size_t)b * Tn + t]) {  // padded step: dh, dc carry through unchanged
                std::fill(dg, dg + G, T(0));
                if (dhu != dgates) std::fill(dhu + grow, dhu + grow + G, T(0));
                continue;
            }
            T* dhb = dh + (size_t)b * H;
            if (dy)
                for (int j = 0; j < H; ++j) dhb[j] += dy[row + j];
            const T* g = cache.gates + grow;
            switch (cfg.cell) {
                case RNNCell::simple: simple_row_backward(slope, H, dg, dhb, g); break;
                case RNNCell::lstm:
                    lstm_row_backward(slope, H, dg, dhb, dc + (size_t)b * H, g, cache.aux + row, cache.c_prev + row);
                    break;
                case RNNCell::gru:
                    gru_row_backward(slope, H, dg, dhb, g, cache.h_prev + row);
                    // classic: dhu is dgates; dr needs d(r h_rec) = dn . U_n^T first (below)
                    if (cfg.reset_after) gru_after_row_backward(slope, H, dg, dhu + grow, g, cache.aux + row);
                    break;
            }
        }
        const T* du0 = dhu + (size_t)b0 * TG + (size_t)t * G;
        if (gru_classic) {
            // d(r h_rec) = dn . U_n^T; dr = d(r h_rec) h_rec ract'(r); d h_rec = d(r h_rec) r + d[r, z] . U_rz^T
            step_product_t<V>(packed_t, b0, b1, du0, TG, 2 * H, H, H, G,
                                   [&](int b, int k0, V v, int n) __attribute__((always_inline)) {
                                       vstore(dhrec + (size_t)b * H + k0, v, n);
                                   });
            for (int b = b0; b < b1; ++b) {
                if (mask && !mask[(size_t)b * Tn + t]) continue;
                const size_t row = (size_t)b * TH + (size_t)t * H, grow = (size_t)b * TG + (size_t)t * G;
                const T* hrb = cache.recurrent_input() + row;
                T* dhrb = dhrec + (size_t)b * H;
                for (int j = 0; j < H; ++j) {
                    const T r = cache.gates[grow + j];
                    dgates[grow + j] = dhrb[j] * hrb[j] * slope.ract(r);
                    dhrb[j] *= r;
                }
            }
            step_product_t<V>(packed_t, b0, b1, du0, TG, 0, 2 * H, H, G,
                                   [&](int b, int k0, V v, int n) __attribute__((always_inline)) {
                                       add_to_dh(b, k0, v + vload<V>(dhrec + (size_t)b * H + k0, n), n);
                                   });
        } else if (grads.dx) {
            // [d h_rec, dx_t] = d(h_rec U + x_t W) . [U; W]^T (du0 is dgates here), W^T from column
            // Hp of packed_t
            const int Hp = padded_units(H, W);
            step_product_t<V>(packed_t, b0, b1, du0, TG, 0, G, Hp + C, G,
                                   [&](int b, int k0, V v, int n) __attribute__((always_inline)) {
                                       if (k0 < Hp) add_to_dh(b, k0, v, std::min(n, H - k0));
                                       else vstore(grads.dx + ((size_t)b * Tn + t) * C + (k0 - Hp), v, n);
                                   });
        } else {
            // d h_rec = d(h_rec U) . U^T
            step_product_t<V>(packed_t, b0, b1, du0, TG, 0, G, H, G, add_to_dh);
        }
        // (padded steps' rows are 0)
        if (grads.db_in) add_rows(grads.db_in, dgates, t);
        if (grads.db_rec) add_rows(grads.db_rec, dhu, t);
        if constexpr (std::is_same_v<T, float>)
            if (grads.pairs) pair_step_rows<V>(*grads.pairs, cfg, b0, b1, t, dgates);
    }
}

template <class T, class Slopes>
void rnn_backward_packed_rows(const RNNConfig& cfg, const Slopes& slope, int b0, int b1, T* dh, T* dc, T* dgates,
                              T* dhu, T* dhrec, const T* dy, const RNNCache<T>& cache, const RecurrentKernel<T>& packed_t,
                              const uint8_t* mask, const T* rec_mask, const StepGradients<T>& grads = {}) {
    on_widest_lanes<T>([&](auto lanes) __attribute__((always_inline)) {
        rnn_backward_steps<decltype(lanes)>(cfg, slope, b0, b1, dh, dc, dgates, dhu, dhrec, dy, cache, packed_t,
                                            mask, rec_mask, grads);
    });
}

// The right operand of the reverse-time steps' product, packed once per call: U^T (G, H), or with W
// (the input kernel, C rows) [U^T | 0 | W^T] (G, Hp + C) for dx in the same product (StepGradients).
template <class T>
void pack_recurrent_kernel_rows_t(Panels<T>& packed_t, const RNNConfig& cfg, const T* U, const T* W = nullptr) {
    const int lanes = tile_lanes<T>(), G = cfg.G(), H = cfg.H;
    if (!W) return pack_panels_t(packed_t, U, G, G, H, 3 * lanes, lanes);
    // [U; 0; W] (Hp + C, G), transposed by the packing
    const int Hp = padded_units(H, lanes);
    thread_local Panels<T> stacked;
    stacked.assign((size_t)(Hp + cfg.C) * G, T(0));
    std::copy(U, U + (size_t)H * G, stacked.data());
    std::copy(W, W + (size_t)cfg.C * G, stacked.data() + (size_t)Hp * G);
    pack_panels_t(packed_t, stacked.data(), G, G, Hp + cfg.C, 3 * lanes, lanes);
}

// reference: cpp/reference/rnn.hpp, rnn_backward
// Whole-sequence backward. dy (B, T, H) may be null (only the final state used); dh, dc (B, H): in
// the gradient of the final state (zeros if none), out that of the initial state. dx (B, T, C) is
// overwritten (may be null); dW, dU, db_in, db_rec accumulate (biases may be null). Workspace:
// dgates (B, T, G*H), dhu (B, T, G*H; dgates itself except for GRU reset_after), dhrec (B, H).
template <class T>
void rnn_backward(const RNNConfig& cfg, T* dx, T* dW, T* dU, T* db_in, T* db_rec, T* dh, T* dc, const T* dy,
                  const RNNCache<T>& cache, const T* x, const T* W, const T* U, const uint8_t* mask,
                  const T* rec_mask, T* dgates, T* dhu, T* dhrec) {
    const int H = cfg.H, G = cfg.G(), C = cfg.C;
    // LSTM and SimpleRNN take dx from the reverse-time tiles (StepGradients), GRU from one GEMM after
    const bool dx_in_steps = dx && cfg.cell != RNNCell::gru;
    thread_local Panels<T> packed;
    pack_recurrent_kernel_rows_t(packed, cfg, U, dx_in_steps ? W : nullptr);
    const RecurrentKernel<T> packed_t{packed.data()};  // this thread's buffer, read by every thread of the batch split
    // [dW; dU] (stacked, C + H rows) += over the n steps of rows from r0 (as rows of (B * T, .)):
    //   LSTM, SimpleRNN: [x | h_rec]^T . dgates, one GEMM per block of rows copied side by side (two
    //     GEMMs packed dgates twice: 7% of the weight gradients' time at LSTM(256), 14% at LSTM(100))
    //   GRU: x^T . dgates and h_rec^T . dhu (and dx = dgates . W^T), one GEMM each
    auto weight_grads = [&](T* dWU, size_t r0, int n) {
        T* dU_ = dWU + (size_t)C * G;
        const T* hr = cache.recurrent_input() + r0 * H;
        if (cfg.cell != RNNCell::gru) {
            constexpr int block = 256;
            thread_local std::vector<T> xh;
            xh.resize((size_t)block * (C + H));
            for (int i0 = 0; i0 < n; i0 += block) {
                const int m = std::min(block, n - i0);
                for (int i = 0; i < m; ++i) {
                    T* to = xh.data() + (size_t)i * (C + H);
                    std::copy_n(x + (r0 + i0 + i) * C, C, to);
                    std::copy_n(hr + (size_t)(i0 + i) * H, H, to + C);
                }
                gemm<T>(true, false, C + H, G, m, T(1), xh.data(), C + H, dgates + (r0 + i0) * G, G, T(1), dWU, G);
            }
            return;
        }
        dense_backward<T>(dx ? dx + r0 * C : nullptr, dWU, nullptr, dgates + r0 * G, x + r0 * C, W, n, C, G);
        if (!cfg.reset_after) {
            // dU_rz += h_rec^T . d[r, z]; dU_n += (r h_rec)^T . dn
            gemm<T>(true, false, H, 2 * H, n, T(1), hr, H, dhu + r0 * G, G, T(1), dU_, G);
            gemm<T>(true, false, H, H, n, T(1), cache.aux + r0 * H, H, dhu + r0 * G + 2 * H, G, T(1), dU_ + 2 * H, G);
        } else {
            dense_backward<T>(nullptr, dU_, nullptr, dhu + r0 * G, hr, U, n, H, G);
        }
    };
    std::mutex sum_lock;
    for_batch_rows(cfg, [&](int b0, int b1) {
        // each thread sums its rows' [dW; dU; db_in; db_rec] in its own buffer (stacked [dW; dU] is
        // one GEMM's output), added under the lock
        std::vector<T> sums((size_t)(C + H + 2) * G, T(0));
        T* sW = sums.data();
        T* sU = sums.data() + (size_t)C * G;
        T* sb_in = sums.data() + (size_t)(C + H) * G;
        T* sb_rec = sums.data() + (size_t)(C + H + 1) * G;
        // (GRU classic has no recurrent bias)
        const bool rec_bias = db_rec && !(cfg.cell == RNNCell::gru && !cfg.reset_after);
        const StepGradients<T> grads{dx_in_steps ? dx : nullptr, db_in ? sb_in : nullptr, rec_bias ? sb_rec : nullptr};
        if (cfg.activation == Activation::tanh && cfg.recurrent_activation == Activation::sigmoid)
            rnn_backward_packed_rows<T>(cfg, TanhSigmoidSlopes<T>{}, b0, b1, dh, dc, dgates, dhu, dhrec, dy, cache,
                                        packed_t, mask, rec_mask, grads);
        else
            rnn_backward_packed_rows<T>(cfg, AnySlopes<T>{cfg.activation, cfg.recurrent_activation}, b0, b1, dh, dc,
                                        dgates, dhu, dhrec, dy, cache, packed_t, mask, rec_mask, grads);
        // the rows' weight gradients in the same parallel region
        weight_grads(sums.data(), (size_t)b0 * cfg.T, (b1 - b0) * cfg.T);
        std::lock_guard<std::mutex> hold(sum_lock);
        auto add = [](T* to, const T* from, size_t count) {
            if (to)
                for (size_t i = 0; i < count; ++i) to[i] += from[i];
        };
        add(dW, sW, (size_t)C * G), add(dU, sU, (size_t)H * G), add(db_in, sb_in, G), add(db_rec, sb_rec, G);
    });
}

}  // namespace attnx
