// Reference embedding lookup: what embedding.hpp computes, one value at a time in double.
#pragma once
#include <cstddef>
#include <cstdint>

namespace attnx::reference {

// out[n, d] = table[ids[n], d]
inline void embedding_forward(double* out, const int64_t* ids, const double* table, size_t N, size_t D) {
    for (size_t n = 0; n < N; ++n)
        for (size_t d = 0; d < D; ++d) out[n * D + d] = table[(size_t)ids[n] * D + d];
}

// out[n, d] = table[ids[n], d]  =>  dtable[ids[n], d] += dout[n, d]  (repeated ids accumulate)
inline void embedding_backward(double* dtable, const double* dout, const int64_t* ids, size_t N, size_t D) {
    for (size_t n = 0; n < N; ++n)
        for (size_t d = 0; d < D; ++d) dtable[(size_t)ids[n] * D + d] += dout[n * D + d];
}

}  // namespace attnx::reference
