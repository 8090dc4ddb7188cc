// decoder_step.hpp against cpp/reference/decoder_step.hpp: the cached step of a stack of decoder
// layers (post- and pre-norm, relu and gelu, a padded and a fully masked source row, without biases
// and norms' beta, without cross-attention as encoder layers), its output, both caches and the last
// layer's cross-attention weights, on odd sizes and on sizes that split across two threads; and
// with int8 kernels (quantized.hpp) in place of float ones, against the reference's int8 products; and
// a step that a team of two threads splits by columns (a few rows) giving one thread's bits.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attnx/decoder_step.hpp"
#include "reference/decoder_step.hpp"
#include "reference/quantized.hpp"
#include "int8_check.hpp"
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

    // int8 (optional): per layer 22 int8 kernels or null, in place of the float kernels of those slots
    template <class T>
    std::vector<DecoderLayerWeights<T>> pointers(const std::vector<std::vector<T>>& cast_arrays,
                                                 const std::vector<const Int8Kernel*>* int8 = nullptr) const {
        std::vector<DecoderLayerWeights<T>> out(cast_arrays.size() / 22);
        for (size_t l = 0; l < out.size(); ++l) {
            const T* p[22];
            for (int i = 0; i < 22; ++i) {
                const auto& a = cast_arrays[l * 22 + i];
                p[i] = a.empty() || (int8 && (*int8)[l * 22 + i]) ? nullptr : a.data();
            }
            out[l] = decoder_layer_weights<T>(p, int8 ? int8->data() + l * 22 : nullptr);
        }
        return out;
    }
};

// The kernel slots of a layer's 22 (decoder_layer_weights): (slot, input size K is D or F)
constexpr int kKernelSlots[8] = {2, 4, 6, 8, 12, 14, 18, 20};

// The inputs of one step besides the weights: x, both caches, the cross keys and values (M memory
// rows: memory_batch, or N), the source mask (row 0 padded, row 1 with nothing to attend to) and the
// config; with memory_batch > 0 the rows read memory rows (n * 3 + 1) % memory_batch (a beam
// search's shared memory); with cache_batch > 0 (>= N) the rows read their history from random cache
// rows per position and write the position to distinct random ones (a beam search's reordered rows)
struct StepInputs {
    std::vector<double> x, keys, values, cross_keys, cross_values;
    std::vector<uint8_t> mask;
    std::vector<int32_t> memory_rows, cache_rows;
    DecoderStepConfig c;

    StepInputs(std::mt19937& rng, int layers, int N, int D, int H, int F, int S, int capacity, int position,
               bool norm_first, Activation act, int memory_batch, int cache_batch = 0) {
        const int M = memory_batch ? memory_batch : N, C = cache_batch ? cache_batch : N;
        x = random_values(rng, (size_t)N * D);
        memory_rows.resize((size_t)N);
        for (int n = 0; n < N; ++n) memory_rows[n] = (n * 3 + 1) % M;
        cache_rows.resize((size_t)N * capacity);
        std::vector<int32_t> written(C);
        std::iota(written.begin(), written.end(), 0);
        std::shuffle(written.begin(), written.end(), rng);
        for (int n = 0; n < N; ++n)
            for (int s = 0; s < capacity; ++s)
                cache_rows[(size_t)n * capacity + s] = s == position ? written[n] : (int32_t)(rng() % C);
        const size_t cache = (size_t)layers * C * capacity * D, cross = (size_t)layers * M * S * D;
        keys = random_values(rng, cache), values = random_values(rng, cache);
        cross_keys = random_values(rng, cross), cross_values = random_values(rng, cross);
        mask.assign((size_t)M * S, 1);
        for (int s = S / 2; s < S; ++s) mask[s] = 0;
        if (M > 1 && S > 0) std::fill(mask.begin() + S, mask.begin() + 2 * S, 0);
        c.layers = layers, c.N = N, c.D = D, c.H = H, c.F = F, c.S = S, c.capacity = capacity, c.position = position;
        c.norm_first = norm_first, c.activation = act, c.epsilon = 1e-5;
        if (memory_batch) c.memory_rows = memory_rows.data(), c.memory_batch = memory_batch;
        if (cache_batch) c.cache_rows = cache_rows.data(), c.cache_batch = cache_batch;
    }

    // the reference step on these inputs
    Named reference(const std::vector<DecoderLayerWeights<double>>& layers) const {
        std::vector<double> x_ = x, keys_ = keys, values_ = values, cross_weights((size_t)c.N * c.H * c.S);
        reference::decoder_stack_step(x_.data(), keys_.data(), values_.data(), cross_weights.data(), cross_keys.data(),
                                      cross_values.data(), mask.data(), layers.data(), c);
        return {{"x", x_}, {"keys", keys_}, {"values", values_}, {"cross_weights", cross_weights}};
    }

