// Dense, activations, embedding, the orthogonal initializer's factor.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "attnx/activations.hpp"
#include "attnx/dense.hpp"
#include "attnx/embedding.hpp"
#include "attnx/orthogonal.hpp"
#include "bindings.hpp"
#include "checks.hpp"

namespace attnx::bind {

void init_core(py::module_& m) {
    m.def(
        "orthogonal_factor",
        [](const py::array& a) {
            check_rank(a, 2, "orthogonal_factor: a");
            const double* pa = in_ptr<double>(a, "orthogonal_factor: a");
            const auto rows = a.shape(0), cols = a.shape(1);
            if (rows < cols)
                throw py::value_error("orthogonal_factor: a needs at least as many rows as columns, got " + shape_str(a));
            if (rows > std::numeric_limits<int>::max() / std::max<py::ssize_t>(cols, 1))
                throw py::value_error("orthogonal_factor: a is too large for LAPACK's 32-bit sizes, got " + shape_str(a));
            auto q = new_array<double>({rows, cols});
            double* pq = q.mutable_data();
            {
                py::gil_scoped_release release;
                orthogonal_factor(pq, pa, (int)rows, (int)cols);
            }
            return q;
        },
        py::arg("a"),
        "Q of a = QR for a float64 (m, n), m >= n, each column times the sign of R's diagonal entry (+1 for 0): "
        "orthonormal columns, uniform over them when a is Gaussian (the orthogonal initializer). LAPACK on one "
        "thread.");

    m.def(
        "dense_forward",
        [](const py::array& x, const py::array& kernel, const py::object& bias, const std::string& activation) {
            const Activation act = parse_activation(activation);
            return dispatch_float(x, "dense_forward: x", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                check_rank(x, 2, "dense_forward: x");
                check_rank(kernel, 2, "dense_forward: kernel");
                const auto N = x.shape(0), C = x.shape(1), OC = kernel.shape(1);
                check_shape(kernel, {C, -1}, "dense_forward: kernel");
                const T* px = in_ptr<T>(x, "dense_forward: x");
                const T* pw = in_ptr<T>(kernel, "dense_forward: kernel");
                const T* pb = optional_in_ptr<T>(bias, {OC}, "dense_forward: bias");
                auto z = new_array<T>({N, OC});
                // gelu's backward needs the pre-activation; every other activation works from y
                py::array_t<T> y = act == Activation::gelu ? new_array<T>({N, OC}) : z;
                T* pz = z.mutable_data();
                T* py_ = y.mutable_data();
                {
                    py::gil_scoped_release release;
                    dense_forward_rows<T>(py_, pz, px, pw, pb, (int)N, (int)C, (int)OC, act);
                }
                return py::make_tuple(y, z);
            });
        },
        py::arg("x"), py::arg("kernel"), py::arg("bias"), py::arg("activation") = "linear",
        "y = act(x . kernel + bias) for x (N, C); returns (y, z) with z the pre-activation (the same array "
        "unless the activation is gelu).");

    m.def(
        "dense_backward",
        [](const py::array& dy, const py::array& x, const py::array& kernel, const py::array& y, const py::array& z,
           const std::string& activation, py::array& dkernel, const py::object& dbias, bool need_dx) -> py::object {
            const Activation act = parse_activation(activation);
            return dispatch_float(dy, "dense_backward: dy", [&](auto tag) -> py::object {
                using T = decltype(tag);
                check_rank(x, 2, "dense_backward: x");
                check_rank(kernel, 2, "dense_backward: kernel");
                const auto N = x.shape(0), C = x.shape(1), OC = kernel.shape(1);
                check_shape(kernel, {C, OC}, "dense_backward: kernel");
                check_shape(dy, {N, OC}, "dense_backward: dy");
                check_shape(y, {N, OC}, "dense_backward: y");
                check_shape(z, {N, OC}, "dense_backward: z");
                check_shape(dkernel, {C, OC}, "dense_backward: dkernel");
                T* pdb = optional_inout_ptr<T>(dbias, {OC}, "dense_backward: dbias");
                const T* pdy = in_ptr<T>(dy, "dense_backward: dy");
                const T* px = in_ptr<T>(x, "dense_backward: x");
                const T* pw = in_ptr<T>(kernel, "dense_backward: kernel");
                const T* py_ = in_ptr<T>(y, "dense_backward: y");
                const T* pz = in_ptr<T>(z, "dense_backward: z");
                T* pdw = inout_ptr<T>(dkernel, "dense_backward: dkernel");
                auto dz = new_array<T>({N, OC});
                py::array_t<T> dx = need_dx ? new_array<T>({N, C}) : py::array_t<T>();
                T* pdz = dz.mutable_data();
                T* pdx = need_dx ? dx.mutable_data() : nullptr;
                {
                    py::gil_scoped_release release;
                    activation_backward<T>(pdz, pdy, pz, py_, N, OC, act);
                    dense_backward<T>(pdx, pdw, pdb, pdz, px, pw, (int)N, (int)C, (int)OC);
                }
                if (!need_dx) return py::none();
                return std::move(dx);
            });
        },
        py::arg("dy"), py::arg("x"), py::arg("kernel"), py::arg("y"), py::arg("z"), py::arg("activation"),
        py::arg("dkernel"), py::arg("dbias"), py::arg("need_dx") = true,
        "Backward of dense_forward: accumulates into dkernel/dbias, returns dx (or None).");

