// Recurrent layers under `mixed_bfloat16` (SimpleRNN, GRU, LSTM; every option of rnn.hpp): every
// product in bfloat16 with float32 sums (bf16.hpp); the gates, their nonlinearities, the cell state and
// the bias gradients in float32. The time loops are rnn.hpp's on [U; W] panels paired along k:
//
//   forward:  steps: pre_t = b_in + [bf16(h_rec), bf16(x_t)] . [bf16(U); bf16(W)], the input projection
//             in each step's product as in float32 (GRU reset_after, whose candidate keeps x_n W_n
//             apart: gates_in = bf16(x) . bf16(W) + b_in first, one product over the B*T rows)
//   backward: the reverse-time steps as rnn.hpp with [d h_rec, dx_t] = bf16(dgates_t) . [bf16(U); bf16(W)]^T
//             (LSTM, SimpleRNN; GRU: d h_rec = bf16(dhu_t) . bf16(U)^T, dx = bf16(dgates) . bf16(W)^T
//             after), giving dgates (and GRU's dhu), dh0, dc0, the biases' gradients; then
//             dW += bf16(x)^T . bf16(dgates), dU += bf16(h_rec)^T . bf16(dhu)
//             (LSTM, SimpleRNN: [dW; dU] in one product; GRU classic: dU_rz from h_rec, dU_n from r * h_rec)
//
// The per-step products are 45% of an LSTM(256)'s training FLOPs at B 64, T 128: in float32 they held
// the bf16 step to 1.03x the float32 one. Paired, U is half the bytes (512 KiB at H 256 for the LSTM's
// four gates, inside a Zen 5 core's 1 MiB L2). With the projections in the steps, the (B, T, 4H) input
// projection makes no round trip through memory, and dgates is paired once (for [dW; dU]), not twice.
#pragma once
#include <mutex>
#include <type_traits>
#include <vector>

#include "attnx/bf16.hpp"
#include "attnx/rnn.hpp"

