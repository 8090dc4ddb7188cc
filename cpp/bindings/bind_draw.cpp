// DRAW's filterbank read and write attention (draw.hpp).
#include "attnx/draw.hpp"
#include "bindings.hpp"
#include "checks.hpp"

namespace attnx::bind {

namespace {

// (out, window, Fx, Fy) of a read (x an image (B, H, W)) or a write (x a patch (B, N, N)).
py::tuple draw_forward(const char* fn, bool write, const py::array& x, const py::array& params, py::ssize_t n,
                       py::ssize_t height, py::ssize_t width) {
    const std::string f(fn);
    return dispatch_float(x, (f + ": x").c_str(), [&](auto tag) -> py::tuple {
        using T = decltype(tag);
        check_rank(x, 3, (f + ": x").c_str());
        DrawConfig cfg;
        cfg.B = (int)x.shape(0);
        cfg.N = (int)(write ? x.shape(1) : n);
        cfg.H = (int)(write ? height : x.shape(1));
        cfg.W = (int)(write ? width : x.shape(2));
        if (cfg.B == 0) throw py::value_error(f + ": x: empty batch, shape " + shape_str(x));
        if (cfg.N < 1 || cfg.H < 1 || cfg.W < 1)
            throw py::value_error(f + ": the patch and image sizes must be positive");
        if (write) check_shape(x, {cfg.B, cfg.N, cfg.N}, (f + ": x").c_str());
        check_shape(params, {cfg.B, 5}, (f + ": params").c_str());
        const T* px = in_ptr<T>(x, (f + ": x").c_str());
        const T* pp = in_ptr<T>(params, (f + ": params").c_str());
        const py::ssize_t B = cfg.B, N = cfg.N, H = cfg.H, W = cfg.W;
        auto out = write ? new_array<T>({B, H, W}) : new_array<T>({B, N, N});
        auto window = new_array<T>({B, 5});
        auto fx = new_array<T>({B, N, W});
        auto fy = new_array<T>({B, N, H});
        T *po = out.mutable_data(), *pw = window.mutable_data(), *pfx = fx.mutable_data(), *pfy = fy.mutable_data();
        {
            py::gil_scoped_release release;
            draw_filterbanks<T>(cfg, pw, pfx, pfy, pp);
            draw_attend_forward<T>(cfg, write, po, px, pw, pfx, pfy);
        }
        return py::make_tuple(out, window, fx, fy);
    });
}

}  // namespace

void init_draw(py::module_& m) {
    m.def(
        "draw_read_forward",
        [](const py::array& image, const py::array& params, py::ssize_t n) {
            return draw_forward("draw_read_forward", false, image, params, n, 0, 0);
        },
        py::arg("image"), py::arg("params"), py::arg("n"),
        "DRAW's read: glimpse = gamma Fy image Fx^T (B, n, n) from images (B, H, W) and params (B, 5) = (g~X, g~Y, "
        "log sigma^2, log delta~, log gamma). Returns (glimpse, window (B, 5) = (gX, gY, sigma^2, delta, gamma), "
        "Fx (B, n, W), Fy (B, n, H)).");
    m.def(
        "draw_write_forward",
        [](const py::array& patch, const py::array& params, py::ssize_t height, py::ssize_t width) {
            return draw_forward("draw_write_forward", true, patch, params, 0, height, width);
        },
        py::arg("patch"), py::arg("params"), py::arg("height"), py::arg("width"),
        "DRAW's write: canvas = Fy^T patch Fx / gamma (B, height, width) from patches (B, N, N) and params (B, 5). "
        "Returns (canvas, window, Fx, Fy) as draw_read_forward.");
    m.def(
        "draw_attend_backward",
        [](const py::array& dout, const py::array& out, const py::array& x, const py::array& window,
           const py::array& fx, const py::array& fy, bool write, bool need_dx) {
            return dispatch_float(x, "draw_attend_backward: x", [&](auto tag) -> py::tuple {
                using T = decltype(tag);
                check_rank(x, 3, "draw_attend_backward: x");
                check_rank(fx, 3, "draw_attend_backward: fx");
                check_rank(fy, 3, "draw_attend_backward: fy");
                DrawConfig cfg;
                cfg.B = (int)x.shape(0), cfg.N = (int)fx.shape(1), cfg.W = (int)fx.shape(2), cfg.H = (int)fy.shape(2);
                const py::ssize_t B = cfg.B, N = cfg.N, H = cfg.H, W = cfg.W;
                const std::vector<py::ssize_t> image{B, H, W}, patch{B, N, N};
                check_shape(x, write ? patch : image, "draw_attend_backward: x");
                check_shape(out, write ? image : patch, "draw_attend_backward: out");
                check_shape(dout, write ? image : patch, "draw_attend_backward: dout");
                check_shape(window, {B, 5}, "draw_attend_backward: window");
                check_shape(fx, {B, N, W}, "draw_attend_backward: fx");
                check_shape(fy, {B, N, H}, "draw_attend_backward: fy");
                const T* pdo = in_ptr<T>(dout, "draw_attend_backward: dout");
                const T* po = in_ptr<T>(out, "draw_attend_backward: out");
                const T* px = in_ptr<T>(x, "draw_attend_backward: x");
                const T* pw = in_ptr<T>(window, "draw_attend_backward: window");
                const T* pfx = in_ptr<T>(fx, "draw_attend_backward: fx");
                const T* pfy = in_ptr<T>(fy, "draw_attend_backward: fy");
                py::array_t<T> dx = need_dx ? new_array<T>(write ? patch : image) : new_array<T>({0});
                auto dparams = new_array<T>({B, 5});
                T* pdx = need_dx ? dx.mutable_data() : nullptr;
                T* pdp = dparams.mutable_data();
                {
                    py::gil_scoped_release release;
                    draw_attend_backward<T>(cfg, write, pdx, pdp, pdo, po, px, pw, pfx, pfy);
                }
                return py::make_tuple(need_dx ? py::object(dx) : py::none(), dparams);
            });
        },
        py::arg("dout"), py::arg("out"), py::arg("x"), py::arg("window"), py::arg("fx"), py::arg("fy"),
        py::arg("write"), py::arg("need_dx") = true,
        "Backward of draw_read_forward (write=False) or draw_write_forward (write=True): returns (dx or None, "
        "dparams (B, 5)).");
}

}  // namespace attnx::bind
