// Optimizer updates in place over flat parameter buffers, following PyTorch's update rules
// (which equal Keras' for a constant learning rate). g is the raw gradient; weight_decay is
// PyTorch's coupled L2 (added to g) except for adamw, which decays the weights directly.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "attnx/activations.hpp"
#include "attnx/parallel.hpp"

namespace attnx {

// reference: cpp/reference/optim.hpp, sgd_update
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

// adam_update's loop over [lo, hi). Scalars by value and the buffers as restrict parameters (the
// four never overlap), inlined where it is called: then no store in the loop can change what it
// reads besides its own element, and it vectorizes (read through a closure's references, the
// scalars kept it scalar).
template <class T>
ATTNX_ALWAYS_INLINE void adam_range(T* __restrict__ p, const T* __restrict__ grad, T* __restrict__ m,
                                    T* __restrict__ v, size_t lo, size_t hi, T beta1, T beta2, T eps, T step_size,
                                    T inv_sqrt_bias2, T shrink, T l2) {
    for (size_t i = lo; i < hi; ++i) {
        const T g = grad[i] + l2 * p[i];
        const T mi = beta1 * m[i] + (T(1) - beta1) * g;
        const T vi = beta2 * v[i] + (T(1) - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * shrink - step_size * mi / (std::sqrt(vi) * inv_sqrt_bias2 + eps);
    }
}

// fn(i, from, to) for the elements [from, to) of array i (sizes n[i]) that fall in [lo, hi) of the
// arrays' elements taken as one range: how the kernels over many arrays (a step's weights and gradients)
// cut them evenly across the threads, so that a call wakes the pool once and its small arrays split too
template <class Fn>
ATTNX_ALWAYS_INLINE void for_array_ranges(const size_t* n, size_t count, size_t lo, size_t hi, Fn&& fn) {
    size_t start = 0;  // of array i in the range
    for (size_t i = 0; i < count && start < hi; start += n[i], ++i) {
        const size_t from = std::max(lo, start), to = std::min(hi, start + n[i]);
        if (from < to) fn(i, from - start, to - start);
    }
}

// Every element of `count` arrays (sizes n[i]) set to zero, the arrays cut across the threads
// (for_array_ranges): a step's gradient buffers, whose fill ran on one core (64 MiB in 8 ms)
template <class T> void zero_arrays(T* const* a, const size_t* n, size_t count) {
    size_t total = 0;
    for (size_t i = 0; i < count; ++i) total += n[i];
    parallel_for(total, double(total), [=](size_t lo, size_t hi) {
        for_array_ranges(n, count, lo, hi, [&](size_t i, size_t from, size_t to) {
            std::memset(a[i] + from, 0, (to - from) * sizeof(T));
        });
    });
}

// reference: cpp/reference/optim.hpp, adam_update (per array)
// m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)      (AdamW first: p *= 1 - lr wd)
// over `count` arrays (sizes n[i]) in one parallel region (for_array_ranges). Each element's update
// depends on nothing else: any cut gives the same numbers.
template <class T>
void adam_update_arrays(T* const* p, const T* const* grad, T* const* m, T* const* v, const size_t* n, size_t count,
                        T lr, T beta1, T beta2, T eps, long step, T weight_decay, bool decoupled) {
    const T bias1 = T(1) - std::pow(beta1, T(step));
    const T sqrt_bias2 = std::sqrt(T(1) - std::pow(beta2, T(step)));
    const T step_size = lr / bias1;
    // decoupled decay as a factor and coupled decay as a gradient term keep the loop branch-free,
    // so it vectorizes
    const T shrink = decoupled ? T(1) - lr * weight_decay : T(1);
    const T l2 = decoupled ? T(0) : weight_decay;
    const T inv_sqrt_bias2 = T(1) / sqrt_bias2;
    size_t total = 0;
    for (size_t i = 0; i < count; ++i) total += n[i];
    parallel_for(total, 8.0 * total, [=](size_t lo, size_t hi) {
        on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {  // the loop vectorizes to each level's width
            for_array_ranges(n, count, lo, hi, [&](size_t i, size_t from, size_t to) __attribute__((always_inline)) {
                adam_range(p[i], grad[i], m[i], v[i], from, to, beta1, beta2, eps, step_size, inv_sqrt_bias2, shrink,
                           l2);
            });
        });
    });
}

// adam_update_arrays on one array
template <class T>
void adam_update(T* p, const T* grad, T* m, T* v, size_t n, T lr, T beta1, T beta2, T eps, long step,
                 T weight_decay, bool decoupled) {
    adam_update_arrays<T>(&p, &grad, &m, &v, &n, 1, lr, beta1, beta2, eps, step, weight_decay, decoupled);
}

// reference: cpp/reference/optim.hpp, rmsprop_update
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

// reference: cpp/reference/optim.hpp, sum_squares
// sum_i x_i^2 in double, in 32 partial sums on the widest vectors (one running sum chained every add
// behind the last)
template <class T> double sum_squares(const T* x, size_t n) {
    return on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {
        return sum_lanes<double, 32>(n, [&](size_t i) { return double(x[i]) * double(x[i]); });
    });
}

