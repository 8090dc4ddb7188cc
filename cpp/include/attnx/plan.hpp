// A compiled inference plan (ARCHITECTURE.md, "Models and training"): a model's layers for one input
// signature (shape and dtype) as an ordered list of kernel calls over buffers allocated once, run in
// one call. Every op calls the kernel its layer's forward calls (dense.hpp, rnn.hpp, pooling.hpp,
// attention.hpp, transformer.hpp, embedding.hpp); the plan adds no layer math but the elementwise
// glue between them: a padding mask from token ids, Bidirectional's merge of two directions, and the
// masked mean over time (GlobalAveragePooling1D, NumPy in the eager path).
//
// Buffers are float32 "slots" numbered by the builder; slot 0 is the caller's input (float32, or the
// int64 token ids an embedding reads), never written. Masks are uint8 (B, T) slots of their own.
// Weights are the caller's arrays (pointers, not copies): the caller keeps them alive and rebuilds the
// plan when a layer replaces an array. A copy the plan makes of a weight (the recurrent kernel packed
// for the steps) is remade whenever the array's bytes differ from those it was made from: weights
// change in place in many ways (optimizers' kernels, set_weights, loaders, a user's numpy write), and
// comparing the bytes costs less than packing them (the sentiment LSTM(100) at batch 1: see run_rnn).
// A recurrent layer reading an embedding's rows takes its input projection from a table of them
// (EmbeddedProjection), made again per row on the same rule.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "attnx/activations.hpp"
#include "attnx/attention.hpp"
#include "attnx/dense.hpp"
#include "attnx/embedding.hpp"
#include "attnx/pooling.hpp"
#include "attnx/quantized.hpp"
#include "attnx/rnn.hpp"
#include "attnx/transformer.hpp"

namespace attnx {

enum class PlanOpKind {
    embedding,          // out (N, D) = table[ids]; ids from slot 0 (int64), checked against the vocabulary
    padding_mask,       // mask (N) = ids != 0                        (Embedding(mask_zero=True))
    dense,              // out (N, OC) = act(in . W + b)              (Dense, the attention projections)
    feed_forward,       // out (N, OC) = act(in . W1 + b1) . W2 + b2  (FeedForward in inference)
    rnn,                // out = the recurrence's y (B, T, H) or final h (B, H)
    merge,              // out = merge(in, in2): concat on the last axis, sum, mul or ave (Bidirectional)
    attention_pooling,  // out = AttentionPooling of in (B, T, C) under mask
    add_positions,      // out (B, T, D) = in + table[:T]
    layernorm,          // out (N, C) = LayerNormalization of in
    sdpa,               // out (B, Tq, H*Dv) = attention of q=in, k=in2, v=in3 under a key padding mask
    residual_add,       // out = in + in2
    mean_pool,          // out (B, C) = mean over the real steps of in (B, T, C)
    activation,         // out = act(in), softmax per row of `cols`
    // int8 (a quantized layer's own kernels, quantized.hpp: the same calls as its eager forward)
    embedding_int8,     // out (N, D) = q[ids] * scale[ids] (w[0]: the scales; int8 table in `table`)
    dense_int8,         // column blocks into slots block_out (ends block_end) = act(in . W + b): dense_forward_int8
    feed_forward_int8,  // out (N, OC) = act(in . W1 + b1) . W2 + b2: feed_forward_forward_int8
    rnn_int8,           // out = rnn_forward_int8's y (B, T, H) or final h (B, H)
};

enum class PlanMerge { concat, sum, mul, ave };

// A weight packed for a kernel's vectors, with the bytes it was packed from: `current` says whether the
// weight still holds them (bitwise: -0 and NaN payloads count) and the panels are for this many lanes
// (the SIMD level can be capped between calls); `remember` records both after a repack.
struct PackedCopy {
    Panels<float> panels;
    std::vector<float> source;
    int lanes = 0;

