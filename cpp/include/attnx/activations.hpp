// Elementwise activations and the row softmax, forward and backward.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

namespace attnx {

enum class Activation { linear, relu, tanh, sigmoid, softmax, gelu };

inline Activation activation_from_name(const std::string& name) {
    if (name == "linear" || name.empty()) return Activation::linear;
    if (name == "relu") return Activation::relu;
    if (name == "tanh") return Activation::tanh;
    if (name == "sigmoid") return Activation::sigmoid;
    if (name == "softmax") return Activation::softmax;
    if (name == "gelu") return Activation::gelu;
    throw std::invalid_argument("unknown activation '" + name +
                                "'; expected linear, relu, tanh, sigmoid, softmax or gelu");
}

template <class T> inline T sigmoid(T x) {
    // branch keeps exp() from overflowing for large |x|
    if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
    T e = std::exp(x);
    return e / (T(1) + e);
}

// gelu(x) = x * Phi(x), Phi the standard normal CDF (exact form, as Keras and PyTorch default)
template <class T> inline T gelu_cdf(T x) { return T(0.5) * (T(1) + std::erf(x * T(0.70710678118654752440))); }
template <class T> inline T gelu_pdf(T x) { return T(0.39894228040143267794) * std::exp(T(-0.5) * x * x); }

// y = softmax(x) over the entries with mask[c] != 0 (mask null: all entries); masked entries get 0
// and a fully masked row is all zeros, never NaN. One row of length cols; y may alias x.
template <class T> inline void masked_softmax_row(T* y, const T* x, const uint8_t* mask, size_t cols) {
    T maxv = -std::numeric_limits<T>::infinity();
    for (size_t c = 0; c < cols; ++c) {
        if (mask && !mask[c]) continue;
        if (std::isnan(x[c])) {  // NaN in, NaN out: a row of NaNs must not pass for a fully masked one
            maxv = x[c];
            break;
        }
        maxv = std::max(maxv, x[c]);
    }
    if (maxv == -std::numeric_limits<T>::infinity()) {  // nothing to attend to
        std::fill(y, y + cols, T(0));
        return;
    }
    T sum = 0;
    for (size_t c = 0; c < cols; ++c) {
        y[c] = (!mask || mask[c]) ? std::exp(x[c] - maxv) : T(0);
        sum += y[c];
    }
    const T inv = T(1) / sum;
    for (size_t c = 0; c < cols; ++c) y[c] *= inv;
}

// y[r, :] = softmax(x[r, :]) for rows of length cols; y may alias x.
template <class T> inline void softmax_rows(T* y, const T* x, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; ++r) masked_softmax_row(y + r * cols, x + r * cols, nullptr, cols);
}

// dx[r, c] = y[r, c] * (dy[r, c] - sum_k dy[r, k] y[r, k]); dx may alias dy. Also the backward of
// masked_softmax_row: masked entries have y = 0 and so get dx = 0.
template <class T> inline void softmax_rows_backward(T* dx, const T* dy, const T* y, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; ++r) {
        const T* yr = y + r * cols;
        const T* dyr = dy + r * cols;
        T dot = 0;
        for (size_t c = 0; c < cols; ++c) dot += dyr[c] * yr[c];
        T* dxr = dx + r * cols;
        for (size_t c = 0; c < cols; ++c) dxr[c] = yr[c] * (dyr[c] - dot);
    }
}

// y = act(x) over a (rows, cols) block; softmax acts on each row. y may alias x.
template <class T> void activation_forward(T* y, const T* x, size_t rows, size_t cols, Activation act) {
    const size_t n = rows * cols;
    switch (act) {
        case Activation::linear: if (y != x) std::copy(x, x + n, y); break;
        case Activation::relu: for (size_t i = 0; i < n; ++i) y[i] = x[i] < T(0) ? T(0) : x[i]; break;  // NaN stays NaN
        case Activation::tanh: for (size_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]); break;
        case Activation::sigmoid: for (size_t i = 0; i < n; ++i) y[i] = sigmoid(x[i]); break;
        case Activation::gelu: for (size_t i = 0; i < n; ++i) y[i] = x[i] * gelu_cdf(x[i]); break;
        case Activation::softmax: softmax_rows(y, x, rows, cols); break;
    }
}

// dx = dy * act'(x), using the cached output y where that is cheaper (gelu needs x).
// dx may alias dy.
template <class T>
void activation_backward(T* dx, const T* dy, const T* x, const T* y, size_t rows, size_t cols, Activation act) {
    const size_t n = rows * cols;
    switch (act) {
        case Activation::linear: if (dx != dy) std::copy(dy, dy + n, dx); break;
        case Activation::relu: for (size_t i = 0; i < n; ++i) dx[i] = y[i] > T(0) ? dy[i] : T(0); break;
        case Activation::tanh: for (size_t i = 0; i < n; ++i) dx[i] = dy[i] * (T(1) - y[i] * y[i]); break;
        case Activation::sigmoid: for (size_t i = 0; i < n; ++i) dx[i] = dy[i] * y[i] * (T(1) - y[i]); break;
        // d/dx [x Phi(x)] = Phi(x) + x phi(x)
        case Activation::gelu:
            for (size_t i = 0; i < n; ++i) dx[i] = dy[i] * (gelu_cdf(x[i]) + x[i] * gelu_pdf(x[i]));
            break;
        case Activation::softmax: softmax_rows_backward(dx, dy, y, rows, cols); break;
    }
}

}  // namespace attnx
