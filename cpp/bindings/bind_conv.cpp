// Conv2D, max and average pooling over channels-last images.
#include <pybind11/stl.h>

#include <array>
#include <string>
#include <type_traits>

#include "attnx/conv.hpp"
#include "bindings.hpp"
#include "checks.hpp"

namespace attnx::bind {

using Pair = std::array<int, 2>;

// The windows of x (B, H, W, C) for windows of `size`, `strides` and `padding` ('same' or 'valid');
// x must already hold a float dtype the kernels take (its sizes then fit in int).
static Window2D windows(const py::array& x, Pair size, Pair strides, const std::string& padding, const char* fn) {
    const std::string f(fn);
    if (padding != "same" && padding != "valid")
        throw py::value_error(f + ": padding must be 'same' or 'valid', got '" + padding + "'");
    check_rank(x, 4, (f + ": x").c_str());
    check_index_range(x, (f + ": x").c_str());
    try {
        return window_2d((int)x.shape(0), (int)x.shape(1), (int)x.shape(2), (int)x.shape(3), size[0], size[1],
                         strides[0], strides[1], padding == "same");
    } catch (const std::invalid_argument& e) {
        throw py::value_error(f + ": " + e.what());
    }
}

// The windows of a convolution of x (B, H, W, C) with kernel (KH, KW, C, F), already checked as
// arrays of the kernels' dtype; its patches (KH * KW * C values) must fit in int.
static Window2D conv_windows(const py::array& x, const py::array& kernel, Pair strides, const std::string& padding,
                             const char* fn) {
    const std::string f(fn);
    check_rank(kernel, 4, (f + ": kernel").c_str());
    const Window2D w = windows(x, {(int)kernel.shape(0), (int)kernel.shape(1)}, strides, padding, fn);
    check_shape(kernel, {w.KH, w.KW, w.C, -1}, (f + ": kernel (input channels as x's)").c_str());
    if ((long long)w.KH * w.KW * w.C > kMaxIndex)
        throw py::value_error(f + ": a patch of " + std::to_string(w.KH) + "x" + std::to_string(w.KW) + " pixels of " +
                              std::to_string(w.C) + " channels exceeds the kernels' limit of 2**31 - 1 values");
    return w;
}

static std::vector<py::ssize_t> out_shape(const Window2D& w, py::ssize_t channels) {
    return {w.B, w.OH, w.OW, channels};
}

// A pooling forward binding: y = Forward{}(x) over the windows
template <class Forward> static void def_pool_forward(py::module_& m, const char* name, const char* doc) {
    const std::string fn(name);
    m.def(
        name,
        [fn](const py::array& x, Pair pool_size, Pair strides, const std::string& padding) {
            return dispatch_float(x, (fn + ": x").c_str(), [&](auto tag) -> py::array {
                using T = decltype(tag);
                const T* px = in_ptr<T>(x, (fn + ": x").c_str());
                const Window2D w = windows(x, pool_size, strides, padding, fn.c_str());
                return released_result<T>(out_shape(w, w.C), [&](T* py_) { Forward{}(py_, px, w); });
            });
        },
        py::arg("x"), py::arg("pool_size"), py::arg("strides"), py::arg("padding") = "valid", doc);
}

// A pooling backward binding: dx = backward(dx, dy, x, y, windows) with y the forward's output (or
// None where the backward does not read it)
template <class Backward>
static void def_pool_backward(py::module_& m, const char* name, bool reads_output, const char* doc) {
    const std::string fn(name);
    auto binding = [fn, reads_output](const py::array& dy, const py::array& x, const py::object& y, Pair pool_size,
                                      Pair strides, const std::string& padding) {
        return dispatch_float(x, (fn + ": x").c_str(), [&](auto tag) -> py::array {
            using T = decltype(tag);
            const T* px = in_ptr<T>(x, (fn + ": x").c_str());
            const Window2D w = windows(x, pool_size, strides, padding, fn.c_str());
            check_shape(dy, out_shape(w, w.C), (fn + ": dy").c_str());
            const T* pdy = in_ptr<T>(dy, (fn + ": dy").c_str());
            const std::string y_what = fn + ": y";
            const T* py_ = reads_output ? in_ptr<T>(shaped_array_arg(y, out_shape(w, w.C), y_what.c_str()), y_what.c_str())
                                        : nullptr;
            std::vector<py::ssize_t> shape(x.shape(), x.shape() + 4);
            return released_result<T>(shape, [&](T* pdx) { Backward{}(pdx, pdy, px, py_, w); });
        });
    };
    if (reads_output)
        m.def(name, binding, py::arg("dy"), py::arg("x"), py::arg("y"), py::arg("pool_size"), py::arg("strides"),
              py::arg("padding") = "valid", doc);
    else
        m.def(
            name,
            [binding](const py::array& dy, const py::array& x, Pair pool_size, Pair strides, const std::string& padding) {
                return binding(dy, x, py::none(), pool_size, strides, padding);
            },
            py::arg("dy"), py::arg("x"), py::arg("pool_size"), py::arg("strides"), py::arg("padding") = "valid", doc);
}

struct MaxForward {
    template <class T> void operator()(T* y, const T* x, const Window2D& w) { max_pool2d_forward(y, x, w); }
};
struct MaxBackward {
    template <class T> void operator()(T* dx, const T* dy, const T* x, const T* y, const Window2D& w) {
        max_pool2d_backward(dx, dy, x, y, w);
    }
};
struct AvgForward {
    template <class T> void operator()(T* y, const T* x, const Window2D& w) { avg_pool2d_forward(y, x, w); }
};
struct AvgBackward {
    template <class T> void operator()(T* dx, const T* dy, const T*, const T*, const Window2D& w) {
        avg_pool2d_backward(dx, dy, w);
    }
};

void init_conv(py::module_& m) {
    m.def(
        "conv2d_forward",
        [](const py::array& x, const py::array& kernel, const py::object& bias, Pair strides,
           const std::string& padding, const std::string& activation, bool bf16) {
            const Activation act = parse_activation(activation);
            return dispatch_float(x, "conv2d_forward: x", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                check_bf16_operands(bf16, x, "conv2d_forward");
                const T* px = in_ptr<T>(x, "conv2d_forward: x");
                const T* pk = in_ptr<T>(kernel, "conv2d_forward: kernel");
                const Window2D w = conv_windows(x, kernel, strides, padding, "conv2d_forward");
                const py::ssize_t F = kernel.shape(3);
                const T* pb = optional_in_ptr<T>(bias, {F}, "conv2d_forward: bias");
                auto z = new_array<T>(out_shape(w, F));
                // gelu's backward needs the pre-activation; every other activation works from y
                py::array_t<T> y = act == Activation::gelu ? new_array<T>(out_shape(w, F)) : z;
                T* pz = z.mutable_data();
                T* py_ = y.mutable_data();
                {
                    py::gil_scoped_release release;
                    if constexpr (std::is_same_v<T, float>) {
                        if (bf16) bf16_conv2d_forward(py_, pz, px, pk, pb, w, (int)F, act);
                        else conv2d_forward<T>(py_, pz, px, pk, pb, w, (int)F, act);
                    } else {
                        conv2d_forward<T>(py_, pz, px, pk, pb, w, (int)F, act);
                    }
                }
                return py::make_tuple(y, z);
            });
        },
        py::arg("x"), py::arg("kernel"), py::arg("bias"), py::arg("strides"), py::arg("padding") = "valid",
        py::arg("activation") = "linear", py::arg("bf16") = false,
        "y = act(conv(x, kernel) + bias) for x (B, H, W, C) and kernel (KH, KW, C, F), TensorFlow's 'same' or "
        "'valid' padding; returns (y, z) with z the pre-activation (the same array unless the activation is gelu). "
        "bf16: the products on bfloat16 operands with float32 sums (float32 only).");