    bool current(const float* w, size_t n, int tile_lanes) const {
        return lanes == tile_lanes && source.size() == n && std::memcmp(source.data(), w, n * sizeof(float)) == 0;
    }
    void remember(const float* w, size_t n, int tile_lanes) {
        source.assign(w, w + n);
        lanes = tile_lanes;
    }
};

// The input projection of a recurrent layer whose input is an embedding's rows, as a table over the
// vocabulary: x_t W + b_in = E[id_t] W + b_in, one row of G values per token, so the steps start from
// rows gathered per token instead of a product per step (the sentiment LSTM(100) at batch 32: 13.1M of
// its 54.1M multiply-adds). A row is made when a call first reads its id, and made again when a byte it
// came from changed: W, b_in and the lanes are compared whole per call (as PackedCopy compares U), E's
// row per id the call reads (B*T rows of D, not the vocabulary). Each row is made alone, with the
// kernel of a one-row Dense, so its value never depends on which other rows were made with it.
struct EmbeddedProjection {
    std::unique_ptr<float[]> rows;       // (V, G): row id valid where checked[id] != 0 (pages touched when made)
    std::unique_ptr<float[]> embedding;  // (V, D): E's rows as the table's rows were made from them
    std::vector<float> kernel, bias;     // W (D, G) and b_in (G) as every row was made from them
    std::vector<uint32_t> checked;       // per id: the call that last checked its row; 0: not made
    uint32_t call = 0;
    int lanes = 0;

    EmbeddedProjection(size_t V, size_t D, size_t G)
        : rows(new float[V * G]), embedding(new float[V * D]), checked(V, 0) {}

    // Makes the rows of ids[0..n) current for E (V, D), W (D, G), b (G, or null); ids lie in [0, V).
    void refresh(const int64_t* ids, size_t n, const float* E, const float* W, const float* b, size_t D, size_t G) {
        const int tile = tile_lanes<float>();
        const size_t nb = b ? G : 0;
        if (lanes != tile || kernel.size() != D * G || std::memcmp(kernel.data(), W, D * G * sizeof(float)) != 0 ||
            bias.size() != nb || (nb && std::memcmp(bias.data(), b, nb * sizeof(float)) != 0)) {
            kernel.assign(W, W + D * G);
            bias.assign(b, b + nb);
            lanes = tile;
            std::fill(checked.begin(), checked.end(), 0u);
        }
        if (++call == 0) {  // (the count wrapped: every made row is checked anew)
            for (uint32_t& c : checked) c = c ? 1u : 0u;
            call = 2;
        }
        for (size_t i = 0; i < n; ++i) {
            const size_t id = (size_t)ids[i];
            if (checked[id] == call) continue;
            const float* e = E + id * D;
            float* made_from = embedding.get() + id * D;
            if (checked[id] == 0 || std::memcmp(made_from, e, D * sizeof(float)) != 0) {
                std::copy(e, e + D, made_from);
                float* row = rows.get() + id * G;
                dense_forward_rows<float>(row, row, made_from, W, b, 1, (int)D, (int)G, Activation::linear);
            }
            checked[id] = call;
        }
    }
    const float* row(int64_t id, size_t G) const { return rows.get() + (size_t)id * G; }
};

struct PlanOp {
    PlanOpKind kind = PlanOpKind::dense;
    int out = -1, in = -1, in2 = -1, in3 = -1, mask = -1;  // float slots (0 = the input), mask slot
    int rows = 0, cols = 0, inner = 0, units = 0;          // N, C, F (feed-forward), OC; or merge's rows / widths
    int64_t vocab = 0;
    const float* w[6] = {};  // weights in the order the op's kernel takes them (null: absent bias, ...)
    Activation act = Activation::linear;
    float scalar = 0.f;      // layer norm's epsilon, the attention's scale
    PlanMerge merge = PlanMerge::concat;
    RNNConfig rnn;
    PoolingConfig pool;
    AttendShape attend;
    std::vector<float> work;  // the op's own workspace (the RNN's gates, the norm's statistics)
    PackedCopy packed;        // the recurrent kernel packed for the steps
    std::unique_ptr<EmbeddedProjection> embedded;  // rnn over token ids: the table of E W + b_in (E: w[4])
    // int8 ops: the packed kernels (attnx.quantization.packed's, shared: the Python side rebuilds the plan
    // when it packs them again), an embedding's int8 table, and dense_int8's column blocks with each
    // block's bias (all or none; gathered into `work` per run, as the eager path concatenates them)
    std::shared_ptr<const Int8Kernel> int8[2];
    const int8_t* table = nullptr;
    int block_out[Int8ColumnBlocks::kMax] = {-1, -1, -1, -1}, block_end[Int8ColumnBlocks::kMax] = {};
    const float* block_bias[Int8ColumnBlocks::kMax] = {};
    int blocks = 0;
};

// An RNN whose (B, T, G) input projection fits in this many bytes projects every step's input with one
// product first, and its steps multiply h_{t-1} alone (K = H, not H + C); a larger one fuses x_t W into
// each step's product (rnn_forward), which spares a round trip of that buffer through memory. Measured
// on the sentiment LSTM(100), T = 32, 1 thread (AMD EPYC Zen 5, shared host): batch 1, 51 -> 46.5 us
// projecting first; batch 32 (1.6 MiB of gates), 590 us fused, 655 us projecting first.
constexpr size_t kProjectFirstBytes = 256 << 10;

class InferencePlan {
  public:
    // A float slot of `size` elements; returns its number (slot 0 is the input).
    int add_slot(size_t size) {
        slots_.emplace_back(size);
        return (int)slots_.size() - 1;
    }
    int add_mask_slot(size_t size) {
        masks_.emplace_back(size);
        return (int)masks_.size() - 1;
    }
    size_t slot_size(int s) const { return s > 0 && s < (int)slots_.size() ? slots_[s].size() : 0; }
    int slot_count() const { return (int)slots_.size(); }
    int mask_count() const { return (int)masks_.size(); }