    // the fast step in T on these inputs, at the current level and thread budget
    template <class T> Named run(const std::vector<DecoderLayerWeights<T>>& layers) const {
        auto x_ = cast<T>(x), keys_ = cast<T>(keys), values_ = cast<T>(values);
        const auto cross_keys_ = cast<T>(cross_keys), cross_values_ = cast<T>(cross_values);
        std::vector<T> cross_weights((size_t)c.N * c.H * c.S);
        decoder_stack_step<T>(x_.data(), keys_.data(), values_.data(), cross_weights.data(), cross_keys_.data(),
                              cross_values_.data(), mask.data(), layers.data(), c);
        return {{"x", to_double(x_)}, {"keys", to_double(keys_)}, {"values", to_double(values_)},
                {"cross_weights", to_double(cross_weights)}};
    }
};

// The int8 kernels of `weights`' kernel slots (each layer's 22; null where none), all of them or the
// attention's only (float_feed_forward); fused: q, k, v first joined in one (D, 3D) kernel in the
// query slot, biases likewise, the key and value slots emptied
std::vector<const Int8Kernel*> int8_kernels(StackWeights& weights, std::vector<std::shared_ptr<Int8Kernel>>& owned,
                                            int layers, int D, int F, bool fused, bool float_feed_forward) {
    std::vector<const Int8Kernel*> int8((size_t)layers * 22, nullptr);
    for (int l = 0; l < layers; ++l) {
        auto& a = weights.arrays;
        const size_t base = (size_t)l * 22;
        if (fused) {
            std::vector<double> W((size_t)D * 3 * D), b;
            for (int i = 0; i < 3; ++i) {
                for (int k = 0; k < D; ++k)
                    for (int n = 0; n < D; ++n) W[(size_t)k * 3 * D + i * D + n] = a[base + 2 + 2 * i][(size_t)k * D + n];
                b.insert(b.end(), a[base + 3 + 2 * i].begin(), a[base + 3 + 2 * i].end());
            }
            a[base + 2] = W, a[base + 3] = b;
            for (int i : {4, 5, 6, 7}) a[base + i].clear();
        }
        for (int slot : kKernelSlots) {
            if (a[base + slot].empty() || (float_feed_forward && slot >= 18)) continue;
            const int K = slot == 20 ? F : D, Nw = slot == 18 ? F : slot == 2 && fused ? 3 * D : D;
            owned.push_back(quantize_kernel(a[base + slot], K, Nw));
            int8[base + slot] = owned.back().get();
        }
    }
    return int8;
}

// The cached step with int8 kernels (every product, or the attention's only: a float feed-forward
// beside them), self q, k, v fused in one (D, 3D) kernel or apart, against the reference's int8
// products: x, both caches and the cross-attention weights, every level, 1 and 2 threads
void test_decoder_step_int8(int layers, int N, int D, int H, int F, int S, int capacity, int position,
                            bool norm_first, bool fused, bool float_feed_forward, unsigned seed, int memory_batch = 0) {
    std::mt19937 rng(seed);
    StackWeights weights(rng, layers, D, F, true, S > 0);
    std::vector<std::shared_ptr<Int8Kernel>> owned;
    const auto int8 = int8_kernels(weights, owned, layers, D, F, fused, float_feed_forward);
    const StepInputs inputs(rng, layers, N, D, H, F, S, capacity, position, norm_first, Activation::relu, memory_batch);
    const Named want = inputs.reference(weights.pointers<double>(weights.arrays, &int8));
    char where[160];
    std::snprintf(where, sizeof where, "decoder_stack_step int8 layers=%d N=%d D=%d F=%d t=%d%s%s%s memory=%d", layers,
                  N, D, F, position, norm_first ? " pre-norm" : "", fused ? " fused qkv" : "",
                  float_feed_forward ? " float feed-forward" : "", memory_batch);
    std::vector<std::vector<float>> arrays;
    for (const auto& a : weights.arrays) arrays.push_back(cast<float>(a));
    const auto fast_layers = weights.pointers<float>(arrays, &int8);
    on_every_level_and_split([&](const std::string& level) {
        // the activations' int8 rounding of float and double inputs may differ by one step in a rare value
        compare_all(inputs.run<float>(fast_layers), want, 1e-3, std::string(where) + " " + level);
    });
}

void test_decoder_step(int layers, int N, int D, int H, int F, int S, int capacity, int position, bool norm_first,
                       Activation act, bool with_biases, unsigned seed, int memory_batch = 0, int cache_batch = 0) {
    std::mt19937 rng(seed);
    const StackWeights weights(rng, layers, D, F, with_biases, S > 0);
    const StepInputs inputs(rng, layers, N, D, H, F, S, capacity, position, norm_first, act, memory_batch,
                            cache_batch);
    char where[180];
    std::snprintf(where, sizeof where,
                  "decoder_stack_step layers=%d N=%d D=%d H=%d F=%d S=%d t=%d%s%s%s memory=%d cache rows=%d", layers, N,
                  D, H, F, S, position, norm_first ? " pre-norm" : "", act == Activation::gelu ? " gelu" : "",
                  with_biases ? "" : " no biases", memory_batch, cache_batch);
    check_every_level(where, inputs.reference(weights.pointers<double>(weights.arrays)), [&](auto tag) {
        using T = decltype(tag);
        std::vector<std::vector<T>> arrays;
        for (const auto& a : weights.arrays) arrays.push_back(cast<T>(a));
        return inputs.run<T>(weights.pointers<T>(arrays));
    });
}

