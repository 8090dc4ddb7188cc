// Argument checks shared by every binding. Python layers convert user input (dtype, contiguity)
// before calling in; these checks are the last line: a wrong dtype, layout, rank or shape raises
// a Python exception here instead of reaching a kernel.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "attnx/activations.hpp"
#include "attnx/random.hpp"
#include "buffer_cache.hpp"

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

// A dropout rate, in [0, 1)
inline void check_dropout_rate(double rate, const std::string& where) {
    if (!(rate >= 0.0 && rate < 1.0)) throw py::value_error(where + ": rate must be in [0, 1), got " + std::to_string(rate));
}

// dropout_stream: None, or (rate, key, first_row), the keep mask random_keep would draw for the
// array's shape, drawn by the kernel as it goes (random.hpp's KeepStream); refused beside a given mask
inline KeepStream keep_stream(const py::object& stream, const py::object& keep, const std::string& where) {
    if (stream.is_none()) return {};
    if (!keep.is_none()) throw py::value_error(where + ": give a keep mask or dropout_stream, not both");
    std::tuple<double, uint64_t, uint64_t> t;
    try {
        if (!py::isinstance<py::tuple>(stream) || py::len(stream) != 3) throw py::cast_error();
        t = stream.cast<std::tuple<double, uint64_t, uint64_t>>();
    } catch (const py::cast_error&) {
        throw py::type_error(where + ": dropout_stream must be a tuple (rate, key, first_row) of a float and two "
                             "integers in [0, 2**64), got " + std::string(py::repr(stream)));
    }
    KeepStream drawn{std::get<1>(t), std::get<2>(t), std::get<0>(t)};
    check_dropout_rate(drawn.rate, where + ": dropout_stream");
    return drawn;
}

// bf16=True (mixed_bfloat16) rounds float32 operands to bf16: a kernel called on another dtype refuses it
inline void check_bf16_operands(bool bf16, const py::array& a, const char* where) {
    if (bf16 && !py::isinstance<py::array_t<float>>(a))
        throw py::type_error(std::string(where) + ": bf16 needs float32 operands, got " + dtype_str(a));
}

// NumPy's ALIGNED flag (pybind11 names only c_style / f_style)
inline bool is_aligned(const py::array& a) { return a.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_; }

// `a` holds T's: NumPy's own dtype object, or an equal one (an unpickled array's dtype is a new
// object, '<f4' where the singleton is '=f4'); a byte-swapped dtype is not equal.
template <class T> bool is_dtype(const py::dtype& dtype) {
    const py::dtype want = py::dtype::of<T>();
    return dtype.is(want) || dtype.equal(want);
}
template <class T> bool has_dtype(const py::array& a) { return is_dtype<T>(a.dtype()); }

template <class T> const char* dtype_name() { return sizeof(T) == 4 ? "float32" : "float64"; }

// The kernels index with int (BLAS' own index type, and their loops over rows, steps and
// features): every axis and every array's element count must fit in one, or the casts wrap
// around (a segfault, or rows silently left out).
constexpr py::ssize_t kMaxIndex = std::numeric_limits<int>::max();

inline void check_index_range(const py::array& a, const char* what) {
    bool ok = a.size() <= kMaxIndex;
    for (py::ssize_t i = 0; ok && i < a.ndim(); ++i) ok = a.shape(i) <= kMaxIndex;
    if (!ok)
        throw py::value_error(std::string(what) + ": shape " + shape_str(a) +
                              " exceeds the kernels' limit of 2**31 - 1 per axis and per array");
}