    void add_op(PlanOp op) {
        switch (op.kind) {  // workspaces sized once
            case PlanOpKind::rnn: {
                const size_t BT = (size_t)op.rnn.B * op.rnn.T, G = (size_t)op.rnn.G(), H = (size_t)op.rnn.H;
                op.work.assign(BT * G + BT * H + (size_t)op.rnn.B * (G + 2 * H), 0.f);
                break;
            }
            case PlanOpKind::dense_int8:  // the blocks' biases side by side
                if (op.block_bias[0]) op.work.assign((size_t)op.units, 0.f);
                break;
            case PlanOpKind::rnn_int8:  // h, c (B, H)
                op.work.assign(2 * (size_t)op.rnn.B * op.rnn.H, 0.f);
                break;
            case PlanOpKind::layernorm: op.work.assign(2 * (size_t)op.rows, 0.f); break;
            case PlanOpKind::attention_pooling: op.work.assign(2 * (size_t)op.pool.B * op.pool.T, 0.f); break;
            default: break;
        }
        ops_.push_back(std::move(op));
    }

    // Runs every op on `input`, leaves the result in slot `result` and copies it to `output`. Returns
    // false, having written nothing to `output`, when a token id lies outside an embedding's table
    // (the caller then runs the eager path, which names the layer and the id). Calls on one plan from
    // several threads take turns.
    bool run(const void* input, int result, float* output) {
        std::lock_guard<std::mutex> lock(mutex_);
        input_ = input;
        for (PlanOp& op : ops_)
            if (!run_op(op)) return false;
        std::copy(slots_[result].begin(), slots_[result].end(), output);
        return true;
    }

  private:
    const float* in(int s) const { return s == 0 ? static_cast<const float*>(input_) : slots_[s].data(); }
    float* out(int s) { return slots_[s].data(); }
    const uint8_t* mask(int m) const { return m < 0 ? nullptr : masks_[m].data(); }

