// Losses: each returns (loss, d loss / d prediction).
#include <cstdint>

#include "attnx/loss.hpp"
#include "bindings.hpp"
#include "checks.hpp"

namespace attnx::bind {

template <class T> static const T* weights_ptr(const py::object& w, py::ssize_t expected, const char* what) {
    if (w.is_none()) return nullptr;
    py::array arr = array_arg(w, what);
    if (arr.size() != expected)
        throw py::value_error(std::string(what) + ": expected " + std::to_string(expected) + " weights, got shape " +
                              shape_str(arr));
    return in_ptr<T>(arr, what);
}

static void check_denom(double denom, const char* what) {
    if (!(denom > 0)) throw py::value_error(std::string(what) + ": the normalizer must be positive");
}

// pred and target of the same shape, elementwise loss
template <class Kernel>
static py::tuple elementwise_loss(const char* name, const py::array& pred, const py::array& target,
                                  const py::object& weights, double denom, Kernel kernel) {
    check_denom(denom, name);
    return dispatch_float(pred, name, [&](auto tag) -> py::tuple {
        using T = decltype(tag);
        std::vector<py::ssize_t> shape(pred.shape(), pred.shape() + pred.ndim());
        check_shape(target, shape, (std::string(name) + ": target").c_str());
        const T* pp = in_ptr<T>(pred, name);
        const T* pt = in_ptr<T>(target, name);
        const T* pw = weights_ptr<T>(weights, pred.size(), name);
        auto grad = new_array<T>(shape);
        T* pg = grad.mutable_data();
        T loss;
        {
            py::gil_scoped_release release;
            loss = kernel(pg, pp, pt, pw, (size_t)pred.size(), T(denom));
        }
        return py::make_tuple(double(loss), grad);
    });
}

void init_loss(py::module_& m) {
    m.def(
        "binary_crossentropy",
        [](const py::array& pred, const py::array& target, const py::object& weights, bool from_logits, double denom) {
            return elementwise_loss("binary_crossentropy", pred, target, weights, denom, [&](auto* g, auto* p, auto* t,
                                                                                              auto* w, size_t n, auto d) {
                return from_logits ? bce_logits(g, p, t, w, n, d) : bce_probs(g, p, t, w, n, d);
            });
        },
        py::arg("pred"), py::arg("target"), py::arg("weights"), py::arg("from_logits"), py::arg("denom"));

    m.def(
        "mean_squared_error",
        [](const py::array& pred, const py::array& target, const py::object& weights, double denom) {
            return elementwise_loss("mean_squared_error", pred, target, weights, denom,
                                    [](auto* g, auto* p, auto* t, auto* w, size_t n, auto d) { return mse(g, p, t, w, n, d); });
        },
        py::arg("pred"), py::arg("target"), py::arg("weights"), py::arg("denom"));

    m.def(
        "sparse_categorical_crossentropy",
        [](const py::array& pred, const py::array& labels, const py::object& weights, bool from_logits,
           int64_t ignore_index, double denom, double label_smoothing) {
            check_denom(denom, "sparse_categorical_crossentropy");
            if (!(label_smoothing >= 0 && label_smoothing < 1))
                throw py::value_error("sparse_categorical_crossentropy: label_smoothing must be in [0, 1), got " +
                                      std::to_string(label_smoothing));
            if (label_smoothing && !from_logits)
                throw py::value_error("sparse_categorical_crossentropy: label_smoothing needs from_logits=True");
            return dispatch_float(pred, "sparse_categorical_crossentropy: pred", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                if (pred.ndim() < 1) throw py::value_error("sparse_categorical_crossentropy: pred must have a class axis");
                const auto K = pred.shape(pred.ndim() - 1);
                const py::ssize_t rows = K ? pred.size() / K : 0;
                if (!has_dtype<int64_t>(labels) || !(labels.flags() & py::array::c_style) ||
                    !is_aligned(labels))
                    throw py::type_error("sparse_categorical_crossentropy: labels must be C-contiguous int64");
                if (labels.size() != rows)
                    throw py::value_error("sparse_categorical_crossentropy: expected " + std::to_string(rows) +
                                          " labels for predictions of shape " + shape_str(pred) + ", got shape " +
                                          shape_str(labels));
                const int64_t* pl = static_cast<const int64_t*>(labels.data());
                for (py::ssize_t r = 0; r < rows; ++r)
                    if (pl[r] != ignore_index && (pl[r] < 0 || pl[r] >= K))
                        throw py::index_error("sparse_categorical_crossentropy: label " + std::to_string(pl[r]) +
                                              " out of range [0, " + std::to_string(K) + ")");
                const T* pp = in_ptr<T>(pred, "sparse_categorical_crossentropy: pred");
                const T* pw = weights_ptr<T>(weights, rows, "sparse_categorical_crossentropy: weights");
                std::vector<py::ssize_t> shape(pred.shape(), pred.shape() + pred.ndim());
                auto grad = new_array<T>(shape);
                T* pg = grad.mutable_data();
                T loss;
                {
                    py::gil_scoped_release release;
                    loss = sparse_cce<T>(pg, pp, pl, pw, (size_t)rows, (size_t)K, from_logits, ignore_index, T(denom),
                                        label_smoothing);
                }
                return py::make_tuple(double(loss), grad);
            });
        },
        py::arg("pred"), py::arg("labels"), py::arg("weights"), py::arg("from_logits"), py::arg("ignore_index"),
        py::arg("denom"), py::arg("label_smoothing") = 0.0);

    m.def(
        "categorical_crossentropy",
        [](const py::array& pred, const py::array& target, const py::object& weights, bool from_logits, double denom) {
            check_denom(denom, "categorical_crossentropy");
            return dispatch_float(pred, "categorical_crossentropy: pred", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                if (pred.ndim() < 1) throw py::value_error("categorical_crossentropy: pred must have a class axis");
                std::vector<py::ssize_t> shape(pred.shape(), pred.shape() + pred.ndim());
                check_shape(target, shape, "categorical_crossentropy: target");
                const auto K = pred.shape(pred.ndim() - 1);
                const py::ssize_t rows = K ? pred.size() / K : 0;
                const T* pp = in_ptr<T>(pred, "categorical_crossentropy: pred");
                const T* pt = in_ptr<T>(target, "categorical_crossentropy: target");
                const T* pw = weights_ptr<T>(weights, rows, "categorical_crossentropy: weights");
                auto grad = new_array<T>(shape);
                T* pg = grad.mutable_data();
                T loss;
                {
                    py::gil_scoped_release release;
                    loss = categorical_cce<T>(pg, pp, pt, pw, (size_t)rows, (size_t)K, from_logits, T(denom));
                }
                return py::make_tuple(double(loss), grad);
            });
        },
        py::arg("pred"), py::arg("target"), py::arg("weights"), py::arg("from_logits"), py::arg("denom"));
}

}  // namespace attnx::bind