namespace attnx {

// Whether the steps multiply x_t W too (rnn.hpp's rnn_forward fuses the same cells)
inline bool bf16_fused_projection(const RNNConfig& cfg) { return !(cfg.cell == RNNCell::gru && cfg.reset_after); }

// [U; W] (H + C, G; W null: U alone) packed by pack_recurrent_kernel (float32, `packed`) and paired along
// H + C (bf16 pairs): the blocks of Q vectors and LSTM's tail block (lstm_tail_units) each with their
// rows paired
inline RecurrentKernel<float> pair_recurrent_kernel(Panels<uint32_t>& pairs, Panels<float>& packed,
                                                    const RNNConfig& cfg, const float* U, const float* W) {
    const int lanes = tile_lanes<float>(), H = cfg.H, C = W ? cfg.C : 0, K = H + C, Q = cfg.gates(), K2 = (K + 1) / 2;
    const bool amx = bf16_steps_on_amx(bf16_tiles().native);
    pack_recurrent_kernel(packed, U, W, H, C, Q, lanes, amx);
    const int tail = cfg.cell == RNNCell::lstm ? lstm_tail_units(Q, H, lanes, amx) : 0, blocks = (H - tail + lanes - 1) / lanes;
    const int width = Q * lanes;
    pairs.resize(((size_t)blocks * Q + (tail ? 1 : 0)) * K2 * lanes);
    for (int c = 0; c < blocks; ++c)
        pack_bf16_columns(pairs.data() + (size_t)c * K2 * width, (size_t)width, packed.data() + (size_t)c * K * width,
                          (size_t)width, K, width, width);
    if (tail)
        pack_bf16_columns(pairs.data() + (size_t)blocks * K2 * width, (size_t)lanes,
                          packed.data() + (size_t)blocks * K * width, (size_t)lanes, K, lanes, lanes);
    return {packed.data(), pairs.data(), bf16_tiles().native};
}

// U^T (G, H), or with W [U^T | 0 | W^T] (G, Hp + C), packed by pack_recurrent_kernel_rows_t and paired
// along G (pair_panels)
inline RecurrentKernel<float> pair_recurrent_kernel_t(Panels<uint32_t>& pairs, Panels<float>& packed,
                                                      const RNNConfig& cfg, const float* U, const float* W) {
    pack_recurrent_kernel_rows_t<float>(packed, cfg, U, W);
    const int lanes = tile_lanes<float>();
    pair_panels(pairs, packed.data(), cfg.G(), W ? padded_units(cfg.H, lanes) + cfg.C : cfg.H, 3 * lanes, lanes);
    return {packed.data(), pairs.data(), bf16_tiles().native};
}

// reference: cpp/reference/rnn.hpp, rnn_forward (x, W, h_rec and U rounded to bf16: bf16_operand)
// rnn_forward's arguments and results (float32); cache.gates (B, T, G) is always given.
inline void rnn_forward_bf16(const RNNConfig& cfg, float* y, float* h, float* c, const RNNCache<float>& cache,
                             const float* x, const float* W, const float* U, const float* b_in, const float* b_rec,
                             const uint8_t* mask, const float* rec_mask, float* hu) {
    const int G = cfg.G(), rows = cfg.B * cfg.T;
    const bool fuse = bf16_fused_projection(cfg);
    if (!fuse) bf16_gemm(cache.gates, (size_t)G, x, (size_t)cfg.C, false, W, (size_t)G, false, rows, G, cfg.C, false, b_in);
    thread_local Panels<float> packed;
    thread_local Panels<uint32_t> pairs;
    // this thread's buffers, read by every thread of the batch split
    const RecurrentKernel<float> kernel = pair_recurrent_kernel(pairs, packed, cfg, U, fuse ? W : nullptr);
    for_batch_rows(cfg, [&](int b0, int b1) {
        const AmxTileScope tiles(amx_bf16_active());  // for all the steps (AmxTileScope)
        rnn_packed_rows<float>(cfg, b0, b1, y, h, c, cache, fuse ? x : nullptr, fuse ? b_in : nullptr, kernel, b_rec,
                               mask, rec_mask, hu, (size_t)G);
    });
}

// reference: cpp/reference/rnn.hpp, rnn_backward (the steps, bf16_operand); cpp/reference/bf16.hpp, bf16_gemm (the
// products over all steps)
// rnn_backward's arguments and results (float32): dgates, dhu (dgates itself except for GRU
// reset_after) and dhrec are workspace, which leaves dgates and dhu holding the steps' gradients.
inline void rnn_backward_bf16(const RNNConfig& cfg, float* dx, float* dW, float* dU, float* db_in, float* db_rec,
                              float* dh, float* dc, const float* dy, const RNNCache<float>& cache, const float* x,
                              const float* W, const float* U, const uint8_t* mask, const float* rec_mask,
                              float* dgates, float* dhu, float* dhrec) {
    const int H = cfg.H, G = cfg.G(), C = cfg.C, rows = cfg.B * cfg.T;
    thread_local Panels<float> packed;
    thread_local Panels<uint32_t> pairs;
    // LSTM and SimpleRNN take dx from the reverse-time tiles (StepGradients), GRU from one product after
    const bool dx_in_steps = dx && cfg.cell != RNNCell::gru;
    const RecurrentKernel<float> packed_t = pair_recurrent_kernel_t(pairs, packed, cfg, U, dx_in_steps ? W : nullptr);
    const bool rec_bias = db_rec && !(cfg.cell == RNNCell::gru && !cfg.reset_after);  // GRU classic has none
    const float* h_rec = cache.recurrent_input();
    // LSTM, SimpleRNN (dhu is dgates): [dW; dU] += [x | h_rec]^T . dgates, one product (two would pair
    // dgates, the largest operand, twice) over each thread's rows in its part of the region, on operands
    // the steps pair while the rows are in cache (StepPairs): no pass over dgates (B T x G) after the
    // steps, and no region to pack them and another to multiply
    const bool weights_in_steps = cfg.cell != RNNCell::gru;
    const int CH = C + H, T2 = (cfg.T + 1) / 2, width = bf16_tiles().width(), panel_count = (G + width - 1) / width;
    // (this thread's buffers, written by every thread of the batch split: a thread_local named in the
    // lambda would be the worker's own)
    thread_local Panels<uint32_t> left_buffer, right_buffer;
    if (weights_in_steps)
        left_buffer.resize((size_t)cfg.B * T2 * CH), right_buffer.resize((size_t)cfg.B * T2 * panel_count * width);
    const StepPairs step_pairs{left_buffer.data(), right_buffer.data(), width, x, h_rec};
    std::mutex sum_lock;
    for_batch_rows(cfg, [&](int b0, int b1) {
        const AmxTileScope tiles(amx_bf16_active());  // for all the steps (AmxTileScope)
        std::vector<float> sums(2 * (size_t)G, 0.0f);  // this thread's rows' db_in, db_rec
        const StepGradients<float> grads{dx_in_steps ? dx : nullptr, db_in ? sums.data() : nullptr,
                                         rec_bias ? sums.data() + G : nullptr, weights_in_steps ? &step_pairs : nullptr};
        if (cfg.activation == Activation::tanh && cfg.recurrent_activation == Activation::sigmoid)
            rnn_backward_packed_rows<float>(cfg, TanhSigmoidSlopes<float>{}, b0, b1, dh, dc, dgates, dhu, dhrec, dy,
                                            cache, packed_t, mask, rec_mask, grads);
        else
            rnn_backward_packed_rows<float>(cfg, AnySlopes<float>{cfg.activation, cfg.recurrent_activation}, b0, b1,
                                            dh, dc, dgates, dhu, dhrec, dy, cache, packed_t, mask, rec_mask, grads);
        // this thread's rows' [dW; dU] (its own buffer, kept: a fresh one of megabytes is as many page faults)
        thread_local std::vector<float> weight_sums;
        const size_t k0 = (size_t)b0 * T2;
        if (weights_in_steps) {
            weight_sums.resize((size_t)CH * G);
            bf16_gemm_pairs(weight_sums.data(), (size_t)G,
                            {step_pairs.left + k0 * CH, 1, (size_t)CH, step_pairs.right + k0 * panel_count * width,
                             (b1 - b0) * T2},
                            CH, G, false);
        }
        std::lock_guard<std::mutex> hold(sum_lock);
        for (int g = 0; g < G; ++g) {
            if (db_in) db_in[g] += sums[g];
            if (rec_bias) db_rec[g] += sums[(size_t)G + g];
        }
        if (!weights_in_steps) return;
        for (size_t i = 0; i < (size_t)C * G; ++i) dW[i] += weight_sums[i];
        for (size_t i = 0; i < (size_t)H * G; ++i) dU[i] += weight_sums[(size_t)C * G + i];
    });
    if (weights_in_steps) return;
    // dx = dgates . W^T;  dW += x^T . dgates
    if (dx) bf16_gemm(dx, (size_t)C, dgates, (size_t)G, false, W, (size_t)G, true, rows, C, G, false);
    bf16_gemm(dW, (size_t)G, x, (size_t)C, true, dgates, (size_t)G, false, C, G, rows, true);
    if (cfg.cell == RNNCell::gru && !cfg.reset_after) {
        // dU_rz += h_rec^T . d[r, z];  dU_n += (r h_rec)^T . dn
        bf16_gemm(dU, (size_t)G, h_rec, (size_t)H, true, dhu, (size_t)G, false, H, 2 * H, rows, true);
        bf16_gemm(dU + 2 * H, (size_t)G, cache.aux, (size_t)H, true, dhu + 2 * H, (size_t)G, false, H, H, rows, true);
    } else {
        // dU += h_rec^T . dhu
        bf16_gemm(dU, (size_t)G, h_rec, (size_t)H, true, dhu, (size_t)G, false, H, G, rows, true);
    }
}

// rnn_forward / rnn_backward with their products in bf16 (bf16: float32 operands only) or as rnn.hpp
// runs them: what the binding calls
template <class T>
void rnn_forward_products(bool bf16, const RNNConfig& cfg, T* y, T* h, T* c, const RNNCache<T>& cache, const T* x,
                          const T* W, const T* U, const T* b_in, const T* b_rec, const uint8_t* mask, const T* rec_mask,
                          T* hu) {
    if constexpr (std::is_same_v<T, float>)
        if (bf16) return rnn_forward_bf16(cfg, y, h, c, cache, x, W, U, b_in, b_rec, mask, rec_mask, hu);
    rnn_forward<T>(cfg, y, h, c, cache, x, W, U, b_in, b_rec, mask, rec_mask, hu);
}
template <class T>
void rnn_backward_products(bool bf16, const RNNConfig& cfg, T* dx, T* dW, T* dU, T* db_in, T* db_rec, T* dh, T* dc,
                           const T* dy, const RNNCache<T>& cache, const T* x, const T* W, const T* U,
                           const uint8_t* mask, const T* rec_mask, T* dgates, T* dhu, T* dhrec) {
    if constexpr (std::is_same_v<T, float>)
        if (bf16)
            return rnn_backward_bf16(cfg, dx, dW, dU, db_in, db_rec, dh, dc, dy, cache, x, W, U, mask, rec_mask, dgates,
                                     dhu, dhrec);
    rnn_backward<T>(cfg, dx, dW, dU, db_in, db_rec, dh, dc, dy, cache, x, W, U, mask, rec_mask, dgates, dhu, dhrec);
}

}  // namespace attnx