    bool run_op(PlanOp& op) {
        switch (op.kind) {
            case PlanOpKind::embedding: {
                const int64_t* ids = static_cast<const int64_t*>(input_);
                const auto [lo, hi] = std::minmax_element(ids, ids + op.rows);
                if (op.rows && (*lo < 0 || *hi >= op.vocab)) return false;
                embedding_forward<float>(out(op.out), ids, op.w[0], (size_t)op.rows, (size_t)op.cols);
                return true;
            }
            case PlanOpKind::padding_mask: {
                const int64_t* ids = static_cast<const int64_t*>(input_);
                uint8_t* m = masks_[op.mask].data();
                for (int i = 0; i < op.rows; ++i) m[i] = ids[i] != 0;
                return true;
            }
            case PlanOpKind::dense:
                // y aliases z: only gelu's backward needs z apart, and nothing runs backward here
                dense_forward_rows<float>(out(op.out), out(op.out), in(op.in), op.w[0], op.w[1], op.rows, op.cols,
                                          op.units, op.act);
                return true;
            case PlanOpKind::feed_forward:
                feed_forward_forward<float>(out(op.out), in(op.in), op.w[0], op.w[1], op.w[2], op.w[3], op.rows,
                                            op.cols, op.inner, op.units, op.act);
                return true;
            case PlanOpKind::rnn: return run_rnn(op);
            case PlanOpKind::merge: run_merge(op); return true;
            case PlanOpKind::attention_pooling: {
                float* weights = op.work.data();
                float* energy = weights + (size_t)op.pool.B * op.pool.T;
                attention_pooling_forward<float>(op.pool, out(op.out), weights, energy, in(op.in), op.w[0], op.w[1],
                                                 mask(op.mask));
                return true;
            }
            case PlanOpKind::add_positions:
                add_positions_forward<float>(out(op.out), in(op.in), op.w[0], (size_t)op.attend.B,
                                             (size_t)op.attend.Tq, (size_t)op.cols);
                return true;
            case PlanOpKind::layernorm:
                layernorm_forward<float>(out(op.out), op.work.data(), op.work.data() + op.rows, in(op.in), op.w[0],
                                         op.w[1], (size_t)op.rows, (size_t)op.cols, op.scalar);
                return true;
            case PlanOpKind::sdpa: {
                AttendMask am;  // a key padding mask (B, S), or none
                am.data = mask(op.mask);
                am.stride_b = (size_t)op.attend.S;
                sdpa_forward<float>(op.attend, out(op.out), nullptr, in(op.in), in(op.in2), in(op.in3), am, nullptr,
                                    op.scalar);
                return true;
            }
            case PlanOpKind::residual_add:
                residual_add<float>(out(op.out), in(op.in), in(op.in2), nullptr, slots_[op.out].size());
                return true;
            case PlanOpKind::mean_pool: run_mean_pool(op); return true;
            case PlanOpKind::activation:
                activation_forward<float>(out(op.out), in(op.in), (size_t)op.rows, (size_t)op.cols, op.act);
                return true;
            case PlanOpKind::embedding_int8: {
                const int64_t* ids = static_cast<const int64_t*>(input_);
                const auto [lo, hi] = std::minmax_element(ids, ids + op.rows);
                if (op.rows && (*lo < 0 || *hi >= op.vocab)) return false;
                embedding_forward_int8(out(op.out), ids, (size_t)op.rows, op.table, op.w[0], op.cols);
                return true;
            }
            case PlanOpKind::dense_int8: {
                Int8ColumnBlocks blocks;
                for (int i = 0, start = 0; i < op.blocks; start = op.block_end[i++]) {
                    blocks.out[i] = out(op.block_out[i]), blocks.ends[i] = op.block_end[i];
                    if (op.block_bias[i]) std::copy(op.block_bias[i], op.block_bias[i] + (op.block_end[i] - start),
                                                    op.work.data() + start);
                }
                blocks.count = op.blocks;
                dense_forward_int8(blocks, in(op.in), op.rows, *op.int8[0], op.block_bias[0] ? op.work.data() : nullptr,
                                   op.act);
                return true;
            }
            case PlanOpKind::feed_forward_int8:
                feed_forward_forward_int8(out(op.out), in(op.in), op.rows, *op.int8[0], op.w[0], op.act, *op.int8[1],
                                          op.w[1]);
                return true;
            case PlanOpKind::rnn_int8: {  // from zero states, as the eager layer's
                const size_t BH = (size_t)op.rnn.B * op.rnn.H;
                const bool sequences = op.units != 0;
                float* h = sequences ? op.work.data() : out(op.out);
                float* c = op.rnn.cell == RNNCell::lstm ? op.work.data() + BH : nullptr;
                std::fill(h, h + BH, 0.f);
                if (c) std::fill(c, c + BH, 0.f);
                rnn_forward_int8(op.rnn, sequences ? out(op.out) : nullptr, h, c, in(op.in), *op.int8[0], *op.int8[1],
                                 op.w[0], op.w[1], mask(op.mask));
                return true;
            }
        }
        return true;
    }

