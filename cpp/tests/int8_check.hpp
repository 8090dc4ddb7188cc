// int8 weights for the C++ tests: a double matrix quantized as Model.quantize("int8") does it
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "attnx/quantized.hpp"
#include "reference/quantized.hpp"

namespace attnx::test {

// W (K, N) quantized per column (symmetric, max|W| / 127) and packed
inline std::shared_ptr<Int8Kernel> quantize_kernel(const std::vector<double>& W, int K, int N) {
    std::vector<int8_t> q((size_t)K * N), column(K);
    std::vector<float> scale(N), values(K);
    for (int n = 0; n < N; ++n) {
        for (int k = 0; k < K; ++k) values[k] = (float)W[(size_t)k * N + n];
        scale[n] = reference::quantize_row_int8(column.data(), values.data(), K);
        for (int k = 0; k < K; ++k) q[(size_t)k * N + n] = column[k];
    }
    auto w = std::make_shared<Int8Kernel>();
    pack_int8_kernel(*w, q.data(), scale.data(), K, N, N);
    return w;
}

}  // namespace attnx::test
