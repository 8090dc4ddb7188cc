// Optimizer updates over lists of parameter buffers, in place, one GIL release per step.
#include <cmath>
#include <vector>

#include "attnx/optim.hpp"
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "checks.hpp"

namespace attnx::bind {

using ArrayList = std::vector<py::array>;

// An optional list argument (None or a sequence of arrays); anything else is a TypeError.
static ArrayList optional_list(const py::object& obj, const char* what) {
    try {
        return obj.cast<ArrayList>();
    } catch (const py::cast_error&) {
        throw py::type_error(std::string(what) + ": expected None or a list of arrays, got " +
                             py::str(py::type::of(obj).attr("__name__")).cast<std::string>());
    }
}

// Pointers into each list, every buffer checked against the matching parameter's size.
template <class T>
static std::vector<T*> mutable_list(ArrayList& arrays, const ArrayList& params, const char* what) {
    if (arrays.size() != params.size())
        throw py::value_error(std::string(what) + ": expected " + std::to_string(params.size()) + " arrays, got " +
                              std::to_string(arrays.size()));
    std::vector<T*> out;
    for (size_t i = 0; i < arrays.size(); ++i) {
        if (arrays[i].size() != params[i].size())
            throw py::value_error(std::string(what) + ": buffer " + std::to_string(i) + " has shape " +
                                  shape_str(arrays[i]) + ", its parameter " + shape_str(params[i]));
        out.push_back(inout_ptr<T>(arrays[i], what));
    }
    return out;
}

template <class T> static std::vector<size_t> sizes_of(const ArrayList& params) {
    std::vector<size_t> n;
    for (auto& p : params) n.push_back((size_t)p.size());
    return n;
}

template <class F> static void dispatch_list(ArrayList& params, const char* what, F&& f) {
    if (params.empty()) return;
    dispatch_float(params[0], what, f);
}

void init_optim(py::module_& m) {
    m.def(
        "sgd_update",
        [](ArrayList params, ArrayList grads, ArrayList bufs, double lr, double momentum, bool nesterov,
           double weight_decay) {
            dispatch_list(params, "sgd_update", [&](auto tag) {
                using T = decltype(tag);
                auto p = mutable_list<T>(params, params, "sgd_update: params");
                auto g = mutable_list<T>(grads, params, "sgd_update: grads");
                auto b = mutable_list<T>(bufs, params, "sgd_update: momentum buffers");
                auto n = sizes_of<T>(params);
                py::gil_scoped_release release;
                for (size_t i = 0; i < p.size(); ++i)
                    sgd_update<T>(p[i], g[i], b[i], n[i], T(lr), T(momentum), nesterov, T(weight_decay));
            });
        },
        py::arg("params"), py::arg("grads"), py::arg("bufs"), py::arg("lr"), py::arg("momentum"), py::arg("nesterov"),
        py::arg("weight_decay"));

    m.def(
        "adam_update",
        [](ArrayList params, ArrayList grads, ArrayList ms, ArrayList vs, double lr, double beta1, double beta2,
           double eps, long step, double weight_decay, bool decoupled) {
            if (step < 1) throw py::value_error("adam_update: step must be >= 1");
            dispatch_list(params, "adam_update", [&](auto tag) {
                using T = decltype(tag);
                auto p = mutable_list<T>(params, params, "adam_update: params");
                auto g = mutable_list<T>(grads, params, "adam_update: grads");
                auto m1 = mutable_list<T>(ms, params, "adam_update: first moments");
                auto m2 = mutable_list<T>(vs, params, "adam_update: second moments");
                auto n = sizes_of<T>(params);
                py::gil_scoped_release release;
                adam_update_arrays<T>(p.data(), g.data(), m1.data(), m2.data(), n.data(), p.size(), T(lr), T(beta1),
                                      T(beta2), T(eps), step, T(weight_decay), decoupled);
            });
        },
        py::arg("params"), py::arg("grads"), py::arg("ms"), py::arg("vs"), py::arg("lr"), py::arg("beta1"),
        py::arg("beta2"), py::arg("eps"), py::arg("step"), py::arg("weight_decay"), py::arg("decoupled"));

    m.def(
        "zero_",
        [](ArrayList arrays) {
            dispatch_list(arrays, "zero_", [&](auto tag) {
                using T = decltype(tag);
                auto a = mutable_list<T>(arrays, arrays, "zero_: arrays");
                auto n = sizes_of<T>(arrays);
                py::gil_scoped_release release;
                zero_arrays<T>(a.data(), n.data(), a.size());
            });
        },
        py::arg("arrays"), "Sets every element of the arrays (one float dtype) to zero, split across the threads.");

    m.def(
        "rmsprop_update",
        [](ArrayList params, ArrayList grads, ArrayList vs, py::object mean_grads, py::object bufs, double lr,
           double rho, double eps, double momentum, double weight_decay) {
            dispatch_list(params, "rmsprop_update", [&](auto tag) {
                using T = decltype(tag);
                auto p = mutable_list<T>(params, params, "rmsprop_update: params");
                auto g = mutable_list<T>(grads, params, "rmsprop_update: grads");
                auto v = mutable_list<T>(vs, params, "rmsprop_update: mean squares");
                ArrayList mg_list, buf_list;
                std::vector<T*> mg(p.size(), nullptr), bf(p.size(), nullptr);
                if (!mean_grads.is_none()) {
                    mg_list = optional_list(mean_grads, "rmsprop_update: mean_grads");
                    mg = mutable_list<T>(mg_list, params, "rmsprop_update: mean gradients");
                }
                if (!bufs.is_none()) {
                    buf_list = optional_list(bufs, "rmsprop_update: bufs");
                    bf = mutable_list<T>(buf_list, params, "rmsprop_update: momentum buffers");
                }
                auto n = sizes_of<T>(params);
                py::gil_scoped_release release;
                for (size_t i = 0; i < p.size(); ++i)
                    rmsprop_update<T>(p[i], g[i], v[i], mg[i], bf[i], n[i], T(lr), T(rho), T(eps), T(momentum),
                                      T(weight_decay));
            });
        },
        py::arg("params"), py::arg("grads"), py::arg("vs"), py::arg("mean_grads"), py::arg("bufs"), py::arg("lr"),
        py::arg("rho"), py::arg("eps"), py::arg("momentum"), py::arg("weight_decay"));

    m.def(
        "global_norm",
        [](ArrayList arrays) {
            double total = 0;
            for (auto& a : arrays)
                total += dispatch_float(a, "global_norm", [&](auto tag) {
                    using T = decltype(tag);
                    return sum_squares<T>(in_ptr<T>(a, "global_norm"), (size_t)a.size());
                });
            return std::sqrt(total);
        },
        py::arg("arrays"), "sqrt of the sum of squares over all arrays.");

    m.def(
        "scale_",
        [](ArrayList arrays, double factor) {
            for (auto& a : arrays)
                dispatch_float(a, "scale_", [&](auto tag) {
                    using T = decltype(tag);
                    scale_inplace<T>(inout_ptr<T>(a, "scale_"), (size_t)a.size(), T(factor));
                });
        },
        py::arg("arrays"), py::arg("factor"), "Multiplies every array in place.");

    m.def(
        "clip_",
        [](ArrayList arrays, double lo, double hi) {
            for (auto& a : arrays)
                dispatch_float(a, "clip_", [&](auto tag) {
                    using T = decltype(tag);
                    clip_inplace<T>(inout_ptr<T>(a, "clip_"), (size_t)a.size(), T(lo), T(hi));
                });
        },
        py::arg("arrays"), py::arg("lo"), py::arg("hi"), "Clips every array in place to [lo, hi].");

    // L1L2 regularization (the factors are checked where Python builds the regularizer)
    m.def(
        "l1l2_penalty",
        [](const py::array& weights, double l1, double l2) {
            return dispatch_float(weights, "l1l2_penalty: weights", [&](auto tag) {
                using T = decltype(tag);
                const T* w = in_ptr<T>(weights, "l1l2_penalty: weights");
                py::gil_scoped_release release;
                return l1l2_penalty<T>(w, (size_t)weights.size(), l1, l2);
            });
        },
        py::arg("weights"), py::arg("l1"), py::arg("l2"), "sum(l1 |w| + l2 w^2), accumulated in double.");

    m.def(
        "l1l2_add_gradient",
        [](py::array& grad, const py::array& weights, double l1, double l2) {
            dispatch_float(weights, "l1l2_add_gradient: weights", [&](auto tag) {
                using T = decltype(tag);
                const T* w = in_ptr<T>(weights, "l1l2_add_gradient: weights");
                check_shape(grad, std::vector<py::ssize_t>(weights.shape(), weights.shape() + weights.ndim()),
                            "l1l2_add_gradient: grad");
                T* g = inout_ptr<T>(grad, "l1l2_add_gradient: grad");
                py::gil_scoped_release release;
                add_l1l2_gradient<T>(g, w, (size_t)weights.size(), l1, l2);
            });
        },
        py::arg("grad"), py::arg("weights"), py::arg("l1"), py::arg("l2"),
        "grad += l1 sign(w) + 2 l2 w, in place (grad: the weights' shape and dtype).");

    m.def(
        "l1l2_penalty_add_gradient",
        [](py::array& grad, const py::array& weights, double l1, double l2) {
            return dispatch_float(weights, "l1l2_penalty_add_gradient: weights", [&](auto tag) {
                using T = decltype(tag);
                const T* w = in_ptr<T>(weights, "l1l2_penalty_add_gradient: weights");
                check_shape(grad, std::vector<py::ssize_t>(weights.shape(), weights.shape() + weights.ndim()),
                            "l1l2_penalty_add_gradient: grad");
                T* g = inout_ptr<T>(grad, "l1l2_penalty_add_gradient: grad");
                py::gil_scoped_release release;
                return l1l2_penalty_add_gradient<T>(g, w, (size_t)weights.size(), l1, l2);
            });
        },
        py::arg("grad"), py::arg("weights"), py::arg("l1"), py::arg("l2"),
        "l1l2_penalty and l1l2_add_gradient in one pass over the weights (the same numbers): returns the penalty.");
}

}  // namespace attnx::bind