    // One direction of one level: rnn_forward from zero states; the output is y (op.units: return
    // sequences) or the final h. Workspace: gates (B, T, G), aux (B, T, H), hu (B, G), h, c (B, H).
    // Over token ids (op.embedded) false, having run nothing, for an id outside the table.
    bool run_rnn(PlanOp& op) {
        const RNNConfig& cfg = op.rnn;
        const size_t BT = (size_t)cfg.B * cfg.T, G = (size_t)cfg.G(), H = (size_t)cfg.H, BH = (size_t)cfg.B * H;
        float* gates = op.work.data();
        float* aux = gates + BT * G;
        float* hu = aux + BT * H;
        float* c = hu + (size_t)cfg.B * G;
        const bool sequences = op.units != 0;
        float* h = sequences ? c + BH : out(op.out);
        std::fill(h, h + BH, 0.f);
        std::fill(c, c + BH, 0.f);
        RNNCache<float> cache;  // inference: gates and aux are workspace only
        cache.gates = gates;
        cache.aux = cfg.cell != RNNCell::simple ? aux : nullptr;
        float* y = sequences ? out(op.out) : nullptr;
        float* cell = cfg.cell == RNNCell::lstm ? c : nullptr;
        if (!op.embedded && BT * G * sizeof(float) > kProjectFirstBytes) {
            rnn_forward<float>(cfg, y, h, cell, cache, in(op.in), op.w[0], op.w[1], op.w[2], op.w[3], mask(op.mask),
                               nullptr, hu);
            return true;
        }
        const int64_t* ids = static_cast<const int64_t*>(input_);
        if (op.embedded) {
            const auto [lo, hi] = std::minmax_element(ids, ids + BT);
            if (*lo < 0 || *hi >= op.vocab) return false;
            op.embedded->refresh(ids, BT, op.w[4], op.w[0], op.w[2], (size_t)cfg.C, G);
        } else {
        // gates = x . W + b_in for every step, then the steps (the decoders' rnn_forward_rows) on U packed:
        // at batch 1 the packed one-row tiles (packed.hpp's row_tile) beat U read in place
        // (RecurrentKernel::rows): sentiment LSTM(100) plan 53 us packed, 67 us in place (Zen 5, shared host)
            dense_forward_rows<float>(gates, gates, in(op.in), op.w[0], op.w[2], (int)BT, cfg.C, (int)G,
                                      Activation::linear);
        }
        // U packed again only when its bytes changed: comparing them costs 1.4 us of CPU, packing 8.6
        // (LSTM(100), U 156 KB; the sentiment plan at batch 1 went from 46.3 to 38.8 us of CPU; Zen 5,
        // shared host)
        const size_t UG = (size_t)H * G;
        const int lanes = tile_lanes<float>();
        if (!op.packed.current(op.w[1], UG, lanes)) {
            pack_recurrent_kernel_rows<float>(op.packed.panels, cfg, op.w[1]);
            op.packed.remember(op.w[1], UG, lanes);
        }
        const RecurrentKernel<float> kernel{op.packed.panels.data()};
        if (!op.embedded) {
            rnn_forward_rows<float>(cfg, 0, cfg.B, y, h, cell, cache, kernel, op.w[3], mask(op.mask), nullptr, hu);
            return true;
        }
        // the rows looked up (read in place: RNNCache::input_rows), then the steps of all rows in one call:
        // each step's panels of U are then read from L1 by every row's tiles (steps in blocks of 7 rows,
        // gathered while in cache, took 0.98 ms at batch 32 against 0.66 fused, one block 15% less than
        // fused; sentiment LSTM(100), Zen 5, shared host)
        thread_local std::vector<const float*> rows;
        rows.resize(BT);
        for (size_t i = 0; i < BT; ++i) rows[i] = op.embedded->row(ids[i], G);
        cache.input_rows = rows.data();
        rnn_forward_rows<float>(cfg, 0, cfg.B, y, h, cell, cache, kernel, op.w[3], mask(op.mask), nullptr, hu);
        return true;
    }

