// Reference 2-D convolution and pooling: what conv.hpp's padded-image tiles, Winograd transforms
// and im2col / col2im compute, one output pixel, window offset and channel at a time in double.
// Channels-last: x (B, H, W, C), kernel (KH, KW, C, F), outputs (B, OH, OW, F); the geometry
// (Window2D: strides, 'same' padding) from conv.hpp's window_2d. Padded positions are zeros for the
// convolution and never part of a pooling window.
#pragma once
#include <cmath>
#include <cstddef>
#include <vector>

#include "attnx/conv.hpp"  // Window2D
#include "reference/activations.hpp"

namespace attnx::reference {

// input row / column of window offset k of output position o, or -1 outside the image
inline int input_at(int o, int stride, int pad, int k, int size) {
    const int i = o * stride - pad + k;
    return i >= 0 && i < size ? i : -1;
}
inline size_t pixel(const Window2D& w, int b, int ih, int iw) { return (((size_t)b * w.H + ih) * w.W + iw) * w.C; }
inline size_t out_pixel(const Window2D& w, int b, int oh, int ow) { return ((size_t)b * w.OH + oh) * w.OW + ow; }

// z[b, oh, ow, f] = bias[f] + sum_{i, j, c} x[b, oh SH - pad_top + i, ow SW - pad_left + j, c] K[i, j, c, f];  y = act(z)
inline void conv2d_forward(double* y, double* z, const double* x, const double* K, const double* bias, const Window2D& w,
                           int F, Activation a) {
    for (int b = 0; b < w.B; ++b)
        for (int oh = 0; oh < w.OH; ++oh)
            for (int ow = 0; ow < w.OW; ++ow)
                for (int f = 0; f < F; ++f) {
                    double acc = bias ? bias[f] : 0;
                    for (int i = 0; i < w.KH; ++i)
                        for (int j = 0; j < w.KW; ++j) {
                            const int ih = input_at(oh, w.SH, w.pad_top, i, w.H), iw = input_at(ow, w.SW, w.pad_left, j, w.W);
                            if (ih < 0 || iw < 0) continue;
                            for (int c = 0; c < w.C; ++c)
                                acc += x[pixel(w, b, ih, iw) + c] * K[(((size_t)i * w.KW + j) * w.C + c) * F + f];
                        }
                    z[out_pixel(w, b, oh, ow) * F + f] = acc;
                }
    activation_forward(y, z, (size_t)w.B * w.OH * w.OW, F, a);
}

// y = act(z);  z = bias + sum x K
// => dz = dy act'(z);  dx[.., ih, iw, c] = sum dz K (overwritten; null: skipped);  dK += sum x dz;  dbias += sum dz
inline void conv2d_backward(double* dx, double* dK, double* dbias, const double* dy, const double* x, const double* K,
                            const double* y, const double* z, const Window2D& w, int F, Activation a) {
    const size_t rows = (size_t)w.B * w.OH * w.OW;
    std::vector<double> dz(rows * F);
    activation_backward(dz.data(), dy, z, y, rows, F, a);
    if (dx)
        for (size_t i = 0; i < (size_t)w.B * w.H * w.W * w.C; ++i) dx[i] = 0;
    for (int b = 0; b < w.B; ++b)
        for (int oh = 0; oh < w.OH; ++oh)
            for (int ow = 0; ow < w.OW; ++ow)
                for (int f = 0; f < F; ++f) {
                    const double g = dz[out_pixel(w, b, oh, ow) * F + f];
                    if (dbias) dbias[f] += g;
                    for (int i = 0; i < w.KH; ++i)
                        for (int j = 0; j < w.KW; ++j) {
                            const int ih = input_at(oh, w.SH, w.pad_top, i, w.H), iw = input_at(ow, w.SW, w.pad_left, j, w.W);
                            if (ih < 0 || iw < 0) continue;
                            for (int c = 0; c < w.C; ++c) {
                                const size_t k = (((size_t)i * w.KW + j) * w.C + c) * F + f;
                                dK[k] += x[pixel(w, b, ih, iw) + c] * g;
                                if (dx) dx[pixel(w, b, ih, iw) + c] += g * K[k];
                            }
                        }
                }
}

// y[b, oh, ow, c] = max over the window's pixels inside the image (NaN wins), or their mean
inline void pool2d_forward(double* y, const double* x, const Window2D& w, bool max) {
    for (int b = 0; b < w.B; ++b)
        for (int oh = 0; oh < w.OH; ++oh)
            for (int ow = 0; ow < w.OW; ++ow)
                for (int c = 0; c < w.C; ++c) {
                    double best = -INFINITY, sum = 0;
                    int count = 0;
                    for (int i = 0; i < w.KH; ++i)
                        for (int j = 0; j < w.KW; ++j) {
                            const int ih = input_at(oh, w.SH, w.pad_top, i, w.H), iw = input_at(ow, w.SW, w.pad_left, j, w.W);
                            if (ih < 0 || iw < 0) continue;
                            const double v = x[pixel(w, b, ih, iw) + c];
                            best = v > best || std::isnan(v) ? v : best;
                            sum += v, ++count;
                        }
                    y[out_pixel(w, b, oh, ow) * w.C + c] = max ? best : sum / count;
                }
}

// max: y = x[argmax]  =>  dx[argmax] += dy, the argmax the first pixel in window order equal to y
// mean: y = sum x / count  =>  dx += dy / count over the window's pixels
inline void pool2d_backward(double* dx, const double* dy, const double* x, const double* y, const Window2D& w, bool max) {
    for (size_t i = 0; i < (size_t)w.B * w.H * w.W * w.C; ++i) dx[i] = 0;
    for (int b = 0; b < w.B; ++b)
        for (int oh = 0; oh < w.OH; ++oh)
            for (int ow = 0; ow < w.OW; ++ow)
                for (int c = 0; c < w.C; ++c) {
                    const size_t o = out_pixel(w, b, oh, ow) * w.C + c;
                    std::vector<size_t> window;
                    for (int i = 0; i < w.KH; ++i)
                        for (int j = 0; j < w.KW; ++j) {
                            const int ih = input_at(oh, w.SH, w.pad_top, i, w.H), iw = input_at(ow, w.SW, w.pad_left, j, w.W);
                            if (ih >= 0 && iw >= 0) window.push_back(pixel(w, b, ih, iw) + c);
                        }
                    if (!max) {
                        for (size_t at : window) dx[at] += dy[o] / window.size();
                        continue;
                    }
                    for (size_t at : window)
                        if (x[at] == y[o] || (std::isnan(x[at]) && std::isnan(y[o]))) {
                            dx[at] += dy[o];
                            break;
                        }
                }
}

}  // namespace attnx::reference
