// Convolution and pooling kernels against direct loops over the windows (double).
#include <cmath>
#include <limits>
#include <vector>

#include <xtensor/xrandom.hpp>
#include <xtensor/xtensor.hpp>
#include <xtensor/xview.hpp>

#include "attnx/conv.hpp"
#include "check.hpp"

using namespace attnx;

// x (B, H, W, C) at (b, ih, iw, c), 0 in the padding
static double pixel(const xt::xtensor<double, 4>& x, int b, int ih, int iw, int c) {
    if (ih < 0 || iw < 0 || ih >= (int)x.shape(1) || iw >= (int)x.shape(2)) return 0.0;
    return x(b, ih, iw, c);
}

// 'same' with stride 2 on a 7x6 image and a 3x2 kernel: padding 1 top, 1 bottom, 0 left, 1 right
static void test_conv2d() {
    xt::random::seed(3);
    const int B = 2, H = 7, W = 6, C = 3, KH = 3, KW = 2, F = 4;
    const Window2D w = window_2d(B, H, W, C, KH, KW, 2, 2, true);
    CHECK(w.OH == 4 && w.OW == 3 && w.pad_top == 1 && w.pad_left == 0);
    xt::xtensor<double, 4> x = xt::random::randn<double>({B, H, W, C});
    xt::xtensor<double, 4> K = xt::random::randn<double>({KH, KW, C, F});
    xt::xtensor<double, 1> bias = xt::random::randn<double>({F});
    std::vector<double> y((size_t)B * w.OH * w.OW * F);
    conv2d_forward(y.data(), y.data(), x.data(), K.data(), bias.data(), w, F, Activation::linear);
    xt::xtensor<double, 4> dy = xt::random::randn<double>({B, w.OH, w.OW, F});
    xt::xtensor<double, 4> dx = xt::zeros<double>({B, H, W, C}), want_dx = xt::zeros<double>({B, H, W, C});
    xt::xtensor<double, 4> dK = xt::ones<double>({KH, KW, C, F}), want_dK = xt::ones<double>({KH, KW, C, F});
    xt::xtensor<double, 1> db = xt::zeros<double>({F});
    conv2d_backward(dx.data(), dK.data(), db.data(), dy.data(), x.data(), K.data(), y.data(), y.data(), w, F,
                    Activation::linear);
    for (int b = 0; b < B; ++b)
        for (int oh = 0; oh < w.OH; ++oh)
            for (int ow = 0; ow < w.OW; ++ow)
                for (int f = 0; f < F; ++f) {
                    double z = bias(f);
                    for (int i = 0; i < KH; ++i)
                        for (int j = 0; j < KW; ++j)
                            for (int c = 0; c < C; ++c) {
                                const int ih = oh * 2 - 1 + i, iw = ow * 2 + j;
                                z += pixel(x, b, ih, iw, c) * K(i, j, c, f);
                                want_dK(i, j, c, f) += pixel(x, b, ih, iw, c) * dy(b, oh, ow, f);
                                if (ih >= 0 && ih < H && iw < W)
                                    want_dx(b, ih, iw, c) += K(i, j, c, f) * dy(b, oh, ow, f);
                            }
                    CHECK_CLOSE(y[((b * w.OH + oh) * w.OW + ow) * F + f], z, 1e-12);
                }
    CHECK(xt::allclose(dx, want_dx));
    CHECK(xt::allclose(dK, want_dK));
    for (int f = 0; f < F; ++f)
        CHECK_CLOSE(db(f), xt::sum(xt::view(dy, xt::all(), xt::all(), xt::all(), f))(), 1e-12);
}

// Max and average over 3x3 windows, stride 2, 'same' on 5x5: windows at the edges hold fewer pixels
static void test_pooling() {
    const int H = 5, C = 2;
    const Window2D w = window_2d(1, H, H, C, 3, 3, 2, 2, true);
    CHECK(w.OH == 3 && w.pad_top == 1);
    std::vector<double> x(H * H * C), y(w.OH * w.OW * C), dx(x.size());
    for (size_t e = 0; e < x.size(); ++e) x[e] = double(e % 7) - 3.0 * (e % 2);
    x[(2 * H + 2) * C] = std::numeric_limits<double>::quiet_NaN();  // a NaN wins its windows
    max_pool2d_forward(y.data(), x.data(), w);
    CHECK(std::isnan(y[(1 * w.OW + 1) * C]));
    CHECK_CLOSE(y[1], std::max({x[1], x[3], x[H * C + 1], x[H * C + 3]}), 0);  // the top-left window: 2x2 pixels
    avg_pool2d_forward(y.data(), x.data(), w);
    CHECK_CLOSE(y[1], (x[1] + x[3] + x[H * C + 1] + x[H * C + 3]) / 4, 1e-12);
    std::vector<double> dy(y.size(), 1.0);
    avg_pool2d_backward(dx.data(), dy.data(), w);
    CHECK_CLOSE(dx[1], 0.25, 1e-12);               // pixel (0, 0): in the top-left window only
    CHECK_CLOSE(dx[(H + 1) * C], 1.0 / 4 + 2.0 / 6 + 1.0 / 9, 1e-12);  // pixel (1, 1): in windows of 4, 6, 6 and 9
}

int main() {
    test_conv2d();
    test_pooling();
    return attnx::test::report("test_conv");
}
