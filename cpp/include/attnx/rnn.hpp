// Recurrent layers (SimpleRNN, GRU, LSTM): whole-sequence forward and backpropagation through time
// over batch-first row-major buffers, with step masks, either time order, initial states and one
// recurrent-dropout mask per sequence. The step-by-step cells are the T = 1 case of the same code.
//
// Shapes: x (B, T, C); kernel W (C, G*H); recurrent kernel U (H, G*H); G gates of H units each,
// in the order SimpleRNN (h), GRU (r, z, n), LSTM (i, f, g, o).
//
// Plan (DESIGN.md, performance): one GEMM projects every time step's input (x . W + b), then each
// step does one small GEMM h_{t-1} . U and fused elementwise gate math. Batch rows never interact,
// so the time loop's rows are split across the thread budget (parallel_for, single-threaded BLAS).
// Backward walks the steps in reverse with one small GEMM each for the recurrent gradient, then
// computes dW, dU, the biases and dx with one large GEMM each over all steps.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attnx/activations.hpp"
#include "attnx/dense.hpp"
#include "attnx/gemm.hpp"
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
    // the state multiplied into U at step t: h_rec with recurrent dropout, else h_prev
    const T* recurrent_input() const { return h_rec ? h_rec : h_prev; }
};

// Activations the recurrent cells accept (the derivative must follow from the output alone).
inline bool rnn_activation_ok(Activation a) {
    return a == Activation::tanh || a == Activation::sigmoid || a == Activation::relu || a == Activation::linear;
}

// Four floats as one value (GCC/Clang vector extension): one SSE register in portable builds.
// Branch-free code on it vectorizes regardless of -ftrapping-math, which keeps GCC from
// if-converting the scalar loops (and wider vectors lower poorly without AVX).
typedef float float4 __attribute__((vector_size(16)));

// tanh without libm: Eigen's rational approximation on [-7.9, 7.9] (tanh is 1 to float precision
// beyond); |error| < 4e-7.
inline float4 tanh_rational(float4 x) {
    const float4 limit = float4{} + 7.90531110763549805f;
    x = x > limit ? limit : x;
    x = x < -limit ? -limit : x;
    const float4 x2 = x * x;
    float4 p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
    p = p * x2 + -8.60467152213735e-11f;
    p = p * x2 + 5.12229709037114e-08f;
    p = p * x2 + 1.48572235717979e-05f;
    p = p * x2 + 6.37261928875436e-04f;
    p = p * x2 + 4.89352455891786e-03f;
    float4 q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
    q = q * x2 + 2.26843463243900e-03f;
    q = q * x2 + 4.89352518554385e-03f;
    return x * p / q;
}

// v[k] = f(v[k]) four at a time (the tail through a zero-padded block).
template <class F> inline void map_float4(float* v, int n, F f) {
    int k = 0;
    for (; k + 4 <= n; k += 4) {
        float4 x;
        std::memcpy(&x, v + k, sizeof x);
        x = f(x);
        std::memcpy(v + k, &x, sizeof x);
    }
    if (k < n) {
        float4 x = {};
        std::memcpy(&x, v + k, (size_t)(n - k) * sizeof(float));
        x = f(x);
        std::memcpy(v + k, &x, (size_t)(n - k) * sizeof(float));
    }
}

