// Argument checks shared by every binding. Python layers convert user input (dtype, contiguity)
// before calling in; these checks are the last line: a wrong dtype, layout, rank or shape raises
// a Python exception here instead of reaching a kernel.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdlib>
#include <mutex>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
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

// Freed result buffers of 64 KiB and more, kept by size for the next array of that size: training
// and inference loops allocate the same shapes call after call, and every fresh page costs a page
// fault (2500 faults, 10 MB, per transformer encoder-layer inference call without the cache).
// At most kMaxCachedBytes are kept; the cache is never destroyed (arrays may outlive static
// destruction).
class BufferCache {
  public:
    static constexpr size_t kMinBytes = size_t(1) << 16, kMaxCachedBytes = size_t(128) << 20;
    static constexpr size_t kHeader = 64;  // the block's size, keeping the data 64-byte aligned

    static BufferCache& instance() {
        static BufferCache* cache = new BufferCache;
        return *cache;
    }

    // A block for `bytes` of data; returns the data pointer.
    void* take(size_t bytes) {
        {
            std::lock_guard<std::mutex> guard(lock_);
            auto it = free_.find(bytes);
            if (it != free_.end() && !it->second.empty()) {
                void* data = it->second.back();
                it->second.pop_back();
                cached_bytes_ -= bytes;
                return data;
            }
        }
        char* block = static_cast<char*>(std::aligned_alloc(kHeader, kHeader + (bytes + kHeader - 1) / kHeader * kHeader));
        if (!block) throw std::bad_alloc();
        *reinterpret_cast<size_t*>(block) = bytes;
        return block + kHeader;
    }

    // The capsule destructor of arrays made by new_array.
    static void give(void* data) {
        BufferCache& cache = instance();
        char* block = static_cast<char*>(data) - kHeader;
        const size_t bytes = *reinterpret_cast<size_t*>(block);
        {
            std::lock_guard<std::mutex> guard(cache.lock_);
            if (cache.cached_bytes_ + bytes <= kMaxCachedBytes) {
                cache.free_[bytes].push_back(data);
                cache.cached_bytes_ += bytes;
                return;
            }
        }
        std::free(block);
    }

  private:
    std::mutex lock_;
    std::unordered_map<size_t, std::vector<void*>> free_;
    size_t cached_bytes_ = 0;
};

// An uninitialized C-contiguous result array (large ones from the BufferCache).
template <class T> py::array_t<T> new_array(const std::vector<py::ssize_t>& shape) {
    size_t count = 1;
    for (auto s : shape) count *= (size_t)s;
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
    T* out = result.mutable_data();
    {
        py::gil_scoped_release release;
        kernel(out);
    }
    return result;
}

// Runs f(T{}) for the floating dtype of `a` (float32 or float64).
template <class F> auto dispatch_float(const py::array& a, const char* what, F&& f) {
    if (a.dtype().is(py::dtype::of<float>())) return f(float{});
    if (a.dtype().is(py::dtype::of<double>())) return f(double{});
    throw py::type_error(std::string(what) + ": expected float32 or float64, got " + dtype_str(a));
}

}  // namespace attnx::bind
