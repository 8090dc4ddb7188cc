// Reference optimizer updates and regularization: what optim.hpp computes, one parameter at a time
// in double (PyTorch's update rules; weight_decay is coupled L2 except AdamW's decoupled decay).
#pragma once
#include <cmath>
#include <cstddef>

namespace attnx::reference {

// g = grad + wd p;  buf = momentum buf + g;  p -= lr (nesterov ? g + momentum buf : buf)   (momentum 0: p -= lr g)
inline void sgd_update(double* p, const double* grad, double* buf, size_t n, double lr, double momentum, bool nesterov,
                       double weight_decay) {
    for (size_t i = 0; i < n; ++i) {
        const double g = grad[i] + weight_decay * p[i];
        if (momentum == 0) {
            p[i] -= lr * g;
            continue;
        }
        buf[i] = momentum * buf[i] + g;
        p[i] -= lr * (nesterov ? g + momentum * buf[i] : buf[i]);
    }
}

// g = grad + wd p (Adam) or p *= 1 - lr wd first (AdamW);  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
// p -= lr / (1 - b1^t) m / (sqrt(v / (1 - b2^t)) + eps)
inline void adam_update(double* p, const double* grad, double* m, double* v, size_t n, double lr, double beta1,
                        double beta2, double eps, long step, double weight_decay, bool decoupled) {
    for (size_t i = 0; i < n; ++i) {
        const double g = grad[i] + (decoupled ? 0 : weight_decay * p[i]);
        if (decoupled) p[i] *= 1 - lr * weight_decay;
        m[i] = beta1 * m[i] + (1 - beta1) * g;
        v[i] = beta2 * v[i] + (1 - beta2) * g * g;
        const double m_hat = m[i] / (1 - std::pow(beta1, step)), v_hat = v[i] / (1 - std::pow(beta2, step));
        p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
}

// g = grad + wd p;  v = rho v + (1 - rho) g^2;  centered: mg = rho mg + (1 - rho) g, var = v - mg^2
// denom = sqrt(var) + eps;  momentum: buf = momentum buf + g / denom, p -= lr buf;  else p -= lr g / denom
inline void rmsprop_update(double* p, const double* grad, double* v, double* mean_grad, double* buf, size_t n,
                           double lr, double rho, double eps, double momentum, double weight_decay) {
    for (size_t i = 0; i < n; ++i) {
        const double g = grad[i] + weight_decay * p[i];
        v[i] = rho * v[i] + (1 - rho) * g * g;
        double var = v[i];
        if (mean_grad) {
            mean_grad[i] = rho * mean_grad[i] + (1 - rho) * g;
            var -= mean_grad[i] * mean_grad[i];
        }
        const double denom = std::sqrt(var) + eps;
        if (buf) {
            buf[i] = momentum * buf[i] + g / denom;
            p[i] -= lr * buf[i];
        } else {
            p[i] -= lr * g / denom;
        }
    }
}

// sum_i x_i^2
inline double sum_squares(const double* x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += x[i] * x[i];
    return s;
}

// penalty = sum_i l1 |w_i| + l2 w_i^2  =>  grad += l1 sign(w) + 2 l2 w
inline double l1l2_penalty(const double* w, size_t n, double l1, double l2) {
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += l1 * std::fabs(w[i]) + l2 * w[i] * w[i];
    return s;
}
inline void add_l1l2_gradient(double* grad, const double* w, size_t n, double l1, double l2) {
    for (size_t i = 0; i < n; ++i) grad[i] += l1 * ((w[i] > 0) - (w[i] < 0)) + 2 * l2 * w[i];
}

// x *= factor;  x = clip(x, lo, hi)
inline void scale_inplace(double* x, size_t n, double factor) {
    for (size_t i = 0; i < n; ++i) x[i] *= factor;
}
inline void clip_inplace(double* x, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; ++i) x[i] = x[i] < lo ? lo : x[i] > hi ? hi : x[i];
}

}  // namespace attnx::reference