    m.def(
        "activation_forward",
        [](const py::array& x, const std::string& activation) {
            const Activation act = parse_activation(activation);
            return dispatch_float(x, "activation_forward: x", [&](auto tag) -> py::array {
                using T = decltype(tag);
                const T* px = in_ptr<T>(x, "activation_forward: x");
                const size_t cols = x.ndim() ? (size_t)x.shape(x.ndim() - 1) : 1;
                const size_t rows = cols ? (size_t)x.size() / cols : 0;
                std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
                return released_result<T>(shape, [&](T* py_) {
                    activation_forward<T>(py_, px, rows, cols, act);
                });
            });
        },
        py::arg("x"), py::arg("activation"), "Elementwise activation (softmax over the last axis).");

    m.def(
        "activation_backward",
        [](const py::array& dy, const py::array& x, const py::array& y, const std::string& activation) {
            const Activation act = parse_activation(activation);
            return dispatch_float(dy, "activation_backward: dy", [&](auto tag) -> py::array {
                using T = decltype(tag);
                std::vector<py::ssize_t> shape(dy.shape(), dy.shape() + dy.ndim());
                check_shape(x, shape, "activation_backward: x");
                check_shape(y, shape, "activation_backward: y");
                const T* pdy = in_ptr<T>(dy, "activation_backward: dy");
                const T* px = in_ptr<T>(x, "activation_backward: x");
                const T* py_ = in_ptr<T>(y, "activation_backward: y");
                const size_t cols = dy.ndim() ? (size_t)dy.shape(dy.ndim() - 1) : 1;
                const size_t rows = cols ? (size_t)dy.size() / cols : 0;
                return released_result<T>(shape, [&](T* pdx) {
                    activation_backward<T>(pdx, pdy, px, py_, rows, cols, act);
                });
            });
        },
        py::arg("dy"), py::arg("x"), py::arg("y"), py::arg("activation"));

    m.def(
        "embedding_forward",
        [](const py::array& ids, const py::array& table) {
            return dispatch_float(table, "embedding_forward: table", [&](auto tag) -> py::array {
                using T = decltype(tag);
                check_rank(table, 2, "embedding_forward: table");
                const auto D = table.shape(1);
                const int64_t* pid = ids_ptr(ids, table.shape(0), "embedding_forward", "ids");
                const size_t N = (size_t)ids.size();
                std::vector<py::ssize_t> shape(ids.shape(), ids.shape() + ids.ndim());
                shape.push_back(D);
                auto out = new_array<T>(shape);
                const T* pt = in_ptr<T>(table, "embedding_forward: table");
                T* po = out.mutable_data();
                {
                    py::gil_scoped_release release;
                    embedding_forward<T>(po, pid, pt, N, (size_t)D);
                }
                return std::move(out);
            });
        },
        py::arg("ids"), py::arg("table"), "out[..., :] = table[ids[...], :]; raises IndexError for ids outside the table.");

    m.def(
        "embedding_backward",
        [](py::array& dtable, const py::array& dout, const py::array& ids) {
            dispatch_float(dtable, "embedding_backward: dtable", [&](auto tag) {
                using T = decltype(tag);
                check_rank(dtable, 2, "embedding_backward: dtable");
                const auto D = dtable.shape(1);
                const int64_t* pid = ids_ptr(ids, dtable.shape(0), "embedding_backward", "ids");
                std::vector<py::ssize_t> shape(ids.shape(), ids.shape() + ids.ndim());
                shape.push_back(D);
                check_shape(dout, shape, "embedding_backward: dout");
                const size_t N = (size_t)ids.size();
                T* pdt = inout_ptr<T>(dtable, "embedding_backward: dtable");
                const T* pdo = in_ptr<T>(dout, "embedding_backward: dout");
                py::gil_scoped_release release;
                embedding_backward<T>(pdt, pdo, pid, N, (size_t)D);
            });
        },
        py::arg("dtable"), py::arg("dout"), py::arg("ids"), "dtable[ids[n]] += dout[n] (accumulates).");
}

}  // namespace attnx::bind