    m.def(
        "conv2d_backward",
        [](const py::array& dy, const py::array& x, const py::array& kernel, const py::array& y, const py::array& z,
           Pair strides, const std::string& padding, const std::string& activation, py::array& dkernel,
           const py::object& dbias, bool need_dx, bool bf16) -> py::object {
            const Activation act = parse_activation(activation);
            return dispatch_float(x, "conv2d_backward: x", [&](auto tag) -> py::object {
                using T = decltype(tag);
                check_bf16_operands(bf16, x, "conv2d_backward");
                const T* px = in_ptr<T>(x, "conv2d_backward: x");
                const T* pk = in_ptr<T>(kernel, "conv2d_backward: kernel");
                const Window2D w = conv_windows(x, kernel, strides, padding, "conv2d_backward");
                const py::ssize_t F = kernel.shape(3);
                check_shape(dkernel, {w.KH, w.KW, w.C, F}, "conv2d_backward: dkernel");
                check_shape(dy, out_shape(w, F), "conv2d_backward: dy");
                check_shape(y, out_shape(w, F), "conv2d_backward: y");
                check_shape(z, out_shape(w, F), "conv2d_backward: z");
                T* pdb = optional_inout_ptr<T>(dbias, {F}, "conv2d_backward: dbias");
                const T* pdy = in_ptr<T>(dy, "conv2d_backward: dy");
                const T* py_ = in_ptr<T>(y, "conv2d_backward: y");
                const T* pz = in_ptr<T>(z, "conv2d_backward: z");
                T* pdk = inout_ptr<T>(dkernel, "conv2d_backward: dkernel");
                py::array_t<T> dx = need_dx ? new_array<T>({w.B, w.H, w.W, w.C}) : py::array_t<T>();
                T* pdx = need_dx ? dx.mutable_data() : nullptr;
                {
                    py::gil_scoped_release release;
                    if constexpr (std::is_same_v<T, float>) {
                        if (bf16) bf16_conv2d_backward(pdx, pdk, pdb, pdy, px, pk, py_, pz, w, (int)F, act);
                        else conv2d_backward<T>(pdx, pdk, pdb, pdy, px, pk, py_, pz, w, (int)F, act);
                    } else {
                        conv2d_backward<T>(pdx, pdk, pdb, pdy, px, pk, py_, pz, w, (int)F, act);
                    }
                }
                if (!need_dx) return py::none();
                return std::move(dx);
            });
        },
        py::arg("dy"), py::arg("x"), py::arg("kernel"), py::arg("y"), py::arg("z"), py::arg("strides"),
        py::arg("padding"), py::arg("activation"), py::arg("dkernel"), py::arg("dbias"), py::arg("need_dx") = true,
        py::arg("bf16") = false,
        "Backward of conv2d_forward: accumulates into dkernel/dbias, returns dx (or None). bf16: as conv2d_forward's.");

    def_pool_forward<MaxForward>(
        m, "max_pool2d_forward", "y[b, oh, ow, c] = the maximum of x (B, H, W, C) over each window inside the image.");
    def_pool_backward<MaxBackward>(m, "max_pool2d_backward", true,
                                   "Backward of max_pool2d_forward from its input x and output y: dy to the first "
                                   "pixel of each window equal to its maximum; returns dx.");
    def_pool_forward<AvgForward>(
        m, "avg_pool2d_forward",
        "y[b, oh, ow, c] = the mean of x (B, H, W, C) over each window's pixels inside the image.");
    def_pool_backward<AvgBackward>(m, "avg_pool2d_backward", false, "Backward of avg_pool2d_forward: returns dx.");
}

}  // namespace attnx::bind
