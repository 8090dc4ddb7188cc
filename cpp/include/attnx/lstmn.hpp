// The Long Short-Term Memory-Network (Cheng, Dong & Lapata 2016, "Long Short-Term Memory-Networks
// for Machine Reading"): an LSTM whose single carried state is replaced by a memory tape of all
// its earlier hidden and cell states, which every step reads through attention (intra-attention).
//
// Shapes: x (B, T, C); kernel W (C, 4H) and recurrent kernel U (H, 4H) in LSTM's gate order
// (i, f, g, o); memory kernel Wm (H, A), attention input kernel Wa (C, A), summary kernel Ws (H, A),
// attention bias ba (A,), attention vector v (A,).
//
// Step t (in processing order; `reverse` walks t = T-1 .. 0 and "earlier" then means later in
// the sequence), over P_t = the earlier real (unmasked) steps of the row:
//   q_t      = x_t Wa + ba + h~_{t-1} Ws                          h~_{-1} = h0
//   e_{t,j}  = tanh(k_j + q_t),   k_j = h_j Wm                     j in P_t
//   alpha_t  = softmax_j(v . e_{t,j})                              zero outside P_t
//   h~_t     = sum_j alpha_{t,j} h_j,   c~_t = sum_j alpha_{t,j} c_j   (P_t empty: h0, c0)
//   [i f g o] = [sig sig tanh sig](x_t W + b + h~_t U)
//   c_t      = f * c~_t + i * g,   h_t = o * tanh(c_t)
// A padded step (mask 0) is skipped: it joins no tape, outputs zeros, has a zero attention row and
// carries h~ through. The final state is the last real step's (h, c), or (h0, c0).
//
// Plan: the input projections x W + b and x Wa + ba are one GEMM each over all B * T rows; batch
// rows never interact, so rows are split across the thread budget for the whole time loop, whose
// per-step products (h~ Ws, h~ U, h Wm) are small GEMMs on strided (B, T, .) rows; the attention
// over the tape is a plain loop per row (O(T^2 A) per row). Backward walks the steps in reverse,
// recomputing e_{t,j} (storing it would take B T^2 A values), then the weight gradients are one
// GEMM each over all rows.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnx/gemm.hpp"
#include "attnx/parallel.hpp"

