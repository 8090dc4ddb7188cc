// Layer normalization, positional encodings, dropout (keep masks come from bind_random.cpp) and residuals.
#include <pybind11/stl.h>

#include <cstdint>

#include "attnx/transformer.hpp"
#include "bindings.hpp"
#include "checks.hpp"

namespace attnx::bind {

static std::vector<py::ssize_t> shape_of(const py::array& a) { return {a.shape(), a.shape() + a.ndim()}; }

void init_transformer(py::module_& m) {
    m.def(
        "layernorm_forward",
        [](const py::array& x, const py::object& gamma, const py::object& beta, double eps) {
            return dispatch_float(x, "layernorm_forward: x", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                check_rank(x, 2, "layernorm_forward: x");
                const auto N = x.shape(0), C = x.shape(1);
                if (!(eps > 0)) throw py::value_error("layernorm_forward: eps must be positive");
                const T* px = in_ptr<T>(x, "layernorm_forward: x");
                const T* pg = optional_in_ptr<T>(gamma, {C}, "layernorm_forward: gamma");
                const T* pb = optional_in_ptr<T>(beta, {C}, "layernorm_forward: beta");
                auto y = new_array<T>({N, C});
                auto mean = new_array<T>({N});
                auto rstd = new_array<T>({N});
                T *py_ = y.mutable_data(), *pm = mean.mutable_data(), *ps = rstd.mutable_data();
                {
                    py::gil_scoped_release release;
                    layernorm_forward<T>(py_, pm, ps, px, pg, pb, N, C, T(eps));
                }
                return py::make_tuple(y, mean, rstd);
            });
        },
        py::arg("x"), py::arg("gamma"), py::arg("beta"), py::arg("eps"),
        "Layer normalization over the last axis of x (N, C); returns (y, mean, rstd).");

    m.def(
        "layernorm_backward",
        [](const py::array& dy, const py::array& x, const py::array& mean, const py::array& rstd,
           const py::object& gamma, const py::object& dgamma, const py::object& dbeta, bool need_dx) {
            return dispatch_float(dy, "layernorm_backward: dy", [&](auto tag) -> py::object {
                using T = decltype(tag);
                check_rank(x, 2, "layernorm_backward: x");
                const auto N = x.shape(0), C = x.shape(1);
                check_shape(dy, {N, C}, "layernorm_backward: dy");
                check_shape(mean, {N}, "layernorm_backward: mean");
                check_shape(rstd, {N}, "layernorm_backward: rstd");
                T* pdg = optional_inout_ptr<T>(dgamma, {C}, "layernorm_backward: dgamma");
                T* pdb = optional_inout_ptr<T>(dbeta, {C}, "layernorm_backward: dbeta");
                const T* pg = optional_in_ptr<T>(gamma, {C}, "layernorm_backward: gamma");
                const T* pdy = in_ptr<T>(dy, "layernorm_backward: dy");
                const T* px = in_ptr<T>(x, "layernorm_backward: x");
                const T* pm = in_ptr<T>(mean, "layernorm_backward: mean");
                const T* ps = in_ptr<T>(rstd, "layernorm_backward: rstd");
                if (!need_dx) {
                    py::gil_scoped_release release;
                    layernorm_backward<T>((T*)nullptr, pdg, pdb, pdy, px, pm, ps, pg, N, C);
                    return py::none();
                }
                return released_result<T>({N, C}, [&](T* pdx) {
                    layernorm_backward<T>(pdx, pdg, pdb, pdy, px, pm, ps, pg, N, C);
                });
            });
        },
        py::arg("dy"), py::arg("x"), py::arg("mean"), py::arg("rstd"), py::arg("gamma"), py::arg("dgamma"),
        py::arg("dbeta"), py::arg("need_dx") = true,
        "Backward of layernorm_forward: returns dx (None when need_dx is False), accumulates into dgamma / dbeta.");

    m.def(
        "sinusoidal_table",
        [](py::ssize_t num_positions, py::ssize_t dim, const py::dtype& dtype, double max_wavelength) {
            if (num_positions < 0 || dim <= 0)
                throw py::value_error("sinusoidal_table: expected num_positions >= 0 and dim > 0, got " +
                                      std::to_string(num_positions) + ", " + std::to_string(dim));
            if (!(max_wavelength > 0)) throw py::value_error("sinusoidal_table: max_wavelength must be positive");
            auto make = [&](auto tag) -> py::array {
                using T = decltype(tag);
                auto table = new_array<T>({num_positions, dim});
                sinusoidal_table<T>(table.mutable_data(), num_positions, dim, max_wavelength);
                return std::move(table);
            };
            if (dtype.is(py::dtype::of<float>())) return make(float{});
            if (dtype.is(py::dtype::of<double>())) return make(double{});
            throw py::type_error("sinusoidal_table: expected float32 or float64, got " +
                                 py::str(dtype).cast<std::string>());
        },
        py::arg("num_positions"), py::arg("dim"), py::arg("dtype"), py::arg("max_wavelength") = 10000.0,
        "Vaswani et al.'s sin/cos position table (num_positions, dim).");