template <class T> void check_dtype(const py::array& a, const char* what) {
    if (!has_dtype<T>(a))
        throw py::type_error(std::string(what) + ": expected dtype " + py::str(py::dtype::of<T>()).cast<std::string>() +
                             ", got " + dtype_str(a));
    if (!(a.flags() & py::array::c_style))
        throw py::value_error(std::string(what) + ": expected a C-contiguous array");
    // e.g. np.frombuffer(..., offset=1): C-contiguous, but reading it as T* is undefined behaviour
    if (!is_aligned(a))
        throw py::value_error(std::string(what) + ": expected an aligned array (np.require(a, requirements='CA'))");
    check_index_range(a, what);
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

// An array argument declared py::object (so that None can pass) must already be a NumPy array:
// an array converted here from a list would be freed before the kernel reads it.
inline py::array array_arg(const py::object& a, const char* what) {
    if (!py::isinstance<py::array>(a))
        throw py::type_error(std::string(what) + ": expected a NumPy array, got " +
                             py::str(py::type::of(a).attr("__name__")).cast<std::string>());
    return py::reinterpret_borrow<py::array>(a);
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

// An array argument (declared py::object) of the given shape: array_arg, then check_shape
inline py::array shaped_array_arg(const py::object& a, const std::vector<py::ssize_t>& shape, const char* what) {
    py::array arr = array_arg(a, what);
    check_shape(arr, shape, what);
    return arr;  // borrows the caller's argument: its data outlives this handle
}

// An optional input (None: null) of the given shape and dtype T
template <class T>
const T* optional_in_ptr(const py::object& a, const std::vector<py::ssize_t>& shape, const char* what) {
    if (a.is_none()) return nullptr;
    return in_ptr<T>(shaped_array_arg(a, shape, what), what);
}

// An optional in-place result (None: null), e.g. a gradient to accumulate into, of the given shape
// and dtype T
template <class T> T* optional_inout_ptr(const py::object& a, const std::vector<py::ssize_t>& shape, const char* what) {
    if (a.is_none()) return nullptr;
    py::array arr = shaped_array_arg(a, shape, what);
    return inout_ptr<T>(arr, what);
}

// Token ids: a C-contiguous, aligned int64 array (TypeError otherwise) whose values index a table
// of `vocab` rows (IndexError otherwise).
inline const int64_t* ids_ptr(const py::array& ids, py::ssize_t vocab, const char* fn, const char* arg) {
    const std::string what = std::string(fn) + ": " + arg;
    if (!has_dtype<int64_t>(ids) || !(ids.flags() & py::array::c_style) || !is_aligned(ids))
        throw py::type_error(what + ": expected a C-contiguous, aligned int64 array (np.require(ids, np.int64, "
                             "'CA')), got dtype " + dtype_str(ids) + (is_aligned(ids) ? "" : ", misaligned"));
    check_index_range(ids, what.c_str());
    const int64_t* p = static_cast<const int64_t*>(ids.data());
    if (ids.size() == 0) return p;
    const auto [lo, hi] = std::minmax_element(p, p + ids.size());
    if (*lo < 0 || *hi >= vocab)
        throw py::index_error(what + ": token id " + std::to_string(*lo < 0 ? *lo : *hi) + " out of range [0, " +
                              std::to_string(vocab) + ")");
    return p;
}

// ----------------------------------------------------------------------------- masks
// The one mask rule of every binding that takes a mask (ARCHITECTURE.md, "The mask rule"):
//  - None (everything allowed) or an array of dtype bool or of any integer dtype whose values are
//    all 0 or 1 (TypeError for any other dtype, ValueError for any other value);
//    True / 1 = a real token / a position that may be attended to.
//  - shape (B, L), one flag per position, or, where the binding takes it, (B, Tq, L), one row per
//    query; a leading axis of 1 instead of B is one mask shared by the whole batch.
//  - any layout: a non-contiguous or integer mask is read through a C-contiguous uint8 copy.
//  - a fully masked row is allowed everywhere: the kernels give it zero weights, a zero context
//    and no state update, never NaN.
struct MaskRows {
    const uint8_t* data = nullptr;      // null: no mask
    size_t stride_b = 0, stride_t = 0;  // elements between batch rows (0: shared) and between query rows
    py::object owner;                   // the array `data` points into (maybe a converted copy)
};

// `mask` under the rule above. query_len < 0: the binding takes only the per-position form (B, L).
inline MaskRows parse_mask(const py::object& mask, py::ssize_t batch, py::ssize_t query_len, py::ssize_t len,
                           const char* fn, const char* arg) {
    MaskRows out;
    if (mask.is_none()) return out;
    const std::string what = std::string(fn) + ": " + arg;
    py::array m = py::array::ensure(mask);
    if (!m) {
        PyErr_Clear();
        throw py::type_error(what + ": expected a bool or 0/1 integer mask array, got " +
                             py::str(py::type::of(mask)).cast<std::string>());
    }
    const char kind = m.dtype().kind();
    if (kind != 'b' && kind != 'i' && kind != 'u')
        throw py::type_error(what + ": expected a bool or 0/1 integer mask, got dtype " + dtype_str(m));
    const bool shared = m.ndim() >= 2 && m.shape(0) == 1 && batch != 1;
    const py::ssize_t rows = shared ? 1 : batch;
    const bool per_query = m.ndim() == 3 && query_len >= 0;
    if (per_query ? (m.shape(0) != rows || m.shape(1) != query_len || m.shape(2) != len)
                  : (m.ndim() != 2 || m.shape(0) != rows || m.shape(1) != len)) {
        std::string expected = "(" + std::to_string(batch) + ", " + std::to_string(len) + ")";
        if (query_len >= 0)
            expected += " or (" + std::to_string(batch) + ", " + std::to_string(query_len) + ", " +
                        std::to_string(len) + ")";
        throw py::value_error(what + ": expected shape " + expected + " (a leading 1 shares one mask across the " +
                              "batch), got " + shape_str(m));
    }
    if (kind != 'b') {
        const py::object outside = (m.attr("__lt__")(0)).attr("__or__")(m.attr("__gt__")(1));
        if (outside.attr("any")().cast<bool>())
            throw py::value_error(what + ": an integer mask holds only 0 and 1, got " +
                                  py::str(m[outside].attr("flat")[py::int_(0)]).cast<std::string>());
    }
    if (kind != 'b' || !(m.flags() & py::array::c_style))
        m = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>::ensure(m);
    out.owner = m;  // a list or a converted copy lives only as long as this reference
    out.data = static_cast<const uint8_t*>(m.data());
    out.stride_t = per_query ? (size_t)len : 0;
    out.stride_b = shared ? 0 : (size_t)(per_query ? query_len * len : len);
    return out;
}

// A per-position mask (B, L) for kernels that read one dense row per batch row: a shared mask is
// copied out to every row.
inline MaskRows parse_position_mask(const py::object& mask, py::ssize_t batch, py::ssize_t len, const char* fn,
                                    const char* arg) {
    MaskRows out = parse_mask(mask, batch, -1, len, fn, arg);
    if (out.data && out.stride_b == 0 && batch > 1) {
        py::array_t<uint8_t> rows({batch, len});
        for (py::ssize_t b = 0; b < batch; ++b) std::copy(out.data, out.data + len, rows.mutable_data() + b * len);
        out.data = rows.data();
        out.stride_b = (size_t)len;
        out.owner = std::move(rows);
    }
    return out;
}

// An uninitialized C-contiguous result array (large ones from the BufferCache).
template <class T> py::array_t<T> new_array(const std::vector<py::ssize_t>& shape) {
    size_t count = 1;
    bool fits = true;
    for (auto s : shape) fits = fits && s <= kMaxIndex && !__builtin_mul_overflow(count, (size_t)s, &count);
    if (!fits || count > (size_t)kMaxIndex) {
        std::string dims;
        for (auto s : shape) dims += (dims.empty() ? "" : ", ") + std::to_string(s);
        throw py::value_error("a result of shape (" + dims + ") exceeds the kernels' limit of 2**31 - 1 elements");
    }
    const size_t bytes = count * sizeof(T);
    if (bytes < BufferCache::kMinBytes) return py::array_t<T>(shape);
    void* data = BufferCache::instance().take(bytes);
    return py::array_t<T>(shape, static_cast<T*>(data), py::capsule(data, &BufferCache::give));
}

// The tail a single-result binding shares: a new_array of `shape` that kernel(out) fills with the
// GIL released.
template <class T, class Kernel>
py::array_t<T> released_result(const std::vector<py::ssize_t>& shape, Kernel&& kernel) {
    auto result = new_array<T>(shape);
    if (result.size() == 0) return result;  // nothing to compute
    T* out = result.mutable_data();
    {
        py::gil_scoped_release release;
        kernel(out);
    }
    return result;
}

// Runs f(T{}) for the floating dtype of `a` (float32 or float64).
template <class F> auto dispatch_float(const py::array& a, const char* what, F&& f) {
    if (has_dtype<float>(a)) return f(float{});
    if (has_dtype<double>(a)) return f(double{});
    throw py::type_error(std::string(what) + ": expected float32 or float64, got " + dtype_str(a));
}

}  // namespace attnx::bind
