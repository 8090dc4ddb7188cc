// Reference activations: what activations.hpp computes, one scalar at a time in double.
// Read this before the fast kernels; the tests (cpp/tests/test_reference_*.cpp) hold every
// SIMD level and thread split of attnx to these loops.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "attnx/activations.hpp"  // the Activation enum only

namespace attnx::reference {

// y = act(x)
inline double act(Activation a, double x) {
    switch (a) {
        case Activation::relu: return x > 0 ? x : 0;
        case Activation::tanh: return std::tanh(x);
        case Activation::sigmoid: return 1 / (1 + std::exp(-x));
        case Activation::gelu: return x * 0.5 * (1 + std::erf(x / std::sqrt(2.0)));
        default: return x;  // linear (softmax acts on rows: softmax_forward)
    }
}

// d act(x) / dx, given x and y = act(x)
inline double act_slope(Activation a, double x, double y) {
    switch (a) {
        case Activation::relu: return y > 0 ? 1 : 0;
        case Activation::tanh: return 1 - y * y;
        case Activation::sigmoid: return y * (1 - y);
        case Activation::gelu: return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
        default: return 1;
    }
}

// y[r, c] = exp(x[r, c]) / sum_k exp(x[r, k]) over the entries with mask[r, c] != 0 (mask null: all);
// masked entries and fully masked rows are 0
inline void softmax_forward(double* y, const double* x, const uint8_t* mask, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; ++r) {
        const double* xr = x + r * cols;
        const uint8_t* mr = mask ? mask + r * cols : nullptr;
        double maxv = -INFINITY;
        for (size_t c = 0; c < cols; ++c)
            if (!mr || mr[c]) maxv = std::fmax(maxv, xr[c]);
        double sum = 0;
        for (size_t c = 0; c < cols; ++c) sum += (!mr || mr[c]) ? std::exp(xr[c] - maxv) : 0;
        for (size_t c = 0; c < cols; ++c) y[r * cols + c] = (!mr || mr[c]) ? std::exp(xr[c] - maxv) / sum : 0;
    }
}

// y[r, c] = exp(x[r, c]) / sum_k exp(x[r, k])
// => dx[r, c] = y[r, c] (dy[r, c] - sum_k dy[r, k] y[r, k])
inline void softmax_backward(double* dx, const double* dy, const double* y, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; ++r) {
        double dot = 0;
        for (size_t k = 0; k < cols; ++k) dot += dy[r * cols + k] * y[r * cols + k];
        for (size_t c = 0; c < cols; ++c) dx[r * cols + c] = y[r * cols + c] * (dy[r * cols + c] - dot);
    }
}

// y = act(x) over a (rows, cols) block
inline void activation_forward(double* y, const double* x, size_t rows, size_t cols, Activation a) {
    if (a == Activation::softmax) return softmax_forward(y, x, nullptr, rows, cols);
    for (size_t i = 0; i < rows * cols; ++i) y[i] = act(a, x[i]);
}

// y = act(x)  =>  dx = dy act'(x)
inline void activation_backward(double* dx, const double* dy, const double* x, const double* y, size_t rows,
                                size_t cols, Activation a) {
    if (a == Activation::softmax) return softmax_backward(dx, dy, y, rows, cols);
    for (size_t i = 0; i < rows * cols; ++i) dx[i] = dy[i] * act_slope(a, x[i], y[i]);
}

}  // namespace attnx::reference