// A few rows at 2 threads, where a team of two splits every product's columns and the attention's
// heads (decoder_stack_run), give exactly one thread's values at every level, float and int8
// kernels (fused q, k, v or apart), and the feed-forward's shares whole vectors (F = 208: 96 + 112)
void test_team_equals_one_thread(int layers, int N, int D, int H, int F, int S, int capacity, int position,
                                 bool norm_first, bool int8, bool fused, unsigned seed, int cache_batch = 0) {
    std::mt19937 rng(seed);
    StackWeights weights(rng, layers, D, F, true, S > 0);
    std::vector<std::shared_ptr<Int8Kernel>> owned;
    std::vector<const Int8Kernel*> kernels;
    if (int8 || fused) kernels = int8_kernels(weights, owned, layers, D, F, fused, !int8);
    if (!int8) std::fill(kernels.begin(), kernels.end(), nullptr);  // fused q, k, v as a float kernel
    const StepInputs inputs(rng, layers, N, D, H, F, S, capacity, position, norm_first, Activation::relu, 0,
                            cache_batch);
    std::vector<std::vector<float>> arrays;
    for (const auto& a : weights.arrays) arrays.push_back(cast<float>(a));
    const auto layers_ = weights.pointers<float>(arrays, kernels.empty() ? nullptr : &kernels);
    const int threads = get_blas_threads();
    for (int level = 0; level <= (int)cpu_simd_level(); ++level) {
        simd_level_cap() = level;
        set_blas_threads(1);
        const Named one = inputs.run<float>(layers_);
        set_blas_threads(2);
        char where[160];
        std::snprintf(where, sizeof where, "decoder_stack_step team N=%d D=%d F=%d%s%s%s cache rows=%d %s: 2 threads", N,
                      D, F, norm_first ? " pre-norm" : "", int8 ? " int8" : "", fused ? " fused qkv" : "", cache_batch,
                      simd_level_name((SimdLevel)level));
        compare_all(inputs.run<float>(layers_), one, 0.0, where);
    }
    simd_level_cap() = (int)SimdLevel::avx512;
    set_blas_threads(threads);
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
    // int8 kernels (the quantized Transformer's step): fused q, k, v or apart, a float feed-forward beside
    // int8 attention, shared memory rows, rows split across threads
    test_decoder_step_int8(2, 3, 32, 4, 48, 5, 6, 4, false, true, false, seed++);
    test_decoder_step_int8(2, 3, 32, 4, 48, 5, 6, 0, true, false, false, seed++);
    test_decoder_step_int8(1, 2, 20, 2, 36, 3, 9, 8, true, true, true, seed++);
    test_decoder_step_int8(2, 40, 64, 4, 96, 9, 6, 2, true, true, false, seed++, 5);
    test_decoder_step_int8(2, 3, 32, 4, 48, 0, 6, 3, false, true, false, seed++);  // encoder layers, causal
    // a few rows on a team of two threads (each a share of every product's columns, its own heads):
    // against the reference, then one thread's bits
    test_decoder_step(2, 1, 128, 4, 200, 9, 12, 5, true, Activation::relu, true, seed++);
    test_decoder_step(2, 4, 128, 4, 200, 9, 12, 5, false, Activation::gelu, true, seed++, 3);
    test_decoder_step_int8(2, 1, 128, 4, 200, 9, 12, 5, true, true, false, seed++);
    test_decoder_step_int8(2, 5, 128, 4, 208, 9, 12, 0, false, false, false, seed++);
    for (int N : {1, 4, 11})
        for (bool int8 : {false, true})
            for (bool fused : {false, true})
                test_team_equals_one_thread(2, N, 128, 4, 208, 9, 12, 5, N != 4, int8, fused, seed++);
    // one row whose second member's heads begin off a vector (D 72, 3 heads of 24): the members' shares of
    // q, k, v and a sync, not their heads' columns alone
    test_team_equals_one_thread(2, 1, 72, 3, 100, 9, 12, 5, true, false, false, seed++);
    // each row's history read through its cache row per position, the position written to another row
    // (a beam search's reorder by cache_rows): alone, rows split across threads, and on a team
    test_decoder_step(2, 3, 12, 3, 17, 5, 6, 4, false, Activation::relu, true, seed++, 0, 5);
    test_decoder_step(2, 3, 12, 3, 17, 5, 6, 0, true, Activation::relu, true, seed++, 2, 3);  // the first position
    test_decoder_step(2, 37, 64, 4, 96, 29, 12, 7, true, Activation::relu, true, seed++, 0, 45);
    test_decoder_step(2, 4, 128, 4, 200, 9, 12, 5, false, Activation::gelu, true, seed++, 3, 9);
    for (int N : {1, 4, 11}) test_team_equals_one_thread(2, N, 128, 4, 208, 9, 12, 5, true, false, false, seed++, 16);
    return attnx::test::report("test_reference_decoder_step");
}
