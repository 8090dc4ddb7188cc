// decoder_step.hpp against cpp/reference/decoder_step.hpp: the cached step of a stack of decoder
// layers (post- and pre-norm, relu and gelu, a padded and a fully masked source row, without biases
// and norms' beta, without cross-attention as encoder layers), its output, both caches and the last
// layer's cross-attention weights, on odd sizes and on sizes that split across two threads.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "attnx/decoder_step.hpp"
#include "reference/decoder_step.hpp"
#include "reference_check.hpp"

using namespace attnx;
using namespace attnx::test;

namespace {

// Every weight of `layers` decoder layers, in DecoderLayerWeights' order, as double vectors
struct StackWeights {
    std::vector<std::vector<double>> arrays;  // per layer: 22 arrays (empty: a null pointer)

    StackWeights(std::mt19937& rng, int layers, int D, int F, bool with_biases, bool with_cross) {
        const double scale = 1.0 / std::sqrt((double)D);
        for (int l = 0; l < layers; ++l) {
            auto vec = [&](size_t n, double s) { return random_values(rng, n, s); };
            auto bias = [&](size_t n) { return with_biases ? vec(n, 0.1) : std::vector<double>{}; };
            auto gamma = [&]() {
                auto g = vec(D, 0.1);
                for (auto& e : g) e = (double)(float)(e + 1.0);
                return g;
            };
            const size_t DD = (size_t)D * D;
            arrays.push_back(gamma()), arrays.push_back(bias(D));                        // norm1
            for (int i = 0; i < 4; ++i) arrays.push_back(vec(DD, scale)), arrays.push_back(bias(D));  // self q k v o
            if (with_cross) {
                arrays.push_back(gamma()), arrays.push_back(bias(D));                    // norm2
                for (int i = 0; i < 2; ++i) arrays.push_back(vec(DD, scale)), arrays.push_back(bias(D));  // cross q o
            } else {
                arrays.resize(arrays.size() + 6);  // an encoder layer run causally: no cross-attention block
            }
            arrays.push_back(gamma()), arrays.push_back(bias(D));                        // norm3
            arrays.push_back(vec((size_t)D * F, scale)), arrays.push_back(bias(F));
            arrays.push_back(vec((size_t)F * D, 1.0 / std::sqrt((double)F))), arrays.push_back(bias(D));
        }
    }

    template <class T>
    std::vector<DecoderLayerWeights<T>> pointers(const std::vector<std::vector<T>>& cast_arrays) const {
        std::vector<DecoderLayerWeights<T>> out(cast_arrays.size() / 22);
        for (size_t l = 0; l < out.size(); ++l) {
            const T* p[22];
            for (int i = 0; i < 22; ++i) {
                const auto& a = cast_arrays[l * 22 + i];
                p[i] = a.empty() ? nullptr : a.data();
            }
            out[l] = {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11],
                      p[12], p[13], p[14], p[15], p[16], p[17], p[18], p[19], p[20], p[21]};
        }
        return out;
    }
};

