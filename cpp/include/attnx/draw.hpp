// DRAW's read and write attention (Gregor et al. 2015, "DRAW: A Recurrent Neural Network For Image
// Generation", section 3.2): an N x N grid of Gaussian filters over an H x W image, placed by five
// numbers per image that a linear layer of the decoder state gives.
//
// Shapes: images (B, H, W), patches (B, N, N), params (B, 5) = (g~X, g~Y, log sigma^2, log delta~,
// log gamma); filterbanks Fx (B, N, W), Fy (B, N, H); window (B, 5) = (gX, gY, sigma^2, delta, gamma).
// Pixel coordinates a = 1..W, b = 1..H as in the paper.
//
//   gX = (W + 1) / 2 (g~X + 1),  gY = (H + 1) / 2 (g~Y + 1),  delta = (max(H, W) - 1) / (N - 1) delta~
//   mu_X,i = gX + (i - N/2 - 1/2) delta,  mu_Y,j = gY + (j - N/2 - 1/2) delta       (i, j = 1..N)
//   Fx[i, a] = exp(-(a - mu_X,i)^2 / (2 sigma^2)) / Z_X,i   (Z_X,i: the row's sum, + kEps)
//   read:  glimpse = gamma Fy x Fx^T                          (N x N)
//   write: canvas  = 1 / gamma Fy^T w Fx                      (H x W)
// N = 1 places one filter at the centre (delta has no effect).
//
// Plan: per image, plain loops (the products are N x H x W, a few thousand multiply-adds), images
// split across the thread budget.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "attnx/parallel.hpp"

