// The one random stream (random.hpp): sub-stream keys, dropout keep masks and uniforms.
#include <pybind11/stl.h>

#include <cstdint>
#include <string>

#include "attnx/random.hpp"
#include "bindings.hpp"
#include "checks.hpp"

namespace attnx::bind {

namespace {

// kernel(T{}, out, rows, cols) into a new array of `shape` (rows = shape[0], cols = the rest; a
// scalar shape is one row of one entry), GIL released, for dtype float32 or float64
template <class Kernel>
py::array drawn(const char* what, const std::vector<py::ssize_t>& shape, const py::dtype& dtype, Kernel&& kernel) {
    for (auto s : shape)
        if (s < 0) throw py::value_error(std::string(what) + ": negative size in shape");
    size_t cols = 1;
    for (size_t i = 1; i < shape.size(); ++i) cols *= (size_t)shape[i];
    const size_t rows = shape.empty() ? 1 : (size_t)shape[0];
    auto make = [&](auto tag) -> py::array {
        using T = decltype(tag);
        return released_result<T>(shape, [&](T* out) { kernel(tag, out, rows, cols); });
    };
    if (is_dtype<float>(dtype)) return make(float{});
    if (is_dtype<double>(dtype)) return make(double{});
    throw py::type_error(std::string(what) + ": expected dtype float32 or float64, got " +
                         py::str(dtype).cast<std::string>());
}

}  // namespace

void init_random(py::module_& m) {
    m.def("random_fold_in", &fold_in, py::arg("key"), py::arg("data"),
          "The key of the sub-stream `data` of `key` (uint64s): JAX's fold_in.");
    m.def(
        "random_keep",
        [](const std::vector<py::ssize_t>& shape, double rate, uint64_t key, uint64_t first_row,
           const py::dtype& dtype) {
            check_dropout_rate(rate, "random_keep");
            return drawn("random_keep", shape, dtype, [&](auto tag, auto* out, size_t rows, size_t cols) {
                random_keep<decltype(tag)>(out, rows, cols, key, first_row, rate);
            });
        },
        py::arg("shape"), py::arg("rate"), py::arg("key"), py::arg("first_row"), py::arg("dtype"),
        "Scaled dropout keep mask of `shape` whose rows are global rows first_row, first_row + 1, ...: each "
        "entry 1 / (1 - rate) with probability 1 - rate, else 0.");
    m.def(
        "random_uniform",
        [](const std::vector<py::ssize_t>& shape, uint64_t key, uint64_t first_row, const py::dtype& dtype) {
            return drawn("random_uniform", shape, dtype, [&](auto tag, auto* out, size_t rows, size_t cols) {
                random_uniform<decltype(tag)>(out, rows, cols, key, first_row);
            });
        },
        py::arg("shape"), py::arg("key"), py::arg("first_row"), py::arg("dtype"),
        "Uniforms in [0, 1) of `shape` whose rows are global rows first_row, first_row + 1, ...");
}

}  // namespace attnx::bind