// memory_batch > 0: the rows read memory rows (n * 3 + 1) % memory_batch (a beam search's shared memory)
void test_decoder_step(int layers, int N, int D, int H, int F, int S, int capacity, int position, bool norm_first,
                       Activation act, bool with_biases, unsigned seed, int memory_batch = 0) {
    std::mt19937 rng(seed);
    const StackWeights weights(rng, layers, D, F, with_biases, S > 0);
    const auto x0 = random_values(rng, (size_t)N * D);
    const int M = memory_batch ? memory_batch : N;  // memory rows
    std::vector<int32_t> memory_rows((size_t)N);
    for (int n = 0; n < N; ++n) memory_rows[n] = (n * 3 + 1) % M;
    const size_t cache = (size_t)layers * N * capacity * D, cross = (size_t)layers * M * S * D;
    const auto keys0 = random_values(rng, cache), values0 = random_values(rng, cache);
    const auto cross_keys = random_values(rng, cross), cross_values = random_values(rng, cross);
    std::vector<uint8_t> mask((size_t)M * S, 1);
    for (int s = S / 2; s < S; ++s) mask[s] = 0;                       // row 0: padded
    if (M > 1 && S > 0) for (int s = 0; s < S; ++s) mask[S + s] = 0;   // row 1: nothing to attend to
    DecoderStepConfig c;
    c.layers = layers, c.N = N, c.D = D, c.H = H, c.F = F, c.S = S, c.capacity = capacity, c.position = position;
    c.norm_first = norm_first, c.activation = act, c.epsilon = 1e-5;
    if (memory_batch) c.memory_rows = memory_rows.data(), c.memory_batch = memory_batch;

    std::vector<double> x = x0, keys = keys0, values = values0, cross_weights((size_t)N * H * S);
    const auto ref_layers = weights.pointers<double>(weights.arrays);
    reference::decoder_stack_step(x.data(), keys.data(), values.data(), cross_weights.data(), cross_keys.data(),
                                  cross_values.data(), mask.data(), ref_layers.data(), c);
    char where[160];
    std::snprintf(where, sizeof where, "decoder_stack_step layers=%d N=%d D=%d H=%d F=%d S=%d t=%d%s%s%s memory=%d",
                  layers, N, D, H, F, S, position, norm_first ? " pre-norm" : "", act == Activation::gelu ? " gelu" : "",
                  with_biases ? "" : " no biases", memory_batch);
    check_every_level(where, {{"x", x}, {"keys", keys}, {"values", values}, {"cross_weights", cross_weights}},
                      [&](auto tag) {
                          using T = decltype(tag);
                          std::vector<std::vector<T>> arrays;
                          for (const auto& a : weights.arrays) arrays.push_back(cast<T>(a));
                          const auto fast_layers = weights.pointers<T>(arrays);
                          auto x_ = cast<T>(x0), keys_ = cast<T>(keys0), values_ = cast<T>(values0);
                          const auto cross_keys_ = cast<T>(cross_keys), cross_values_ = cast<T>(cross_values);
                          std::vector<T> cross_weights_((size_t)N * H * S);
                          decoder_stack_step<T>(x_.data(), keys_.data(), values_.data(), cross_weights_.data(),
                                                cross_keys_.data(), cross_values_.data(), mask.data(),
                                                fast_layers.data(), c);
                          return Named{{"x", to_double(x_)}, {"keys", to_double(keys_)},
                                       {"values", to_double(values_)}, {"cross_weights", to_double(cross_weights_)}};
                      });
}

}  // namespace

int main() {
    unsigned seed = 1;
    for (bool norm_first : {false, true}) {
        test_decoder_step(2, 3, 12, 3, 17, 5, 6, 0, norm_first, Activation::relu, true, seed++);   // first position
        test_decoder_step(2, 3, 12, 3, 17, 5, 6, 4, norm_first, Activation::gelu, true, seed++);
        test_decoder_step(1, 2, 10, 2, 7, 3, 9, 8, norm_first, Activation::relu, false, seed++);  // the last cache row
    }
    test_decoder_step(3, 37, 64, 4, 96, 29, 12, 7, false, Activation::relu, true, seed++);  // splits across two threads
    test_decoder_step(2, 7, 12, 3, 17, 5, 6, 3, false, Activation::relu, true, seed++, 3);     // shared memory rows
    test_decoder_step(2, 40, 64, 4, 96, 9, 6, 2, true, Activation::gelu, true, seed++, 5);     // ... split, whole vectors
    for (bool norm_first : {false, true})  // S = 0: encoder layers run causally, no cross-attention
        test_decoder_step(2, 3, 12, 3, 17, 0, 6, 4, norm_first, Activation::relu, true, seed++);
    return attnx::test::report("test_reference_decoder_step");
}