// v = act(v) over n contiguous values. Float uses tanh_rational (sigmoid(x) = (1 + tanh(x / 2)) / 2);
// double, for the gradient checks, the exact libm functions.
template <class T> void activate_block(Activation a, T* v, int n) {
    switch (a) {
        case Activation::tanh:
            if constexpr (std::is_same_v<T, float>) {
                map_float4(v, n, [](float4 x) { return tanh_rational(x); });
            } else {
                for (int k = 0; k < n; ++k) v[k] = std::tanh(v[k]);
            }
            break;
        case Activation::sigmoid:
            if constexpr (std::is_same_v<T, float>) {
                map_float4(v, n, [](float4 x) { return 0.5f + 0.5f * tanh_rational(0.5f * x); });
            } else {
                for (int k = 0; k < n; ++k) v[k] = sigmoid(v[k]);
            }
            break;
        case Activation::relu:
            for (int k = 0; k < n; ++k) v[k] = v[k] > T(0) ? v[k] : T(0);
            break;
        default: break;
    }
}

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
// Steps of rows [b0, b1). h, c (B, H) hold the initial state and leave with the final one;
// hu (B, G*H) is the per-step workspace for h . U.
template <class T>
void rnn_forward_rows(const RNNConfig& cfg, int b0, int b1, T* y, T* h, T* c, const RNNCache<T>& cache, const T* U,
                      const T* b_rec, const uint8_t* mask, const T* rec_mask, T* hu) {
    const int Tn = cfg.T, H = cfg.H, G = cfg.G(), nb = b1 - b0;
    const size_t TH = (size_t)Tn * H, TG = (size_t)Tn * G;
    const Activation act = cfg.activation, ract = cfg.recurrent_activation;
    for (int s = 0; s < Tn; ++s) {
        const int t = cfg.time_at(s);
        // cache the state entering step t (and its dropped-out copy that meets U)
        for (int b = b0; b < b1; ++b) {
            const size_t row = (size_t)b * TH + (size_t)t * H;
            std::copy(h + (size_t)b * H, h + (size_t)(b + 1) * H, cache.h_prev + row);
            if (cache.c_prev) std::copy(c + (size_t)b * H, c + (size_t)(b + 1) * H, cache.c_prev + row);
            if (rec_mask)
                for (int j = 0; j < H; ++j) cache.h_rec[row + j] = h[(size_t)b * H + j] * rec_mask[(size_t)b * H + j];
        }
        const T* hr = rec_mask ? cache.h_rec + (size_t)b0 * TH + (size_t)t * H : h + (size_t)b0 * H;
        const int ld_hr = rec_mask ? (int)TH : H;
        T* hu0 = hu + (size_t)b0 * G;
        if (cfg.cell == RNNCell::gru && !cfg.reset_after) {
            // hu[:, :2H] = h_rec . U[:, :2H]  (the candidate's product needs r first)
            gemm<T>(false, false, nb, 2 * H, H, T(1), hr, ld_hr, U, G, T(0), hu0, G);
        } else if (cfg.cell == RNNCell::gru) {
            // hu = h_rec . U + b_rec
            for (int b = 0; b < nb; ++b)
                for (int k = 0; k < G; ++k) hu0[(size_t)b * G + k] = b_rec ? b_rec[k] : T(0);
            gemm<T>(false, false, nb, G, H, T(1), hr, ld_hr, U, G, T(1), hu0, G);
        } else {
            // hu = h_rec . U
            gemm<T>(false, false, nb, G, H, T(1), hr, ld_hr, U, G, T(0), hu0, G);
        }

        for (int b = b0; b < b1; ++b) {
            const size_t row = (size_t)b * TH + (size_t)t * H;
            T* g = cache.gates + (size_t)b * TG + (size_t)t * G;
            const T* u = hu + (size_t)b * G;
            T* hb = h + (size_t)b * H;
            T* yb = y + row;
            T* aux = cache.aux ? cache.aux + row : nullptr;
            if (mask && !mask[(size_t)b * Tn + t]) {  // padded step: state carries through, output 0
                std::fill(yb, yb + H, T(0));
                if (aux) std::fill(aux, aux + H, T(0));  // aux meets dU's GEMM in backward: keep it finite
                continue;
            }
            // pre-activations of the gates (GRU's candidate n and classic GRU's product come later)
            const int summed = cfg.cell == RNNCell::gru ? 2 * H : G;
            for (int k = 0; k < summed; ++k) g[k] += u[k];
            switch (cfg.cell) {
                case RNNCell::simple:
                    // h_t = act(x_t W + b + h_{t-1} U)
                    activate_block(act, g, H);
                    std::copy(g, g + H, hb);
                    std::copy(g, g + H, yb);
                    break;
                case RNNCell::lstm: {
                    // i, f, o = ract(.), g = act(.); c_t = f c_{t-1} + i g; h_t = o act(c_t)
                    activate_block(ract, g, 2 * H);
                    activate_block(act, g + 2 * H, H);
                    activate_block(ract, g + 3 * H, H);
                    T* cb = c + (size_t)b * H;
                    for (int j = 0; j < H; ++j) {
                        cb[j] = g[H + j] * cb[j] + g[j] * g[2 * H + j];
                        aux[j] = cb[j];
                    }
                    activate_block(act, aux, H);
                    for (int j = 0; j < H; ++j) {
                        hb[j] = g[3 * H + j] * aux[j];
                        yb[j] = hb[j];
                    }
                    break;
                }
                case RNNCell::gru:
                    // r, z = ract(x W + b_in + h U + b_rec)
                    activate_block(ract, g, 2 * H);
                    if (cfg.reset_after) {
                        // n = act(x_n + r * (h U_n + b_hn)); h_t = z h_{t-1} + (1 - z) n
                        for (int j = 0; j < H; ++j) {
                            aux[j] = u[2 * H + j];
                            g[2 * H + j] += g[j] * aux[j];
                        }
                        activate_block(act, g + 2 * H, H);
                        for (int j = 0; j < H; ++j) {
                            hb[j] = g[H + j] * hb[j] + (T(1) - g[H + j]) * g[2 * H + j];
                            yb[j] = hb[j];
                        }
                    } else {
                        // the candidate's input r * h_rec goes to aux for the second GEMM
                        const T* hrb = cache.recurrent_input() + row;
                        for (int j = 0; j < H; ++j) aux[j] = g[j] * hrb[j];
                    }
                    break;
            }
        }
        if (cfg.cell == RNNCell::gru && !cfg.reset_after) {
            // hu[:, 2H:] = (r * h_rec) . U_n; n = act(x_n + that); h_t = z h_{t-1} + (1 - z) n
            gemm<T>(false, false, nb, H, H, T(1), cache.aux + (size_t)b0 * TH + (size_t)t * H, (int)TH, U + 2 * H, G,
                    T(0), hu0 + 2 * H, G);
            for (int b = b0; b < b1; ++b) {
                if (mask && !mask[(size_t)b * Tn + t]) continue;
                T* g = cache.gates + (size_t)b * TG + (size_t)t * G;
                const T* u = hu + (size_t)b * G;
                T* hb = h + (size_t)b * H;
                T* yb = y + (size_t)b * TH + (size_t)t * H;
                for (int j = 0; j < H; ++j) g[2 * H + j] += u[2 * H + j];
                activate_block(act, g + 2 * H, H);
                for (int j = 0; j < H; ++j) {
                    hb[j] = g[H + j] * hb[j] + (T(1) - g[H + j]) * g[2 * H + j];
                    yb[j] = hb[j];
                }
            }
        }
    }
}