    m.def(
        "add_positions_forward",
        [](const py::array& x, const py::array& table) {
            return dispatch_float(x, "add_positions_forward: x", [&](auto tag) -> py::array {
                using T = decltype(tag);
                check_rank(x, 3, "add_positions_forward: x");
                const auto B = x.shape(0), Tn = x.shape(1), D = x.shape(2);
                check_shape(table, {-1, D}, "add_positions_forward: table");
                if (table.shape(0) < Tn)
                    throw py::value_error("add_positions_forward: sequence length " + std::to_string(Tn) +
                                          " exceeds the table's " + std::to_string(table.shape(0)) + " positions");
                const T* px = in_ptr<T>(x, "add_positions_forward: x");
                const T* pt = in_ptr<T>(table, "add_positions_forward: table");
                return released_result<T>({B, Tn, D}, [&](T* py_) {
                    add_positions_forward<T>(py_, px, pt, B, Tn, D);
                });
            });
        },
        py::arg("x"), py::arg("table"), "y[b, t] = x[b, t] + table[t] for x (B, T, D) and table (>= T, D).");

    m.def(
        "add_positions_backward",
        [](py::array& dtable, const py::array& dy) {
            dispatch_float(dy, "add_positions_backward: dy", [&](auto tag) {
                using T = decltype(tag);
                check_rank(dy, 3, "add_positions_backward: dy");
                const auto B = dy.shape(0), Tn = dy.shape(1), D = dy.shape(2);
                check_shape(dtable, {-1, D}, "add_positions_backward: dtable");
                if (dtable.shape(0) < Tn)
                    throw py::value_error("add_positions_backward: sequence length " + std::to_string(Tn) +
                                          " exceeds the table's " + std::to_string(dtable.shape(0)) + " positions");
                T* pdt = inout_ptr<T>(dtable, "add_positions_backward: dtable");
                const T* pdy = in_ptr<T>(dy, "add_positions_backward: dy");
                py::gil_scoped_release release;
                add_positions_backward<T>(pdt, pdy, B, Tn, D);
            });
        },
        py::arg("dtable"), py::arg("dy"), "dtable[t] += sum_b dy[b, t] (accumulates).");

    m.def(
        "apply_keep",
        [](const py::array& x, const py::array& keep) {
            return dispatch_float(x, "apply_keep: x", [&](auto tag) -> py::array {
                using T = decltype(tag);
                check_shape(keep, shape_of(x), "apply_keep: keep");
                const T* px = in_ptr<T>(x, "apply_keep: x");
                const T* pk = in_ptr<T>(keep, "apply_keep: keep");
                return released_result<T>(shape_of(x), [&](T* py_) {
                    apply_keep<T>(py_, px, pk, (size_t)x.size());
                });
            });
        },
        py::arg("x"), py::arg("keep"), "y = x * keep (dropout forward, and backward on dy).");

    m.def(
        "feed_forward_forward",
        [](const py::array& x, const py::array& kernel1, const py::object& bias1, const py::array& kernel2,
           const py::object& bias2, const std::string& activation) {
            const Activation act = parse_activation(activation);
            return dispatch_float(x, "feed_forward_forward: x", [&](auto tag) -> py::array {
                using T = decltype(tag);
                check_rank(x, 2, "feed_forward_forward: x");
                check_rank(kernel1, 2, "feed_forward_forward: kernel1");
                check_rank(kernel2, 2, "feed_forward_forward: kernel2");
                const auto N = x.shape(0), C = x.shape(1), F = kernel1.shape(1), OC = kernel2.shape(1);
                check_shape(kernel1, {C, F}, "feed_forward_forward: kernel1");
                check_shape(kernel2, {F, OC}, "feed_forward_forward: kernel2");
                const T* px = in_ptr<T>(x, "feed_forward_forward: x");
                const T* pw1 = in_ptr<T>(kernel1, "feed_forward_forward: kernel1");
                const T* pw2 = in_ptr<T>(kernel2, "feed_forward_forward: kernel2");
                const T* pb1 = optional_in_ptr<T>(bias1, {F}, "feed_forward_forward: bias1");
                const T* pb2 = optional_in_ptr<T>(bias2, {OC}, "feed_forward_forward: bias2");
                return released_result<T>({N, OC}, [&](T* py_) {
                    feed_forward_forward<T>(py_, px, pw1, pb1, pw2, pb2, (int)N, (int)C, (int)F, (int)OC, act);
                });
            });
        },
        py::arg("x"), py::arg("kernel1"), py::arg("bias1"), py::arg("kernel2"), py::arg("bias2"),
        py::arg("activation") = "relu",
        "y = act(x . kernel1 + bias1) . kernel2 + bias2 for x (N, C), without keeping the hidden activations "
        "(inference).");

    m.def(
        "residual_add",
        [](const py::array& x, const py::array& sub, const py::object& keep) {
            return dispatch_float(x, "residual_add: x", [&](auto tag) -> py::array {
                using T = decltype(tag);
                check_shape(sub, shape_of(x), "residual_add: sub");
                const T* px = in_ptr<T>(x, "residual_add: x");
                const T* ps = in_ptr<T>(sub, "residual_add: sub");
                const T* pk = optional_in_ptr<T>(keep, shape_of(x), "residual_add: keep");
                return released_result<T>(shape_of(x), [&](T* py_) {
                    residual_add<T>(py_, px, ps, pk, (size_t)x.size());
                });
            });
        },
        py::arg("x"), py::arg("sub"), py::arg("keep"), "y = x + keep * sub (keep None: y = x + sub).");
}

}  // namespace attnx::bind