namespace attnx {

struct DrawConfig {
    int B = 0, H = 0, W = 0, N = 0;
};

constexpr double kDrawEps = 1e-8;  // keeps a filter row far off the image from dividing by zero

// The window of one image from its params: (gX, gY, sigma^2, delta, gamma)
template <class T> inline void draw_window(const DrawConfig& cfg, T* window, const T* p) {
    const T stride = cfg.N > 1 ? T(std::max(cfg.H, cfg.W) - 1) / T(cfg.N - 1) : T(0);
    window[0] = T(cfg.W + 1) / 2 * (p[0] + 1);
    window[1] = T(cfg.H + 1) / 2 * (p[1] + 1);
    window[2] = std::exp(p[2]);
    window[3] = stride * std::exp(p[3]);
    window[4] = std::exp(p[4]);
}

// One axis' filterbank F (N, L) for centre g, stride delta, variance s2:
//   F[i, a] = exp(-(a - mu_i)^2 / (2 s2)) / Z_i,  mu_i = g + (i - N/2 - 1/2) delta  (a, i from 1)
template <class T> inline void draw_filterbank(T* F, int N, int L, T g, T delta, T s2) {
    for (int i = 0; i < N; ++i) {
        const T mu = g + (T(i + 1) - T(N) / 2 - T(0.5)) * delta;
        T* row = F + (size_t)i * L;
        T z = T(0);
        for (int a = 0; a < L; ++a) z += (row[a] = std::exp(-(T(a + 1) - mu) * (T(a + 1) - mu) / (2 * s2)));
        z += T(kDrawEps);
        for (int a = 0; a < L; ++a) row[a] /= z;
    }
}

// Backward of draw_filterbank: from dF (N, L) adds into dg, ddelta, ds2.
//   e = exp(-(a - mu)^2 / (2 s2)),  F = e / Z:   de[i, a] = (dF[i, a] - sum_a' dF[i, a'] F[i, a']) / Z_i
//   dmu_i = sum_a de e (a - mu_i) / s2,   ds2 += sum_a de e (a - mu_i)^2 / (2 s2^2)
//   dg += sum_i dmu_i,   ddelta += sum_i dmu_i (i - N/2 - 1/2)
template <class T>
inline void draw_filterbank_backward(T& dg, T& ddelta, T& ds2, const T* dF, const T* F, int N, int L, T g, T delta,
                                     T s2) {
    for (int i = 0; i < N; ++i) {
        const T offset = T(i + 1) - T(N) / 2 - T(0.5), mu = g + offset * delta;
        const T* f = F + (size_t)i * L;
        const T* df = dF + (size_t)i * L;
        T z = T(0), fdf = T(0);
        for (int a = 0; a < L; ++a) {
            z += std::exp(-(T(a + 1) - mu) * (T(a + 1) - mu) / (2 * s2));
            fdf += df[a] * f[a];
        }
        z += T(kDrawEps);
        T dmu = T(0);
        for (int a = 0; a < L; ++a) {
            const T d = T(a + 1) - mu, e = f[a] * z;  // e = F Z
            const T de = (df[a] - fdf) / z;
            dmu += de * e * d / s2;
            ds2 += de * e * d * d / (2 * s2 * s2);
        }
        dg += dmu;
        ddelta += dmu * offset;
    }
}

// Fills each image's window (B, 5) and filterbanks Fx (B, N, W), Fy (B, N, H) from params (B, 5).
template <class T> void draw_filterbanks(const DrawConfig& cfg, T* window, T* Fx, T* Fy, const T* params) {
    const int N = cfg.N, H = cfg.H, W = cfg.W;
    parallel_for((size_t)cfg.B, (double)cfg.B * N * (H + W) * 8, [&](size_t lo, size_t hi) {
        for (size_t b = lo; b < hi; ++b) {
            T* w = window + b * 5;
            draw_window(cfg, w, params + b * 5);
            draw_filterbank(Fx + b * (size_t)N * W, N, W, w[0], w[3], w[2]);
            draw_filterbank(Fy + b * (size_t)N * H, N, H, w[1], w[3], w[2]);
        }
    });
}

// read:  out[b] = gamma Fy x[b] Fx^T  (N x N);   write: out[b] = 1 / gamma Fy^T x[b] Fx  (H x W)
// (`write` false: x is an image (B, H, W); true: a patch (B, N, N)); the filterbanks from draw_filterbanks.
template <class T>
void draw_attend_forward(const DrawConfig& cfg, bool write, T* out, const T* x, const T* window, const T* Fx,
                         const T* Fy) {
    const int N = cfg.N, H = cfg.H, W = cfg.W;
    parallel_for((size_t)cfg.B, (double)cfg.B * N * H * W * 2, [&](size_t lo, size_t hi) {
        std::vector<T> mid(write ? (size_t)N * W : (size_t)H * N);
        for (size_t b = lo; b < hi; ++b) {
            const T* fx = Fx + b * (size_t)N * W;
            const T* fy = Fy + b * (size_t)N * H;
            const T gamma = window[b * 5 + 4];
            if (!write) {
                // mid = x Fx^T (H x N),  out = gamma Fy mid (N x N)
                const T* img = x + b * (size_t)H * W;
                for (int y = 0; y < H; ++y)
                    for (int i = 0; i < N; ++i) {
                        T s = T(0);
                        for (int a = 0; a < W; ++a) s += img[(size_t)y * W + a] * fx[(size_t)i * W + a];
                        mid[(size_t)y * N + i] = s;
                    }
                T* o = out + b * (size_t)N * N;
                for (int j = 0; j < N; ++j)
                    for (int i = 0; i < N; ++i) {
                        T s = T(0);
                        for (int y = 0; y < H; ++y) s += fy[(size_t)j * H + y] * mid[(size_t)y * N + i];
                        o[(size_t)j * N + i] = gamma * s;
                    }
            } else {
                // mid = w Fx (N x W),  out = 1 / gamma Fy^T mid (H x W)
                const T* patch = x + b * (size_t)N * N;
                for (int j = 0; j < N; ++j)
                    for (int a = 0; a < W; ++a) {
                        T s = T(0);
                        for (int i = 0; i < N; ++i) s += patch[(size_t)j * N + i] * fx[(size_t)i * W + a];
                        mid[(size_t)j * W + a] = s;
                    }
                T* o = out + b * (size_t)H * W;
                for (int y = 0; y < H; ++y)
                    for (int a = 0; a < W; ++a) {
                        T s = T(0);
                        for (int j = 0; j < N; ++j) s += fy[(size_t)j * H + y] * mid[(size_t)j * W + a];
                        o[(size_t)y * W + a] = s / gamma;
                    }
            }
        }
    });
}

// Backward of draw_attend_forward: dx (null: skipped) overwritten, dparams (B, 5) overwritten.
//   read,  r = gamma Fy m, m = x Fx^T:  dFy = gamma dr m^T,  dm = gamma Fy^T dr,  dFx = dm^T x,
//          dx = dm Fx,  dgamma = sum dr r / gamma
//   write, c = Fy^T m / gamma, m = w Fx:  dFy = m dc^T / gamma,  dm = Fy dc / gamma,  dFx = w^T dm,
//          dw = dm Fx^T,  dgamma = -sum dc c / gamma
//   then the filterbanks' backward, and the params':
//   dg~X = dgX (W + 1) / 2,  dg~Y = dgY (H + 1) / 2,  dlog sigma^2 = dsigma^2 sigma^2,
//   dlog delta~ = ddelta delta,  dlog gamma = dgamma gamma
template <class T>
void draw_attend_backward(const DrawConfig& cfg, bool write, T* dx, T* dparams, const T* dout, const T* out,
                          const T* x, const T* window, const T* Fx, const T* Fy) {
    const int N = cfg.N, H = cfg.H, W = cfg.W;
    parallel_for((size_t)cfg.B, (double)cfg.B * N * H * W * 6, [&](size_t lo, size_t hi) {
        std::vector<T> mid(write ? (size_t)N * W : (size_t)H * N), dmid(mid.size()), dfx((size_t)N * W),
            dfy((size_t)N * H);
        for (size_t b = lo; b < hi; ++b) {
            const T* fx = Fx + b * (size_t)N * W;
            const T* fy = Fy + b * (size_t)N * H;
            const T* win = window + b * 5;
            const T gamma = win[4];
            std::fill(dfx.begin(), dfx.end(), T(0));
            std::fill(dfy.begin(), dfy.end(), T(0));
            T dgamma = T(0);
            if (!write) {
                const T* img = x + b * (size_t)H * W;
                const T* dr = dout + b * (size_t)N * N;
                const T* r = out + b * (size_t)N * N;
                for (int y = 0; y < H; ++y)
                    for (int i = 0; i < N; ++i) {
                        T s = T(0);
                        for (int a = 0; a < W; ++a) s += img[(size_t)y * W + a] * fx[(size_t)i * W + a];
                        mid[(size_t)y * N + i] = s;
                    }
                for (int k = 0; k < N * N; ++k) dgamma += dr[k] * r[k] / gamma;
                for (int j = 0; j < N; ++j)
                    for (int y = 0; y < H; ++y) {
                        T s = T(0);
                        for (int i = 0; i < N; ++i) s += dr[(size_t)j * N + i] * mid[(size_t)y * N + i];
                        dfy[(size_t)j * H + y] = gamma * s;
                    }
                for (int y = 0; y < H; ++y)
                    for (int i = 0; i < N; ++i) {
                        T s = T(0);
                        for (int j = 0; j < N; ++j) s += fy[(size_t)j * H + y] * dr[(size_t)j * N + i];
                        dmid[(size_t)y * N + i] = gamma * s;
                    }
                for (int i = 0; i < N; ++i)
                    for (int a = 0; a < W; ++a) {
                        T s = T(0);
                        for (int y = 0; y < H; ++y) s += dmid[(size_t)y * N + i] * img[(size_t)y * W + a];
                        dfx[(size_t)i * W + a] = s;
                    }
                if (dx) {
                    T* d = dx + b * (size_t)H * W;
                    for (int y = 0; y < H; ++y)
                        for (int a = 0; a < W; ++a) {
                            T s = T(0);
                            for (int i = 0; i < N; ++i) s += dmid[(size_t)y * N + i] * fx[(size_t)i * W + a];
                            d[(size_t)y * W + a] = s;
                        }
                }
            } else {
                const T* patch = x + b * (size_t)N * N;
                const T* dc = dout + b * (size_t)H * W;
                const T* c = out + b * (size_t)H * W;
                for (int j = 0; j < N; ++j)
                    for (int a = 0; a < W; ++a) {
                        T s = T(0);
                        for (int i = 0; i < N; ++i) s += patch[(size_t)j * N + i] * fx[(size_t)i * W + a];
                        mid[(size_t)j * W + a] = s;
                    }
                for (int k = 0; k < H * W; ++k) dgamma -= dc[k] * c[k] / gamma;
                for (int j = 0; j < N; ++j)
                    for (int y = 0; y < H; ++y) {
                        T s = T(0);
                        for (int a = 0; a < W; ++a) s += mid[(size_t)j * W + a] * dc[(size_t)y * W + a];
                        dfy[(size_t)j * H + y] = s / gamma;
                    }
                for (int j = 0; j < N; ++j)
                    for (int a = 0; a < W; ++a) {
                        T s = T(0);
                        for (int y = 0; y < H; ++y) s += fy[(size_t)j * H + y] * dc[(size_t)y * W + a];
                        dmid[(size_t)j * W + a] = s / gamma;
                    }
                for (int i = 0; i < N; ++i)
                    for (int a = 0; a < W; ++a) {
                        T s = T(0);
                        for (int j = 0; j < N; ++j) s += patch[(size_t)j * N + i] * dmid[(size_t)j * W + a];
                        dfx[(size_t)i * W + a] = s;
                    }
                if (dx) {
                    T* d = dx + b * (size_t)N * N;
                    for (int j = 0; j < N; ++j)
                        for (int i = 0; i < N; ++i) {
                            T s = T(0);
                            for (int a = 0; a < W; ++a) s += dmid[(size_t)j * W + a] * fx[(size_t)i * W + a];
                            d[(size_t)j * N + i] = s;
                        }
                }
            }
            T dgx = T(0), dgy = T(0), ddelta = T(0), ds2 = T(0);
            draw_filterbank_backward(dgx, ddelta, ds2, dfx.data(), fx, N, W, win[0], win[3], win[2]);
            draw_filterbank_backward(dgy, ddelta, ds2, dfy.data(), fy, N, H, win[1], win[3], win[2]);
            T* dp = dparams + b * 5;
            dp[0] = dgx * T(W + 1) / 2;
            dp[1] = dgy * T(H + 1) / 2;
            dp[2] = ds2 * win[2];
            dp[3] = ddelta * win[3];
            dp[4] = dgamma * gamma;
        }
    });
}

}  // namespace attnx
