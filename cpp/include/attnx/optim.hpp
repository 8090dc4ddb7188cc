// Optimizer updates in place over flat parameter buffers, following PyTorch's update rules
// (which equal Keras' for a constant learning rate). g is the raw gradient; weight_decay is
// PyTorch's coupled L2 (added to g) except for adamw, which decays the weights directly.
#pragma once
#include <cmath>
#include <cstddef>

#include "attnx/activations.hpp"
#include "attnx/parallel.hpp"

namespace attnx {

// buf = momentum * buf + g;  step = nesterov ? g + momentum * buf : buf;  p -= lr * step
template <class T>
void sgd_update(T* p, const T* grad, T* buf, size_t n, T lr, T momentum, bool nesterov, T weight_decay) {
    for (size_t i = 0; i < n; ++i) {
        T g = grad[i] + weight_decay * p[i];
        if (momentum != T(0)) {
            buf[i] = momentum * buf[i] + g;
            g = nesterov ? g + momentum * buf[i] : buf[i];
        }
        p[i] -= lr * g;
    }
}

// m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)      (AdamW first: p *= 1 - lr wd)
template <class T>
void adam_update(T* p, const T* grad, T* m, T* v, size_t n, T lr, T beta1, T beta2, T eps, long step,
                 T weight_decay, bool decoupled) {
    const T bias1 = T(1) - std::pow(beta1, T(step));
    const T sqrt_bias2 = std::sqrt(T(1) - std::pow(beta2, T(step)));
    const T step_size = lr / bias1;
    // decoupled decay as a factor and coupled decay as a gradient term keep the loop branch-free,
    // so it vectorizes
    const T shrink = decoupled ? T(1) - lr * weight_decay : T(1);
    const T l2 = decoupled ? T(0) : weight_decay;
    const T inv_sqrt_bias2 = T(1) / sqrt_bias2;
    parallel_for(n, 8.0 * n, [=](size_t lo, size_t hi) {
        T* __restrict__ pp = p;  // the four buffers never overlap
        T* __restrict__ mm = m;
        T* __restrict__ vv = v;
        const T* __restrict__ gg = grad;
        on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {  // the loop vectorizes to each level's width
            for (size_t i = lo; i < hi; ++i) {
                const T g = gg[i] + l2 * pp[i];
                const T mi = beta1 * mm[i] + (T(1) - beta1) * g;
                const T vi = beta2 * vv[i] + (T(1) - beta2) * g * g;
                mm[i] = mi;
                vv[i] = vi;
                pp[i] = pp[i] * shrink - step_size * mi / (std::sqrt(vi) * inv_sqrt_bias2 + eps);
            }
        });
    });
}

// v = rho v + (1 - rho) g^2;  centered: mg = rho mg + (1 - rho) g, denom = sqrt(v - mg^2) + eps
// momentum: buf = momentum buf + g / denom, p -= lr buf;  else p -= lr g / denom
template <class T>
void rmsprop_update(T* p, const T* grad, T* v, T* mean_grad, T* buf, size_t n, T lr, T rho, T eps, T momentum,
                    T weight_decay) {
    for (size_t i = 0; i < n; ++i) {
        const T g = grad[i] + weight_decay * p[i];
        v[i] = rho * v[i] + (T(1) - rho) * g * g;
        T mean_square = v[i];
        if (mean_grad) {
            mean_grad[i] = rho * mean_grad[i] + (T(1) - rho) * g;
            mean_square -= mean_grad[i] * mean_grad[i];
        }
        const T denom = std::sqrt(mean_square) + eps;
        if (buf) {
            buf[i] = momentum * buf[i] + g / denom;
            p[i] -= lr * buf[i];
        } else {
            p[i] -= lr * g / denom;
        }
    }
}

template <class T> double sum_squares(const T* x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
    return s;
}

template <class T> void scale_inplace(T* x, size_t n, T factor) {
    for (size_t i = 0; i < n; ++i) x[i] *= factor;
}

template <class T> void clip_inplace(T* x, size_t n, T lo, T hi) {
    for (size_t i = 0; i < n; ++i) x[i] = x[i] < lo ? lo : (x[i] > hi ? hi : x[i]);
}

}  // namespace attnx
