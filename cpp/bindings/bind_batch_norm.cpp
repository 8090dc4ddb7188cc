// BatchNormalization's kernels (batch_norm.hpp): x of any rank >= 2, normalized per channel of `axis`.
#include <string>

#include "attnx/batch_norm.hpp"
#include "bindings.hpp"
#include "checks.hpp"

namespace attnx::bind {

// x as (outer, C, inner) around its feature axis, and the mask (B, T) of x (B, T, ...) or None
struct BatchNormView {
    BatchNormConfig cfg;
    MaskRows mask;
};

static BatchNormView batch_norm_view(const py::array& x, int axis, const py::object& mask, const char* fn) {
    const std::string f(fn);
    const int ndim = (int)x.ndim();
    if (ndim < 2) throw py::value_error(f + ": x: expected rank 2 or more (batch, ..., features), got shape " + shape_str(x));
    check_index_range(x, (f + ": x").c_str());
    if (axis < -ndim || axis >= ndim || (axis + ndim) % ndim == 0)
        throw py::value_error(f + ": axis " + std::to_string(axis) + " is not a feature axis of x of shape " +
                              shape_str(x) + " (expected 1 <= axis < rank, or its negative)");
    axis = (axis + ndim) % ndim;
    BatchNormView view;
    view.cfg.outer = view.cfg.inner = 1;
    for (int a = 0; a < ndim; ++a) {
        if (a < axis) view.cfg.outer *= (size_t)x.shape(a);
        if (a > axis) view.cfg.inner *= (size_t)x.shape(a);
    }
    view.cfg.C = (size_t)x.shape(axis);
    if (!mask.is_none()) {
        if (ndim < 3)
            throw py::value_error(f + ": mask: needs x of rank 3 or more (batch, steps, ..., features), got shape " +
                                  shape_str(x));
        view.mask = parse_position_mask(mask, x.shape(0), x.shape(1), fn, "mask");
        view.cfg.mask_span = (size_t)x.size() / ((size_t)x.shape(0) * (size_t)x.shape(1));
    }
    return view;
}

void init_batch_norm(py::module_& m) {
    m.def(
        "batch_norm_forward",
        [](const py::array& x, int axis, const py::object& gamma, const py::object& beta, py::array& moving_mean,
           py::array& moving_variance, const py::object& mask, bool training, double momentum, double epsilon) {
            return dispatch_float(x, "batch_norm_forward: x", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                BatchNormView view = batch_norm_view(x, axis, mask, "batch_norm_forward");
                BatchNormConfig& cfg = view.cfg;
                const auto C = (py::ssize_t)cfg.C;
                if (!(momentum >= 0 && momentum <= 1))
                    throw py::value_error("batch_norm_forward: momentum must be in [0, 1], got " +
                                          std::to_string(momentum));
                if (!(epsilon > 0)) throw py::value_error("batch_norm_forward: epsilon must be positive");
                cfg.batch_statistics = training, cfg.momentum = momentum, cfg.epsilon = epsilon;
                const T* px = in_ptr<T>(x, "batch_norm_forward: x");
                const T* pg = optional_in_ptr<T>(gamma, {C}, "batch_norm_forward: gamma");
                const T* pb = optional_in_ptr<T>(beta, {C}, "batch_norm_forward: beta");
                check_shape(moving_mean, {C}, "batch_norm_forward: moving_mean (one per channel of x's axis)");
                check_shape(moving_variance, {C}, "batch_norm_forward: moving_variance (one per channel of x's axis)");
                // the moving statistics are written only by a training call: inference reads read-only ones
                T* pmm = training ? inout_ptr<T>(moving_mean, "batch_norm_forward: moving_mean")
                                  : const_cast<T*>(in_ptr<T>(moving_mean, "batch_norm_forward: moving_mean"));
                T* pmv = training ? inout_ptr<T>(moving_variance, "batch_norm_forward: moving_variance")
                                  : const_cast<T*>(in_ptr<T>(moving_variance, "batch_norm_forward: moving_variance"));
                std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
                auto y = new_array<T>(shape);
                auto mean = new_array<T>({C}), rstd = new_array<T>({C});
                py::object count = py::none();
                T* pcount = nullptr;
                if (training) {
                    auto counts = new_array<T>({C});
                    pcount = counts.mutable_data();
                    count = std::move(counts);
                }
                T *py_ = y.mutable_data(), *pm = mean.mutable_data(), *ps = rstd.mutable_data();
                {
                    py::gil_scoped_release release;
                    batch_norm_forward<T>(cfg, py_, pm, ps, pcount, pmm, pmv, px, pg, pb, view.mask.data);
                }
                return py::make_tuple(y, mean, rstd, count);
            });
        },
        py::arg("x"), py::arg("axis"), py::arg("gamma"), py::arg("beta"), py::arg("moving_mean"),
        py::arg("moving_variance"), py::arg("mask"), py::arg("training"), py::arg("momentum"), py::arg("epsilon"),
        "Batch normalization of x over every axis but `axis`: returns (y, mean, rstd, count), count None unless "
        "training (the batch's statistics; the moving ones move in place), else the moving statistics are read.");

