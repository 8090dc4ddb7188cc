// pooling.hpp against cpp/reference/pooling.hpp: attention pooling, pooled and returning sequences,
// a bias per step or one, with and without a mask, dweights and dx; odd sizes and one that splits
// across two threads.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attnx/pooling.hpp"
#include "reference/pooling.hpp"
#include "reference_check.hpp"

using namespace attnx;
using namespace attnx::test;

namespace {

void test_pooling(int B, int T, int C, bool per_step, bool sequences, bool masked, bool with_dx, unsigned seed) {
    std::mt19937 rng(seed);
    PoolingConfig cfg;
    cfg.B = B, cfg.T = T, cfg.C = C, cfg.bias_per_step = per_step, cfg.return_sequences = sequences;
    const size_t nout = sequences ? (size_t)B * T * C : (size_t)B * C;
    const auto x = random_values(rng, (size_t)B * T * C), W = random_values(rng, C, 0.3);
    const auto bias = random_values(rng, per_step ? T : 1), dout = random_values(rng, nout);
    const auto dweights = random_values(rng, (size_t)B * T);
    const auto dW0 = random_values(rng, C), dbias0 = random_values(rng, per_step ? T : 1);
    std::vector<uint8_t> mask((size_t)B * T);
    for (size_t i = 0; i < mask.size(); ++i) mask[i] = i % T == 0 || rng() % 3 != 0;
    const uint8_t* m = masked ? mask.data() : nullptr;
    std::vector<double> out(nout), weights((size_t)B * T), energy((size_t)B * T), dx(x.size()), dW = dW0, dbias = dbias0;
    reference::attention_pooling_forward(cfg, out.data(), weights.data(), energy.data(), x.data(), W.data(), bias.data(), m);
    reference::attention_pooling_backward(cfg, with_dx ? dx.data() : nullptr, dW.data(), dbias.data(), dout.data(),
                                          masked ? dweights.data() : nullptr, weights.data(), energy.data(), x.data(),
                                          W.data());
    Named want{{"out", out}, {"weights", weights}, {"energy", energy}, {"dW", dW}, {"dbias", dbias}};
    if (with_dx) want.push_back({"dx", dx});
    char where[128];
    std::snprintf(where, sizeof where, "attention pooling B=%d T=%d C=%d%s%s%s%s", B, T, C, per_step ? " bias per step" : "",
                  sequences ? " sequences" : "", masked ? " masked + dweights" : "", with_dx ? "" : " no dx");
    check_every_level(where, want, [&](auto tag) {
        using Tp = decltype(tag);
        const auto x_ = cast<Tp>(x), W_ = cast<Tp>(W), bias_ = cast<Tp>(bias), dout_ = cast<Tp>(dout);
        const auto dweights_ = cast<Tp>(dweights);
        std::vector<Tp> out_(nout), weights_((size_t)B * T), energy_((size_t)B * T), dx_(x.size()), dW_ = cast<Tp>(dW0),
            dbias_ = cast<Tp>(dbias0);
        attention_pooling_forward<Tp>(cfg, out_.data(), weights_.data(), energy_.data(), x_.data(), W_.data(),
                                      bias_.data(), m);
        attention_pooling_backward<Tp>(cfg, with_dx ? dx_.data() : nullptr, dW_.data(), dbias_.data(), dout_.data(),
                                       masked ? dweights_.data() : nullptr, weights_.data(), energy_.data(), x_.data(),
                                       W_.data());
        Named got{{"out", to_double(out_)}, {"weights", to_double(weights_)}, {"energy", to_double(energy_)},
                  {"dW", to_double(dW_)}, {"dbias", to_double(dbias_)}};
        if (with_dx) got.push_back({"dx", to_double(dx_)});
        return got;
    });
}

}  // namespace

int main() {
    unsigned seed = 1;
    for (bool per_step : {false, true})
        for (bool sequences : {false, true})
            for (bool masked : {false, true}) test_pooling(3, 7, 13, per_step, sequences, masked, true, seed++);
    test_pooling(5, 3, 9, true, false, true, false, seed++);
    test_pooling(64, 33, 41, false, false, true, true, seed++);  // splits across two threads
    test_pooling(64, 33, 41, true, true, false, true, seed++);
    return attnx::test::report("test_reference_pooling");
}