    // out = in ++ in2 on the last axis (rows of `cols` each), or in (+, *, mean) in2 elementwise
    void run_merge(const PlanOp& op) {
        const float* a = in(op.in);
        const float* b = in(op.in2);
        float* y = out(op.out);
        const size_t rows = (size_t)op.rows, width = (size_t)op.cols, n = rows * width;
        switch (op.merge) {
            case PlanMerge::concat:
                for (size_t r = 0; r < rows; ++r) {
                    std::copy(a + r * width, a + (r + 1) * width, y + 2 * r * width);
                    std::copy(b + r * width, b + (r + 1) * width, y + (2 * r + 1) * width);
                }
                break;
            case PlanMerge::sum: for (size_t i = 0; i < n; ++i) y[i] = a[i] + b[i]; break;
            case PlanMerge::mul: for (size_t i = 0; i < n; ++i) y[i] = a[i] * b[i]; break;
            case PlanMerge::ave: for (size_t i = 0; i < n; ++i) y[i] = (a[i] + b[i]) * 0.5f; break;
        }
    }

    // reference: cpp/tests/test_plan.cpp (double loops); the eager path: GlobalAveragePooling1D (NumPy)
    // out[b, c] = sum_t m[b, t] x[b, t, c] / max(sum_t m[b, t], 1), m = 1 without a mask
    void run_mean_pool(const PlanOp& op) {
        const int B = op.attend.B, Tn = op.attend.Tq, C = op.cols;
        const float* x = in(op.in);
        const uint8_t* m = mask(op.mask);
        float* y = out(op.out);
        for (int b = 0; b < B; ++b) {
            float* yr = y + (size_t)b * C;
            std::fill(yr, yr + C, 0.f);
            int count = 0;
            for (int t = 0; t < Tn; ++t) {
                if (m && !m[(size_t)b * Tn + t]) continue;
                ++count;
                const float* xr = x + ((size_t)b * Tn + t) * C;
                for (int c = 0; c < C; ++c) yr[c] += xr[c];
            }
            const float scale = 1.f / (float)std::max(count, 1);
            for (int c = 0; c < C; ++c) yr[c] *= scale;
        }
    }

    std::vector<std::vector<float>> slots_{1};  // slot 0: the input, never allocated
    std::vector<std::vector<uint8_t>> masks_;
    std::vector<PlanOp> ops_;
    const void* input_ = nullptr;
    std::mutex mutex_;
};

}  // namespace attnx