// reference: cpp/reference/optim.hpp, l1l2_penalty
// The L1L2 regularization of weights w: penalty sum_i l1 |w_i| + l2 w_i^2 (in double) and gradient
// grad += l1 sign(w) + 2 l2 w, each one pass on the widest vectors (NumPy took 105 us a step, and
// temporaries, for the main job's 5000 x 32 embedding table).
// One weight's penalty term and gradient term (l1 != 0), for the three kernels below
template <class T> ATTNX_ALWAYS_INLINE double l1l2_term(T w, double l1, double l2) {
    const double v = w;
    return l1 * std::fabs(v) + l2 * v * v;
}
template <class T> ATTNX_ALWAYS_INLINE T l1l2_slope(T w, T l1, T two_l2) {
    return l1 * (T(w > T(0)) - T(w < T(0))) + two_l2 * w;
}

template <class T> double l1l2_penalty(const T* w, size_t n, double l1, double l2) {
    if (l1 == 0) return l2 * sum_squares(w, n);
    return on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {
        return sum_lanes<double, 32>(n, [&](size_t i) { return l1l2_term(w[i], l1, l2); });
    });
}

// reference: cpp/reference/optim.hpp, add_l1l2_gradient
template <class T> void add_l1l2_gradient(T* grad, const T* w, size_t n, double l1, double l2) {
    on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {
        const T l1t = T(l1), two_l2 = T(2 * l2);
        if (l1 == 0)
            for (size_t i = 0; i < n; ++i) grad[i] += two_l2 * w[i];
        else
            for (size_t i = 0; i < n; ++i) grad[i] += l1l2_slope(w[i], l1t, two_l2);
    });
}

// reference: cpp/reference/optim.hpp, l1l2_penalty and add_l1l2_gradient
// Both in one pass over w, for a training step, which takes both: l1l2_penalty's sums and
// add_l1l2_gradient's terms, bit for bit (the main job's 5000 x 32 table read once a step, not twice).
template <class T> double l1l2_penalty_add_gradient(T* grad, const T* w, size_t n, double l1, double l2) {
    return on_widest_lanes<T>([&](auto) __attribute__((always_inline)) {
        T* __restrict__ g = grad;
        const T* __restrict__ x = w;
        const T l1t = T(l1), two_l2 = T(2 * l2);
        if (l1 == 0)
            return l2 * sum_lanes<double, 32>(n, [&](size_t i) {
                g[i] += two_l2 * x[i];
                return double(x[i]) * double(x[i]);
            });
        return sum_lanes<double, 32>(n, [&](size_t i) {
            g[i] += l1l2_slope(x[i], l1t, two_l2);
            return l1l2_term(x[i], l1, l2);
        });
    });
}

// reference: cpp/reference/optim.hpp, scale_inplace
template <class T> void scale_inplace(T* x, size_t n, T factor) {
    for (size_t i = 0; i < n; ++i) x[i] *= factor;
}

// reference: cpp/reference/optim.hpp, clip_inplace
template <class T> void clip_inplace(T* x, size_t n, T lo, T hi) {
    for (size_t i = 0; i < n; ++i) x[i] = x[i] < lo ? lo : (x[i] > hi ? hi : x[i]);
}

}  // namespace attnx