// Whole-sequence forward. y (B, T, H): h_t at real steps, 0 at padded ones. h, c (B, H): in the
// initial state (zeros if none), out the final state (after each row's last real step). c and
// cache.c_prev are LSTM only. b_in (G*H) / b_rec (G*H, GRU reset_after) may be null. mask (B, T)
// nonzero = real step, null = all real. rec_mask (B, H) multiplies the state entering U (then
// cache.h_rec must be given). hu: workspace (B, G*H).
template <class T>
void rnn_forward(const RNNConfig& cfg, T* y, T* h, T* c, const RNNCache<T>& cache, const T* x, const T* W,
                 const T* U, const T* b_in, const T* b_rec, const uint8_t* mask, const T* rec_mask, T* hu) {
    dense_forward<T>(cache.gates, x, W, b_in, cfg.B * cfg.T, cfg.C, cfg.G());
    for_batch_rows(cfg, [&](int b0, int b1) {
        rnn_forward_rows<T>(cfg, b0, b1, y, h, c, cache, U, b_rec, mask, rec_mask, hu);
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

// SimpleRNN: d pre = dh act'(h_t); h_{t-1} reaches h_t only through U
template <class T, class Slopes>
void simple_row_backward(const Slopes& slope, int H, T* __restrict__ dg, T* __restrict__ dh, const T* __restrict__ g) {
    for (int j = 0; j < H; ++j) {
        dg[j] = dh[j] * slope.act(g[j]);
        dh[j] = T(0);
    }
}

// LSTM: dc_t += dh o act'(c_t); di = dc g, df = dc c_{t-1}, dg = dc i, do = dh act(c_t), each times
// its activation's slope; dc_{t-1} = dc_t f
template <class T, class Slopes>
void lstm_row_backward(const Slopes& slope, int H, T* __restrict__ dg, T* __restrict__ dh, T* __restrict__ dc,
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

// GRU: dn = dh (1 - z) act'(n), dz = dh (h_{t-1} - n) ract'(z), direct dh_{t-1} = dh z. The reset
// gate's gradient follows in gru_after_row_backward or, for the classic form, after U_n^T.
template <class T, class Slopes>
void gru_row_backward(const Slopes& slope, int H, T* __restrict__ dg, T* __restrict__ dh, const T* __restrict__ g,
                      const T* __restrict__ h_prev) {
    for (int j = 0; j < H; ++j) {
        const T z = g[H + j], n = g[2 * H + j];
        dg[2 * H + j] = dh[j] * (T(1) - z) * slope.act(n);
        dg[H + j] = dh[j] * (h_prev[j] - n) * slope.ract(z);
        dh[j] *= z;
    }
}

// GRU reset_after: n's pre-activation is x_n + r * hn, so dr = dn hn and d hn = dn r; dhu is the
// gradient of h U + b_rec
template <class T, class Slopes>
void gru_after_row_backward(const Slopes& slope, int H, T* __restrict__ dg, T* __restrict__ dhu,
                            const T* __restrict__ g, const T* __restrict__ hn) {
    for (int j = 0; j < H; ++j) {
        const T r = g[j], dn = dg[2 * H + j];
        dg[j] = dn * hn[j] * slope.ract(r);
        dhu[j] = dg[j];
        dhu[H + j] = dg[H + j];
        dhu[2 * H + j] = dn * r;
    }
}

// Reverse-time steps of rows [b0, b1). dh, dc (B, H) come in as the gradient of the final state and
// leave as that of the initial state. dgates (B, T, G*H) receives d(x W + b_in) per step; dhu
// (B, T, G*H) receives d(h_rec U + b_rec) (the same buffer as dgates except for GRU reset_after);
// dhrec (B, H) is workspace.
template <class T, class Slopes>
void rnn_backward_rows(const RNNConfig& cfg, const Slopes& slope, int b0, int b1, T* dh, T* dc, T* dgates, T* dhu,
                       T* dhrec, const T* dy, const RNNCache<T>& cache, const T* U, const uint8_t* mask,
                       const T* rec_mask) {
    const int Tn = cfg.T, H = cfg.H, G = cfg.G(), nb = b1 - b0;
    const size_t TH = (size_t)Tn * H, TG = (size_t)Tn * G;
    const bool gru_classic = cfg.cell == RNNCell::gru && !cfg.reset_after;
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
        T* dhr0 = dhrec + (size_t)b0 * H;
        if (gru_classic) {
            // d(r h_rec) = dn . U_n^T; dr = d(r h_rec) h_rec ract'(r); d h_rec = d(r h_rec) r + d[r, z] . U_rz^T
            gemm<T>(false, true, nb, H, H, T(1), du0 + 2 * H, (int)TG, U + 2 * H, G, T(0), dhr0, H);
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
            gemm<T>(false, true, nb, H, 2 * H, T(1), du0, (int)TG, U, G, T(1), dhr0, H);
        } else {
            // d h_rec = d(h_rec U) . U^T
            gemm<T>(false, true, nb, H, G, T(1), du0, (int)TG, U, G, T(0), dhr0, H);
        }
        // dh_{t-1} += d h_rec * recurrent dropout mask (padded rows have d h_rec = 0)
        for (int b = b0; b < b1; ++b) {
            T* dhb = dh + (size_t)b * H;
            const T* dhrb = dhrec + (size_t)b * H;
            if (rec_mask) {
                const T* m = rec_mask + (size_t)b * H;
                for (int j = 0; j < H; ++j) dhb[j] += dhrb[j] * m[j];
            } else {
                for (int j = 0; j < H; ++j) dhb[j] += dhrb[j];
            }
        }
    }
}

// Whole-sequence backward. dy (B, T, H) may be null (only the final state used); dh, dc (B, H): in
// the gradient of the final state (zeros if none), out that of the initial state. dx (B, T, C) is
// overwritten (may be null); dW, dU, db_in, db_rec accumulate (biases may be null). Workspace:
// dgates (B, T, G*H), dhu (B, T, G*H; may alias dgates except for GRU), dhrec (B, H).
template <class T>
void rnn_backward(const RNNConfig& cfg, T* dx, T* dW, T* dU, T* db_in, T* db_rec, T* dh, T* dc, const T* dy,
                  const RNNCache<T>& cache, const T* x, const T* W, const T* U, const uint8_t* mask,
                  const T* rec_mask, T* dgates, T* dhu, T* dhrec) {
    const int BT = cfg.B * cfg.T, H = cfg.H, G = cfg.G();
    for_batch_rows(cfg, [&](int b0, int b1) {
        if (cfg.activation == Activation::tanh && cfg.recurrent_activation == Activation::sigmoid)
            rnn_backward_rows<T>(cfg, TanhSigmoidSlopes<T>{}, b0, b1, dh, dc, dgates, dhu, dhrec, dy, cache, U, mask,
                                 rec_mask);
        else
            rnn_backward_rows<T>(cfg, AnySlopes<T>{cfg.activation, cfg.recurrent_activation}, b0, b1, dh, dc, dgates,
                                 dhu, dhrec, dy, cache, U, mask, rec_mask);
    });
    // dW += x^T . dgates, db_in += sum dgates, dx = dgates . W^T: one GEMM each over all steps
    dense_backward<T>(dx, dW, db_in, dgates, x, W, BT, cfg.C, G);
    const T* hr = cache.recurrent_input();
    if (cfg.cell == RNNCell::gru && !cfg.reset_after) {
        // dU_rz += h_rec^T . d[r, z]; dU_n += (r h_rec)^T . dn
        gemm<T>(true, false, H, 2 * H, BT, T(1), hr, H, dhu, G, T(1), dU, G);
        gemm<T>(true, false, H, H, BT, T(1), cache.aux, H, dhu + 2 * H, G, T(1), dU + 2 * H, G);
    } else {
        // dU += h_rec^T . dhu, db_rec += sum dhu
        dense_backward<T>(nullptr, dU, db_rec, dhu, hr, U, BT, H, G);
    }
}

}  // namespace attnx