    m.def(
        "batch_norm_backward",
        [](const py::array& dy, const py::array& x, int axis, const py::array& mean, const py::array& rstd,
           const py::object& count, const py::object& gamma, const py::object& mask, const py::object& dgamma,
           const py::object& dbeta, bool need_dx) {
            return dispatch_float(dy, "batch_norm_backward: dy", [&](auto tag) -> py::object {
                using T = decltype(tag);
                BatchNormView view = batch_norm_view(x, axis, mask, "batch_norm_backward");
                BatchNormConfig& cfg = view.cfg;
                const auto C = (py::ssize_t)cfg.C;
                cfg.batch_statistics = !count.is_none();
                check_shape(dy, std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()),
                            "batch_norm_backward: dy (x's shape)");
                check_shape(mean, {C}, "batch_norm_backward: mean");
                check_shape(rstd, {C}, "batch_norm_backward: rstd");
                const T* pdy = in_ptr<T>(dy, "batch_norm_backward: dy");
                const T* px = in_ptr<T>(x, "batch_norm_backward: x");
                const T* pm = in_ptr<T>(mean, "batch_norm_backward: mean");
                const T* ps = in_ptr<T>(rstd, "batch_norm_backward: rstd");
                const T* pcount = optional_in_ptr<T>(count, {C}, "batch_norm_backward: count");
                const T* pg = optional_in_ptr<T>(gamma, {C}, "batch_norm_backward: gamma");
                T* pdg = optional_inout_ptr<T>(dgamma, {C}, "batch_norm_backward: dgamma");
                T* pdb = optional_inout_ptr<T>(dbeta, {C}, "batch_norm_backward: dbeta");
                const uint8_t* pmask = view.mask.data;
                if (!need_dx) {
                    py::gil_scoped_release release;
                    batch_norm_backward<T>(cfg, (T*)nullptr, pdg, pdb, pdy, px, pm, ps, pcount, pg, pmask);
                    return py::none();
                }
                return released_result<T>(std::vector<py::ssize_t>(x.shape(), x.shape() + x.ndim()), [&](T* pdx) {
                    batch_norm_backward<T>(cfg, pdx, pdg, pdb, pdy, px, pm, ps, pcount, pg, pmask);
                });
            });
        },
        py::arg("dy"), py::arg("x"), py::arg("axis"), py::arg("mean"), py::arg("rstd"), py::arg("count"),
        py::arg("gamma"), py::arg("mask"), py::arg("dgamma"), py::arg("dbeta"), py::arg("need_dx") = true,
        "Backward of batch_norm_forward (count None: the moving statistics were read, constants): returns dx (None "
        "when need_dx is False), accumulates into dgamma / dbeta.");
}

}  // namespace attnx::bind
