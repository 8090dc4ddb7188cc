// Argument checks shared by every binding. Python layers convert user input (dtype, contiguity)
// before calling in; these checks are the last line: a wrong dtype, layout, rank or shape raises
// a Python exception here instead of reaching a kernel.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnx/activations.hpp"

namespace attnx::bind {
namespace py = pybind11;

// An activation by name; an unknown name raises ValueError.
inline Activation parse_activation(const std::string& name) {
    try {
        return activation_from_name(name);
    } catch (const std::invalid_argument& e) {
        throw py::value_error(e.what());
    }
}

inline std::string shape_str(const py::array& a) {
    std::ostringstream s;
    s << "(";
    for (py::ssize_t i = 0; i < a.ndim(); ++i) s << (i ? ", " : "") << a.shape(i);
    s << (a.ndim() == 1 ? ",)" : ")");
    return s.str();
}

inline std::string dtype_str(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

// NumPy's ALIGNED flag (pybind11 names only c_style / f_style)
inline bool is_aligned(const py::array& a) { return a.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_; }

template <class T> const char* dtype_name() { return sizeof(T) == 4 ? "float32" : "float64"; }

template <class T> void check_dtype(const py::array& a, const char* what) {
    if (!a.dtype().is(py::dtype::of<T>()))
        throw py::type_error(std::string(what) + ": expected dtype " + py::str(py::dtype::of<T>()).cast<std::string>() +
                             ", got " + dtype_str(a));
    if (!(a.flags() & py::array::c_style))
        throw py::value_error(std::string(what) + ": expected a C-contiguous array");
    // e.g. np.frombuffer(..., offset=1): C-contiguous, but reading it as T* is undefined behaviour
    if (!is_aligned(a))
        throw py::value_error(std::string(what) + ": expected an aligned array (np.require(a, requirements='CA'))");
}

// Read-only view of a C-contiguous array of exactly dtype T.
template <class T> const T* in_ptr(const py::array& a, const char* what) {
    check_dtype<T>(a, what);
    return static_cast<const T*>(a.data());
}

// Writable view for in-place results (gradients, parameters, optimizer state): never a copy,
// since a converted copy would silently drop the update.
template <class T> T* inout_ptr(py::array& a, const char* what) {
    check_dtype<T>(a, what);
    if (!a.writeable()) throw py::value_error(std::string(what) + ": array is read-only");
    return static_cast<T*>(a.mutable_data());
}

template <class T> const T* optional_in_ptr(const py::object& a, const char* what) {
    if (a.is_none()) return nullptr;
    return in_ptr<T>(a.cast<py::array>(), what);
}

inline void check_rank(const py::array& a, py::ssize_t rank, const char* what) {
    if (a.ndim() != rank)
        throw py::value_error(std::string(what) + ": expected rank " + std::to_string(rank) + ", got shape " +
                              shape_str(a));
}

// Checks a.shape == expected, where -1 in expected accepts any size on that axis.
inline void check_shape(const py::array& a, const std::vector<py::ssize_t>& expected, const char* what) {
    bool ok = a.ndim() == (py::ssize_t)expected.size();
    for (size_t i = 0; ok && i < expected.size(); ++i) ok = expected[i] < 0 || a.shape(i) == expected[i];
    if (!ok) {
        std::ostringstream s;
        s << what << ": expected shape (";
        for (size_t i = 0; i < expected.size(); ++i) {
            s << (i ? ", " : "");
            if (expected[i] < 0) s << "*"; else s << expected[i];
        }
        s << (expected.size() == 1 ? ",)" : ")") << ", got " << shape_str(a);
        throw py::value_error(s.str());
    }
}

template <class T> py::array_t<T> new_array(const std::vector<py::ssize_t>& shape) { return py::array_t<T>(shape); }

// Runs f(T{}) for the floating dtype of `a` (float32 or float64).
template <class F> auto dispatch_float(const py::array& a, const char* what, F&& f) {
    if (a.dtype().is(py::dtype::of<float>())) return f(float{});
    if (a.dtype().is(py::dtype::of<double>())) return f(double{});
    throw py::type_error(std::string(what) + ": expected float32 or float64, got " + dtype_str(a));
}

}  // namespace attnx::bind
