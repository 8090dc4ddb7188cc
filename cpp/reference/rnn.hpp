// Reference recurrent layers (SimpleRNN, GRU in both reset_after forms, LSTM): what rnn.hpp's
// register-tiled time loops compute, as the equations read, one batch row, step and unit at a time
// in double. Shapes as rnn.hpp: x (B, T, C); W (C, G); U (H, G); G = gates * H, gates in the order
// SimpleRNN (h), GRU (r, z, n), LSTM (i, f, g, o). mask (B, T): nonzero = real step (a padded step
// carries h and c and outputs 0); rec_mask (B, H): recurrent dropout, multiplies h_{t-1} where it
// meets U; cfg.reverse walks t = T-1 .. 0. recurrent_operand (if given) maps both operands of the
// per-step products h_rec U and dhu U^T (bf16 rounding for mixed_bfloat16, cpp/reference/bf16.hpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnx/rnn.hpp"  // RNNConfig, RNNCell
#include "reference/activations.hpp"

namespace attnx::reference {

// What the backward pass reads, per (b, t): the state entering the step, its dropped-out copy, the
// activated gates, and the cell's extra: LSTM act(c_t), GRU reset_after hn = h_rec U_n + b_rec_n,
// GRU classic rh = r * h_rec
struct RNNCache {
    std::vector<double> h_prev, c_prev, h_rec, gates, aux;
};

// (x_t W + b_in)[col] for batch row b at time t
inline double rnn_pre(const RNNConfig& cfg, const double* x, const double* W, const double* b_in, int b, int t, int col) {
    const int G = cfg.G();
    double a = b_in ? b_in[col] : 0;
    for (int k = 0; k < cfg.C; ++k) a += x[((size_t)b * cfg.T + t) * cfg.C + k] * W[(size_t)k * G + col];
    return a;
}

inline void rnn_forward(const RNNConfig& cfg, double* y, double* h, double* c, RNNCache& cache, const double* x,
                        const double* W, const double* U, const double* b_in, const double* b_rec,
                        const uint8_t* mask, const double* rec_mask, double (*recurrent_operand)(double) = nullptr) {
    const int B = cfg.B, T = cfg.T, H = cfg.H, G = cfg.G();
    auto op = [&](double v) { return recurrent_operand ? recurrent_operand(v) : v; };
    const Activation act = cfg.activation, ract = cfg.recurrent_activation;
    const size_t BTH = (size_t)B * T * H;
    cache.h_prev.assign(BTH, 0), cache.c_prev.assign(BTH, 0), cache.h_rec.assign(BTH, 0);
    cache.gates.assign(BTH * cfg.gates(), 0), cache.aux.assign(BTH, 0);
    for (int b = 0; b < B; ++b) {
        for (int s = 0; s < T; ++s) {
            const int t = cfg.time_at(s);
            const size_t bt = (size_t)b * T + t;
            double* hb = h + (size_t)b * H;
            double* cb = c ? c + (size_t)b * H : nullptr;
            double* hp = &cache.h_prev[bt * H];
            double* hr = &cache.h_rec[bt * H];
            double* g = &cache.gates[bt * G];
            double* aux = &cache.aux[bt * H];
            for (int j = 0; j < H; ++j) {
                hp[j] = hb[j];
                if (cb) cache.c_prev[bt * H + j] = cb[j];
                // h_rec = h_{t-1} * rec_mask
                hr[j] = hb[j] * (rec_mask ? rec_mask[(size_t)b * H + j] : 1.0);
            }
            if (mask && !mask[bt]) {  // padded: state carries, output 0
                if (y)
                    for (int j = 0; j < H; ++j) y[bt * H + j] = 0;
                continue;
            }
            // hu[col] = h_rec . U[:, col]
            auto hu = [&](const double* left, int col) {
                double a = 0;
                for (int k = 0; k < H; ++k) a += op(left[k]) * op(U[(size_t)k * G + col]);
                return a;
            };
            auto bias_rec = [&](int col) { return b_rec ? b_rec[col] : 0.0; };
            for (int j = 0; j < H; ++j) {
                switch (cfg.cell) {
                    case RNNCell::simple:
                        // h_t = act(x_t W + b_in + h_rec U)
                        g[j] = reference::act(act, rnn_pre(cfg, x, W, b_in, b, t, j) + hu(hr, j));
                        hb[j] = g[j];
                        break;
                    case RNNCell::lstm: {
                        // i, f, o = ract(x_t W + b_in + h_rec U), g = act(.)
                        // c_t = f c_{t-1} + i g;  h_t = o act(c_t)
                        double pre[4];
                        for (int q = 0; q < 4; ++q) pre[q] = rnn_pre(cfg, x, W, b_in, b, t, q * H + j) + hu(hr, q * H + j);
                        g[j] = reference::act(ract, pre[0]);
                        g[H + j] = reference::act(ract, pre[1]);
                        g[2 * H + j] = reference::act(act, pre[2]);
                        g[3 * H + j] = reference::act(ract, pre[3]);
                        cb[j] = g[H + j] * cb[j] + g[j] * g[2 * H + j];
                        aux[j] = reference::act(act, cb[j]);
                        break;
                    }
                    case RNNCell::gru:
                        // r = ract(x W_r + b_r + h_rec U_r (+ b_rec_r)), z likewise
                        g[j] = reference::act(ract, rnn_pre(cfg, x, W, b_in, b, t, j) + hu(hr, j) +
                                                        (cfg.reset_after ? bias_rec(j) : 0));
                        g[H + j] = reference::act(ract, rnn_pre(cfg, x, W, b_in, b, t, H + j) + hu(hr, H + j) +
                                                            (cfg.reset_after ? bias_rec(H + j) : 0));
                        break;
                }
            }
            if (cfg.cell == RNNCell::lstm)
                for (int j = 0; j < H; ++j) hb[j] = g[3 * H + j] * aux[j];
            if (cfg.cell == RNNCell::gru) {
                if (cfg.reset_after) {
                    // n = act(x W_n + b_n + r * (h_rec U_n + b_rec_n))
                    for (int j = 0; j < H; ++j) {
                        aux[j] = hu(hr, 2 * H + j) + bias_rec(2 * H + j);
                        g[2 * H + j] = reference::act(act, rnn_pre(cfg, x, W, b_in, b, t, 2 * H + j) + g[j] * aux[j]);
                    }
                } else {
                    // n = act(x W_n + b_n + (r * h_rec) U_n)
                    for (int j = 0; j < H; ++j) aux[j] = g[j] * hr[j];
                    for (int j = 0; j < H; ++j)
                        g[2 * H + j] = reference::act(act, rnn_pre(cfg, x, W, b_in, b, t, 2 * H + j) + hu(aux, 2 * H + j));
                }
                // h_t = z h_{t-1} + (1 - z) n
                for (int j = 0; j < H; ++j) hb[j] = g[H + j] * hp[j] + (1 - g[H + j]) * g[2 * H + j];
            }
            if (y)
                for (int j = 0; j < H; ++j) y[bt * H + j] = hb[j];
        }
    }
}

// Backpropagation through time. dy (B, T, H) may be null; dh, dc (B, H): in the gradient of the
// final state, out that of the initial state. dx is overwritten; dW, dU, db_in, db_rec accumulate.
inline void rnn_backward(const RNNConfig& cfg, double* dx, double* dW, double* dU, double* db_in, double* db_rec,
                         double* dh, double* dc, const double* dy, const RNNCache& cache, const double* x,
                         const double* W, const double* U, const uint8_t* mask, const double* rec_mask,
                         double (*recurrent_operand)(double) = nullptr) {
    const int B = cfg.B, T = cfg.T, C = cfg.C, H = cfg.H, G = cfg.G();
    auto op = [&](double v) { return recurrent_operand ? recurrent_operand(v) : v; };
    const Activation act = cfg.activation, ract = cfg.recurrent_activation;
    auto slope = [](Activation a, double y) { return reference::act_slope(a, 0, y); };  // tanh, sigmoid, relu, linear
    std::vector<double> dpre(G), dhu(G), dhr(H);
    for (size_t i = 0; i < (size_t)B * T * C; ++i) dx[i] = 0;
    for (int b = 0; b < B; ++b) {
        double* dhb = dh + (size_t)b * H;
        double* dcb = dc ? dc + (size_t)b * H : nullptr;
        for (int s = T - 1; s >= 0; --s) {
            const int t = cfg.time_at(s);
            const size_t bt = (size_t)b * T + t;
            // a padded step passes dh and dc through; y = 0 there
            if (mask && !mask[bt]) continue;
            if (dy)
                for (int j = 0; j < H; ++j) dhb[j] += dy[bt * H + j];
            const double* g = &cache.gates[bt * G];
            const double* aux = &cache.aux[bt * H];
            const double* hp = &cache.h_prev[bt * H];
            const double* hr = &cache.h_rec[bt * H];
            const double* cp = &cache.c_prev[bt * H];
            // dpre: gradient of x_t W + b_in (the input side); dhu: of h_rec U (+ b_rec)
            switch (cfg.cell) {
                case RNNCell::simple:
                    // h_t = act(x_t W + b_in + h_rec U)
                    for (int j = 0; j < H; ++j) dpre[j] = dhu[j] = dhb[j] * slope(act, g[j]), dhb[j] = 0;
                    break;
                case RNNCell::lstm:
                    for (int j = 0; j < H; ++j) {
                        const double i = g[j], f = g[H + j], gg = g[2 * H + j], o = g[3 * H + j];
                        // h_t = o act(c_t)
                        const double dct = dcb[j] + dhb[j] * o * slope(act, aux[j]);
                        const double d_o = dhb[j] * aux[j];
                        // c_t = f c_{t-1} + i g
                        const double di = dct * gg, df = dct * cp[j], dg = dct * i;
                        dcb[j] = dct * f;
                        dpre[j] = di * slope(ract, i);
                        dpre[H + j] = df * slope(ract, f);
                        dpre[2 * H + j] = dg * slope(act, gg);
                        dpre[3 * H + j] = d_o * slope(ract, o);
                        dhb[j] = 0;
                    }
                    for (int col = 0; col < G; ++col) dhu[col] = dpre[col];
                    break;
                case RNNCell::gru:
                    for (int j = 0; j < H; ++j) {
                        const double z = g[H + j], n = g[2 * H + j];
                        // h_t = z h_{t-1} + (1 - z) n
                        const double dn = dhb[j] * (1 - z), dz = dhb[j] * (hp[j] - n);
                        dhb[j] *= z;
                        dpre[2 * H + j] = dn * slope(act, n);
                        dpre[H + j] = dhu[H + j] = dz * slope(ract, z);
                    }
                    if (cfg.reset_after) {
                        // n = act(x W_n + b_n + r * hn),  hn = h_rec U_n + b_rec_n
                        for (int j = 0; j < H; ++j) {
                            const double dn_pre = dpre[2 * H + j], r = g[j];
                            dpre[j] = dhu[j] = dn_pre * aux[j] * slope(ract, r);
                            dhu[2 * H + j] = dn_pre * r;
                        }
                    } else {
                        // n = act(x W_n + b_n + rh U_n),  rh = r * h_rec
                        for (int j = 0; j < H; ++j) {
                            double drh = 0;
                            for (int k = 0; k < H; ++k) drh += op(dpre[2 * H + k]) * op(U[(size_t)j * G + 2 * H + k]);
                            dpre[j] = dhu[j] = drh * hr[j] * slope(ract, g[j]);
                            dhr[j] = drh * g[j];  // the direct part through rh
                        }
                        // dU_n += rh^T dn
                        for (int k = 0; k < H; ++k)
                            for (int j = 0; j < H; ++j) dU[(size_t)k * G + 2 * H + j] += aux[k] * dpre[2 * H + j];
                    }
                    break;
            }
            // pre = x_t W + b_in: dW += x_t^T dpre, db_in += dpre, dx_t = dpre W^T
            for (int col = 0; col < G; ++col) {
                if (db_in) db_in[col] += dpre[col];
                for (int k = 0; k < C; ++k) {
                    dW[(size_t)k * G + col] += x[bt * C + k] * dpre[col];
                    dx[bt * C + k] += dpre[col] * W[(size_t)k * G + col];
                }
            }
            // hu = h_rec U (+ b_rec) over the columns h_rec meets directly (GRU classic: r and z only)
            const int ncols = cfg.cell == RNNCell::gru && !cfg.reset_after ? 2 * H : G;
            const bool rec_bias = db_rec && !(cfg.cell == RNNCell::gru && !cfg.reset_after);
            for (int j = 0; j < H; ++j) {
                double d = cfg.cell == RNNCell::gru && !cfg.reset_after ? dhr[j] : 0;
                for (int col = 0; col < ncols; ++col) {
                    dU[(size_t)j * G + col] += hr[j] * dhu[col];
                    d += op(dhu[col]) * op(U[(size_t)j * G + col]);
                }
                // h_rec = h_{t-1} * rec_mask
                dhb[j] += d * (rec_mask ? rec_mask[(size_t)b * H + j] : 1.0);
            }
            if (rec_bias)
                for (int col = 0; col < G; ++col) db_rec[col] += dhu[col];
        }
    }
}

}  // namespace attnx::reference
