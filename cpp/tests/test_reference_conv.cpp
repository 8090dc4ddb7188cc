// conv.hpp against cpp/reference/conv.hpp: Conv2D through each of its paths (the direct tiles,
// Winograd for 3x3 stride 1 on 8+ channels, im2col / col2im for strides, one input channel,
// 'same' and 'valid' padding, relu fused), forward and backward; max and average pooling with
// windows that tile, overlap and overhang the image; odd sizes, and shapes that split across two
// threads.
#include <random>
#include <string>
#include <vector>

#include "attnx/conv.hpp"
#include "reference/conv.hpp"
#include "reference_check.hpp"

using namespace attnx;
using namespace attnx::test;

namespace {

std::string describe(const char* what, const Window2D& w, int F) {
    char s[160];
    std::snprintf(s, sizeof s, "%s B=%d H=%d W=%d C=%d K=%dx%d S=%dx%d pad=%d,%d F=%d", what, w.B, w.H, w.W, w.C, w.KH,
                  w.KW, w.SH, w.SW, w.pad_top, w.pad_left, F);
    return s;
}

void test_conv(int B, int H, int W, int C, int K, int S, bool same, int F, Activation act, bool alias, unsigned seed) {
    std::mt19937 rng(seed);
    const Window2D w = window_2d(B, H, W, C, K, K, S, S, same);
    const size_t nx = (size_t)B * H * W * C, nk = (size_t)K * K * C * F, ny = (size_t)B * w.OH * w.OW * F;
    const auto x = random_values(rng, nx), kernel = random_values(rng, nk, 0.3), bias = random_values(rng, F);
    const auto dy = random_values(rng, ny), dK0 = random_values(rng, nk), db0 = random_values(rng, F);
    std::vector<double> y(ny), z(ny), dx(nx), dK = dK0, db = db0;
    reference::conv2d_forward(y.data(), z.data(), x.data(), kernel.data(), bias.data(), w, F, act);
    reference::conv2d_backward(dx.data(), dK.data(), db.data(), dy.data(), x.data(), kernel.data(), y.data(), z.data(), w,
                               F, act);
    check_every_level(describe(act == Activation::relu ? "conv2d relu" : "conv2d tanh", w, F) + (alias ? " y=z" : ""),
                      {{"y", y}, {"dx", dx}, {"dkernel", dK}, {"dbias", db}}, [&](auto tag) {
                          using T = decltype(tag);
                          const auto x_ = cast<T>(x), k_ = cast<T>(kernel), b_ = cast<T>(bias), dy_ = cast<T>(dy);
                          std::vector<T> y_(ny), z_(ny), dx_(nx), dK_ = cast<T>(dK0), db_ = cast<T>(db0);
                          T* zp = alias ? y_.data() : z_.data();
                          conv2d_forward<T>(y_.data(), zp, x_.data(), k_.data(), b_.data(), w, F, act);
                          conv2d_backward<T>(dx_.data(), dK_.data(), db_.data(), dy_.data(), x_.data(), k_.data(), y_.data(),
                                             zp, w, F, act);
                          return Named{{"y", to_double(y_)}, {"dx", to_double(dx_)}, {"dkernel", to_double(dK_)},
                                       {"dbias", to_double(db_)}};
                      });
}

void test_pool(int B, int H, int W, int C, int K, int S, bool same, unsigned seed) {
    std::mt19937 rng(seed);
    const Window2D w = window_2d(B, H, W, C, K, K, S, S, same);
    const size_t nx = (size_t)B * H * W * C, ny = (size_t)B * w.OH * w.OW * C;
    auto x = random_values(rng, nx);
    for (size_t i = 0; i < nx; i += 7) x[i] = x[(i * 13) % nx];  // ties: the first pixel in window order takes dy
    const auto dy = random_values(rng, ny);
    std::vector<double> ymax(ny), yavg(ny), dxmax(nx), dxavg(nx);
    reference::pool2d_forward(ymax.data(), x.data(), w, true);
    reference::pool2d_forward(yavg.data(), x.data(), w, false);
    reference::pool2d_backward(dxmax.data(), dy.data(), x.data(), ymax.data(), w, true);
    reference::pool2d_backward(dxavg.data(), dy.data(), x.data(), yavg.data(), w, false);
    check_every_level(describe("pool2d", w, C), {{"max", ymax}, {"dmax", dxmax}, {"avg", yavg}, {"davg", dxavg}},
                      [&](auto tag) {
                          using T = decltype(tag);
                          const auto x_ = cast<T>(x), dy_ = cast<T>(dy);
                          std::vector<T> ymax_(ny), yavg_(ny), dxmax_(nx), dxavg_(nx);
                          max_pool2d_forward<T>(ymax_.data(), x_.data(), w);
                          avg_pool2d_forward<T>(yavg_.data(), x_.data(), w);
                          max_pool2d_backward<T>(dxmax_.data(), dy_.data(), x_.data(), ymax_.data(), w);
                          avg_pool2d_backward<T>(dxavg_.data(), dy_.data(), w);
                          return Named{{"max", to_double(ymax_)}, {"dmax", to_double(dxmax_)}, {"avg", to_double(yavg_)},
                                       {"davg", to_double(dxavg_)}};
                      });
}

}  // namespace

int main() {
    unsigned seed = 1;
    // (B, H, W, C, K, S, same, F)
    test_conv(2, 7, 6, 3, 3, 1, true, 5, Activation::tanh, false, seed++);     // direct tiles, 'same'
    test_conv(2, 9, 8, 11, 3, 1, true, 13, Activation::relu, true, seed++);    // Winograd, relu fused
    test_conv(3, 10, 9, 9, 3, 1, false, 7, Activation::tanh, false, seed++);   // Winograd, 'valid'
    test_conv(2, 9, 11, 5, 3, 2, true, 6, Activation::relu, false, seed++);    // stride 2: col2im
    test_conv(2, 8, 7, 1, 5, 1, false, 4, Activation::tanh, false, seed++);    // one channel
    test_conv(2, 12, 13, 4, 2, 3, false, 9, Activation::relu, true, seed++);   // stride beyond the kernel
    test_conv(4, 16, 16, 8, 3, 1, true, 16, Activation::relu, false, seed++);  // splits across two threads
    test_conv(4, 15, 14, 6, 5, 2, true, 10, Activation::tanh, false, seed++);  // splits, col2im
    // (B, H, W, C, K, S, same)
    test_pool(2, 8, 8, 5, 2, 2, false, seed++);   // windows tile the image
    test_pool(2, 9, 7, 19, 3, 2, true, seed++);   // overlapping, overhanging, channel tails
    test_pool(3, 7, 9, 3, 3, 1, true, seed++);
    test_pool(16, 32, 32, 8, 2, 2, false, seed++);  // splits across two threads
    return attnx::test::report("test_reference_conv");
}
