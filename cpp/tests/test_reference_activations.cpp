// activations.hpp against cpp/reference/activations.hpp: every activation forward and backward
// (softmax on rows, masked softmax rows, the vector exp and the recurrent loops' float tanh and
// sigmoid), on lengths that leave vector tails, on every SIMD level; and the float tanh, sigmoid
// and gelu (and gelu's slope) over a dense sweep of [-10, 10] against libm in double at every
// level: their stated error bounds, and the exact values, symmetry, range and NaNs they promise.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attnx/activations.hpp"
#include "reference/activations.hpp"
#include "reference_check.hpp"

using namespace attnx;
using namespace attnx::test;

namespace {

void test_activation(Activation act, size_t rows, size_t cols, unsigned seed) {
    std::mt19937 rng(seed);
    const auto x = random_values(rng, rows * cols, 3.0), dy = random_values(rng, rows * cols);
    std::vector<double> y(rows * cols), dx(rows * cols);
    reference::activation_forward(y.data(), x.data(), rows, cols, act);
    reference::activation_backward(dx.data(), dy.data(), x.data(), y.data(), rows, cols, act);
    char where[64];
    std::snprintf(where, sizeof where, "%s rows=%zu cols=%zu", activation_name(act), rows, cols);
    check_every_level(where, {{"y", y}, {"dx", dx}}, [&](auto tag) {
        using T = decltype(tag);
        const auto x_ = cast<T>(x), dy_ = cast<T>(dy);
        std::vector<T> y_(rows * cols), dx_(rows * cols);
        activation_forward<T>(y_.data(), x_.data(), rows, cols, act);
        activation_backward<T>(dx_.data(), dy_.data(), x_.data(), y_.data(), rows, cols, act);
        return Named{{"y", to_double(y_)}, {"dx", to_double(dx_)}};
    });
}

// masked_softmax_row with a mask (a fully masked row gives zeros), exp_array, and the float
// tanh / sigmoid of the recurrent loops (activate_block)
void test_rows_and_vectors(size_t cols, unsigned seed) {
    std::mt19937 rng(seed);
    const auto x = random_values(rng, 3 * cols, 3.0);
    std::vector<uint8_t> mask(3 * cols);
    for (size_t i = 0; i < cols; ++i) mask[i] = i % 3 != 1, mask[cols + i] = 0, mask[2 * cols + i] = 1;
    std::vector<double> soft(3 * cols), e(3 * cols), t(3 * cols), s(3 * cols);
    reference::softmax_forward(soft.data(), x.data(), mask.data(), 3, cols);
    for (size_t i = 0; i < x.size(); ++i) {
        e[i] = std::exp(x[i]);
        t[i] = reference::act(Activation::tanh, x[i]);
        s[i] = reference::act(Activation::sigmoid, x[i]);
    }
    char where[64];
    std::snprintf(where, sizeof where, "masked softmax, exp, tanh, sigmoid cols=%zu", cols);
    check_every_level(where, {{"masked softmax", soft}, {"exp", e}, {"tanh", t}, {"sigmoid", s}}, [&](auto tag) {
        using T = decltype(tag);
        const auto x_ = cast<T>(x);
        std::vector<T> soft_(3 * cols), e_(3 * cols), t_ = x_, s_ = x_;
        for (size_t r = 0; r < 3; ++r) masked_softmax_row<T>(soft_.data() + r * cols, x_.data() + r * cols, mask.data() + r * cols, cols);
        exp_array<T>(e_.data(), x_.data(), e_.size());
        activate_block<T>(Activation::tanh, t_.data(), (int)t_.size());
        activate_block<T>(Activation::sigmoid, s_.data(), (int)s_.size());
        return Named{{"masked softmax", to_double(soft_)}, {"exp", to_double(e_)}, {"tanh", to_double(t_)},
                     {"sigmoid", to_double(s_)}};
    });
}


// The largest error of float activations over a sweep, and the bounds activations.hpp states
struct SweepErrors {
    double tanh = 0, sigmoid_relative = 0, gate_sigmoid = 0, gelu_cdf = 0, gelu_relative = 0, gelu_far_relative = 0,
           gelu_slope = 0;
};

// activation_forward / _backward in float on x at the current level: y and gelu's dx for dy = 1
std::vector<float> forward(Activation act, const std::vector<float>& x) {
    std::vector<float> y(x.size());
    activation_forward<float>(y.data(), x.data(), 1, x.size(), act);
    return y;
}

// The dense sweep x_i = -10 + i / 2^14 (every float step of 6e-5 across [-10, 10], 327681 points)
// on every SIMD level, activation_forward / _backward (the layers' path) and activate_block (the
// gates'), against libm in double: the bounds of activations.hpp (tanh |error| < 4e-7; sigmoid
// relative error < 3e-7, the gates' sigmoid |error| < 2e-7; gelu's Phi error < 2e-7, gelu's
// relative error < 1e-6 on [-5, 0) and < 3e-6 below, where |gelu| < 1.5e-6; gelu's slope within
// 5e-7 (1 + |slope|)); tanh(0) = 0 and exactly +-1 from the clamp on, odd to the bit, |tanh| <= 1,
// sigmoid in [0, 1], NaN in -> NaN out.
void test_sweep() {
    std::vector<float> x;
    for (int i = -10 * 16384; i <= 10 * 16384; ++i) x.push_back((float)i / 16384.0f);
    const float limit = 7.90531110763549805f, nan = std::numeric_limits<float>::quiet_NaN(),
                inf = std::numeric_limits<float>::infinity();
    for (int level = 0; level <= (int)cpu_simd_level(); ++level) {
        simd_level_cap() = level;
        const char* where = simd_level_name((SimdLevel)level);
        const auto t = forward(Activation::tanh, x), s = forward(Activation::sigmoid, x),
                   g = forward(Activation::gelu, x);
        std::vector<float> gate_s = x;  // the gates' sigmoid (activate_block: activate())
        activate_block<float>(Activation::sigmoid, gate_s.data(), (int)gate_s.size());
        std::vector<float> dg(x.size()), ones(x.size(), 1.0f);
        activation_backward<float>(dg.data(), ones.data(), x.data(), g.data(), 1, x.size(), Activation::gelu);
        SweepErrors worst;
        bool odd = true, tanh_in_range = true, sigmoid_in_range = true;
        for (size_t i = 0; i < x.size(); ++i) {
            const double xi = x[i], phi = 0.5 * std::erfc(-xi / std::sqrt(2.0));
            worst.tanh = std::max(worst.tanh, std::abs(t[i] - std::tanh(xi)));
            const double sigmoid = 1 / (1 + std::exp(-xi));
            worst.sigmoid_relative = std::max(worst.sigmoid_relative, std::abs(s[i] - sigmoid) / sigmoid);
            worst.gate_sigmoid = std::max(worst.gate_sigmoid, std::abs(gate_s[i] - sigmoid));
            if (xi != 0) worst.gelu_cdf = std::max(worst.gelu_cdf, std::abs(g[i] / xi - phi));
            if (xi < 0) {
                double& range = xi >= -5 ? worst.gelu_relative : worst.gelu_far_relative;
                range = std::max(range, std::abs(g[i] - xi * phi) / std::abs(xi * phi));
            }
            const double slope = phi + xi * std::exp(-0.5 * xi * xi) / std::sqrt(2 * M_PI);
            worst.gelu_slope = std::max(worst.gelu_slope, std::abs(dg[i] - slope) / (1 + std::abs(slope)));
            odd = odd && t[i] == -t[x.size() - 1 - i];
            tanh_in_range = tanh_in_range && std::abs(t[i]) <= 1;
            sigmoid_in_range = sigmoid_in_range && s[i] >= 0 && s[i] <= 1 && gate_s[i] >= 0 && gate_s[i] <= 1;
        }
        std::printf("%s float max error over [-10, 10]: tanh %.3g, sigmoid relative %.3g, gates' sigmoid %.3g, "
                    "gelu Phi %.3g, gelu relative %.3g on [-5, 0), %.3g on [-10, -5), gelu slope %.3g\n",
                    where, worst.tanh, worst.sigmoid_relative, worst.gate_sigmoid, worst.gelu_cdf, worst.gelu_relative,
                    worst.gelu_far_relative, worst.gelu_slope);
        CHECK(worst.tanh < 4e-7);
        CHECK(worst.sigmoid_relative < 3e-7);
        CHECK(worst.gate_sigmoid < 2e-7);
        CHECK(worst.gelu_cdf < 2e-7);
        CHECK(worst.gelu_relative < 1e-6);
        CHECK(worst.gelu_far_relative < 3e-6);
        CHECK(worst.gelu_slope < 5e-7);
        CHECK(odd);
        CHECK(tanh_in_range);
        CHECK(sigmoid_in_range);
        // the exact values, the far tails and NaN on both paths
        std::vector<float> special = {0.0f, limit, -limit, 8.0f, -8.0f, 1e30f, -1e30f, inf, -inf, nan, -100.0f, 100.0f};
        std::vector<float> ts = special, ss = special, gs = forward(Activation::gelu, special),
                           output_s = forward(Activation::sigmoid, special);
        activate_block<float>(Activation::tanh, ts.data(), (int)ts.size());
        activate_block<float>(Activation::sigmoid, ss.data(), (int)ss.size());
        CHECK(ts[0] == 0.0f && ts[1] == 1.0f && ts[2] == -1.0f && ts[3] == 1.0f && ts[4] == -1.0f);
        CHECK(ts[5] == 1.0f && ts[6] == -1.0f && ts[7] == 1.0f && ts[8] == -1.0f && std::isnan(ts[9]));
        CHECK(ss[0] == 0.5f && ss[7] == 1.0f && ss[8] == 0.0f && std::isnan(ss[9]) && ss[10] == 0.0f && ss[11] == 1.0f);
        CHECK(output_s[0] == 0.5f && output_s[7] == 1.0f && output_s[8] == 0.0f && std::isnan(output_s[9]) &&
              output_s[10] == 0.0f && output_s[11] == 1.0f);
        CHECK(gs[0] == 0.0f && gs[7] == inf && std::isnan(gs[9]) && gs[11] == 100.0f && gs[10] == 0.0f);
        std::vector<float> dgs(special.size()), ones_s(special.size(), 1.0f);
        activation_backward<float>(dgs.data(), ones_s.data(), special.data(), gs.data(), 1, special.size(), Activation::gelu);
        CHECK(dgs[0] == 0.5f && std::isnan(dgs[9]) && dgs[11] == 1.0f && dgs[10] == 0.0f);
        if (failures()) std::printf("FAIL at level %s\n", where);
    }
    simd_level_cap() = (int)SimdLevel::avx512;
}

}  // namespace

int main() {
    unsigned seed = 1;
    for (Activation act : {Activation::linear, Activation::relu, Activation::tanh, Activation::sigmoid, Activation::gelu,
                           Activation::softmax}) {
        test_activation(act, 1, 1, seed++);
        test_activation(act, 7, 13, seed++);
        test_activation(act, 3, 67, seed++);
    }
    for (size_t cols : {1, 3, 8, 19, 33}) test_rows_and_vectors(cols, seed++);
    test_sweep();
    return attnx::test::report("test_reference_activations");
}
