// The C++ search alone (search.hpp over decoder_step.hpp's DecoderSearchStep), without Python, the
// encoder or the binding: tokens per second of greedy or beam search on bench_ctranslate2.py's model
// sizes (vocabulary 6000, D 256, 4 heads, feed-forward 512, 2 decoder layers, pre-norm, fused q, k, v,
// 10 source positions) with random weights, which never emit the end token: every sentence decodes
// max_length 20 positions. Beside bench_ctranslate2.py's figures it splits a cell's time into the
// search and the rest (Python, encoder, crossing). Best of 3 passes over `sentences` sentences.
//   g++ -std=c++17 -O3 -ffp-contract=off -fno-math-errno -fno-trapping-math -Wno-psabi -Icpp/include \
//       -o /tmp/decode_search benchmarks/decode_search.cpp -lopenblas -lpthread
//   /tmp/decode_search THREADS SENTENCES WIDTH BATCH      (under `env -u OPENBLAS_CORETYPE`)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "attnx/decoder_step.hpp"
#include "attnx/search.hpp"

using namespace attnx;

int main(int argc, char** argv) {
    const int threads = argc > 1 ? std::atoi(argv[1]) : 2, sentences = argc > 2 ? std::atoi(argv[2]) : 256;
    const int width = argc > 3 ? std::atoi(argv[3]) : 1, B = argc > 4 ? std::atoi(argv[4]) : 1;
    const int layers_count = 2, D = 256, H = 4, F = 512, S = 10, V = 6000, T = 20;
    std::mt19937 rng(0);
    std::normal_distribution<float> normal(0.f, 1.f);
    auto values = [&](size_t n, float scale, float shift = 0.f) {
        std::vector<float> v(n);
        for (auto& e : v) e = shift + normal(rng) * scale;
        return v;
    };
    // per layer the 22 slots of decoder_layer_weights (empty: null), q, k, v fused in the query slot
    std::vector<std::vector<float>> arrays;
    for (int l = 0; l < layers_count; ++l) {
        arrays.push_back(values(D, 0.1f, 1.f)), arrays.push_back(values(D, 0.1f));
        arrays.push_back(values((size_t)D * 3 * D, 0.06f)), arrays.push_back(values(3 * D, 0.1f));
        arrays.resize(arrays.size() + 4);
        arrays.push_back(values((size_t)D * D, 0.06f)), arrays.push_back(values(D, 0.1f));
        arrays.push_back(values(D, 0.1f, 1.f)), arrays.push_back(values(D, 0.1f));
        for (int i = 0; i < 2; ++i) arrays.push_back(values((size_t)D * D, 0.06f)), arrays.push_back(values(D, 0.1f));
        arrays.push_back(values(D, 0.1f, 1.f)), arrays.push_back(values(D, 0.1f));
        arrays.push_back(values((size_t)D * F, 0.06f)), arrays.push_back(values(F, 0.1f));
        arrays.push_back(values((size_t)F * D, 0.04f)), arrays.push_back(values(D, 0.1f));
    }
    std::vector<DecoderLayerWeights<float>> layers(layers_count);
    for (int l = 0; l < layers_count; ++l) {
        const float* p[22];
        for (int i = 0; i < 22; ++i) p[i] = arrays[l * 22 + i].empty() ? nullptr : arrays[l * 22 + i].data();
        layers[l] = decoder_layer_weights<float>(p);
    }
    const auto cross_keys = values((size_t)layers_count * B * S * D, 1.f);
    const auto cross_values = values(cross_keys.size(), 1.f);
    const auto embedding = values((size_t)V * D, 0.5f), positions = values((size_t)T * D, 0.5f);
    const auto gamma = values(D, 0.1f, 1.f), beta = values(D, 0.1f);
    const auto kernel = values((size_t)D * V, 0.1f), bias = values(V, 0.5f);
    const std::vector<uint8_t> mask((size_t)B * S, 1);
    DecoderEnds<float> ends;
    ends.embedding = embedding.data(), ends.embedding_scale = 16.f, ends.positions = positions.data();
    ends.norm_gamma = gamma.data(), ends.norm_beta = beta.data();
    ends.output = {kernel.data(), nullptr, bias.data()}, ends.vocab = V;
    DecoderStepConfig c;
    c.layers = layers_count, c.D = D, c.H = H, c.F = F, c.S = S, c.capacity = T, c.norm_first = true;
    c.N = B * width, c.memory_batch = B;
    SearchConfig search_config;
    search_config.batch = B, search_config.width = width, search_config.max_length = T;
    search_config.start_id = 1, search_config.end_id = 2;
    set_blas_threads(threads);
    double best = 1e30;
    for (int pass = 0; pass < 3; ++pass) {
        const auto start = std::chrono::steady_clock::now();
        long tokens = 0;
        for (int s = 0; s < sentences; s += B) {
            DecoderSearchStep<float> step(layers.data(), c, cross_keys.data(), cross_values.data(), mask.data(), ends,
                                          false);
            tokens += (long)search(step, search_config).steps * B;
        }
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / tokens);
    }
    std::printf("threads %d beam %d batch %2d: %8.0f tokens/s (%.1f us per token)\n", threads, width, B, 1 / best,
                best * 1e6);
}
