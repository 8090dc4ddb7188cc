// activations.hpp against cpp/reference/activations.hpp: every activation forward and backward
// (softmax on rows, masked softmax rows, the vector exp and the recurrent loops' float tanh and
// sigmoid), on lengths that leave vector tails, on every SIMD level.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attnx/activations.hpp"
#include "reference/activations.hpp"
#include "reference_check.hpp"

using namespace attnx;
using namespace attnx::test;

namespace {

const char* name(Activation a) {
    switch (a) {
        case Activation::relu: return "relu";
        case Activation::tanh: return "tanh";
        case Activation::sigmoid: return "sigmoid";
        case Activation::softmax: return "softmax";
        case Activation::gelu: return "gelu";
        default: return "linear";
    }
}

void test_activation(Activation act, size_t rows, size_t cols, unsigned seed) {
    std::mt19937 rng(seed);
    const auto x = random_values(rng, rows * cols, 3.0), dy = random_values(rng, rows * cols);
    std::vector<double> y(rows * cols), dx(rows * cols);
    reference::activation_forward(y.data(), x.data(), rows, cols, act);
    reference::activation_backward(dx.data(), dy.data(), x.data(), y.data(), rows, cols, act);
    char where[64];
    std::snprintf(where, sizeof where, "%s rows=%zu cols=%zu", name(act), rows, cols);
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
    return attnx::test::report("test_reference_activations");
}