namespace attnx {

struct LSTMNConfig {
    int B = 0, T = 0, C = 0, H = 0, A = 0;
    bool reverse = false;  // process t = T-1 .. 0 (the backward direction of a bidirectional layer)
    int time_at(int step) const { return reverse ? T - 1 - step : step; }
};

// What the time loop writes, each (B, T, .) row-major and kept for backward.
template <class T> struct LSTMNCache {
    T* gates = nullptr;         // (B, T, 4H): x W + b on entry; the activated i, f, g, o on exit
    T* h = nullptr;             // (B, T, H): h_t (zeros at padded steps): the outputs and the tape
    T* c = nullptr;             // (B, T, H): c_t (zeros at padded steps)
    T* summary = nullptr;       // (B, T, H): h~_t
    T* summary_c = nullptr;     // (B, T, H): c~_t
    T* summary_prev = nullptr;  // (B, T, H): h~_{t-1}, what q_t read
    T* keys = nullptr;          // (B, T, A): k_t = h_t Wm
    T* query = nullptr;         // (B, T, A): x Wa + ba on entry; q_t on exit
    T* weights = nullptr;       // (B, T, T): alpha_t over the earlier steps
};

template <class T> inline T lstmn_sigmoid(T z) { return T(1) / (T(1) + std::exp(-z)); }

// Calls fn(j) for the steps before t in processing order that are real in row `m` (null: all).
template <class F> inline void for_earlier_steps(const LSTMNConfig& cfg, int t, const uint8_t* m, F&& fn) {
    if (cfg.reverse) {
        for (int j = cfg.T - 1; j > t; --j)
            if (!m || m[j]) fn(j);
    } else {
        for (int j = 0; j < t; ++j)
            if (!m || m[j]) fn(j);
    }
}

// The tape read of step t in row b: writes alpha_t (its row of `weights`), h~_t and c~_t; returns
// false (and writes nothing but a zero alpha row) when no earlier step is real.
//   s_j = v . tanh(k_j + q_t),  alpha_t = softmax(s),  h~_t = sum_j alpha_j h_j,  c~_t = sum_j alpha_j c_j
template <class T>
bool lstmn_read_tape(const LSTMNConfig& cfg, const LSTMNCache<T>& cache, const T* v, const uint8_t* m, int b, int t) {
    const int Tn = cfg.T, H = cfg.H, A = cfg.A;
    const size_t bt = (size_t)b * Tn + t;
    T* alpha = cache.weights + bt * Tn;
    std::fill(alpha, alpha + Tn, T(0));
    const T* q = cache.query + bt * A;
    bool any = false;
    T top = T(0);
    for_earlier_steps(cfg, t, m, [&](int j) {
        const T* k = cache.keys + ((size_t)b * Tn + j) * A;
        T s = T(0);
        for (int a = 0; a < A; ++a) s += v[a] * std::tanh(k[a] + q[a]);
        alpha[j] = s;
        top = any ? std::max(top, s) : s;
        any = true;
    });
    if (!any) return false;
    T total = T(0);
    for_earlier_steps(cfg, t, m, [&](int j) { total += (alpha[j] = std::exp(alpha[j] - top)); });
    T* ht = cache.summary + bt * H;
    T* ct = cache.summary_c + bt * H;
    std::fill(ht, ht + H, T(0));
    std::fill(ct, ct + H, T(0));
    for_earlier_steps(cfg, t, m, [&](int j) {
        const T a = alpha[j] /= total;
        const T* hj = cache.h + ((size_t)b * Tn + j) * H;
        const T* cj = cache.c + ((size_t)b * Tn + j) * H;
        for (int u = 0; u < H; ++u) ht[u] += a * hj[u], ct[u] += a * cj[u];
    });
    return true;
}

// Forward over the whole sequence. h_final, c_final (B, H) receive the final state; h0, c0 (B, H)
// may be null (zeros); b, ba may be null (no bias); mask (B, T) may be null (every step real).
template <class T>
void lstmn_forward(const LSTMNConfig& cfg, T* h_final, T* c_final, const LSTMNCache<T>& cache, const T* x,
                   const T* W, const T* U, const T* b, const T* Wm, const T* Wa, const T* Ws, const T* ba, const T* v,
                   const T* h0, const T* c0, const uint8_t* mask) {
    const int B = cfg.B, Tn = cfg.T, C = cfg.C, H = cfg.H, A = cfg.A, G = 4 * H;
    // gates = x W + b,  query = x Wa + ba   (every row at once)
    matmul<T>(cache.gates, x, W, B * Tn, G, C);
    matmul<T>(cache.query, x, Wa, B * Tn, A, C);
    for (size_t r = 0; r < (size_t)B * Tn; ++r) {
        for (int g = 0; b && g < G; ++g) cache.gates[r * G + g] += b[g];
        for (int a = 0; ba && a < A; ++a) cache.query[r * A + a] += ba[a];
    }
    const double work = (double)B * Tn * ((double)Tn * A + (double)H * (G + 2 * A));
    parallel_for((size_t)B, work, [&](size_t lo, size_t hi) {
        const int b0 = (int)lo, n = (int)(hi - lo);
        const size_t row0 = (size_t)b0 * Tn;
        std::vector<T> carry((size_t)n * H);  // h~ of the row's last real step (h0 before)
        for (int r = 0; r < n; ++r)
            for (int u = 0; u < H; ++u) carry[(size_t)r * H + u] = h0 ? h0[(size_t)(b0 + r) * H + u] : T(0);
        for (int step = 0; step < Tn; ++step) {
            const int t = cfg.time_at(step);
            const size_t at = row0 + t;  // (row b0, step t); rows of one step lie T apart
            // q_t += h~_{t-1} Ws
            for (int r = 0; r < n; ++r)
                std::copy(&carry[(size_t)r * H], &carry[(size_t)r * H] + H, cache.summary_prev + (at + (size_t)r * Tn) * H);
            gemm<T>(false, false, n, A, H, T(1), cache.summary_prev + at * H, Tn * H, Ws, A, T(1),
                    cache.query + at * A, Tn * A);
            // alpha_t, h~_t, c~_t from the tape (h0, c0 when it is empty); a padded step carries h~
            for (int r = 0; r < n; ++r) {
                const int bb = b0 + r;
                const uint8_t* m = mask ? mask + (size_t)bb * Tn : nullptr;
                const size_t bt = (size_t)bb * Tn + t;
                T* ht = cache.summary + bt * H;
                T* ct = cache.summary_c + bt * H;
                if (m && !m[t]) {
                    std::fill(cache.weights + bt * Tn, cache.weights + (bt + 1) * Tn, T(0));
                    std::copy(&carry[(size_t)r * H], &carry[(size_t)r * H] + H, ht);
                    std::fill(ct, ct + H, T(0));
                    continue;
                }
                if (!lstmn_read_tape(cfg, cache, v, m, bb, t)) {
                    for (int u = 0; u < H; ++u) {
                        ht[u] = h0 ? h0[(size_t)bb * H + u] : T(0);
                        ct[u] = c0 ? c0[(size_t)bb * H + u] : T(0);
                    }
                }
                std::copy(ht, ht + H, &carry[(size_t)r * H]);
            }
            // gates_t += h~_t U
            gemm<T>(false, false, n, G, H, T(1), cache.summary + at * H, Tn * H, U, G, T(1), cache.gates + at * G,
                    Tn * G);
            // [i f g o] = act(gates_t),  c_t = f * c~_t + i * g,  h_t = o * tanh(c_t)
            for (int r = 0; r < n; ++r) {
                const size_t bt = (size_t)(b0 + r) * Tn + t;
                T* z = cache.gates + bt * G;
                T* h = cache.h + bt * H;
                T* c = cache.c + bt * H;
                if (mask && !mask[(size_t)(b0 + r) * Tn + t]) {
                    std::fill(z, z + G, T(0));
                    std::fill(h, h + H, T(0));
                    std::fill(c, c + H, T(0));
                    continue;
                }
                const T* ct = cache.summary_c + bt * H;
                for (int u = 0; u < H; ++u) {
                    const T i = lstmn_sigmoid(z[u]), f = lstmn_sigmoid(z[H + u]), g = std::tanh(z[2 * H + u]),
                            o = lstmn_sigmoid(z[3 * H + u]);
                    z[u] = i, z[H + u] = f, z[2 * H + u] = g, z[3 * H + u] = o;
                    c[u] = f * ct[u] + i * g;
                    h[u] = o * std::tanh(c[u]);
                }
            }
            // k_t = h_t Wm
            gemm<T>(false, false, n, A, H, T(1), cache.h + at * H, Tn * H, Wm, A, T(0), cache.keys + at * A, Tn * A);
        }
        // the final state: the last real step's (h, c), or (h0, c0)
        for (int r = 0; r < n; ++r) {
            const int bb = b0 + r;
            int last = -1;
            for (int step = 0; step < Tn; ++step)
                if (!mask || mask[(size_t)bb * Tn + cfg.time_at(step)]) last = cfg.time_at(step);
            for (int u = 0; u < H; ++u) {
                const size_t i = (size_t)bb * H + u;
                h_final[i] = last >= 0 ? cache.h[((size_t)bb * Tn + last) * H + u] : h0 ? h0[i] : T(0);
                c_final[i] = last >= 0 ? cache.c[((size_t)bb * Tn + last) * H + u] : c0 ? c0[i] : T(0);
            }
        }
    });
}

// Scratch of lstmn_backward, each (B, T, .) like the cache: dgates (4H), dquery (A), dh (H), dc (H),
// dkeys (A); dv_rows (B, A).
template <class T> struct LSTMNWork {
    T* dgates = nullptr;
    T* dquery = nullptr;
    T* dh = nullptr;
    T* dc = nullptr;
    T* dkeys = nullptr;
    T* dv_rows = nullptr;
};

// Backward of lstmn_forward. dx (B, T, C) is overwritten (null: skipped); dh0, dc0 (B, H) are
// overwritten; the weight gradients accumulate (dbias, dba null without bias). dy (B, T, H),
// dh_final, dc_final (B, H) may be null (no gradient).
template <class T>
void lstmn_backward(const LSTMNConfig& cfg, T* dx, T* dW, T* dU, T* db, T* dWm, T* dWa, T* dWs, T* dba, T* dv, T* dh0,
                    T* dc0, const T* dy, const T* dh_final, const T* dc_final, const LSTMNCache<T>& cache,
                    const LSTMNWork<T>& work, const T* x, const T* W, const T* U, const T* Wm, const T* Wa,
                    const T* Ws, const T* v, const uint8_t* mask) {
    const int B = cfg.B, Tn = cfg.T, C = cfg.C, H = cfg.H, A = cfg.A, G = 4 * H;
    const size_t BT = (size_t)B * Tn;
    if (dy) std::copy(dy, dy + BT * H, work.dh); else std::fill(work.dh, work.dh + BT * H, T(0));
    std::fill(work.dc, work.dc + BT * H, T(0));
    std::fill(work.dkeys, work.dkeys + BT * A, T(0));
    std::fill(work.dv_rows, work.dv_rows + (size_t)B * A, T(0));
    std::fill(dh0, dh0 + (size_t)B * H, T(0));
    std::fill(dc0, dc0 + (size_t)B * H, T(0));
    const double cost = (double)B * Tn * (2.0 * Tn * A + (double)H * (G + 2 * A));
    parallel_for((size_t)B, cost, [&](size_t lo, size_t hi) {
        const int b0 = (int)lo, n = (int)(hi - lo);
        const size_t row0 = (size_t)b0 * Tn;
        // carry: the gradient of h~ of the step being undone; dct: that of its c~
        std::vector<T> carry((size_t)n * H, T(0)), dct((size_t)n * H), dalpha(Tn);
        // the final state's gradients reach the last real step, or (h0, c0)
        for (int r = 0; r < n; ++r) {
            const int bb = b0 + r;
            int last = -1;
            for (int step = 0; step < Tn; ++step)
                if (!mask || mask[(size_t)bb * Tn + cfg.time_at(step)]) last = cfg.time_at(step);
            T* dh_to = last >= 0 ? work.dh + ((size_t)bb * Tn + last) * H : dh0 + (size_t)bb * H;
            T* dc_to = last >= 0 ? work.dc + ((size_t)bb * Tn + last) * H : dc0 + (size_t)bb * H;
            for (int u = 0; u < H; ++u) {
                if (dh_final) dh_to[u] += dh_final[(size_t)bb * H + u];
                if (dc_final) dc_to[u] += dc_final[(size_t)bb * H + u];
            }
        }
        for (int step = Tn - 1; step >= 0; --step) {
            const int t = cfg.time_at(step);
            const size_t at = row0 + t;
            // k_t = h_t Wm:  dh_t += dk_t Wm^T   (dk_t is whole: only later steps read k_t)
            gemm<T>(false, true, n, H, A, T(1), work.dkeys + at * A, Tn * A, Wm, A, T(1), work.dh + at * H, Tn * H);
            // c_t = f * c~_t + i * g,  h_t = o * tanh(c_t):
            //   dc = dc_t + dh_t o (1 - tanh^2 c_t),  dc~_t = dc f
            //   d[i f g o] = [dc g, dc c~_t, dc i, dh_t tanh(c_t)] * act'
            for (int r = 0; r < n; ++r) {
                const size_t bt = (size_t)(b0 + r) * Tn + t;
                T* dz = work.dgates + bt * G;
                if (mask && !mask[bt]) {
                    std::fill(dz, dz + G, T(0));
                    continue;
                }
                const T* z = cache.gates + bt * G;
                const T* c = cache.c + bt * H;
                const T* ct = cache.summary_c + bt * H;
                const T* dh = work.dh + bt * H;
                const T* dcn = work.dc + bt * H;
                for (int u = 0; u < H; ++u) {
                    const T i = z[u], f = z[H + u], g = z[2 * H + u], o = z[3 * H + u], tc = std::tanh(c[u]);
                    const T dc = dcn[u] + dh[u] * o * (T(1) - tc * tc);
                    dz[u] = dc * g * i * (T(1) - i);
                    dz[H + u] = dc * ct[u] * f * (T(1) - f);
                    dz[2 * H + u] = dc * i * (T(1) - g * g);
                    dz[3 * H + u] = dh[u] * tc * o * (T(1) - o);
                    dct[(size_t)r * H + u] = dc * f;
                }
            }
            // gates_t += h~_t U:  dh~_t += dgates_t U^T
            gemm<T>(false, true, n, H, G, T(1), work.dgates + at * G, Tn * G, U, G, T(1), carry.data(), H);
            // the tape read (lstmn_read_tape):
            //   dalpha_j = dh~_t . h_j + dc~_t . c_j,   dh_j += alpha_j dh~_t,   dc_j += alpha_j dc~_t
            //   ds_j = alpha_j (dalpha_j - sum_i alpha_i dalpha_i)
            //   e_j = tanh(k_j + q_t):  dk_j += ds_j v (1 - e_j^2),  dq_t += the same,  dv += ds_j e_j
            // P_t empty: dh0 += dh~_t, dc0 += dc~_t
            for (int r = 0; r < n; ++r) {
                const int bb = b0 + r;
                const uint8_t* m = mask ? mask + (size_t)bb * Tn : nullptr;
                const size_t bt = (size_t)bb * Tn + t;
                T* dq = work.dquery + bt * A;
                std::fill(dq, dq + A, T(0));
                if (m && !m[t]) continue;  // a padded step passes dh~ on to the step before
                T* dht = &carry[(size_t)r * H];
                const T* dcr = &dct[(size_t)r * H];
                const T* alpha = cache.weights + bt * Tn;
                const T* q = cache.query + bt * A;
                bool any = false;
                T weighted = T(0);
                for_earlier_steps(cfg, t, m, [&](int j) {
                    any = true;
                    const T* hj = cache.h + ((size_t)bb * Tn + j) * H;
                    const T* cj = cache.c + ((size_t)bb * Tn + j) * H;
                    T* dhj = work.dh + ((size_t)bb * Tn + j) * H;
                    T* dcj = work.dc + ((size_t)bb * Tn + j) * H;
                    T da = T(0);
                    for (int u = 0; u < H; ++u) {
                        da += dht[u] * hj[u] + dcr[u] * cj[u];
                        dhj[u] += alpha[j] * dht[u];
                        dcj[u] += alpha[j] * dcr[u];
                    }
                    dalpha[j] = da;
                    weighted += alpha[j] * da;
                });
                if (!any) {
                    for (int u = 0; u < H; ++u) dh0[(size_t)bb * H + u] += dht[u], dc0[(size_t)bb * H + u] += dcr[u];
                }
                T* dvr = work.dv_rows + (size_t)bb * A;
                for_earlier_steps(cfg, t, m, [&](int j) {
                    const T ds = alpha[j] * (dalpha[j] - weighted);
                    const T* k = cache.keys + ((size_t)bb * Tn + j) * A;
                    T* dk = work.dkeys + ((size_t)bb * Tn + j) * A;
                    for (int a = 0; a < A; ++a) {
                        const T ea = std::tanh(k[a] + q[a]), de = ds * v[a] * (T(1) - ea * ea);
                        dk[a] += de;
                        dq[a] += de;
                        dvr[a] += ds * ea;
                    }
                });
                std::fill(dht, dht + H, T(0));
            }
            // q_t = x_t Wa + ba + h~_{t-1} Ws:  dh~_{t-1} += dq_t Ws^T
            gemm<T>(false, true, n, H, A, T(1), work.dquery + at * A, Tn * A, Ws, A, T(1), carry.data(), H);
        }
        // h~_{-1} = h0
        for (int r = 0; r < n; ++r)
            for (int u = 0; u < H; ++u) dh0[(size_t)(b0 + r) * H + u] += carry[(size_t)r * H + u];
    });
    // weight gradients over all rows:
    //   dW += x^T dgates,  dU += h~^T dgates,  db += sum dgates
    //   dWa += x^T dq,  dWs += h~_prev^T dq,  dba += sum dq,  dWm += h^T dk,  dv += sum of the rows' dv
    matmul<T>(dW, x, work.dgates, C, G, (int)BT, true, false, T(1));
    matmul<T>(dU, cache.summary, work.dgates, H, G, (int)BT, true, false, T(1));
    matmul<T>(dWa, x, work.dquery, C, A, (int)BT, true, false, T(1));
    matmul<T>(dWs, cache.summary_prev, work.dquery, H, A, (int)BT, true, false, T(1));
    matmul<T>(dWm, cache.h, work.dkeys, H, A, (int)BT, true, false, T(1));
    for (size_t r = 0; r < BT; ++r) {
        for (int g = 0; db && g < G; ++g) db[g] += work.dgates[r * G + g];
        for (int a = 0; dba && a < A; ++a) dba[a] += work.dquery[r * A + a];
    }
    for (int bb = 0; bb < B; ++bb)
        for (int a = 0; a < A; ++a) dv[a] += work.dv_rows[(size_t)bb * A + a];
    // x feeds gates and query:  dx = dgates W^T + dq Wa^T
    if (dx) {
        matmul<T>(dx, work.dgates, W, (int)BT, C, G, false, true);
        matmul<T>(dx, work.dquery, Wa, (int)BT, C, A, false, true, T(1));
    }
}

}  // namespace attnx
